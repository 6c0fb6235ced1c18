"""Check that a snapshot pickle's end state is consistent with its trace (and describe the file).

Contract: ``python benchmarks/check_generated.py FILE [--device N] [--strict]`` loads FILE with a
restricted unpickler (builtins only, no globals), replays the device's trace and exits 0 when every check
passes, 1 when one fails (each failure printed, at most 20 of a kind), 2 when the file cannot be read.
It prints a short description (actions, sizes, frames sharing) either way.

Checks, the replay `snapanalyze.replay` proves (its module docstring):
- ``alloc`` +size, ``free_completed`` -size by address; a free whose address had no earlier ``alloc`` was
  live from before the window (its size from the free entry); an ``alloc`` at a live address is an error.
- At the end the replayed live set plus the active blocks never touched by the trace equals the active blocks
  of the device in ``segments`` (address, requested_size); an active block whose address was freed and not
  re-allocated in the trace is an error.
- Segments: blocks tile each segment in address order (sum of sizes == total_size); allocated/active/requested
  aggregates match the blocks; block sizes are multiples of 512 and >= the rounded request.
- Segment events replay: every ``alloc`` lies inside a segment that exists at that moment, and live blocks
  never overlap.  ``time_us`` never decreases.
With ``--strict`` (what generate.py promises): every entry has the torch 2.11 keys, the free_requested and
free_completed of one block share one frames list, and each alloc has a frames list of its own.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fixtures"))
from support import read_builtins, round_size  # noqa: E402

MiB = 1024 * 1024
TRACE_KEYS = ("action", "addr", "size", "stream", "time_us", "compile_context", "user_metadata", "frames")
SEGMENT_KEYS = (
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
    "segment_type",
    "segment_pool_id",
    "is_expandable",
    "frames",
    "blocks",
)


def load(path: Path) -> Any:
    return read_builtins(path)


class Problems:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def add(self, kind: str, message: str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= 20:
            print(f"FAIL [{kind}] {message}")

    def __bool__(self) -> bool:
        return bool(self.counts)


def check_segments(segments: list[dict[str, Any]], bad: Problems) -> dict[int, int]:
    """Structural checks; returns {address: requested_size} of the active blocks."""
    active: dict[int, int] = {}
    for seg in segments:
        base, total = seg["address"], seg["total_size"]
        cursor, allocated, act, requested = base, 0, 0, 0
        for block in seg["blocks"]:
            addr = block.get("address", cursor)
            if addr != cursor:
                bad.add("tiling", f"segment {base:#x}: block at {addr:#x}, expected {cursor:#x}")
            cursor = addr + block["size"]
            state = block["state"]
            if state == "inactive":
                continue
            if block["size"] % 512 or block["size"] < round_size(block["requested_size"]):
                bad.add(
                    "block-size",
                    f"block {addr:#x}: size {block['size']} for request {block['requested_size']}",
                )
            act += block["size"]
            requested += block["requested_size"]
            if state == "active_allocated":
                allocated += block["size"]
            active[addr] = block["requested_size"]
        if cursor != base + total:
            bad.add("tiling", f"segment {base:#x}: blocks sum to {cursor - base}, total_size {total}")
        for key, value in (
            ("allocated_size", allocated),
            ("active_size", act),
            ("requested_size", requested),
        ):
            if key in seg and seg[key] != value:
                bad.add("aggregate", f"segment {base:#x}: {key} {seg[key]} != {value} from its blocks")
    return active


def replay(
    trace: list[dict[str, Any]], segments: list[dict[str, Any]], active: dict[int, int], bad: Problems
) -> dict[str, int]:
    # Pass 1: which addresses were freed before any alloc (live before the window).
    seen_alloc: set[int] = set()
    pre_window: dict[int, int] = {}
    touched: set[int] = set()
    for e in trace:
        action = e["action"]
        if action == "alloc":
            seen_alloc.add(e["addr"])
            touched.add(e["addr"])
        elif action in ("free_requested", "free_completed"):
            touched.add(e["addr"])
            if e["addr"] not in seen_alloc and e["addr"] not in pre_window:
                pre_window[e["addr"]] = e["size"]

    # Segments at the start of the window: undo the trace's segment events from the end state.
    segs = {s["address"]: s["total_size"] for s in segments}
    for e in reversed(trace):
        if e["action"] in ("segment_alloc", "segment_map"):
            if segs.pop(e["addr"], None) is None:
                bad.add("segment-events", f"{e['action']} at {e['addr']:#x} not in the later state")
        elif e["action"] in ("segment_free", "segment_unmap"):
            if e["addr"] in segs:
                bad.add("segment-events", f"{e['action']} at {e['addr']:#x} but the segment exists later")
            segs[e["addr"]] = e["size"]
    seg_starts = sorted(segs)

    # Pass 2: forward replay.
    untouched_active = {a: r for a, r in active.items() if a not in touched}
    live: dict[int, int] = dict(pre_window)
    extent: dict[int, int] = {a: round_size(r) for a, r in {**untouched_active, **pre_window}.items()}
    starts = sorted(extent)
    last_t = None
    peak = current = sum(pre_window.values()) + sum(untouched_active.values())
    for i, e in enumerate(trace):
        action, addr = e["action"], e["addr"]
        t = e.get("time_us")
        if t is not None:
            if last_t is not None and t < last_t:
                bad.add("time", f"entry {i}: time_us {t} < previous {last_t}")
            last_t = t
        if action == "alloc":
            size = e["size"]
            if addr in live:
                bad.add("double-alloc", f"entry {i}: alloc at live address {addr:#x}")
            live[addr] = size
            current += size
            peak = max(peak, current)
            j = bisect_right(seg_starts, addr) - 1
            if j < 0 or addr + size > seg_starts[j] + segs[seg_starts[j]]:
                bad.add("outside-segment", f"entry {i}: alloc [{addr:#x}, +{size}) not inside a live segment")
            end = addr + round_size(size)
            k = bisect_left(starts, addr)
            if (k < len(starts) and starts[k] < end) or (
                k > 0 and starts[k - 1] + extent[starts[k - 1]] > addr
            ):
                bad.add("overlap", f"entry {i}: alloc at {addr:#x} overlaps a live block")
            starts.insert(k, addr)
            extent[addr] = round_size(size)
        elif action == "free_completed":
            size = live.pop(addr, None)
            if size is None:
                bad.add("free-unknown", f"entry {i}: free_completed at {addr:#x}, not live")
                continue
            if size != e["size"]:
                bad.add("free-size", f"entry {i}: free_completed size {e['size']} != alloc size {size}")
            current -= size
            del starts[bisect_left(starts, addr)]
            del extent[addr]
        elif action in ("segment_alloc", "segment_map"):
            insort(seg_starts, addr)
            segs[addr] = e["size"]
        elif action in ("segment_free", "segment_unmap"):
            for blk in live:
                if addr <= blk < addr + e["size"]:
                    bad.add(
                        "segment-free-live", f"entry {i}: segment_free {addr:#x} holds live block {blk:#x}"
                    )
                    break
            del seg_starts[bisect_left(seg_starts, addr)]
            del segs[addr]

    # The end state.
    expected = {**live, **untouched_active}
    for addr, size in expected.items():
        if addr not in active:
            bad.add(
                "end-state", f"live at the end after replay but not active in segments: {addr:#x} ({size} B)"
            )
        elif active[addr] != size:
            bad.add(
                "end-state", f"{addr:#x}: replay says {size} B, segments say requested_size {active[addr]}"
            )
    for addr in active:
        if addr not in expected:
            bad.add("end-state", f"active in segments but freed in the trace: {addr:#x}")
    return {
        "pre_window_freed": len(pre_window),
        "pre_window_live_at_end": len(untouched_active),
        "live_at_end": len(expected),
        "allocated_in_window_live_at_end": len(live),
        "peak_requested": peak,
    }


def check_strict(snapshot: dict[str, Any], trace: list[dict[str, Any]], bad: Problems) -> dict[str, Any]:
    for key in ("segments", "device_traces", "allocator_settings", "external_annotations"):
        if key not in snapshot:
            bad.add("strict-keys", f"top-level key {key!r} missing")
    for i, e in enumerate(trace):
        if tuple(e) != TRACE_KEYS:
            bad.add("strict-keys", f"entry {i}: keys {tuple(e)}")
        if e["compile_context"] != "N/A" or e["user_metadata"] != "" or e["stream"] != 0:
            bad.add("strict-values", f"entry {i}: compile_context/user_metadata/stream {e}")
    for seg in snapshot["segments"]:
        if tuple(seg) != SEGMENT_KEYS:
            bad.add("strict-keys", f"segment {seg['address']:#x}: keys {tuple(seg)}")
        total, kind = seg["total_size"], seg["segment_type"]
        if (kind == "small") != (total == 2 * MiB):
            bad.add("strict-segment", f"segment {seg['address']:#x}: {kind} with total_size {total}")
    pending: dict[int, list[Any]] = {}
    alloc_lists: set[int] = set()
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            alloc_lists.add(id(e["frames"]))
        elif e["action"] == "free_requested":
            pending[e["addr"]] = e["frames"]
        elif e["action"] == "free_completed":
            fr = pending.pop(e["addr"], None)
            if fr is not e["frames"]:
                bad.add(
                    "strict-frames", f"entry {i}: free_completed does not share free_requested's frames list"
                )
            if id(e["frames"]) in alloc_lists:
                bad.add("strict-frames", f"entry {i}: free frames list is also an alloc's frames list")
    n_alloc = sum(1 for e in trace if e["action"] == "alloc")
    if len(alloc_lists) != n_alloc:
        bad.add(
            "strict-frames", f"{n_alloc} allocs share {len(alloc_lists)} frames lists (expected one each)"
        )
    return {}


def describe(trace: list[dict[str, Any]], snapshot: dict[str, Any]) -> None:
    actions = Counter(e["action"] for e in trace)
    print("actions:", dict(actions))
    sizes = [e["size"] for e in trace if e["action"] == "alloc"]
    if sizes:
        bins = Counter(
            "<1MiB"
            if s <= MiB
            else "1-10MiB"
            if s < 10 * MiB
            else "10-100MiB"
            if s < 100 * MiB
            else ">=100MiB"
            for s in sizes
        )
        print(
            "alloc sizes:",
            {k: bins[k] for k in ("<1MiB", "1-10MiB", "10-100MiB", ">=100MiB")},
            f"max {max(sizes) / MiB:.0f} MiB",
        )
    frame_ids: set[int] = set()
    list_ids: set[int] = set()
    stacks: set[tuple[int, ...]] = set()
    refs = 0
    depths: list[int] = []
    for e in trace:
        frames = e.get("frames")
        if frames is None or id(frames) in list_ids:
            continue
        list_ids.add(id(frames))
        refs += len(frames)
        depths.append(len(frames))
        ids = tuple(map(id, frames))
        stacks.add(ids)
        frame_ids.update(ids)
    if depths:
        depths.sort()
        print(
            f"frames: {refs} references in {len(list_ids)} lists -> {len(frame_ids)} distinct frame dicts, "
            f"{len(stacks)} distinct stacks; depth min/median/max {depths[0]}/{depths[len(depths) // 2]}/"
            f"{depths[-1]}"
        )
    if trace and "time_us" in trace[0]:
        print(f"window: {(trace[-1]['time_us'] - trace[0]['time_us']) / 1e6:.1f} s")
    segs = snapshot["segments"] if isinstance(snapshot, dict) else snapshot
    print(
        f"segments: {len(segs)}, reserved {sum(s['total_size'] for s in segs) / 2**30:.2f} GiB, "
        f"annotations: {len(snapshot.get('external_annotations', [])) if isinstance(snapshot, dict) else 0}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--strict", action="store_true", help="also check what generate.py promises")
    args = parser.parse_args(argv)

    t0 = time.perf_counter()
    try:
        snapshot = load(args.file)
    except (OSError, pickle.UnpicklingError, EOFError) as exc:
        print(f"cannot read {args.file}: {exc}", file=sys.stderr)
        return 2
    t1 = time.perf_counter()
    if isinstance(snapshot, list):  # torch <= 1.13: a bare list of segments
        snapshot = {"segments": snapshot, "device_traces": []}
    traces = snapshot.get("device_traces") or []
    trace = traces[args.device] if args.device < len(traces) else []
    segments = [s for s in snapshot["segments"] if s.get("device", 0) == args.device]
    bad = Problems()
    describe(trace, snapshot)
    active = check_segments(segments, bad)
    info = replay(trace, segments, active, bad)
    if args.strict:
        check_strict(snapshot, trace, bad)
    t2 = time.perf_counter()
    print(
        f"replay: {info['live_at_end']} live at the end ({info['pre_window_live_at_end']} from before the "
        f"window, {info['allocated_in_window_live_at_end']} allocated in it), {info['pre_window_freed']} "
        f"pre-window blocks freed, peak requested {info['peak_requested'] / 2**30:.2f} GiB"
    )
    print(f"load {t1 - t0:.1f} s, checks {t2 - t1:.1f} s")
    if bad:
        print("FAILED:", dict(bad.counts))
        return 1
    print("OK: the trace replays to the active blocks in segments")
    return 0


if __name__ == "__main__":
    sys.exit(main())
