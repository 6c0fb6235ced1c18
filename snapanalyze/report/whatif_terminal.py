"""The allocator what-if in a terminal: how far the simulation reproduces the trace, then what other settings
would have done.

Contract: `render_whatif(result, width)` renders the `analyze.whatif.WhatIf` itself (its JSON is `to_json()`).
What each divergence points at is data here (DIVERGENCE_TEXT), keyed by `allocator.trace_replay.DIVERGENCES`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..units import fmt_bytes
from . import text

if TYPE_CHECKING:
    from ..allocator.state import SegmentEvent
    from ..analyze.trace_replay import DeviceReplay, DeviceWhatIf, OomOutcome
    from ..analyze.whatif import WhatIf

# what the first divergence of a replay points at (replay) or why a prediction stops (what-if)
DIVERGENCE_TEXT = {
    "trace_reserved": "the allocator reserved a new segment where the simulation reused a cached block: a block "
                      "held by another stream's pending free (record_stream), a setting changed at run time, or a "
                      "state at the window's start the file does not pin down",
    "simulation_reserved": "the simulation reserved a new segment where the allocator reused a cached block: "
                           "memory came back by a path the trace does not record (a free-memory callback, IPC, "
                           "a pluggable allocator) or the window's start state is incomplete",
    "segment_differs": "the segments reserved or given back differ in size, address or order: a setting changed "
                       "at run time (roundup_power2_divisions, max_split_size) or a different allocator version",
    "expandable_switched": "segment_map/unmap against segment_alloc/free: expandable_segments was switched at run "
                           "time (vLLM's CuMemAllocator turns it off around its pool)",
    "address": "the block went to another address than best fit chose: a pending free on another stream, or a "
               "window's start state the file does not pin down",
    "unknown_free": "the trace frees a block the simulation never held: the window began after it was allocated "
                    "and the file does not show it",
    "oom_served": "the request the program failed would have been served; what the program did next is unknown",
    "oom_unserved": "this allocation would have failed: the program would have stopped (or recovered) here",
}
CAPACITY_SOURCES = {"given": "given with --capacity", "oom": "reserved + free at the first OOM",
                    "none": "unknown: no OOM in the trace and no --capacity, so no request can fail"}


def render_whatif(result: WhatIf, width: int | None = None) -> str:
    lines = [f"whatif: {result.source}"]
    if not result.traced:
        lines.append("  the file holds no trace (a state-only snapshot): there are no requests to simulate. "
                     "Record with torch.cuda.memory._record_memory_history() to get one.")
        return "\n".join(lines)
    lines.append(f"  recorded settings: {result.recorded.conf() or 'defaults'}")
    for r in result.requires:
        lines.append(f"  note: {r.setting} needs torch ≥ {r.since}; this file was written by torch {r.file_torch} "
                     f"(inferred from its keys){'' if r.certain else ', which may be older'}: what follows is "
                     f"this program on torch ≥ {r.since}")
    for d in result.devices:
        lines += ["", f"device {d.device}"]
        lines += _replay(d.replay)
        if d.whatif is not None:
            lines += _whatif(d.whatif, width)
    return "\n".join(lines)


def _replay(r: DeviceReplay) -> list[str]:
    div = r.first_divergence
    start = "the end state (exact)" if r.start_exact else "the end state with the trace undone"
    out = ["  replay under the recorded settings:",
           f"    segment events reproduced in order: {r.matched:,} of {r.segment_events:,}",
           f"    block addresses reproduced: {r.addresses_matched:,} of {r.allocations:,} allocations",
           f"    events simulated: {r.simulated:,} of {r.events:,}; start state from {start}"]
    if div is None:
        out.append("    the simulation reproduces every segment event and block of this trace; the reserved curve "
                   "is equal after every event")
    else:
        out.append(f"    first divergence at event {div.index:,} ({div.kind}): {DIVERGENCE_TEXT[div.kind]}")
        if div.recorded or div.simulated:
            out.append(f"      trace:      {_events(div.recorded)}")
            out.append(f"      simulation: {_events(div.simulated)}")
        if div.recorded_addr is not None:
            simulated = f"{div.simulated_addr:#x}" if div.simulated_addr is not None else "None"
            out.append(f"      trace address {div.recorded_addr:#x}, simulation {simulated} "
                       f"({fmt_bytes(div.size)} requested)")
        out.append("    what-if predictions hold as far as the replay agrees")
    return out


def _events(events: tuple[SegmentEvent, ...]) -> str:
    if not events:
        return "none"
    return ", ".join(f"{e.action} {fmt_bytes(e.size)} at {e.addr:#x}" for e in events)


def _whatif(w: DeviceWhatIf, width: int | None) -> list[str]:
    base, new = w.baseline, w.changed
    cap = w.capacity
    out = ["", f"  what if {new.settings or 'the recorded settings'}:",
           f"    capacity for PyTorch: {fmt_bytes(cap) if cap is not None else 'unbounded'} "
           f"({CAPACITY_SOURCES[w.capacity_source]})"]
    rows = [["reserved peak", fmt_bytes(base.reserved_peak), fmt_bytes(new.reserved_peak)],
            ["reserved but unallocated at it", fmt_bytes(base.unallocated_at_peak),
             fmt_bytes(new.unallocated_at_peak)],
            ["largest free block at it", fmt_bytes(base.largest_free_at_peak),
             fmt_bytes(new.largest_free_at_peak)]]
    changed_ooms = {o.index: o for o in new.ooms}
    for o in base.ooms:
        rows.append([f"OOM at event {o.index:,}: {fmt_bytes(o.request)}", _oom(o), _oom(changed_ooms.get(o.index))])
    header = ["", f"recorded ({base.settings or 'defaults'})", new.settings]
    table = text.table(header, rows, right=[False, True, True], width=(width - 4) if width else None)
    out += ["    " + line for line in table.splitlines()]
    out.append(f"    trace's own reserved peak: {fmt_bytes(w.trace_reserved_peak)}")
    for label, p in (("recorded", base), ("changed", new)):
        if p.stop is not None:
            out.append(f"    {label}: valid up to event {p.stop.index:,}: {DIVERGENCE_TEXT[p.stop.kind]}")
    return out


def _oom(o: OomOutcome | None) -> str:
    if o is None:
        return "not reached"
    if o.served:
        return f"served, reserved {fmt_bytes(o.reserved)}"
    return f"fails, largest free {fmt_bytes(o.largest_free)}"
