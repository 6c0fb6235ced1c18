"""The JSON-ready document of `check` (diff's and capacity's are their typed results' `to_json()`).

Contract: `check_document` turns a CheckResult into plain dicts of str/int/bool/list/dict, in a fixed key
order, with bytes as exact ints. Keys keep their meaning; new keys may be added. Nothing here analyses
anything: {"source", "metric", "passed", "checks": [{device, check, subject, limit_bytes, actual_bytes,
  headroom_bytes, ok, at_peak_bytes, event_index}], "failures": [str]}.
"""

from __future__ import annotations

from typing import Any

from ..analyze.check import CheckResult


def check_document(result: CheckResult) -> dict[str, Any]:
    """The `check --format json` document (see the module docstring)."""
    return {
        "source": result.source, "metric": result.metric, "passed": result.passed,
        "checks": [{"device": int(r.device), "check": r.check, "subject": r.subject, "limit_bytes": int(r.limit_bytes),
                    "actual_bytes": int(r.actual_bytes), "headroom_bytes": int(r.headroom_bytes), "ok": bool(r.ok),
                    "at_peak_bytes": int(r.at_peak_bytes), "event_index": int(r.event_index)}
                   for r in result.rows.itertuples()],
        "failures": result.failures(),
    }
