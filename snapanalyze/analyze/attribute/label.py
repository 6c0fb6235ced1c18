"""Label blocks: the frames' decision per stack, then the block stages in their order (`STAGES`), then the
table each block's row shows.

Contract: `label(snapshot, device, live, decider, ...)` returns the rows of `Attribution.blocks` for the given
block lifetimes, in their order (`by_size`: by size, largest first, then address), the instant's request and
the count of blocks whose request is ambiguous. Each stage is a function `(Blocks, codes) -> codes` over the
blocks' decision codes, named as in `rules.STAGES`; a rules file's `disable` switches it off. Every stage
decides once per distinct combination of what it reads and broadcasts the result.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ...model import Snapshot
from ...sites import site_text
from ..annotations import annotated_category
from ..modules import ModuleDecision, ModuleIndex
from ..rules import RuleSet
from ..spans import open_spans
from . import lifecycle, signals
from .blocks import Blocks
from .decisions import distinct
from .frames import Decider
from .result import BLOCK_COLUMNS, ID_COLUMNS, Decision

Stage = Callable[[Blocks, np.ndarray], np.ndarray]


def _module_may_decide(d: Decision, rules: RuleSet) -> bool:
    """A module span outranks what frames guess from names (user-code heuristics, or nothing), never what a
    library rule or a lifecycle proves."""
    if d.category == "other":
        return True
    return d.rule.startswith("generic.") and rules.categories[d.category].owner == "innermost"


def module_spans(b: Blocks, code: np.ndarray) -> np.ndarray:
    """A module span of the collector (`collect.modules`) around a block's allocation names the module
    (`modules`), above what frames only guess from names."""
    modules = ModuleIndex.of(b.markers)
    trace = b.snapshot.trace(b.device)
    if not len(modules) or trace.time_us is None or not b.from_trace.any():
        return code
    rules, table = b.decider.rules, b.table
    where = np.flatnonzero(b.from_trace)
    spans = modules.decide(trace.time_us[b.alloc_index[where]], rules)
    named = list({id(m): m for m in spans if m is not None}.values())
    which = {id(m): k for k, m in enumerate(named)}
    span = np.array([which[id(m)] if m is not None else -1 for m in spans], dtype=np.int64)
    where, span = where[span >= 0], span[span >= 0]
    if not len(where):
        return code

    def by_module(m: ModuleDecision, d: Decision) -> Decision:
        if not _module_may_decide(d, rules):
            return d
        return Decision(m.category, "signal.module_span", (m.reason,), d.frame,
                        tuple(dict.fromkeys(t for t in (*m.tags, d.category, *d.tags)
                                            if t not in ("other", m.category))),
                        inferred=True, context=d.context, owner=d.owner)
    code = code.copy()
    pairs = np.stack([span, code[where]], axis=1)
    first, inverse = distinct(pairs)
    code[where] = table.codes([by_module(named[int(pairs[k, 0])], table.items[int(pairs[k, 1])])
                               for k in first.tolist()])[inverse]
    return code


def annotated(b: Blocks, code: np.ndarray) -> np.ndarray:
    """An annotation the program made on a block (`annotations`: torch ≥ 2.14's `_annotate_tensor`) naming a
    category decides it outright: the program said so."""
    table, categories = b.table, b.decider.rules.categories
    code = code.copy()
    for i in np.flatnonzero(b.annotations != "").tolist():
        named_cat = annotated_category(b.annotations[i], categories)
        if named_cat is not None:
            d = table.items[int(code[i])]
            code[i] = table.add(Decision(
                named_cat, "signal.annotation", (f"the program annotated this block {b.annotations[i]!r} "
                                                 "(torch.cuda.memory._annotate_tensor)",), d.frame,
                tuple(t for t in (d.category, *d.tags) if t not in ("other", named_cat))))
    return code


# The block stages, in the order they apply after the frames' (`frames.FRAME_STAGES`); names as in
# `rules.STAGES`.
STAGES: tuple[tuple[str, Stage], ...] = (
    ("stage.before_window", lifecycle.stage),
    ("stage.module_spans", module_spans),
    ("stage.signals", signals.stage),
    ("stage.annotations", annotated),
)


def label(snapshot: Snapshot, device: int, live: pd.DataFrame, decider: Decider,
          markers: pd.DataFrame | None = None, at_time: int | None = None,
          at_index: int | None = None, by_size: bool = False, window: pd.DataFrame | None = None
          ) -> tuple[pd.DataFrame, str | None, int]:
    """Label the given block lifetimes (rows of `DeviceTimeline.lifetimes`), in their order (`by_size`: by
    size, largest first, then address); `at_index` / `at_time`: the instant they are live at, if one (its
    allocation names the instant's request); `window`: every lifetime of the device (what the program kept)."""
    b = Blocks.of(snapshot, device, live, decider, markers, at_time, at_index, window)
    code = b.table.codes([decider.decide(int(s)) for s in b.stacks.tolist()])[b.by_stack]
    for name, stage in STAGES:
        if decider.rules.enabled(name):
            code = stage(b, code)
    return _table(b, live, code, by_size), b.request, b.ambiguous


def _table(b: Blocks, live: pd.DataFrame, code: np.ndarray, by_size: bool) -> pd.DataFrame:
    """The rows of `Attribution.blocks`: each block's decision, the frame it shows and its owner, as ids and as
    the text the table shows."""
    if not len(live):
        df = pd.DataFrame([], columns=[*BLOCK_COLUMNS, *ID_COLUMNS])
        df["address"] = df["address"].astype(np.uint64)
        return df
    decider, table = b.decider, b.table
    # The frame shown: the frame decision's deciding frame, else the stack's innermost meaningful one.
    pairs = np.stack([code, b.stack], axis=1)
    first, inverse = distinct(pairs)
    shown = np.array([d.frame if (d := table.items[int(pairs[k, 0])]).frame >= 0
                      else decider.display_frame(int(pairs[k, 1])) for k in first.tolist()], dtype=np.int64)
    # The owner shown: each distinct stack's innermost frame of model code.
    owners = np.array([decider.owner_frame(int(sid)) for sid in b.stacks.tolist()], dtype=np.int64)
    trace = b.snapshot.trace(b.device)
    span = np.full(len(live), "", dtype=object)          # the record_function span the allocation ran in
    if trace.time_us is not None and b.from_trace.any():
        span[b.from_trace] = open_spans(b.snapshot, b.device, trace.time_us[b.alloc_index[b.from_trace]])
    of = table.columns()
    rows = np.lexsort((b.addr, -b.sizes.astype(np.int64))) if by_size else np.arange(len(live))
    code, inverse = code[rows], inverse[rows]

    def texts(values: np.ndarray) -> pd.Series:
        # Object dtype: each distinct text stays one shared Python string. pandas >= 3 would copy every row's
        # text into an Arrow string column (for 250k blocks: a tenth of a second and ~200 MB that its memory
        # pool keeps).
        return pd.Series(values, dtype=object, copy=False)

    def labels(frame_ids: np.ndarray) -> np.ndarray:
        return np.array([site_text(decider.site(int(f))) for f in frame_ids.tolist()], dtype=object)

    def decided(field: str) -> pd.Series:
        return texts(np.asarray(of[field], dtype=object)[code])
    owner_of = b.by_stack[rows]
    named, which = np.unique(np.asarray(of["category"], dtype=object)[code].astype(str), return_inverse=True)
    lifecycle = np.array([decider.rules.categories[c].lifecycle if c in decider.rules.categories else ""
                          for c in named.tolist()], dtype=object)[which.reshape(-1)]
    transient = (b.origin[rows] == "trace") & (b.free_index[rows] >= 0)
    lifecycle[lifecycle == ""] = np.where(transient, "activations", "unknown")[lifecycle == ""]
    return pd.DataFrame({
        "device": np.full(len(live), b.device, dtype=np.int64), "address": b.addr[rows].astype(np.uint64),
        "size": b.sizes[rows].astype(np.int64),
        "allocated_est": live["allocated_est"].to_numpy()[rows].astype(np.int64),
        "category": decided("category"), "tags": decided("tags"), "rule": decided("rule"),
        "reason": decided("reason"), "frame": texts(labels(shown)[inverse]),
        "owner": texts(labels(owners)[owner_of]),
        "inferred": of["inferred"][code], "stack_id": b.stack[rows],
        "user_metadata": texts(b.metadata[rows]), "pool": texts(b.pools[rows]),
        "stream": live["stream"].to_numpy()[rows].astype(np.int64),
        "origin": texts(b.origin[rows]), "alloc_index": b.alloc_index[rows].astype(np.int64),
        "annotation": texts(b.annotations[rows]), "span": texts(span[rows]), "lifecycle": texts(lifecycle),
        "frame_id": shown[inverse], "owner_id": owners[owner_of], "decision": code.astype(np.int64)},
        columns=[*BLOCK_COLUMNS, *ID_COLUMNS])
