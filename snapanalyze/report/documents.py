"""JSON-ready documents for scripts and CI, following the contract in the architecture notes.

Contract: functions here turn analysis results (Timeline, peak and attribution DataFrames, summary dicts)
into plain dicts of str/int/float/None/list/dict. Keys documented in the contract never change meaning;
new keys may be added.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..replay import Timeline


def _plain(value: Any) -> Any:
    if value is None or value is pd.NA:
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def peak_record(row: pd.Series) -> dict[str, Any]:
    return {
        "event_index": int(row["event_index"]),
        "time_us": _plain(row["time_us"]),
        "active_bytes": int(row["active_bytes"]),
        "reserved_bytes": int(row["reserved_bytes"]),
        "allocated_est_bytes": int(row["allocated_est_bytes"]),
        "transient_bytes": int(row["transient_bytes"]),
        "until_index": int(row["until_index"]),
        "duration_us": _plain(row["duration_us"]),
    }


def device_header(timeline: Timeline, device: int) -> dict[str, Any]:
    dt = timeline[device]
    first, last = dt.time_at(0), dt.time_at(len(dt) - 1)
    return {
        "device": device,
        "baseline_active_bytes": dt.baseline_active,
        "baseline_reserved_bytes": dt.baseline_reserved,
        "events": len(dt),
        "window_us": (last - first) if first is not None and last is not None else None,
        "first_time_us": first,
    }


def peaks_document(timeline: Timeline, peaks: pd.DataFrame) -> dict[str, Any]:
    """{"source", "devices": [{"device", "baseline_active_bytes", "peak", "peaks": [...]} ...]}"""
    devices = []
    for device, group in peaks.groupby("device", sort=True):
        records = [peak_record(r) for _, r in group.sort_values("rank").iterrows()]
        devices.append({**device_header(timeline, int(device)), "peak": records[0], "peaks": records})
    return {"source": timeline.snapshot.source, "devices": devices,
            "notes": {"allocated_est_bytes": "estimate: rounded block sizes, exact only for blocks in segments"}}
