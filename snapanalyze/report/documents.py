"""JSON-ready documents for scripts and CI, following the contract in the architecture notes.

Contract: functions here turn analysis results (attribution DataFrames)
into plain dicts of str/int/float/None/list/dict. Keys documented in the contract never change meaning;
new keys may be added.
"""

from __future__ import annotations

import sys
from typing import Any


def _plain(value: Any) -> Any:
    pandas = sys.modules.get("pandas")    # pd.NA can only come from a pandas that is already loaded
    if value is None or (pandas is not None and value is pandas.NA):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def attribution_document(attribution: Any, explain: bool = False, top: int = 3) -> dict[str, Any]:
    """The `attribute --format json` contract: devices[].categories[] sum exactly to peak.active_bytes; each
    category's `top` sites by bytes in top_frames."""
    from ..analyze.attribute import SUMMARY_TOP, summarize_blocks

    devices = []
    summaries = attribution.summary if top == SUMMARY_TOP else summarize_blocks(attribution.blocks, top=top)
    for device, instant in sorted(attribution.instants.items()):
        summary = summaries[summaries["device"] == device]
        entry: dict[str, Any] = {
            "device": device,
            "baseline_active_bytes": instant.baseline_active_bytes,
            "baseline": instant.baseline,
            "instant": instant.label,
            "peak": {"event_index": instant.event_index, "time_us": instant.time_us,
                     "active_bytes": instant.active_bytes, "reserved_bytes": instant.reserved_bytes},
            "transient_bytes": instant.active_bytes - instant.baseline_active_bytes,
            "request": instant.request,
            "categories": [{"category": r.category, "bytes": int(r.bytes), "share": round(float(r.share), 6),
                            "blocks": int(r.blocks), "top_frames": list(r.top_frames),
                            "top_frame_bytes": list(r.top_frame_bytes), "inferred_bytes": int(r.inferred_bytes)}
                           for r in summary.itertuples()],
        }
        if explain:
            entry["explain"] = explain_records(attribution, device)
        devices.append(entry)
    return {"source": attribution.snapshot.source, "devices": devices, "notes": list(attribution.notes),
            "rules": attribution.rules.sources}


def explain_records(attribution: Any, device: int) -> list[dict[str, Any]]:
    """Which rule fired on which frame, grouped by (category, rule, frame), largest first."""
    b = attribution.blocks[attribution.blocks["device"] == device]
    g = (b.groupby(["category", "rule", "frame", "reason", "tags", "inferred"], sort=False, observed=True)
         .agg(bytes=("size", "sum"), blocks=("size", "size"), stacks=("stack_id", "nunique"))
         .reset_index().sort_values("bytes", ascending=False, kind="stable"))
    return [{"category": r.category, "rule": r.rule, "frame": r.frame, "reason": r.reason,
             "tags": [t for t in r.tags.split(",") if t], "inferred": bool(r.inferred), "bytes": int(r.bytes),
             "blocks": int(r.blocks), "stacks": int(r.stacks)} for r in g.itertuples()]


def blocks_csv(blocks: Any) -> str:
    """`Attribution.blocks` as CSV that a spreadsheet opens safely: each distinct text cell made inert once
    (`text.csv_cell`: formulas get a leading apostrophe, hidden characters become escapes)."""
    import pandas as pd

    from .text import csv_cell

    safe = blocks.copy(deep=False)
    for column in safe.columns:
        if safe[column].dtype == object:
            codes, uniques = pd.factorize(safe[column], use_na_sentinel=False)
            safe[column] = pd.Series([csv_cell(u) for u in uniques], dtype=object).to_numpy()[codes]
    text: str = safe.to_csv(index=False)
    return text
