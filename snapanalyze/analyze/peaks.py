"""Find the peaks of a device's active-bytes curve.

Contract: `find_peaks(timeline, top=5)` returns one row per peak, highest first, per device. Peak 1 is the
global maximum of active bytes (first occurrence on ties; event_index −1 when the maximum is the baseline
itself, i.e. nothing in the window rose above what was live when it began). Further peaks are local maxima
separated from every higher peak by a valley at least `min_prominence` × (max − min of the curve) deep, so
one long rise reports once, not once per allocation.

Columns: device, peak (1 = the highest; `--at peak:N` names the same), event_index, until_index (the next
event that changed active bytes, −1: none), time_us (nullable), duration_us (nullable: how long the peak
held), active_bytes, reserved_bytes, allocated_est_bytes (an estimate, see replay), baseline_active_bytes,
transient_bytes (active − baseline).

`peaks_of(timeline, top, device, host)` is the `peaks` command's typed result: a frozen, picklable `Peaks`
(each device's window, baseline and peaks, pinned host memory apart, the replay's own problems); its
`to_json()` is the document `peaks --format json` prints and the terminal renders the object.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..replay import DeviceTimeline, Timeline

if TYPE_CHECKING:                     # `peak_records` serves the CLI without loading pandas
    import pandas as pd

MIN_PROMINENCE = 0.05   # a further peak's valley to every higher one, as a share of the curve's range
NOTES = {"allocated_est_bytes": "estimate: rounded block sizes, exact only for blocks in segments"}

COLUMNS = ["device", "peak", "event_index", "until_index", "time_us", "duration_us", "active_bytes",
           "reserved_bytes", "allocated_est_bytes", "baseline_active_bytes", "transient_bytes"]


class _RangeMin:
    """Minimum over index ranges of a long array in O(√n) per query, O(n / block) memory."""

    def __init__(self, values: np.ndarray, block: int = 1024) -> None:
        self.values, self.block = values, block
        pad = (-len(values)) % block
        padded = np.concatenate([values, np.full(pad, np.iinfo(np.int64).max, dtype=np.int64)])
        self.block_min = padded.reshape(-1, block).min(axis=1) if len(padded) else padded

    def __call__(self, lo: int, hi: int) -> int:
        """min(values[lo..hi]) inclusive."""
        b = self.block
        blo, bhi = lo // b, hi // b
        if bhi - blo <= 1:
            return int(self.values[lo:hi + 1].min())
        return int(min(self.values[lo:(blo + 1) * b].min(), self.block_min[blo + 1:bhi].min(),
                       self.values[bhi * b:hi + 1].min()))


def global_peak_index(dt: DeviceTimeline) -> int:
    """Event index of the global maximum of active bytes (first on ties; −1 when it is the baseline)."""
    if len(dt) == 0:
        return -1
    i = int(np.argmax(dt.active))
    return -1 if dt.baseline_active >= int(dt.active[i]) else i


def _candidates(curve: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Local maxima (event index, or −1 for the baseline) and the index of the next change after each, on
    the active curve with the baseline in front (position = event index + 1)."""
    step = np.diff(curve)
    change = np.flatnonzero(step)                          # event indices whose event changed active bytes
    if len(change) == 0:
        return np.array([-1]), np.array([-1])
    rising = step[change] > 0
    nxt_falls = np.ones(len(change), dtype=bool)
    nxt_falls[:-1] = ~rising[1:]
    top = change[rising & nxt_falls]
    until = np.full(len(top), -1, dtype=np.int64)
    pos = np.searchsorted(change, top) + 1
    has_next = pos < len(change)
    until[has_next] = change[pos[has_next]]
    if not rising[0]:                                       # the window starts by falling: baseline is a peak
        top = np.concatenate([[-1], top])
        until = np.concatenate([[change[0]], until])
    return top.astype(np.int64), until


def _highest_first(tops: np.ndarray, heights: np.ndarray, batch: int = 256) -> Iterator[int]:
    """Positions of the candidates, highest first (earliest first on ties), sorted in growing batches: the top
    few peaks are usually accepted long before the hundreds of thousands of local maxima run out."""
    remaining = np.arange(len(tops))
    while len(remaining):
        if len(remaining) > batch:
            cut = np.partition(heights[remaining], len(remaining) - batch)[len(remaining) - batch]
            high = heights[remaining] >= cut
            take, remaining = remaining[high], remaining[~high]
        else:
            take, remaining = remaining, remaining[:0]
        yield from take[np.lexsort((tops[take], -heights[take]))].tolist()
        batch *= 16


def _device_peaks(dt: DeviceTimeline, top: int, min_prominence: float) -> list[dict[str, Any]]:
    curve = np.concatenate([np.array([dt.baseline_active], dtype=np.int64), dt.active])  # position = index + 1
    tops, until = _candidates(curve)
    heights = curve[tops + 1]
    span = int(curve.max() - curve.min())
    need = max(1, int(span * min_prominence))
    rmq = _RangeMin(curve)
    g = global_peak_index(dt)
    accepted: list[int] = []                                 # positions in curve, sorted
    chosen: list[int] = []
    for k in _highest_first(tops, heights):
        if len(chosen) >= top:
            break
        pos = int(tops[k]) + 1
        if chosen and int(tops[k]) != g:
            j = bisect.bisect_left(accepted, pos)
            h = int(heights[k])
            if j > 0 and h - rmq(accepted[j - 1], pos) < need:
                continue
            if j < len(accepted) and h - rmq(pos, accepted[j]) < need:
                continue
        elif not chosen and int(tops[k]) != g:
            continue  # the global peak (first occurrence) is always peak 1
        bisect.insort(accepted, pos)
        chosen.append(k)
    if not chosen:
        chosen_rows = [(g, -1)]
    else:
        chosen_rows = [(int(tops[k]), int(until[k])) for k in chosen]
    rows = []
    for peak, (index, nxt) in enumerate(chosen_rows, start=1):
        t0, t1 = dt.time_at(index), dt.time_at(nxt) if nxt >= 0 else None
        active = dt.active_at(index)
        rows.append({
            "device": dt.device, "peak": peak, "event_index": index, "until_index": nxt,
            "time_us": t0, "duration_us": (t1 - t0) if (t0 is not None and t1 is not None) else None,
            "active_bytes": active, "reserved_bytes": dt.reserved_at(index),
            "allocated_est_bytes": dt.allocated_est_at(index), "baseline_active_bytes": dt.baseline_active,
            "transient_bytes": active - dt.baseline_active,
        })
    return rows


def peak_records(timeline: Timeline, top: int = 5, device: int | None = None,
                 min_prominence: float = MIN_PROMINENCE) -> list[dict[str, Any]]:
    """`find_peaks` as a list of dicts (keys COLUMNS; None where a time is unknown)."""
    if top < 1:
        raise ValueError("top must be at least 1")
    devices = [device] if device is not None else sorted(timeline.devices)
    return [r for d in devices for r in _device_peaks(timeline[d], top, min_prominence)]


def find_peaks(timeline: Timeline, top: int = 5, device: int | None = None,
               min_prominence: float = MIN_PROMINENCE) -> pd.DataFrame:
    """Top peaks of each device (or one device), highest first; see the module docstring."""
    import pandas as pd
    df = pd.DataFrame(peak_records(timeline, top, device, min_prominence), columns=COLUMNS)
    for c in ("time_us", "duration_us"):
        df[c] = df[c].astype("Int64")
    return df


@dataclass(frozen=True)
class Peak:
    """One peak of a device's active bytes (the `find_peaks` row without its device and baseline)."""

    event_index: int                 # −1: the baseline itself
    time_us: int | None
    active_bytes: int
    reserved_bytes: int
    allocated_est_bytes: int         # an estimate: rounded block sizes
    transient_bytes: int             # active − the window's baseline
    until_index: int                 # the next event that changed active bytes (−1: none)
    duration_us: int | None          # how long the peak held


@dataclass(frozen=True)
class DevicePeaks:
    """A device's trace window, the baseline live when it began, and its peaks, highest first."""

    device: int | str                # "host" for pinned host memory
    baseline_active_bytes: int
    baseline_reserved_bytes: int
    events: int
    window_us: int | None            # last − first event time (None: no timestamps)
    first_time_us: int | None
    peaks: tuple[Peak, ...]          # never empty

    def to_json(self) -> dict[str, Any]:
        peaks = [asdict(p) for p in self.peaks]
        return {"device": self.device, "baseline_active_bytes": self.baseline_active_bytes,
                "baseline_reserved_bytes": self.baseline_reserved_bytes, "events": self.events,
                "window_us": self.window_us, "first_time_us": self.first_time_us, "state_only": self.state_only,
                "peak": peaks[0], "peaks": peaks}

    @property
    def state_only(self) -> bool:
        """The allocator's state without a trace (or with a 1-entry legacy one): no peak can be found in it."""
        return self.events <= 1


@dataclass(frozen=True)
class Peaks:
    """The `peaks` command's result (see the module docstring)."""

    source: str
    devices: tuple[DevicePeaks, ...]
    host: tuple[DevicePeaks, ...] | None        # pinned host memory, apart from the devices (torch >= 2.14)
    replay_problems: tuple[str, ...]            # what proves the replay wrong against the end state
    estimate: bool = False                      # the file is an estimate (`snapanalyze estimate`), not a measurement
    ooms: tuple[Mapping[str, Any], ...] = ()    # the file's oom entries (`Snapshot.oom_mentions`): it ran out

    def to_json(self) -> dict[str, Any]:
        """The JSON document (the replay's problems are the terminal's warning, not part of it)."""
        return {"source": self.source, "estimate": self.estimate, "ooms": [dict(o) for o in self.ooms],
                "devices": [d.to_json() for d in self.devices],
                "host": [d.to_json() for d in self.host] if self.host is not None else None,
                "notes": dict(NOTES)}


def peaks_of(timeline: Timeline, top: int = 5, device: int | None = None,
             host: Timeline | None = None) -> Peaks:
    """Each device's (or one device's) window, baseline and top peaks; `host`: the replay of the file's
    pinned host memory, described apart (its device named "host")."""
    if top < 1:
        raise ValueError("top must be at least 1")
    return Peaks(timeline.snapshot.source, _devices_of(timeline, top, device),
                 _devices_of(host, top, None, "host") if host is not None else None,
                 tuple(timeline.check_invariants()), timeline.snapshot.estimate is not None,
                 timeline.snapshot.oom_mentions())


def _devices_of(timeline: Timeline, top: int, device: int | None,
                name: str | None = None) -> tuple[DevicePeaks, ...]:
    out = []
    for d in [device] if device is not None else sorted(timeline.devices):
        dt = timeline[d]
        first, last = dt.time_at(0), dt.time_at(len(dt) - 1)
        peaks = tuple(Peak(r["event_index"], r["time_us"], r["active_bytes"], r["reserved_bytes"],
                           r["allocated_est_bytes"], r["transient_bytes"], r["until_index"], r["duration_us"])
                      for r in _device_peaks(dt, top, MIN_PROMINENCE))
        out.append(DevicePeaks(name if name is not None else d, dt.baseline_active, dt.baseline_reserved, len(dt),
                               (last - first) if first is not None and last is not None else None, first, peaks))
    return tuple(out)
