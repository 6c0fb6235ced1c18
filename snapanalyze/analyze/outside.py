"""Memory outside the allocator: NVML samples joined to the trace on the µs clock.

Contract: `join_samples(device_timeline, nvml)` puts each NVML sample of that device next to what the
allocator had reserved at the same instant — the collector's own `torch_reserved_bytes` when it read it,
else the replayed reserved curve at the sample's time (samples before the first trace event have no replayed
value) — and derives `outside_bytes` = used − reserved (CUDA context, NCCL, library workspaces created
outside the allocator, other processes), split where NVML listed processes into `own_outside_bytes`
(this process's NVML usage − reserved), `other_processes_bytes` and `unattributed_bytes` (the rest: driver
reservations). `outside_at_peaks(timeline, nvml, peaks)` reads those numbers at each peak: from the samples
taken while the peak held when there are any (`basis` "during"), else from the samples bracketing it
("bracketing", or "one side" when only one lies within `max_gap_us`) with `uncertain` set and the sampling
interval and the peak's duration named in `note`, because a sampler slower than the peak never saw it;
"none near", "no samples" and "no timestamps" leave the numbers null. NVML measures how much memory is
outside the allocator, never what it is: nothing here names a cause.

`join_samples` columns: device, time_us, used_bytes, total_bytes, reserved_bytes (nullable), reserved_source
("torch_reserved_bytes" | "replay" | None), outside_bytes, own_outside_bytes, other_processes_bytes,
unattributed_bytes (nullable Int64), in_window (the sample lies at or after the first trace event).
`outside_at_peaks` columns: OUTSIDE_COLUMNS (below); `outside_at_instant` returns one such row as a dict.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..replay import DeviceTimeline, Timeline
from .peaks import find_peaks

OUTSIDE_COLUMNS = [
    "device", "peak", "event_index", "time_us", "duration_us", "reserved_bytes", "basis", "samples_during",
    "sample_before_us", "sample_after_us", "interval_us", "outside_bytes", "outside_low_bytes",
    "outside_high_bytes", "own_outside_bytes", "other_processes_bytes", "nvml_used_bytes", "nvml_used_measured",
    "total_bytes", "uncertain", "note",
]
JOIN_COLUMNS = ["device", "time_us", "used_bytes", "total_bytes", "reserved_bytes", "reserved_source",
                "outside_bytes", "own_outside_bytes", "other_processes_bytes", "unattributed_bytes", "in_window"]
WHAT_OUTSIDE_IS = ("NVML measures how much device memory lies outside the allocator (CUDA context, NCCL, "
                   "library workspaces, other processes), not what it is")


def _int(value: Any) -> int | None:
    return None if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)) else int(value)


def join_samples(dt: DeviceTimeline, nvml: pd.DataFrame) -> pd.DataFrame:
    """NVML samples of `dt.device`, each with the allocator's reserved bytes at that instant (see docstring)."""
    rows = nvml[nvml["device"] == dt.device].sort_values("time_us", kind="stable").reset_index(drop=True)
    n = len(rows)

    def column(name: str) -> pd.Series:
        return rows[name].astype("Int64") if name in rows else pd.Series([pd.NA] * n, dtype="Int64")

    t = rows["time_us"].to_numpy(dtype=np.int64)
    reserved = column("torch_reserved_bytes")
    source = pd.Series([None if missing else "torch_reserved_bytes" for missing in reserved.isna()], dtype=object)
    in_window = np.zeros(n, dtype=bool)
    if dt.time_us is not None and len(dt):
        in_window = t >= int(dt.time_us[0])
        idx = np.searchsorted(dt.time_us, t, side="right") - 1
        replayed = np.where(idx >= 0, dt.reserved[np.maximum(idx, 0)], dt.baseline_reserved)
        use = reserved.isna().to_numpy() & in_window
        reserved[use] = replayed[use]
        source[use] = "replay"
    used = column("used_bytes")
    process = column("process_used_bytes")
    others = column("other_processes_used_bytes")
    return pd.DataFrame({
        "device": np.full(n, dt.device, dtype=np.int64),
        "time_us": t,
        "used_bytes": rows["used_bytes"].to_numpy(dtype=np.int64),
        "total_bytes": rows["total_bytes"].to_numpy(dtype=np.int64),
        "reserved_bytes": reserved,
        "reserved_source": source,
        "outside_bytes": used - reserved,
        "own_outside_bytes": process - reserved,
        "other_processes_bytes": others,
        "unattributed_bytes": used - process - others,
        "in_window": in_window,
    }, columns=JOIN_COLUMNS)


def _median_interval(t: np.ndarray) -> int | None:
    if len(t) < 2:
        return None
    gaps = np.diff(t)
    gaps = gaps[gaps > 0]
    return int(np.median(gaps)) if len(gaps) else None


def _fmt_us(us: int | None) -> str:
    if us is None:
        return "unknown"
    return f"{us:,} µs" if us < 1000 else f"{us / 1000:,.1f} ms" if us < 1_000_000 else f"{us / 1e6:,.2f} s"


def outside_at_instant(dt: DeviceTimeline, joined: pd.DataFrame, index: int, duration_us: int | None,
                       peak: int | None = None, max_gap_us: int | None = None, what: str = "the peak") \
        -> dict[str, Any]:
    """Outside-allocator numbers at event `index` of `dt` held for `duration_us` (None: until the trace ends).

    `joined` is `join_samples(dt, nvml)`. Samples within the hold decide (measured); else the last sample
    before and the first after, no farther than `max_gap_us` (default: 10 sampling intervals, ≥ 100 ms)."""
    t0 = dt.time_at(index)
    reserved = dt.reserved_at(index)
    row: dict[str, Any] = {c: None for c in OUTSIDE_COLUMNS}
    row.update(device=dt.device, peak=peak, event_index=index, time_us=t0, duration_us=duration_us,
               reserved_bytes=reserved, samples_during=0, nvml_used_measured=False, uncertain=True)
    usable = joined[~joined["outside_bytes"].isna()]
    if len(joined) == 0:
        row.update(basis="no samples", note="no NVML samples for this device")
        return row
    if t0 is None:
        row.update(basis="no timestamps", note="the trace has no time_us, so NVML samples cannot be joined to it")
        return row
    t = usable["time_us"].to_numpy(dtype=np.int64)
    interval = _median_interval(joined["time_us"].to_numpy(dtype=np.int64))
    row["interval_us"] = interval
    row["total_bytes"] = int(joined["total_bytes"].iloc[-1])
    gap = max_gap_us if max_gap_us is not None else max(10 * (interval or 0), 100_000)
    if duration_us is not None:
        end = t0 + duration_us
    elif dt.time_us is not None and len(dt):
        end = int(dt.time_us[-1]) + 1
    else:
        end = t0 + 1
    during = usable[(t >= t0) & (t < end)]
    outside = usable["outside_bytes"].to_numpy(dtype=np.int64)
    held = _fmt_us(duration_us) if duration_us is not None else "until the end of the trace"
    what_held = f"{what} is an instant" if duration_us == 0 else f"{what} held {held}"
    if len(during):
        best = during.loc[during["used_bytes"].idxmax()]
        row.update(basis="during", samples_during=len(during), uncertain=False,
                   sample_before_us=int(during["time_us"].iloc[0]), sample_after_us=int(during["time_us"].iloc[-1]),
                   outside_bytes=int(best["outside_bytes"]),
                   outside_low_bytes=int(during["outside_bytes"].min()),
                   outside_high_bytes=int(during["outside_bytes"].max()),
                   own_outside_bytes=_int(best["own_outside_bytes"]),
                   other_processes_bytes=_int(best["other_processes_bytes"]),
                   nvml_used_bytes=int(best["used_bytes"]), nvml_used_measured=True,
                   note=f"{len(during)} NVML sample(s) taken while {what} held ({held}); sampling every "
                        f"{_fmt_us(interval)}")
        return row
    before = np.flatnonzero((t < t0) & (t >= t0 - gap))
    after = np.flatnonzero((t >= end) & (t <= end + gap))
    pick = [int(before[-1])] if len(before) else []
    pick += [int(after[0])] if len(after) else []
    if not pick:
        row.update(basis="none near",
                   note=f"no NVML sample within {_fmt_us(gap)} of {what} (samples every {_fmt_us(interval)})")
        return row
    near = min(pick, key=lambda i: abs(int(t[i]) - t0))
    sample = usable.iloc[near]
    values = outside[pick]
    row.update(
        basis="bracketing" if len(pick) == 2 else "one side",
        sample_before_us=int(t[before[-1]]) if len(before) else None,
        sample_after_us=int(t[after[0]]) if len(after) else None,
        outside_bytes=int(outside[near]), outside_low_bytes=int(values.min()), outside_high_bytes=int(values.max()),
        own_outside_bytes=_int(sample["own_outside_bytes"]),
        other_processes_bytes=_int(sample["other_processes_bytes"]),
        nvml_used_bytes=reserved + int(outside[near]))
    spread = int(values.max() - values.min())
    span = (int(t[after[0]]) - int(t[before[-1]])) if len(before) and len(after) else None
    row["note"] = (f"no NVML sample fell inside {what}: sampled every {_fmt_us(interval)}"
                   + (f" ({_fmt_us(span)} between the samples around it)" if span is not None else
                      " (a sample on one side only)")
                   + f", {what_held}, so NVML never saw it; NVML used there is estimated as the allocator's reserved "
                     f"bytes + the outside bytes of the nearest sample"
                   + (f", which vary by {spread:,} bytes across the samples around it" if spread else "")
                   + ". " + WHAT_OUTSIDE_IS)
    return row


def outside_at_peaks(timeline: Timeline, nvml: pd.DataFrame, peaks: pd.DataFrame | None = None,
                     max_gap_us: int | None = None) -> pd.DataFrame:
    """Memory outside the allocator at each peak (default: `find_peaks(timeline)`); columns OUTSIDE_COLUMNS."""
    peaks = find_peaks(timeline) if peaks is None else peaks
    joined = {d: join_samples(timeline[d], nvml) for d in sorted(timeline.devices)}
    rows = []
    for p in peaks.itertuples(index=False):
        dt = timeline[int(p.device)]
        duration = None if p.duration_us is pd.NA or p.duration_us is None else int(p.duration_us)
        rows.append(outside_at_instant(dt, joined[int(p.device)], int(p.event_index), duration, peak=int(p.peak),
                                       max_gap_us=max_gap_us))
    df = pd.DataFrame(rows, columns=OUTSIDE_COLUMNS)
    for c in ("peak", "time_us", "duration_us", "sample_before_us", "sample_after_us", "interval_us",
              "outside_bytes", "outside_low_bytes", "outside_high_bytes", "own_outside_bytes",
              "other_processes_bytes", "nvml_used_bytes", "total_bytes"):
        df[c] = df[c].astype("Int64")
    return df
