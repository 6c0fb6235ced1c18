"""Which module an allocation ran in: module spans (the collector's `module` markers) decide a category.

Contract: `ModuleIndex.of(markers)` takes the spans of kind "module" (name = the qualified module path,
attrs {"class", "pass"}) and turns them into owned time intervals (`spans.SpanIndex`: the innermost span
open at a time, unknown when spans of several threads are open), each with the chain of classes from the
root module down to it (parents found per thread by depth, in start order). `decide(times, rules)` returns
per time None, or a `ModuleDecision` from the `[[modules]]` rules (`rules.ModuleRule`): the highest
category precedence among the matches wins, then the deepest match (the innermost module that names it).
Times are µs since the epoch, the trace's clock. The index of the last markers table asked about is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .rules import RuleSet
from .spans import SpanIndex


@dataclass(frozen=True)
class ModuleDecision:
    category: str
    rule: str
    reason: str
    path: str
    tags: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class ModuleIndex:
    spans: SpanIndex
    paths: tuple[str, ...]
    classes: tuple[str, ...]        # the class chain of each span, root first, joined by "."
    passes: tuple[str, ...]         # "forward" or "backward"

    def __len__(self) -> int:
        return len(self.paths)

    @staticmethod
    def of(markers: pd.DataFrame | None) -> ModuleIndex:
        global _last
        if _last is not None and _last[0] is markers:
            return _last[1]
        rows = markers[markers["kind"] == "module"] if markers is not None and len(markers) else None
        index = _build(rows) if rows is not None and len(rows) else \
            ModuleIndex(SpanIndex.build(pd.DataFrame()), (), (), ())
        _last = (markers, index)
        return index

    def decide(self, times: np.ndarray, rules: RuleSet) -> list[ModuleDecision | None]:
        """The module decision at each time (None: no single module span, or no rule names its module)."""
        if not len(self) or not len(times):
            return [None] * len(times)
        owners = self.spans.owner_at(np.asarray(times, dtype=np.int64))
        cache: dict[int, ModuleDecision | None] = {}
        out: list[ModuleDecision | None] = []
        for owner in owners.tolist():
            if owner < 0:
                out.append(None)
                continue
            if owner not in cache:
                cache[owner] = _decide(self.paths[owner], self.classes[owner], self.passes[owner], rules)
            out.append(cache[owner])
        return out


_last: tuple[pd.DataFrame | None, ModuleIndex] | None = None


def _build(rows: pd.DataFrame) -> ModuleIndex:
    rows = rows.reset_index(drop=True)
    attrs = [a if isinstance(a, dict) else {} for a in rows["attrs"]]
    own = [str(a.get("class", "")) or "?" for a in attrs]
    sessions = rows["session"].tolist() if "session" in rows else [0] * len(rows)
    threads = list(zip(sessions, rows["thread_id"].tolist()))
    depths = rows["depth"].tolist()
    starts = rows["start_time_us"].to_numpy(dtype=np.int64)
    ends = rows["end_time_us"].astype("Int64")
    stops = np.where(ends.isna().to_numpy(), np.iinfo(np.int64).max, ends.fillna(0).to_numpy(dtype=np.int64))
    order = np.argsort(starts, kind="stable")
    chains: list[str] = [""] * len(rows)
    open_at: dict[tuple[object, int], int] = {}        # (thread, depth) → the last span begun there
    for k in order.tolist():
        parent = None
        for d in range(int(depths[k]) - 1, -1, -1):      # phases and requests sit between modules
            parent = open_at.get((threads[k], d))
            if parent is not None and stops[parent] >= starts[k]:
                break
            parent = None
        chains[k] = f"{chains[parent]}.{own[k]}" if parent is not None else own[k]
        open_at[(threads[k], int(depths[k]))] = k
    passes = tuple(str(a.get("pass", "forward")) for a in attrs)
    return ModuleIndex(SpanIndex.build(rows), tuple(str(n) for n in rows["name"]), tuple(chains), passes)


def _decide(path: str, classes: str, which: str, rules: RuleSet) -> ModuleDecision | None:
    found: dict[str, tuple[int, str, str]] = {}          # category → (depth, rule, reason)
    for rule in rules.modules:
        depth = rule.match(path, classes)
        if depth is not None and (rule.category not in found or depth > found[rule.category][0]):
            found[rule.category] = (depth, rule.name, rule.reason)
    if not found:
        return None
    cats = rules.categories
    category = max(found, key=lambda c: (cats[c].precedence, found[c][0]))
    _, name, reason = found[category]
    where = f"in the {which} of module {path} ({classes.rsplit('.', 1)[-1]})"
    return ModuleDecision(category, name, f"{reason}: {where}, by time", path,
                          tuple(c for c in found if c != category))
