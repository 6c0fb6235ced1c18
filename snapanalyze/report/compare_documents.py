"""JSON-ready documents for the comparison analyses: capacity, check (diff's is `analyze.diff_result`'s).

Contract: `capacity_document` and `check_document` turn a Capacity (with an optional contract) and a
CheckResult into plain dicts of str/int/float/bool/None/list/dict, in a fixed key
order, with bytes as exact ints (fits' coefficients are floats: bytes per unit of the driver). Keys keep
their meaning; new keys may be added. Nothing here analyses anything.

- capacity: {"driver", "model", "points": [{label, source, phase, device, shape, x, baseline_bytes,
  peak_bytes, transient_bytes, reserved_bytes, categories: {target: {kind, baseline_bytes, peak_bytes,
  transient_bytes}}}], "fits": [{target, kind, model, intercept_bytes, linear_bytes, quadratic_bytes,
  max_rel_residual, points, from_x, to_x, jumped}], "jumps": [...], "drivers": [...], "contract", "notes"};
  a fit without a model ("insufficient": too few shapes; "none") has null coefficients and residual, and the
  contract's limits say `extrapolated` / `bounded` (capped at `EXTRAPOLATION_LIMIT` × measured) / `insufficient`.
- check: {"source", "metric", "passed", "checks": [{device, check, subject, limit_bytes, actual_bytes,
  headroom_bytes, ok, at_peak_bytes, event_index}], "failures": [str]}.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..analyze.capacity import Capacity, Contract
from ..analyze.check import CheckResult
from ..batch_shape import SHAPE_KEYS
from ..plain import plain

MODEL_TEXT = ("transient bytes = intercept + linear·t + quadratic·q with t = batch·x, q = batch·x², x the "
              "driver's value per sequence; coefficients ≥ 0, fitted on relative residuals")


def _plain(value: Any) -> Any:
    return plain(value, nan_as_none=True)


def _number(value: Any) -> float | None:
    """A fit's float, or None where there is no number (an insufficient fit's NaN, a failed fit's inf)."""
    v = float(value)
    return v if math.isfinite(v) else None


def _fit_record(r: Any) -> dict[str, Any]:
    return {"target": r.target, "kind": r.kind, "model": r.model, "intercept_bytes": _number(r.intercept_bytes),
            "linear_bytes": _number(r.linear_bytes), "quadratic_bytes": _number(r.quadratic_bytes),
            "max_rel_residual": _number(r.max_rel_residual), "points": int(r.points), "from_x": float(r.from_x),
            "to_x": float(r.to_x), "jumped": bool(r.jumped)}


def contract_document(contract: Contract) -> dict[str, Any]:
    """A `Contract` as the JSON-ready dict of `capacity --format json` (its fields, in order)."""
    doc = dataclasses.asdict(contract)
    for key in ("limits", "observed", "notes"):
        doc[key] = list(doc[key])
    return doc


def capacity_document(cap: Capacity, contract: Contract | None = None) -> dict[str, Any]:
    """The `capacity --format json` document (see the module docstring)."""
    shapes = cap.sweep.shapes
    xs = dict(zip(cap.points["label"], cap.points["x"]))
    cats = cap.sweep.categories
    extra = [c for c in shapes.columns if c not in ("label", "source", "phase", "device", *SHAPE_KEYS)
             and c not in ("first_index", "last_index", "peak_event_index", "peak_time_us", "baseline_bytes",
                           "peak_bytes", "transient_bytes", "reserved_bytes", "max_reserved_bytes",
                           "outside_bytes", "outside_measured")]
    points = []
    for r in shapes.to_dict("records"):
        mine = cats[cats["label"] == r["label"]]
        shape = {k: _plain(r[k]) for k in (*SHAPE_KEYS, *extra) if _plain(r[k]) is not None}
        points.append({
            "label": r["label"], "source": r["source"], "phase": _plain(r["phase"]), "device": int(r["device"]),
            "shape": shape, "x": float(xs[r["label"]]), "peak_event_index": int(r["peak_event_index"]),
            "baseline_bytes": int(r["baseline_bytes"]), "peak_bytes": int(r["peak_bytes"]),
            "transient_bytes": int(r["transient_bytes"]), "reserved_bytes": int(r["reserved_bytes"]),
            "max_reserved_bytes": int(r["max_reserved_bytes"]),
            "categories": {c.target: {"kind": c.kind, "baseline_bytes": int(c.baseline_bytes),
                                      "peak_bytes": int(c.peak_bytes), "transient_bytes": int(c.transient_bytes)}
                           for c in mine.itertuples()},
        })
    return {
        "driver": cap.driver, "model": MODEL_TEXT, "points": points,
        "fits": [_fit_record(r) for r in cap.fits.itertuples()],
        "jumps": [{"from_label": r.from_label, "to_label": r.to_label, "from_x": float(r.from_x),
                   "to_x": float(r.to_x), "category": r.category, "how": r.how, "bytes_before": int(r.bytes_before),
                   "bytes_after": int(r.bytes_after), "predicted_bytes": int(r.predicted_bytes),
                   "total_before": int(r.total_before), "total_after": int(r.total_after),
                   "total_predicted": int(r.total_predicted), "targets": list(r.targets)}
                  for r in cap.jumps.itertuples()],
        "drivers": [{"driver": r.driver, "model": r.model, "max_rel_residual": _number(r.max_rel_residual),
                     "score": _number(r.score), "chosen": bool(r.chosen)} for r in cap.drivers.itertuples()],
        "contract": None if contract is None else contract_document(contract),
        "notes": list(cap.notes),
    }


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
