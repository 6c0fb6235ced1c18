"""The report's wording, in one place: joining and capitalising, signed sizes, the names of OOM verdicts and
why each happened (`OOM_REASONS`), the notes the sections print (`INFERRED_NOTE`, `WHAT_OUTSIDE`), and the
phrases that place an instant in its window and phase (`when_in_window`, `phase_at`, `_at`, `_during`) and
say in a few words what was live there (`_live`, `_flagged`, `_held`). Phrases that read a view sit above
`view`, never below it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import plots
from ...units import fmt_bytes, fmt_duration_us, fmt_signed_bytes
from ..context import RankView
from .view import _phase_label, _window, category_rows

# `RuleSet.persistent`: categories held across steps; the verdict names the others (what the step put on top).

VERDICT_NAMES = {"fragmentation": "fragmentation", "live_exhaustion": "live memory exhaustion",
                 "outside_pressure": "pressure from outside the allocator", "unexplained": "unexplained"}
INFERRED_NOTE = ("inferred: decided by sizes, lifetimes, layout, time, the call tree or a name rather than proven "
                 "by a frame, pool or metadata (Rules that fired gives the reason).")


OOM_REASONS = {
    "fragmentation": lambda v: (f"no free block fits it although {fmt_bytes(v.reserved_free_bytes)} is reserved "
                                "but free"),
    "live_exhaustion": lambda v: f"{fmt_bytes(v.shortfall_bytes)} short of what the device could give",
    "outside_pressure": lambda v: (f"other processes held {fmt_bytes(v.pressure_bytes)}"
                                   if v.pressure == "other_processes" else
                                   f"memory outside the allocator grew by {fmt_bytes(v.pressure_bytes)}"),
    "unexplained": lambda v: (f"yet a {fmt_bytes(v.largest_free_block_bytes)} free block could have served it: "
                              "the state at the failure differs from the file"),
}


WHAT_OUTSIDE = ("NVML measures how much device memory lies outside the allocator — CUDA context, NCCL and "
                "library workspaces, other processes — not what it is.")


def _join(parts: list[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _signed(n: int) -> str:
    return fmt_signed_bytes(n)


def _category_phrase(category: str, size: int, inferred: int) -> str:
    text = f"{fmt_bytes(size)} {category}"
    if category == "other":
        text += " (matched no rule)"
    if inferred and inferred >= size:
        text += " (inferred, not proven by a frame)"
    elif inferred:
        text += f" ({fmt_bytes(inferred)} of it inferred, not proven by a frame)"
    return text


def when_in_window(view: RankView, device: int, index: int) -> str:
    """'at 2.38 ms into the 2.41 ms window (event 598 of 619)', or 'at event 598 of 619' without times."""
    dt = view.timeline[device]
    window, events = _window(view, device)
    event = "before the first event" if index < 0 else f"event {index:,} of {events:,}"
    t, first = dt.time_at(index), dt.time_at(0)
    if window is None or t is None or first is None:
        if index < 0:
            return "at the start of the window"
        return f"at {event}" + (" (the trace has no timestamps)" if window is None else "")
    return f"at {fmt_duration_us(t - first)} into the {fmt_duration_us(window)} window ({event})"


def phase_at(view: RankView, device: int, index: int) -> str | None:
    """'during prefill #1 (request req-1)': the innermost phase (markers or record_function annotations) and
    the requests whose span holds event `index` of `device`; None when no span holds it."""
    table = view.phases
    if not len(table) or index < 0:
        return None
    rows = table[table["device"] == device]
    inside = rows[(rows["start_index"] <= index) & (rows["end_index"] >= index)]
    phases = inside[inside["kind"].isin(plots.BAND_KINDS)]
    requests = inside[inside["kind"] == "request"]
    parts = []
    if len(phases):
        best = phases.sort_values(["start_index", "end_index"], ascending=[False, True], kind="stable").iloc[0]
        parts.append(_phase_label(rows[rows["kind"].isin(plots.BAND_KINDS)], best))
    names = [str(n) for n in dict.fromkeys(requests["phase"])]
    if names:
        shown = _join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        text = f"request{'s' if len(names) > 1 else ''} {shown}"
        parts.append(f"({text})" if parts else text)
    return "during " + " ".join(parts) if parts else None


def _flagged(row: dict[str, Any], owner: bool = False) -> str:
    """"9.56 GiB logits", with "(inferred)" or "(… inferred)" when frames did not prove it, and, where the
    category is `other` or inferred, the code that made most of it: "78.3 GiB other (78.1 GiB made in
    models.py:181:update_nodes)"."""
    text = f"{fmt_bytes(row['bytes'])} {row['category']}"
    notes = []
    if row["inferred"]:
        notes.append("inferred" if row["inferred"] >= row["bytes"] else f"{fmt_bytes(row['inferred'])} inferred")
    if owner and row.get("owner") and (row["category"] == "other" or row["inferred"]):
        share = "" if row["owner_bytes"] >= row["bytes"] else f"{fmt_bytes(row['owner_bytes'])} "
        notes.append(f"{share}made in {row['owner']}")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _held(rows: list[dict[str, Any]]) -> str:
    """"55.28 GiB of kv_cache and weights" (" (… inferred)" when some of it is)."""
    total, inferred = sum(r["bytes"] for r in rows), sum(r["inferred"] for r in rows)
    flag = "" if not inferred else " (inferred)" if inferred >= total else f" ({fmt_bytes(inferred)} inferred)"
    if len(rows) == 1:
        return _flagged(rows[0])
    return f"{fmt_bytes(total)} of {_join([r['category'] for r in rows])}{flag}"


@dataclass(frozen=True)
class _Live:
    """What was live at an instant, in a few words: `rose` ("9.56 GiB logits and 8.12 MiB workspace"; "" when
    only what stays was live), `held` ("61.84 GiB of kv_cache and weights"; "" when none of it was), the
    category that rose most (`owner`, None when none did) and whether an inferred amount was named."""

    rose: str
    held: str
    owner: str | None
    inferred: bool

    def text(self, verb: str = "") -> str:
        """"9.56 GiB logits{verb}, on top of 61.84 GiB of kv_cache and weights", "only …" or "nothing"."""
        if self.rose and self.held:
            return f"{self.rose}{verb}, on top of {self.held}" if verb else f"{self.rose} on top of {self.held}"
        if self.rose:
            return self.rose + verb
        return f"only {self.held}" if self.held else "nothing"


ROSE_SHARE = 0.05       # what "rose into" a peak (and "made the difference") must reach of the live bytes


def _live(view: RankView, device: int, index: int, top: int = 1, rest: bool = True, owners: bool = False) -> _Live:
    """`_Live` at `index` of `device`: the `top` categories that rose (then, with `rest`, the others as
    "N more"), on top of the categories that stay (`RuleSet.persistent`); with `owners`, the code that made most of a
    category named `other` or inferred."""
    rows = [r for r in category_rows(view, device, index) if r["bytes"] > 0]
    total = sum(r["bytes"] for r in rows)
    # Categories not of the persistent kind, most risen first: bytes allocated inside the window (what was live
    # when it began is resident across iterations, not what made this instant).
    transient = sorted((r for r in rows if r["category"] not in view.rules.persistent),
                       key=lambda r: -r.get("rose", r["bytes"]))
    persistent = [r for r in rows if r["category"] in view.rules.persistent]
    named = transient if rest and len(transient) <= top + 1 else transient[:top]
    others = transient[len(named):] if rest else []
    parts = [_flagged(r, owners) for r in named]
    if others:
        parts.append(f"{len(others)} more categor{'y' if len(others) == 1 else 'ies'} "
                     f"({fmt_bytes(sum(r['bytes'] for r in others))})")
    # What made the difference rose into the instant by at least ROSE_SHARE of what is live (not a 15 MiB site
    # at a 10 GiB peak, not data resident since before the window); else nothing is said to have made it.
    owner = named[0] if named and named[0].get("rose", named[0]["bytes"]) >= ROSE_SHARE * total else None
    return _Live(_join(parts), _held(persistent) if persistent else "",
                 str(owner["category"]) if owner is not None else None,
                 any(r["inferred"] for r in named + persistent))


def _at(view: RankView, device: int, index: int, short: bool = False) -> str:
    """"at 2.38 ms into the 2.41 ms window" ("at 2.38 ms" when `short`), "at event 598 of 619" without times."""
    dt = view.timeline[device]
    window, events = _window(view, device)
    t, first = dt.time_at(index), dt.time_at(0)
    if index < 0:
        return "at the start of the window"
    if window is None or t is None or first is None:
        return f"at event {index:,}" + ("" if short else f" of {events:,}")
    return f"at {fmt_duration_us(t - first)}" + ("" if short else f" into the {fmt_duration_us(window)} window")


def _during(view: RankView, device: int, index: int) -> str:
    phase = phase_at(view, device, index)
    return f", {phase}" if phase else ""
