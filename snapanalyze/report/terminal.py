"""Terminal rendering of the typed results of summary, peaks and attribute as plain text.

Contract: each `render_*` takes an analysis' result (its typed result: `Peaks`, `Summary`,
`AttributionResult`) and returns the text a person reads in a terminal;
`width` (the terminal's columns, None when piped) fits its tables into it (`text.table`). Nothing here
analyses, prints or reads files.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import units
from ..sites import NO_FRAMES, site_text, words_text
from . import text

if TYPE_CHECKING:
    from ..analyze.attribute.compact import AttributionResult, DeviceAttribution
    from ..analyze.peaks import DevicePeaks, Peaks
    from ..analyze.summary import Summary


def oom_lines(source: str, ooms: Any) -> list[str]:
    """What any answer about a file with `oom` entries says first: the program ran out of memory, and how to see why."""
    out = []
    for o in list(ooms)[:3]:
        free = f", device free {units.fmt_bytes(o['device_free_bytes'])}" if o["device_free_bytes"] is not None else ""
        out.append(f"OUT OF MEMORY on device {o['device']} at event {o['index']:,}: a request of "
                   f"{units.fmt_bytes(o['request_bytes'])} failed{free}")
    if len(ooms) > 3:
        out.append(f"… and {len(ooms) - 3:,} more oom entries")
    if ooms:
        out.append(f"  why: snapanalyze explain-oom {source}")
    return out


def render_peaks(result: Peaks, width: int | None = None) -> str:
    out = [result.source + (f"  ({text.ESTIMATED})" if result.estimate else ""), *oom_lines(result.source, result.ooms)]
    if not result.devices:
        out.append("  no devices: the snapshot holds no segments and no trace")
    for d in result.devices:
        out += _peaks_of(d, f"device {d.device}", width)
    for d in result.host or ():
        out += _peaks_of(d, "pinned host memory (not device memory)", width)
    out.append("\nactive = Σ requested bytes live (exact); allocated (est.) = rounded block sizes, an estimate.")
    if result.replay_problems:
        out.append("warning: the replay does not match the end state:\n  " + "\n  ".join(result.replay_problems))
    return "\n".join(out)


def _peaks_of(d: DevicePeaks, label: str, width: int | None) -> list[str]:
    if d.state_only:
        last = d.peaks[0] if d.peaks else None
        live = (f"{units.fmt_bytes(last.active_bytes)} active, {units.fmt_bytes(last.reserved_bytes)} reserved"
                if last is not None else f"{units.fmt_bytes(d.baseline_active_bytes)} active, "
                f"{units.fmt_bytes(d.baseline_reserved_bytes)} reserved")
        trace = ", no trace" if not d.events else " and a 1-entry legacy trace"
        return [f"\n{label}: the allocator's state{trace}: no peak can be found in it; live in the state: {live}"]
    window = units.fmt_duration_us(d.window_us)
    out = [f"\n{label}: {d.events:,} events"
           + (f" over {window}" if d.window_us is not None else " (no timestamps)")
           + (f", from {units.fmt_time_us(d.first_time_us)}" if d.first_time_us else ""),
           f"  baseline (live when the window began): {units.fmt_bytes(d.baseline_active_bytes)}"
           f" active, {units.fmt_bytes(d.baseline_reserved_bytes)} reserved"]
    rows = []
    for rank, p in enumerate(d.peaks, start=1):
        event = "baseline" if p.event_index < 0 else f"{p.event_index:,}"
        rows.append([str(rank), event, units.fmt_time_us(p.time_us), units.fmt_bytes(p.active_bytes),
                     units.fmt_bytes(p.reserved_bytes), units.fmt_bytes(p.allocated_est_bytes),
                     units.fmt_bytes(p.transient_bytes), units.fmt_duration_us(p.duration_us)])
    out.append(text.table(["peak", "event", "time", "active", "reserved", "allocated (est.)",
                           "transient", "held"], rows, right=[True, True, False] + [True] * 5, width=width))
    return out


def _kept(d: DeviceAttribution) -> str:
    """The device's forward-pass tensors kept across training steps, in the OOM advice's words (imported
    here: the words need the OOM analysis, which summary and peaks never load)."""
    from .oom_text import kept_words

    assert d.kept is not None
    return kept_words(d.kept, f"at the {d.instant}")


def render_summary(f: Summary) -> str:
    v, has, kind = f.torch_version, f.has, f.device_type
    out = [f"{f.source}",
           f"  format: {f.container}, {f.layout}",
           f"  torch: {v.range} (inferred from: {'; '.join(v.evidence) or 'nothing'})"]
    if kind.value != "cuda":
        out.append(f"  device type: {kind.value} (inferred: {kind.evidence})")
    labelled = [(f"device {d.device}", d) for d in f.devices]
    labelled += [("pinned host memory (not device memory)", d) for d in f.host or ()]
    for label, d in labelled:
        actions = ", ".join(f"{k} {n:,}" for k, n in d.actions.items()) or "none"
        span = units.fmt_duration_us(d.duration_us) if d.duration_us is not None else "no timestamps"
        out += [f"  {label}: {d.events:,} events ({actions})",
                f"    window: {span}; ring buffer: {d.ring_buffer}",
                f"    end state: {d.segments:,} segments, {units.fmt_bytes(d.reserved_bytes)} reserved, "
                f"{d.active_blocks:,} active blocks; {d.events_with_frames:,} events with frames"]
    yes = {True: "yes", False: "no"}
    out += [f"  frames: {yes[bool(has.frames)]}; C++ frames: {yes[bool(has.cpp_frames)]}; "
            f"annotations: {has.annotations}; user_metadata entries: {has.user_metadata_entries}; "
            f"compile_context: {yes[bool(has.compile_context)]}",
            f"  private pools: {', '.join(has.private_pools) or 'none'}; expandable segments: "
            f"{yes[bool(has.expandable_segments)]}; legacy 2.0 blocks: {yes[bool(has.legacy_block_history)]}"]
    settings = f.allocator_settings
    if settings:
        shown = {k: val for k, val in settings.items() if k != "roundup_power2_divisions"}
        divisions = {k: val for k, val in (settings.get("roundup_power2_divisions") or {}).items() if val}
        out.append("  allocator settings: " + ", ".join(f"{k}={val!r}" for k, val in shown.items())
                   + (f", roundup_power2_divisions={divisions}" if divisions else ""))
    else:
        out.append("  allocator settings: not recorded")
    if f.ooms:
        for o in f.ooms:
            out.append(f"  OOM on device {o['device']} at event {o['index']:,}: request "
                       f"{units.fmt_bytes(o['size'])}, device free {units.fmt_bytes(o['device_free'])}")
    else:
        out.append("  OOM entries: none")
    if f.unknown_actions:
        out.append(f"  unknown actions (ignored): {', '.join(f.unknown_actions)}")
    return "\n".join(out)


def render_attribution(result: AttributionResult, top: int, explain: bool, width: int | None = None) -> str:
    out = [result.source + (f"  ({text.ESTIMATED})" if result.estimate else ""), *oom_lines(result.source, result.ooms)]
    for d in result.devices:
        where = "before the first event" if d.event_index < 0 else f"event {d.event_index:,}"
        if d.instant == "allocator state":
            out.append(f"\ndevice {d.device}: the allocator's state (the file holds no trace, so when memory peaked "
                       "and what rose into a peak cannot be seen; what is live in the state is below)")
            out.append(f"  active {units.fmt_bytes(d.active_bytes)}; reserved {units.fmt_bytes(d.reserved_bytes)}")
        else:
            when = units.fmt_time_us(d.time_us) if d.time_us else None
            if d.instant.startswith("event ") and d.event_index < 0:
                head = "at the window's start (before the first event)"
            elif d.instant.startswith("event "):          # 'at event 229 (time)': the label is the event
                head = f"at {d.instant}" + (f" ({when})" if when else "")
            elif d.instant.startswith("time "):           # 'at time T (event 229)': the label is the time
                head = f"at {d.instant} ({where})"
            else:
                head = f"at the {d.instant} ({where}" + (f", {when}" if when else "") + ")"
            out.append(f"\ndevice {d.device} {head}")
            if d.below_baseline_bytes:        # freed since the baseline: no transient to add to it
                change = (f"{units.fmt_bytes(d.below_baseline_bytes)} below the "
                          f"{units.fmt_bytes(d.baseline_active_bytes)} at {d.baseline} (freed since)")
            else:
                change = (f"{units.fmt_bytes(d.baseline_active_bytes)} at {d.baseline} + transient "
                          f"{units.fmt_bytes(d.transient_bytes)}")
            out.append(f"  active {units.fmt_bytes(d.active_bytes)}" + (", " if d.below_baseline_bytes else " = ")
                       + f"{change}; reserved {units.fmt_bytes(d.reserved_bytes)}"
                       + (f"; made by request {d.request!r}" if d.request else ""))
        rows = [[c.category, units.fmt_bytes(c.bytes), units.fmt_share(c.share), f"{c.blocks:,}",
                 text.inferred_share(c.inferred_bytes, c.bytes),
                 "; ".join(f"{site_text(site, none=NO_FRAMES)} ({units.fmt_bytes(n)})" for site, n in
                           zip(c.top_frames[:top], c.top_frame_bytes[:top]))] for c in d.categories]
        out.append(text.table(["category", "bytes", "share", "blocks", "inferred", "top allocation sites"], rows,
                              right=[False, True, True, True, True, False], width=width))
        if d.kept is not None:
            out.append("  " + _kept(d))
        if explain:
            out.append("\n  why (rule → frame, largest first):")
            for e in d.explain or ():
                flag = " [inferred]" if e.inferred else ""
                tags = f" tags={','.join(e.tags)}" if e.tags else ""
                out.append(f"  {units.fmt_bytes(e.bytes):>10}  {e.category}{tags} ← {e.rule}{flag} "
                           f"@ {site_text(e.frame) or '(no frame)'}\n{'':14}{words_text(e.reason)}")
    if any(c.inferred_bytes for d in result.devices for c in d.categories):
        out.append(f"{text.INFERRED_LEGEND} (--explain shows the arithmetic)")
    for note in result.notes:
        out.append(f"note: {note}")
    return "\n".join(out)
