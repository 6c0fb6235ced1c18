"""Terminal rendering of the run-level results: ranks and phases (the typed `Ranks` and `Phases`), OOM
explanations (`explain_path`'s `SnapshotOoms`, each verdict an `OomVerdict`).

Contract: each `render_*` takes the typed result and returns the text a person reads in a terminal;
estimates are labelled as such, problems (missing ranks, NVML files) close the output as warnings; `width`
(the terminal's columns, None when piped) fits the tables into it. Nothing here analyses, prints or reads
files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import units
from ..sites import site_text
from . import oom_text, text

if TYPE_CHECKING:
    import pandas as pd

    from ..analyze.oom import FailedAllocation, OomVerdict, SnapshotOoms
    from ..analyze.phase_result import Phases
    from ..analyze.rank_result import Ranks


def render_ranks(result: Ranks, width: int | None = None) -> str:
    out = [result.run]
    rows = []
    for r in result.ranks:
        used = units.fmt_bytes(r.nvml_used_bytes)
        if r.nvml_used_bytes is not None and not r.nvml_used_measured:
            used += " (est.)"
        rows.append([str(r.rank), str(r.device), units.fmt_time_us(r.time_us),
                     units.fmt_bytes(r.active_bytes), units.fmt_bytes(r.reserved_bytes), used,
                     units.fmt_bytes(r.outside_bytes),
                     f"{r.top_category or '–'} {units.fmt_bytes(r.top_category_bytes)}",
                     ("+" if r.difference_bytes > 0 else "") + units.fmt_bytes(r.difference_bytes),
                     "OUTLIER" if r.outlier else ""])
    out.append(text.table(["rank", "dev", "peak time", "active", "reserved", "NVML used", "outside alloc.",
                           "top category", "vs median", ""], rows,
                          right=[True, True, False, True, True, True, True, False, True, False], width=width))
    if result.median_rank is not None:
        out.append(f"\nmedian rank: {result.median_rank} (device {result.median_device})")
    if result.outliers:
        for o in result.outliers:
            sign = "above" if o.difference_bytes > 0 else "below"
            out.append(f"rank {o.rank} (device {o.device}) peaks {units.fmt_bytes(abs(o.difference_bytes))} "
                       f"{sign} the median rank; the difference by category:")
            out.append(text.table(["category", f"rank {o.rank}", "median rank", "difference"],
                                  [[c.category, units.fmt_bytes(c.bytes), units.fmt_bytes(c.median_bytes),
                                    ("+" if c.difference_bytes > 0 else "") + units.fmt_bytes(c.difference_bytes)]
                                   for c in o.categories], right=[False, True, True, True], width=width))
    elif result.ranks:
        out.append("no outlier: every rank peaks within the tolerance of the median rank")
    notes = [f"rank {r.rank}: {r.outside_note}" for r in result.ranks if r.outside_uncertain and r.outside_note]
    if notes:
        out.append("\nNVML at the peak:\n  " + "\n  ".join(notes))
    out.append("\nNVML used (est.) = reserved at the peak + memory outside the allocator from the samples around it.")
    return "\n".join(out + [f"warning: {p}" for p in result.problems])


def _failed_lines(f: FailedAllocation | None) -> list[str]:
    """The allocation that failed: its bytes, the code that asked (owner, else the deciding frame), what it is,
    the request and span it ran in, and its stack (Python frames, innermost first)."""
    if f is None:
        return []
    stack = f.stack
    who = site_text(stack.owner or stack.frame) if stack is not None else None
    what = (f"{stack.category}{' (inferred)' if stack.inferred else ''}, rule {stack.rule}"
            if stack is not None and stack.category else "")
    where = "; ".join(x for x in (f"request {f.request}" if f.request else "",
                                  f"in span {f.span}" if f.span else "") if x)
    out = [f"  failed: {units.fmt_bytes(f.size)} asked for by {who} ({what})" if who else
           f"  failed: {units.fmt_bytes(f.size)} (the oom entry records no frames)"]
    if where:
        out.append(f"    {where}")
    if stack is not None and stack.frames:
        out.append("    stack, innermost first:")
        out.extend(f"      {site_text(frame)}" for frame in stack.frames)
        if stack.more_frames:
            out.append(f"      … {units.fmt_count(stack.more_frames, 'more frame')}")
    return out


def _oom_block(o: OomVerdict, categories: pd.DataFrame, engine: str, width: int | None) -> list[str]:
    """One entry's block; `categories`: the rows of the categories live at it."""
    where = f"event {o.index:,}" + (f", {units.fmt_time_us(o.time_us)}" if o.time_us else "")
    out = [f"\nOOM on device {o.device} at {where}: verdict {o.verdict.replace('_', ' ').upper()}",
           *_failed_lines(o.failed), f"  {oom_text.why(o)}"]
    est = "" if o.exact else " (est.)"
    rows = [
        ["request (rounded)", units.fmt_bytes(o.request_bytes), f"stream {o.stream}, {o.segment_type} pool"],
        ["device free", units.fmt_bytes(o.device_free_bytes), "reported by the driver at the failure"],
        ["live (active)", units.fmt_bytes(o.active_bytes), "Σ requested bytes of live blocks"],
        ["in blocks" + est, units.fmt_bytes(o.allocated_bytes), "Σ sizes of blocks in use"],
        ["reserved", units.fmt_bytes(o.reserved_bytes), "Σ segment sizes"],
        ["reserved but free" + est, units.fmt_bytes(o.reserved_free_bytes),
         f"in {units.fmt_count(o.free_blocks, 'free block')}"],
        ["largest usable free block" + est, units.fmt_bytes(o.largest_free_block_bytes),
         f"largest of any pool/stream: {units.fmt_bytes(o.largest_free_block_any_bytes)}"],
        ["capacity", units.fmt_bytes(o.capacity_bytes), o.capacity_source],
        ["outside the allocator", units.fmt_bytes(o.outside_bytes), o.outside_source or "capacity unknown"],
    ]
    if o.own_outside_bytes is not None or o.other_processes_bytes is not None:
        rows.append(["  this process (NVML)", units.fmt_bytes(o.own_outside_bytes), "CUDA context, NCCL, libraries"])
        rows.append(["  other processes (NVML)", units.fmt_bytes(o.other_processes_bytes), ""])
    out.append(text.table(["at the failure", "bytes", "what it is"], rows, right=[False, True, False], width=width))
    if not o.exact:
        out.append(f"  (est.): {o.state_source}")
    if len(categories):
        out.append("  live at the failure:")
        out.append(text.table(["category", "bytes", "share", "allocated in window"],
                              [[c.category, units.fmt_bytes(int(c.bytes)), units.fmt_share(round(float(c.share), 6)),
                                units.fmt_bytes(int(c.window_bytes))] for c in categories.itertuples()],
                              right=[False, True, True, True], width=width))
    advice = oom_text.advice(o, engine)
    if advice:
        out.append("  what would have helped:")
        out.extend(f"  - {a}" for a in advice)
    return out


def render_oom(items: Sequence[SnapshotOoms], problems: Sequence[str], source: str, width: int | None = None) -> str:
    """`explain-oom` in a terminal: each snapshot's OOMs (`explain_path`'s typed explanations), else its
    no-OOM statement per device, then the run's problems."""
    out = [source]
    for item in items:
        e = item.explanation
        path = str(item.path)
        if item.rank is not None:
            out.append(f"\nrank {item.rank}: {path}")
        elif path != source:
            out.append(f"\n{path}")
        if e.verdicts and e.engine is not None and e.engine.evidence is not None:
            out.append(f"  program: {e.engine.label} (recognised by {e.engine.evidence_text()}); advice in its terms")
        engine = e.engine.name if e.engine is not None else "pytorch"     # advice in the program's own knobs
        by_entry = dict(iter(e.categories.groupby(["device", "index"], sort=False)))   # once, not per entry
        empty = e.categories.iloc[:0]
        for verdict in e.verdicts:
            out.extend(_oom_block(verdict, by_entry.get((verdict.device, verdict.index), empty), engine, width))
        for n in e.no_oom:
            out.append(f"  device {n.device}: {oom_text.no_oom_message(n)}")
        for x in e.state_only:
            out.append(f"  device {x.device}: {oom_text.state_only_message(x)}")
        out.extend(f"  note: {note}" for note in e.notes)
    return "\n".join(out + [f"warning: {p}" for p in problems])


def render_phases(result: Phases, width: int | None = None) -> str:
    out = [result.source]
    if not result.phases:
        out.append("  no phases: no collector markers, record_function annotations or user_metadata in the window")
    rows = []
    for p in result.phases:
        flags = ", ".join(f for f, on in (("clipped", p.clipped), ("open", p.open)) if on)
        cats = "; ".join(f"{c} {units.fmt_bytes(b)}{_inferred_note(i, b)}" for c, b, i in
                         zip(p.top_categories, p.top_category_bytes, p.top_category_inferred_bytes))
        rows.append([str(p.device), p.label, p.kind,
                     f"{p.start_index:,}–{p.end_index:,}" if p.end_index >= p.start_index else "no events",
                     units.fmt_bytes(p.before_bytes), units.fmt_bytes(p.peak_bytes),
                     units.fmt_bytes(p.transient_bytes), units.fmt_bytes(p.after_bytes), cats or "–", flags])
    if rows:
        out.append(text.table(["dev", "phase", "kind", "events", "before", "peak", "transient", "after",
                               "top categories", "flags"], rows,
                              right=[True, False, False, True, True, True, True, True, False, False], width=width))
        out.append("\nbefore = active bytes just before the phase; transient = peak − before; top categories = "
                   "allocated inside the phase and live at its peak; clipped = began before the trace window; open = "
                   "no end recorded. A phase's name is what --phase accepts (NAME#K: the K-th of a repeated name).")
        if any(any(p.top_category_inferred_bytes) for p in result.phases):
            out.append(f"{text.INFERRED_LEGEND} (attribute --explain shows the arithmetic)")
    return "\n".join(out + [f"warning: {problem}" for problem in result.problems])


def _inferred_note(inferred: int, total: int) -> str:
    """" (inferred)" when a category's bytes were all decided by inference, " (N inferred)" for a part, else ""."""
    share = text.inferred_share(inferred, total)
    return " (inferred)" if share == "all" else f" ({share} inferred)" if share else ""
