"""JSON-ready documents for OOM explanations (the ranks' is `analyze.rank_result.Ranks.to_json`).

Contract: each function turns one analysis result (the `(explanations, problems)` of
`session.explain_path`) into plain dicts of
str/int/float/bool/None/list/dict; bytes stay exact integers, times are µs since the Unix epoch. Keys keep
their meaning once published; new keys may be added. `problems` lists what was missing (reported, not fatal).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pandas as pd

from ..plain import plain as _plain
from ..sites import site_text
from . import oom_text


def _record(row: pd.Series | dict[str, Any], keys: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in keys:
        v = row[k]
        if isinstance(v, list):
            out[k] = [_plain(x) for x in v]
        elif isinstance(v, dict):
            out[k] = {str(a): _plain(b) for a, b in v.items()}
        else:
            out[k] = _plain(v)
    return out


OOM_KEYS = ["device", "index", "time_us", "stream", "request_bytes", "device_free_bytes", "active_bytes",
            "allocated_bytes", "reserved_bytes", "reserved_free_bytes", "largest_free_block_bytes",
            "largest_free_block_any_bytes", "free_blocks", "pool", "segment_type", "exact", "state_source",
            "capacity_bytes",
            "capacity_source", "outside_bytes", "outside_source", "own_outside_bytes", "other_processes_bytes",
            "outside_growth_bytes", "shortfall_bytes", "split_segments", "verdict", "why", "advice"]


def failed_record(failed: Any) -> dict[str, Any] | None:
    """The allocation that failed (`analyze.oom.FailedAllocation`) as JSON: its bytes, the code that asked for
    it (category, rule, inferred, deciding frame, owner, frames innermost first) and its request and span."""
    if failed is None:
        return None
    stack = failed.stack
    return {"size_bytes": failed.size, "request": failed.request or None, "span": failed.span or None,
            **({"category": stack.category, "rule": stack.rule, "inferred": stack.inferred,
                "frame": site_text(stack.frame), "owner": site_text(stack.owner) or None,
                "frames": [site_text(f) for f in stack.frames], "more_frames": stack.more_frames}
               if stack is not None else
               {"category": None, "rule": None, "inferred": None, "frame": None, "owner": None, "frames": [],
                "more_frames": 0})}


def no_oom_record(n: Any) -> dict[str, Any]:
    """A device without an OOM (`analyze.oom.NoOom`) as the JSON record: its fields, then the message."""
    fields = dataclasses.asdict(n)
    fields["rejected_requests"] = list(fields["rejected_requests"])
    return {**fields, "message": oom_text.no_oom_message(n)}


def oom_document(items: list[Any], problems: list[str], source: str) -> dict[str, Any]:
    """`snapanalyze explain-oom --format json`: per snapshot, its `ooms` (with the categories live at each)
    or its `no_oom` statement per device, `state_only` for devices with a state and no trace, and the run's
    problems."""
    snapshots = []
    for item in items:
        e = item.explanation
        engine = e.engine.name if e.engine is not None else "pytorch"     # advice in the program's own knobs
        ooms = []
        by_entry = dict(iter(e.categories.groupby(["device", "index"], sort=False)))   # once, not per entry
        empty = e.categories.iloc[:0]
        for (_, row), verdict in zip(e.ooms.iterrows(), e.verdicts):
            rec = _record({**row.to_dict(), "why": oom_text.why(verdict),
                           "advice": oom_text.advice(verdict, engine)}, OOM_KEYS)
            rec["failed_allocation"] = failed_record(verdict.failed)
            rec["kept_across_step"] = verdict.kept.to_json() if verdict.kept is not None else None
            c = by_entry.get((int(row["device"]), int(row["index"])), empty)
            rec["categories"] = [{"category": x.category, "bytes": int(x.bytes), "share": round(float(x.share), 6),
                                  "blocks": int(x.blocks), "window_bytes": int(x.window_bytes)}
                                 for x in c.itertuples()]
            ooms.append(rec)
        no_oom = [_record(n, list(n)) for n in (no_oom_record(x) for x in e.no_oom)]
        state_only = [{**dataclasses.asdict(x), "message": oom_text.state_only_message(x)} for x in e.state_only]
        snapshots.append({"rank": item.rank, "tag": item.tag, "path": str(item.path),
                          "engine": ({"name": e.engine.name, "label": e.engine.label,
                                      "evidence": e.engine.evidence_text()}
                                     if e.engine is not None else None),
                          "ooms": ooms,
                          "no_oom": no_oom, "state_only": state_only, "notes": list(e.notes)})
    return {"source": source, "snapshots": snapshots, "problems": list(problems)}
