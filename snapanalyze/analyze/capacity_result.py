"""The `capacity` command's typed result: the sweep's points, fits, jumps, the drivers tried and the contract.

Contract: `capacity_result(cap, contract=None)` turns a `capacity.Capacity` (DataFrames) and its optional
`Contract` into a frozen, picklable `CapacityResult` of plain values; `to_json()` is the document
`capacity --format json` prints (bytes exact ints; a fit's coefficients are floats in bytes per unit of the
driver, None where there is no number: an insufficient fit's NaN, a failed fit's inf); the terminal renders
the object. A point's `shape` holds the shape keys it has (tokens, batch, chunk, images and any other the
manifest gave), its `categories` each target's bytes, both in the sweep's order.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from ..batch_shape import SHAPE_KEYS
from ..plain import plain
from .capacity import Capacity, Contract

MODEL = ("transient bytes = intercept + linear·t + quadratic·q with t = batch·x, q = batch·x², x the "
         "driver's value per sequence; coefficients ≥ 0, fitted on relative residuals")
_MEASURED = ("label", "source", "phase", "device", *SHAPE_KEYS, "first_index", "last_index", "peak_event_index",
             "peak_time_us", "baseline_bytes", "peak_bytes", "transient_bytes", "reserved_bytes",
             "max_reserved_bytes", "outside_bytes", "outside_measured")


@dataclass(frozen=True)
class PointTarget:
    """One target's bytes at a point (a category, or a family of them)."""

    kind: str
    baseline_bytes: int
    peak_bytes: int
    transient_bytes: int


@dataclass(frozen=True)
class Point:
    label: str
    source: str
    phase: str | None
    device: int
    shape: tuple[tuple[str, Any], ...]
    x: float
    peak_event_index: int
    baseline_bytes: int
    peak_bytes: int
    transient_bytes: int
    reserved_bytes: int
    max_reserved_bytes: int
    categories: tuple[tuple[str, PointTarget], ...]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["shape"] = dict(self.shape)
        doc["categories"] = {target: asdict(c) for target, c in self.categories}
        return doc


@dataclass(frozen=True)
class FitRow:
    target: str
    kind: str
    model: str
    intercept_bytes: float | None
    linear_bytes: float | None
    quadratic_bytes: float | None
    max_rel_residual: float | None
    points: int
    from_x: float
    to_x: float
    jumped: bool


@dataclass(frozen=True)
class Jump:
    from_label: str
    to_label: str
    from_x: float
    to_x: float
    category: str
    how: str
    bytes_before: int
    bytes_after: int
    predicted_bytes: int
    total_before: int
    total_after: int
    total_predicted: int
    targets: tuple[str, ...]


@dataclass(frozen=True)
class DriverScore:
    driver: str
    model: str
    max_rel_residual: float | None
    score: float | None
    chosen: bool


@dataclass(frozen=True)
class CapacityResult:
    """The `capacity` command's result (see the module docstring)."""

    driver: str
    model: str
    points: tuple[Point, ...]
    fits: tuple[FitRow, ...]
    jumps: tuple[Jump, ...]
    drivers: tuple[DriverScore, ...]
    contract: Contract | None
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"driver": self.driver, "model": self.model, "points": [p.to_json() for p in self.points],
                "fits": [asdict(f) for f in self.fits],
                "jumps": [{**asdict(j), "targets": list(j.targets)} for j in self.jumps],
                "drivers": [asdict(d) for d in self.drivers],
                "contract": None if self.contract is None else contract_json(self.contract),
                "notes": list(self.notes)}


def contract_json(contract: Contract) -> dict[str, Any]:
    """A `Contract` as JSON: its fields, in order."""
    doc = asdict(contract)
    for key in ("limits", "observed", "notes"):
        doc[key] = list(doc[key])
    return doc


def _number(value: Any) -> float | None:
    """A fit's float, or None where there is no number (an insufficient fit's NaN, a failed fit's inf)."""
    v = float(value)
    return v if math.isfinite(v) else None


def _plain(value: Any) -> Any:
    return plain(value, nan_as_none=True)


def capacity_result(cap: Capacity, contract: Contract | None = None) -> CapacityResult:
    """The typed result of a fitted sweep and its contract (see the module docstring)."""
    shapes = cap.sweep.shapes
    xs = dict(zip(cap.points["label"], cap.points["x"]))
    cats = cap.sweep.categories
    extra = [c for c in shapes.columns if c not in _MEASURED]
    points = []
    for r in shapes.to_dict("records"):
        mine = cats[cats["label"] == r["label"]]
        points.append(Point(
            label=r["label"], source=r["source"], phase=_plain(r["phase"]), device=int(r["device"]),
            shape=tuple((k, _plain(r[k])) for k in (*SHAPE_KEYS, *extra) if _plain(r[k]) is not None),
            x=float(xs[r["label"]]), peak_event_index=int(r["peak_event_index"]),
            baseline_bytes=int(r["baseline_bytes"]), peak_bytes=int(r["peak_bytes"]),
            transient_bytes=int(r["transient_bytes"]), reserved_bytes=int(r["reserved_bytes"]),
            max_reserved_bytes=int(r["max_reserved_bytes"]),
            categories=tuple((c.target, PointTarget(c.kind, int(c.baseline_bytes), int(c.peak_bytes),
                                                    int(c.transient_bytes))) for c in mine.itertuples())))
    return CapacityResult(
        driver=cap.driver, model=MODEL, points=tuple(points),
        fits=tuple(FitRow(r.target, r.kind, r.model, _number(r.intercept_bytes), _number(r.linear_bytes),
                          _number(r.quadratic_bytes), _number(r.max_rel_residual), int(r.points), float(r.from_x),
                          float(r.to_x), bool(r.jumped)) for r in cap.fits.itertuples()),
        jumps=tuple(Jump(r.from_label, r.to_label, float(r.from_x), float(r.to_x), r.category, r.how,
                         int(r.bytes_before), int(r.bytes_after), int(r.predicted_bytes), int(r.total_before),
                         int(r.total_after), int(r.total_predicted), tuple(r.targets))
                    for r in cap.jumps.itertuples()),
        drivers=tuple(DriverScore(r.driver, r.model, _number(r.max_rel_residual), _number(r.score), bool(r.chosen))
                      for r in cap.drivers.itertuples()),
        contract=contract, notes=tuple(cap.notes))
