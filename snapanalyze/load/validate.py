"""Check once, on columns, that a loaded snapshot's values make sense together.

Contract: `validate(snapshot)` returns the snapshot, with `warnings` listing what the analysis can live with
— each names the field and what was done about it, and the numbers it affects are withheld rather than
guessed (a trace whose times run backwards loses its times, so no window or duration is made from them;
blocks that do not fill their segment are shown as they are; an allocator setting of the wrong type is
ignored) — or raises BadInputError naming the file, the
field, the first offending entry's index and what was expected, for a violation that would make the numbers
meaningless: a negative or absurd size (past MAX_BYTES), a range past 2**64, a segment on a device the
traces do not have, segments or blocks that overlap, a block outside its segment or asking for more than it
holds, a negative free-memory reading, sizes that would overflow a sum. Pure numpy, no Python call per event
or block; the error path alone looks up where the first bad entry came from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import BadInputError
from ..model import ACTIVE_STATES, HOST_DEVICE, Snapshot
from ..units import fmt_untrusted_int

MAX_BYTES = 1 << 44        # 16 TiB: no allocation, segment or device holds more (an H200 has 141 GB)
MAX_TOTAL = 1 << 62        # what sizes may add up to before an int64 sum could overflow
MAX_DEVICES = 1 << 16
UINT64_MAX = (1 << 64) - 1
# allocator_settings the analyses read, and the type each must have (bool is an int: checked apart)
SETTING_TYPES: dict[str, tuple[type, ...]] = {
    "max_split_size": (int,), "expandable_segments": (bool,), "garbage_collection_threshold": (int, float),
    "roundup_power2_divisions": (dict,), "PYTORCH_CUDA_ALLOC_CONF": (str, type(None)),
}


class _Fatal(Exception):
    pass


def _name(snapshot: Snapshot, part: str = "segments") -> str:
    """How the file names the part being checked: pinned host memory has its own keys."""
    return f"host_{part}" if snapshot.format.layout == "host" else part


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


def _check_sizes(values: np.ndarray, where: Callable[[int], str], what: str = "size") -> None:
    bad = _first((values < 0) | (values > MAX_BYTES))
    if bad is not None:
        raise _Fatal(f"{where(bad)}.{what} is {int(values[bad]):,}: expected 0 ≤ {what} ≤ {MAX_BYTES:,} (16 TiB)")
    if float(values.sum(dtype=np.float64)) > MAX_TOTAL:
        raise _Fatal(f"the {what}s of {where(0).split('[')[0]} add up past 2**62 bytes: not a real device")


def _lex_order(*keys: np.ndarray) -> np.ndarray:
    """`np.lexsort(keys)` (the last key first), without sorting rows that are in that order already, as blocks
    (by segment and address) and often segments are: one pass of comparisons instead of a sort."""
    n = len(keys[0])
    later, tie = np.zeros(max(n - 1, 0), dtype=bool), np.ones(max(n - 1, 0), dtype=bool)
    for key in reversed(keys):
        later |= tie & (key[1:] > key[:-1])
        tie &= key[1:] == key[:-1]
    return np.arange(n) if (later | tie).all() else np.lexsort(keys)   # equal rows keep their order either way


def _ends_fit(start: np.ndarray, size: np.ndarray) -> int | None:
    """Index of the first range start + size that passes 2**64 (sizes are checked ≥ 0 already)."""
    return _first(start > np.uint64(UINT64_MAX) - size.astype(np.uint64))


def _traces(snapshot: Snapshot) -> None:
    """Sizes, ranges and free-memory readings of every trace entry."""
    for device, trace in snapshot.traces.items():
        def at(i: int, d: int = device) -> str:
            return ("host_traces" if d == HOST_DEVICE else f"device_traces[{d}]") + f"[{i}]"
        _check_sizes(trace.size, at)
        bad = _ends_fit(trace.addr, trace.size)
        if bad is not None:
            raise _Fatal(f"{at(bad)}: addr 0x{int(trace.addr[bad]):x} + size {int(trace.size[bad]):,} passes 2**64")
        for index, free in trace.device_free.items():
            if not 0 <= free <= MAX_BYTES:
                raise _Fatal(f"{at(index)}.device_free is {fmt_untrusted_int(free)}: expected 0 ≤ device_free ≤ "
                             f"{MAX_BYTES:,}")


def _unordered_times(snapshot: Snapshot) -> dict[int, str]:
    """device → why its times cannot be used: a negative time, or one earlier than the entry before it."""
    found = {}
    for device, trace in snapshot.traces.items():
        t = trace.time_us
        if t is None or not len(t):
            continue
        name = "host_traces" if device == HOST_DEVICE else f"device_traces[{device}]"
        negative = _first(t < 0)
        back = _first(np.diff(t) < 0)
        if negative is not None:
            found[device] = f"{name}[{negative}].time_us is negative ({int(t[negative]):,})"
        elif back is not None:
            found[device] = (f"{name}[{back + 1}].time_us runs backwards "
                             f"({int(t[back + 1]):,} µs after {int(t[back]):,} µs)")
    return found


def _block_where(snapshot: Snapshot, row: int) -> str:
    """segments[i].blocks[j] of block row `row` (blocks are stored in segment order, segments unique)."""
    segs, blocks = snapshot.segment_columns, snapshot.block_columns
    same = (blocks["device"] == blocks["device"][row]) & (blocks["segment_address"] == blocks["segment_address"][row])
    seg = _first((segs["device"] == blocks["device"][row]) & (segs["address"] == blocks["segment_address"][row]))
    first = _first(same)
    return f"{_name(snapshot)}[{seg}].blocks[{row - (first or 0)}]"


def _segments(snapshot: Snapshot) -> Iterator[str]:
    segs = snapshot.segment_columns
    device, address, total = segs["device"], segs["address"], segs["total_size"]
    name, low = _name(snapshot), HOST_DEVICE if snapshot.format.layout == "host" else 0
    bad = _first((device < low) | (device >= MAX_DEVICES) | ((device != low) if low < 0 else False))
    if bad is not None:
        expected = f"{HOST_DEVICE}, pinned host memory" if low < 0 else f"0 ≤ device < {MAX_DEVICES}"
        raise _Fatal(f"{name}[{bad}].device is {int(device[bad])}: expected {expected}")
    n_traced = snapshot.format.trace_devices
    bad = _first(device >= n_traced) if n_traced else None
    if bad is not None:
        raise _Fatal(f"{_name(snapshot)}[{bad}].device is {int(device[bad])}, but the snapshot traces {n_traced} "
                     f"device(s) (0–{n_traced - 1})")
    _check_sizes(total, lambda i: f"{_name(snapshot)}[{i}]", "total_size")
    bad = _ends_fit(address, total)
    if bad is not None:
        raise _Fatal(f"{_name(snapshot)}[{bad}]: address 0x{int(address[bad]):x} + total_size {int(total[bad]):,} "
                     "passes 2**64")
    order = _lex_order(address, device)
    d, a, t = device[order], address[order], total[order]
    overlap = _first((d[1:] == d[:-1]) & (a[1:] < a[:-1] + t[:-1].astype(np.uint64)))
    if overlap is not None:
        i, j = sorted((int(order[overlap]), int(order[overlap + 1])))
        what = "repeats" if a[overlap] == a[overlap + 1] else "overlaps"
        name = _name(snapshot)
        raise _Fatal(f"{name}[{j}] (device {int(device[j])}, 0x{int(address[j]):x}) {what} {name}[{i}] "
                     f"(0x{int(address[i]):x}, {int(total[i]):,} bytes)")
    yield from _blocks(snapshot)


def _blocks(snapshot: Snapshot) -> Iterator[str]:
    segs, blocks = snapshot.segment_columns, snapshot.block_columns
    if not len(blocks["size"]):
        return
    size, requested, address = blocks["size"], blocks["requested_size"], blocks["address"]
    bad = _first((size < 0) | (size > MAX_BYTES))
    if bad is not None:
        raise _Fatal(f"{_block_where(snapshot, bad)}.size is {int(size[bad]):,}: expected 0 ≤ size ≤ {MAX_BYTES:,}")
    active = np.isin(blocks["state"], ACTIVE_STATES)
    bad = _first((requested < 0) | (active & (requested > size)))
    if bad is not None:
        raise _Fatal(f"{_block_where(snapshot, bad)}.requested_size is {int(requested[bad]):,}: expected "
                     f"0 ≤ requested_size ≤ its size ({int(size[bad]):,})")
    seg_rows = _segment_rows(segs, blocks)
    if seg_rows is None:
        raise _Fatal("a block names a segment (device, address) that `segments` does not hold")
    start = segs["address"][seg_rows]
    end = start + segs["total_size"][seg_rows].astype(np.uint64)
    bad = _first((address < start) | (address + size.astype(np.uint64) > end))
    if bad is not None:
        raise _Fatal(f"{_block_where(snapshot, bad)} (0x{int(address[bad]):x}, {int(size[bad]):,} bytes) lies "
                     f"outside its segment (0x{int(start[bad]):x}–0x{int(end[bad]):x})")
    order = _lex_order(address, seg_rows)
    r, a, s = seg_rows[order], address[order], size[order].astype(np.uint64)
    overlap = _first((r[1:] == r[:-1]) & (a[1:] < a[:-1] + s[:-1]))
    if overlap is not None:
        row = int(order[overlap + 1])
        raise _Fatal(f"{_block_where(snapshot, row)} (0x{int(address[row]):x}) overlaps the block before it")
    filled = np.bincount(seg_rows, weights=size.astype(np.float64), minlength=len(segs["address"]))
    short = np.flatnonzero(filled != segs["total_size"])
    if len(short):
        i = int(short[0])
        yield (f"{_name(snapshot)}[{i}]: its blocks hold {int(filled[i]):,} of its {int(segs['total_size'][i]):,} bytes"
               + (f" (and {len(short) - 1} more such segments)" if len(short) > 1 else "")
               + ": reserved bytes are the segments' total_size, block views show what the blocks hold")


def _segment_rows(segs: Mapping[str, np.ndarray], blocks: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """The segment row of each block, by (device, segment_address); None when one has no segment."""
    order = _lex_order(segs["address"], segs["device"])
    dev, addr = segs["device"][order], segs["address"][order]
    found = np.empty(len(blocks["address"]), dtype=np.int64)
    low, high = int(blocks["device"].min()), int(blocks["device"].max())
    for device in [low] if low == high else np.unique(blocks["device"]).tolist():   # nearly always one
        mine = blocks["device"] == device
        start, stop = int(np.searchsorted(dev, device, "left")), int(np.searchsorted(dev, device, "right"))
        where = np.searchsorted(addr[start:stop], blocks["segment_address"][mine]) + start
        where = np.minimum(where, max(stop - 1, 0))
        if stop == start or not (addr[where] == blocks["segment_address"][mine]).all():
            return None
        found[mine] = order[where]
    return found


def _finite(value: Any, where: str, withheld: list[str]) -> Any:
    """`value` without its non-finite floats (NaN, ±inf: no JSON, no arithmetic), each path put in `withheld`:
    a dict drops the key, a list keeps the place as None."""
    if isinstance(value, float) and not math.isfinite(value):
        withheld.append(where)
        return None
    if isinstance(value, dict):
        kept = {}
        for k, v in value.items():
            if isinstance(v, float) and not math.isfinite(v):
                withheld.append(f"{where}.{k}")
            else:
                kept[k] = _finite(v, f"{where}.{k}", withheld)
        return kept
    if isinstance(value, list):
        return [_finite(v, f"{where}[{i}]", withheld) for i, v in enumerate(value)]
    return value


def _settings(settings: dict[str, Any] | None) -> tuple[dict[str, Any] | None, list[str]]:
    """The settings without the known ones of the wrong type and without non-finite numbers, and a warning
    for each dropped."""
    if not settings:
        return settings, []
    wrong = [key for key, types in SETTING_TYPES.items() if key in settings and (
        not isinstance(settings[key], types) or (bool not in types and isinstance(settings[key], bool)))]
    withheld: list[str] = []
    kept = _finite({k: v for k, v in settings.items() if k not in wrong}, "allocator_settings", withheld)
    return kept, [f"allocator_settings.{key} is a {type(settings[key]).__name__}, expected "
                  f"{' or '.join(t.__name__ for t in SETTING_TYPES[key])}: ignored" for key in wrong] + [
                  f"{where} is not a finite number: withheld" for where in withheld]


def estimate_warning(made: dict[str, Any]) -> str:
    """What every command says of an estimate: its numbers were not measured."""
    shapes = made.get("shapes")
    at = ", ".join(f"{k}={v}" for k, v in shapes.items()) if isinstance(shapes, dict) and shapes else ""
    return ("an estimate, not a measurement: `snapanalyze estimate` ran the program with fake tensors on a CPU"
            + (f" at {at}" if at else "") + "; every number from this file is estimated")


def validate(snapshot: Snapshot) -> Snapshot:
    """The snapshot with its `warnings`, or BadInputError for values that make no sense (module docstring)."""
    try:
        _traces(snapshot)
        warnings = list(_segments(snapshot))
    except _Fatal as exc:
        raise BadInputError(snapshot.source, f"inconsistent snapshot: {exc}") from None
    settings, dropped = _settings(snapshot.allocator_settings)
    warnings += dropped
    unordered = _unordered_times(snapshot)
    traces = dict(snapshot.traces)
    for device, why in unordered.items():
        warnings.append(f"{why}: device {device}'s times are not used (no time windows or durations)")
        traces[device] = dataclasses.replace(traces[device], time_us=None)
    if snapshot.estimate is not None:
        warnings.insert(0, estimate_warning(snapshot.estimate))
    host = snapshot.host
    if host is not None:
        host = validate(host)
        warnings += [f"pinned host memory: {w}" for w in host.warnings]
    if not warnings and host is snapshot.host:
        return snapshot
    return dataclasses.replace(snapshot, traces=traces, allocator_settings=settings, host=host,
                               warnings=tuple(dict.fromkeys((*snapshot.warnings, *warnings))))
