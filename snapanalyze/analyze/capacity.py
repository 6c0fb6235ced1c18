"""Fit a measured sweep (`sweep`) and turn it into a capacity contract: fit, find jumps, solve for a budget.

Contract: `fit_capacity(sweep)` chooses the driver — the shape variable that best explains the total
transient — and fits transient bytes = a + b·t + c·q per target (t = m·x, q = m·x² for the driver's
per-sequence value x and m sequences) by least squares on relative residuals with non-negative coefficients,
choosing the model by the worst relative residual plus FIT_PENALTY per coefficient. It flags **jumps**:
consecutive shapes where a target grows more than JUMP_FACTOR × what the shapes before it predict (a category
absent before counts as predicted 0), naming the category; a category that only takes over bytes of its own
family (scores labelled `attention` at one length, `fallback_kernel` at the next) is not a jump. Fits start
after a target's last jump. A regime with fewer than MIN_FIT_SHAPES distinct shapes (or a negative measured
transient) is not fitted: its model is "insufficient" and its coefficients and residual are NaN — two shapes
fit any one-term model as well as another, so a 0 % residual there proves nothing. `capacity_contract(...)`
solves the fits for a device budget: the largest driver value per concurrency that fits beside the baseline,
the reserve to hold back, the observed points that fit. Fits and contracts are models and say so: an answer
beyond the measured shapes is `extrapolated`, and none goes past EXTRAPOLATION_LIMIT × the largest measured
shape (per-sequence x, and x × concurrency against the largest measured t) — there it is `bounded`.

DataFrame columns:
- `Capacity.points`: label, x, multiplier, t, q, then one column per target (transient bytes; "total" is
  the window transient).
- `Capacity.fits`: target, kind ("total" | "family" | "category"), model, intercept_bytes, linear_bytes,
  quadratic_bytes, max_rel_residual, points, from_x, to_x, jumped.
- `Capacity.jumps`: from_label, to_label, from_x, to_x, category, how ("appears" | "grows"), bytes_before,
  bytes_after, predicted_bytes, total_before, total_after, total_predicted, targets (list of every target
  that jumped there).
- `Capacity.drivers`: driver, model, max_rel_residual, score, chosen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..errors import UsageError
from .sweep import FAMILIES, Sweep

FIT_PENALTY = 0.02          # an extra coefficient must cut the worst relative residual by 2 points
JUMP_FACTOR = 2.0           # grown past twice the prediction from the shapes before
MATERIAL_MIN_BYTES = 1 << 20
MATERIAL_SHARE = 0.05       # … and by at least 5 % of that shape's total transient (and ≥ 1 MiB)
MIN_FIT_SHAPES = 3          # distinct shapes a regime needs before its fit is a model
EXTRAPOLATION_LIMIT = 2.0   # answers stop at 2× the largest measured shape
DRIVER_ORDER = ("tokens", "chunk", "images", "batch")
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)

FIT_COLUMNS = ["target", "kind", "model", "intercept_bytes", "linear_bytes", "quadratic_bytes", "max_rel_residual",
               "points", "from_x", "to_x", "jumped"]
JUMP_COLUMNS = ["from_label", "to_label", "from_x", "to_x", "category", "how", "bytes_before", "bytes_after",
                "predicted_bytes", "total_before", "total_after", "total_predicted", "targets"]
DRIVER_COLUMNS = ["driver", "model", "max_rel_residual", "score", "chosen"]


# ---------------------------------------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fit:
    """bytes = intercept + linear·t + quadratic·q, all coefficients ≥ 0; `model` names the highest term, or
    says why there is no model: "none" (no non-negative fit) or "insufficient" (too few shapes: see
    `fit_capacity`); those predict NaN."""

    model: str                  # "constant" | "linear" | "quadratic" | "none" | "insufficient"
    intercept: float
    linear: float
    quadratic: float
    max_rel_residual: float     # max |fit − y| / y over the fitted points (y floored, see `fit_bytes`)
    points: int

    @property
    def usable(self) -> bool:
        """Whether this is a model one may evaluate (not "none" nor "insufficient")."""
        return self.model in ("constant", "linear", "quadratic")

    def predict(self, t: Any, q: Any) -> np.ndarray:
        tt, qq = np.asarray(t, dtype=float), np.asarray(q, dtype=float)
        if not self.usable:
            return np.full(np.broadcast(tt, qq).shape, np.nan)
        return self.intercept + self.linear * tt + self.quadratic * qq

    @property
    def coefficients(self) -> int:
        return sum(1 for c in (self.intercept, self.linear, self.quadratic) if c > 0)


def _floor(y: np.ndarray) -> np.ndarray:
    return np.maximum(np.abs(y), max(1.0, 1e-3 * float(np.max(np.abs(y), initial=0.0))))


def fit_bytes(t: Sequence[float] | np.ndarray, q: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray,
              penalty: float = FIT_PENALTY) -> Fit:
    """Fit y ≈ a + b·t + c·q with a, b, c ≥ 0, minimising squared relative residuals (|y| floored at 0.1 %
    of the largest |y|). Every subset of the three terms is a candidate (the non-negative optimum lies in
    one) if it has fewer coefficients than there are distinct (t, q) points (or one coefficient); the
    winner minimises max relative residual + `penalty` × coefficients."""
    tt, qq, yy = (np.asarray(v, dtype=float) for v in (t, q, y))
    n = len(yy)
    if n == 0:
        return Fit("none", 0.0, 0.0, 0.0, 0.0, 0)
    if not np.any(yy):
        return Fit("constant", 0.0, 0.0, 0.0, 0.0, n)
    distinct = len({(a, b) for a, b in zip(tt.tolist(), qq.tolist())})
    basis = np.column_stack([np.ones(n), tt, qq])
    scale = np.maximum(np.abs(basis).max(axis=0), 1e-300)
    w = 1.0 / _floor(yy)
    best: tuple[float, int, np.ndarray, float] | None = None
    for subset in ((0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)):
        k = len(subset)
        if k > max(1, distinct - 1):
            continue
        cols = list(subset)
        a = basis[:, cols] / scale[cols] * w[:, None]
        sol, *_ = np.linalg.lstsq(a, yy * w, rcond=None)
        coef = np.zeros(3)
        coef[cols] = sol / scale[cols]
        if np.any(coef[cols] <= 0):
            continue
        rel = float(np.max(np.abs(basis @ coef - yy) / _floor(yy)))
        score = rel + penalty * k
        if best is None or (score, k) < (best[0], best[1]):
            best = (score, k, coef, rel)
    if best is None:  # pragma: no cover - a one-term fit of positive data always has a positive coefficient
        return Fit("none", 0.0, 0.0, 0.0, float("inf"), n)
    _, _, coef, rel = best
    model = "quadratic" if coef[2] > 0 else "linear" if coef[1] > 0 else "constant"
    return Fit(model, float(coef[0]), float(coef[1]), float(coef[2]), rel, n)


def _driver_x(shapes: pd.DataFrame, driver: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Per point: the driver's per-sequence value x and the multiplier m (sequences), or None if undefined."""
    def col(key: str) -> pd.Series:
        return shapes[key] if key in shapes.columns else pd.Series([pd.NA] * len(shapes), dtype="Int64")

    batch = col("batch").fillna(1).astype(float).to_numpy()
    if driver == "tokens":
        x = col("tokens")
    elif driver == "chunk":
        chunk, tokens = col("chunk"), col("tokens")
        if chunk.isna().any():
            return None
        x = pd.Series(np.where(tokens.isna(), chunk.astype(float), np.minimum(chunk.astype(float),
                                                                                 tokens.astype(float).fillna(0))))
    elif driver == "images":
        x = col("images")
    elif driver == "batch":
        x, batch = col("batch"), np.ones(len(shapes))
    else:
        raise UsageError(f"unknown driver {driver!r}: expected one of {', '.join(DRIVER_ORDER)}")
    if x.isna().any():
        return None
    return x.astype(float).to_numpy(), batch


@dataclass(frozen=True, eq=False)
class Capacity:
    """The fitted sweep: driver, per-point features and targets, fits, jumps (see the module docstring)."""

    sweep: Sweep
    driver: str
    points: pd.DataFrame
    fits: pd.DataFrame
    jumps: pd.DataFrame
    drivers: pd.DataFrame
    regimes: dict[str, list[tuple[float, float, Fit]]] = field(repr=False)
    notes: tuple[str, ...] = ()

    def fit(self, target: str = "total") -> Fit:
        """The fit of `target` in its last regime (after its last jump)."""
        return self.regimes[target][-1][2]


def _material(total: np.ndarray) -> np.ndarray:
    return np.maximum(MATERIAL_MIN_BYTES, MATERIAL_SHARE * np.maximum(total, 0))


def _predict_from(prefix: np.ndarray, t: np.ndarray, q: np.ndarray, x: np.ndarray, y: np.ndarray,
                  tj: float, qj: float) -> float:
    """The most the shapes `prefix` let one expect at (tj, qj): the larger of their fit (with ≥ 3 distinct
    x) and quadratic growth from the previous shape (y · qj / q), the steepest a materialised score grows."""
    if len(prefix) == 0:
        return 0.0
    previous = prefix[x[prefix] == x[prefix].max()]
    steepest = max((float(y[i]) * qj / float(q[i]) for i in previous if q[i] > 0), default=0.0)
    if len(np.unique(x[prefix])) >= 3:
        return max(steepest, float(fit_bytes(t[prefix], q[prefix], y[prefix]).predict(tj, qj)))
    return steepest


def _target_jumps(x: np.ndarray, t: np.ndarray, q: np.ndarray, y: np.ndarray, material: np.ndarray) \
        -> list[tuple[int, int, float]]:
    """(index before, index that jumped, predicted bytes there) for each jump of one target series."""
    jumps: list[tuple[int, int, float]] = []
    groups = np.unique(x)
    start = groups[0]
    for k in range(1, len(groups)):
        prefix = np.flatnonzero((x >= start) & (x < groups[k]))
        here = np.flatnonzero(x == groups[k])
        hit = None
        for j in here:
            pred = _predict_from(prefix, t, q, x, y, t[j], q[j])
            if y[j] > JUMP_FACTOR * pred and y[j] - pred >= material[j]:
                hit = (int(prefix[np.argmax(x[prefix])]), int(j), pred)
                break
        if hit is not None:
            jumps.append(hit)
            start = groups[k]
    return jumps


def _choose_driver(shapes: pd.DataFrame, total: np.ndarray, driver: str | None
                   ) -> tuple[str, np.ndarray, np.ndarray, list[dict[str, Any]]]:
    """The driver that explains the total transient best (or the one asked for): (name, x, m, rows)."""
    driver_rows: list[dict[str, Any]] = []
    candidates: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name in ([driver] if driver else DRIVER_ORDER):
        found = _driver_x(shapes, name)
        if found is None or len(np.unique(found[0] * found[1])) < 2:
            if driver:
                raise UsageError(f"capacity: driver {driver!r} is not known (or does not vary) for every point")
            continue
        x, m = found
        f = fit_bytes(m * x, m * x * x, total)
        candidates[name] = (x, m)
        driver_rows.append({"driver": name, "model": f.model, "max_rel_residual": f.max_rel_residual,
                            "score": f.max_rel_residual + FIT_PENALTY * f.coefficients, "chosen": False})
    if not candidates:
        raise UsageError("capacity: no shape variable varies across the sweep (tokens, batch, chunk, images)")
    best = min(driver_rows, key=lambda r: (round(float(r["score"]), 9), DRIVER_ORDER.index(str(r["driver"]))))
    best["chosen"] = True
    chosen = str(best["driver"])
    return chosen, *candidates[chosen], driver_rows


def _target_series(cats: pd.DataFrame, labels: np.ndarray, total: np.ndarray) -> dict[str, tuple[str, np.ndarray]]:
    """Per target (the total, each family, each category with bytes): (kind, transient per point in order)."""
    series: dict[str, tuple[str, np.ndarray]] = {"total": ("total", total)}
    for kind in ("family", "category"):
        sub = cats[cats["kind"] == kind]
        for target in sorted(sub["target"].unique()):
            by_label = sub[sub["target"] == target].set_index("label")["transient_bytes"]
            values = np.array([float(by_label.get(lb, 0)) for lb in labels])
            if np.any(values > 0):
                series[target] = (kind, values)
    return series


@dataclass(frozen=True, eq=False)
class _Curves:
    """The sweep's points in driver order: x, t = m·x, q = m·x², the targets' series and the kept jumps."""

    x: np.ndarray
    t: np.ndarray
    q: np.ndarray
    series: dict[str, tuple[str, np.ndarray]]
    kept: dict[str, list[tuple[int, int, float]]]        # target → (from point, to point, predicted) jumps

    def expected_at(self, target: str, j: int) -> float:
        """What the target's shapes before x[j] (since its last kept jump) predict at point j."""
        x = self.x
        starts = [float(x[jj]) for _, jj, _ in self.kept[target] if x[jj] < x[j]]
        lo = max(starts, default=float(x[0]))
        return _predict_from(np.flatnonzero((x >= lo) & (x < x[j])), self.t, self.q, x, self.series[target][1],
                             self.t[j], self.q[j])


def _kept_jumps(c_x: np.ndarray, t: np.ndarray, q: np.ndarray, series: dict[str, tuple[str, np.ndarray]],
                material: np.ndarray) -> dict[str, list[tuple[int, int, float]]]:
    """Each target's jumps, without a category's that only relabel bytes inside its family."""
    raw = {target: _target_jumps(c_x, t, q, y, material) for target, (_, y) in series.items()}
    family_of = {c: fam for fam, members in FAMILIES.items() for c in members}
    kept: dict[str, list[tuple[int, int, float]]] = {}
    for target, js in raw.items():
        fam = family_of.get(target) if series[target][0] == "category" else None
        if fam is not None:                      # a relabel inside a family is no jump
            fam_at = {float(c_x[j]) for _, j, _ in raw.get(fam, [])}
            js = [jp for jp in js if float(c_x[jp[1]]) in fam_at]
        kept[target] = js
    return kept


def _jump_rows(c: _Curves, labels: np.ndarray, material: np.ndarray) -> list[dict[str, Any]]:
    """One row per x where something jumped, naming the category that jumped (or the largest riser)."""
    x, series, total = c.x, c.series, c.series["total"][1]
    rows = []
    for xj in sorted({float(x[jp[1]]) for js in c.kept.values() for jp in js}):
        at = {target: jp for target, js in c.kept.items() for jp in js if float(x[jp[1]]) == xj}
        cat_hits = {tg: jp for tg, jp in at.items() if series[tg][0] == "category"}
        if cat_hits:
            name = max(cat_hits, key=lambda tg: (float(series[tg][1][cat_hits[tg][1]] - cat_hits[tg][2]), tg))
            i, j, pred = cat_hits[name]
        else:                                    # a family or the total jumped: name its largest riser
            i, j, _ = next(iter(at.values()))
            cats = [tg for tg, (kind, _) in series.items() if kind == "category"]
            name = max(cats, key=lambda tg: (float(series[tg][1][j] - series[tg][1][i]), tg)) if cats else "total"
            pred = c.expected_at(name, j)
        y = series[name][1]
        total_pred = at["total"][2] if "total" in at else c.expected_at("total", j)
        absent_before = float(np.max(y[x < x[j]], initial=0.0)) < material[j] * 0.2
        rows.append({
            "from_label": labels[i], "to_label": labels[j], "from_x": float(x[i]), "to_x": float(x[j]),
            "category": name, "how": "appears" if absent_before else "grows",
            "bytes_before": int(y[i]), "bytes_after": int(y[j]), "predicted_bytes": int(round(pred)),
            "total_before": int(total[i]), "total_after": int(total[j]), "total_predicted": int(round(total_pred)),
            "targets": sorted(at),
        })
    return rows


def _regime_fit(t: np.ndarray, q: np.ndarray, y: np.ndarray) -> Fit:
    """The fit of one regime, or "insufficient" below MIN_FIT_SHAPES distinct shapes or with a negative
    measured transient (a window that freed more than it allocated has no transient to model)."""
    distinct = len({(a, b) for a, b in zip(t.tolist(), q.tolist())})
    if distinct < MIN_FIT_SHAPES or np.any(y < 0):
        nan = float("nan")
        return Fit("insufficient", nan, nan, nan, nan, len(y))
    return fit_bytes(t, q, y)


def _regimes(c: _Curves, material: np.ndarray) -> tuple[dict[str, list[tuple[float, float, Fit]]],
                                                         list[dict[str, Any]]]:
    """Each target's fits per regime (between its jumps, from where it is present) and its last fit's row."""
    x, t, q = c.x, c.t, c.q
    fit_rows, regimes = [], {}
    for target, (kind, y) in c.series.items():
        starts = [float(x[0])] + [float(x[j]) for _, j, _ in c.kept[target]]
        present = np.flatnonzero(y >= material * (0.2 if kind != "total" else 0.0))
        if kind != "total" and len(present):
            first_present = float(x[present[0]])
            starts = list(dict.fromkeys(max(s, first_present) for s in starts))
        bounds = starts[1:] + [math.inf]
        regs = []
        for lo, hi in zip(starts, bounds):
            idx = np.flatnonzero((x >= lo) & (x < hi))
            regs.append((lo, float(x[idx].max()) if len(idx) else lo, _regime_fit(t[idx], q[idx], y[idx])))
        regimes[target] = regs
        lo, hi, f = regs[-1]
        fit_rows.append({"target": target, "kind": kind, "model": f.model, "intercept_bytes": f.intercept,
                         "linear_bytes": f.linear, "quadratic_bytes": f.quadratic,
                         "max_rel_residual": f.max_rel_residual, "points": f.points, "from_x": lo, "to_x": hi,
                         "jumped": bool(c.kept[target])})
    return regimes, fit_rows


def fit_capacity(sweep: Sweep, driver: str | None = None) -> Capacity:
    """Choose the driver, fit every target, find the jumps (see the module docstring)."""
    shapes = sweep.shapes
    if len(shapes) < 2:
        raise UsageError(f"capacity: a sweep needs at least 2 shapes, got {len(shapes)}")
    total = shapes["transient_bytes"].to_numpy().astype(float)
    chosen, x, m, driver_rows = _choose_driver(shapes, total, driver)
    order = np.lexsort((shapes["label"].to_numpy(), m, x))
    x, m, total = x[order], m[order], total[order]
    labels = shapes["label"].to_numpy()[order]
    t, q = m * x, m * x * x
    series = _target_series(sweep.categories, labels, total)
    material = _material(total)
    curves = _Curves(x=x, t=t, q=q, series=series, kept=_kept_jumps(x, t, q, series, material))
    jump_rows = _jump_rows(curves, labels, material)
    regimes, fit_rows = _regimes(curves, material)
    points = pd.DataFrame({"label": labels, "x": x, "multiplier": m, "t": t, "q": q,
                           **{target: y for target, (_, y) in series.items()}})
    notes = list(sweep.notes)
    if chosen == "chunk":
        notes.append("the transient follows the chunk size (tokens per prefill step), not the prompt length")
    return Capacity(sweep=sweep, driver=chosen, points=points,
                    fits=pd.DataFrame(fit_rows, columns=FIT_COLUMNS),
                    jumps=pd.DataFrame(jump_rows, columns=JUMP_COLUMNS),
                    drivers=pd.DataFrame(driver_rows, columns=DRIVER_COLUMNS), regimes=regimes, notes=tuple(notes))


# ---------------------------------------------------------------------------------------------------------
# The contract
# ---------------------------------------------------------------------------------------------------------

def _solve(f: Fit, m: float, available: float) -> float | None:
    """Largest x ≥ 0 with f(m·x, m·x²) ≤ available; inf when f does not grow; None when even x = 0 fails."""
    a, b, c = f.intercept, f.linear * m, f.quadratic * m
    if a > available:
        return None
    if c > 0:
        return (-b + math.sqrt(b * b + 4 * c * (available - a))) / (2 * c)
    if b > 0:
        return (available - a) / b
    return math.inf


@dataclass(frozen=True)
class DriverLimit:
    """The largest driver value whose modelled total transient fits, from which regime, what it predicts
    there, whether that lies beyond the measured shapes (`extrapolated`), whether the model would allow more
    than the trusted range and max_x is that bound (`bounded`; `unbounded` too when the model never reaches
    the budget). max_x None: nothing fits, nothing within the trusted range (`bounded`), or no regime has
    enough shapes to fit (`insufficient`)."""

    max_x: int | None
    regime_from_x: float | None
    predicted_bytes: float | None
    extrapolated: bool
    unbounded: bool
    bounded: bool = False
    insufficient: bool = False


@dataclass(frozen=True)
class ContractLimit:
    """At one concurrency: the largest driver value that fits, driver × concurrency, the modelled transient
    there, whether it extrapolates beyond the measured shapes (or concurrencies), whether it is the trusted
    bound rather than the budget's answer (`bounded`), whether there was too little data (`insufficient`)."""

    concurrency: int
    max_x: int | None
    max_total: int | None
    predicted_bytes: int | None
    extrapolated: bool
    unbounded: bool
    bounded: bool = False
    insufficient: bool = False


@dataclass(frozen=True)
class Reserve:
    """The transient to hold back for the target shape `x` (with its multiplier): modelled (None: its regime
    has no model), measured (None: not a measured shape), the reserve with the margin, whether baseline +
    reserve fits and the headroom left (all None when neither a model nor a measurement gives a number), and
    whether the number is extrapolated (modelled past the measured shapes or across a jump's gap)."""

    x: float
    multiplier: float
    predicted_bytes: int | None
    measured_bytes: int | None
    reserve_bytes: int | None
    fits: bool | None
    headroom_bytes: int | None
    extrapolated: bool = False


@dataclass(frozen=True)
class ObservedPoint:
    """A measured shape's peak against the budget (`fits` None without a device budget)."""

    label: str
    x: float
    peak_bytes: int
    fits: bool | None


@dataclass(frozen=True)
class Contract:
    """The fitted sweep solved for a budget (see `capacity_contract`)."""

    driver: str
    budget_bytes: int | None
    baseline_bytes: int
    transient_budget_bytes: int
    margin: float
    limits: tuple[ContractLimit, ...]
    reserve: Reserve
    observed: tuple[ObservedPoint, ...]
    notes: tuple[str, ...]


def trusted_bound(cap: Capacity, multiplier: float = 1.0) -> float:
    """The largest driver value an answer may give at `multiplier` sequences: EXTRAPOLATION_LIMIT × the
    largest measured x, and EXTRAPOLATION_LIMIT × the largest measured t (= sequences × x) over `multiplier`."""
    pts = cap.points
    return EXTRAPOLATION_LIMIT * min(float(pts["x"].max()), float(pts["t"].max()) / multiplier)


def max_driver_value(cap: Capacity, available: float, multiplier: float = 1.0) -> DriverLimit:
    """The largest driver value whose modelled total transient fits in `available` bytes, across regimes:
    a regime below a jump is only trusted up to its last measured shape (the threshold lies somewhere after
    it), the last one up to `trusted_bound`, and a regime without a model ("insufficient") not at all."""
    regs = cap.regimes["total"]
    pts = cap.points
    x_seen, t_max = pts["x"].to_numpy(), float(pts["t"].max())
    bound = trusted_bound(cap, multiplier)
    modelled = bounded_out = False
    for r in range(len(regs) - 1, -1, -1):
        lo, last, f = regs[r]
        if not f.usable:
            continue
        modelled = True
        final = r == len(regs) - 1
        x_star = _solve(f, multiplier, available)
        floor = 0.0 if r == 0 else lo
        if x_star is None or x_star < floor:
            continue
        model_x = min(x_star, math.inf if final else last)
        bounded = model_x > bound
        best = math.floor(min(model_x, bound))
        if best < floor or best < 1:
            bounded_out = bounded_out or bounded
            continue
        beyond = best > x_seen.max() or best < x_seen.min() or multiplier * best > t_max
        return DriverLimit(int(best), lo, float(f.predict(multiplier * best, multiplier * best * best)),
                           bool(beyond or bounded), bool(final and math.isinf(x_star)), bool(bounded))
    return DriverLimit(None, None, None, False, False, bounded=bounded_out, insufficient=not modelled)


def _reserve(cap: Capacity, target_x: float | None, margin: float, available: float) -> tuple[Reserve, list[str]]:
    """The reserve for the target shape (default the largest measured) and the notes it needs."""
    pts, driver = cap.points, cap.driver
    x_seen = pts["x"].to_numpy()
    tx = float(x_seen.max()) if target_x is None else float(target_x)
    if tx < 0 or tx > EXTRAPOLATION_LIMIT * x_seen.max():
        raise UsageError(f"capacity: the target {driver} {tx:g} is outside 0 … {EXTRAPOLATION_LIMIT:g}× the "
                         f"largest measured shape ({x_seen.max():g}): the fits are not trusted that far; measure a "
                         "larger shape")
    at_target = pts[pts["x"] == tx]
    m_target = float(at_target["multiplier"].max()) if len(at_target) else 1.0
    regs = cap.regimes["total"]
    r = next((k for k in range(len(regs) - 1, -1, -1) if tx >= regs[k][0]), 0)
    fit = regs[r][2]
    predicted = float(fit.predict(m_target * tx, m_target * tx * tx)) if fit.usable else None
    measured = float(at_target["total"].max()) if len(at_target) else None
    notes = []
    in_gap = r < len(regs) - 1 and tx > regs[r][1]          # after a regime's last shape, before the jump's regime
    extrapolated = measured is None and (tx > x_seen.max() or tx < x_seen.min() or in_gap)
    if measured is None and predicted is not None:
        where = (f"between {driver} {regs[r][1]:g} and {regs[r + 1][0]:g}, where the transient jumps" if in_gap
                 else "beyond the measured shapes" if extrapolated else "between measured shapes")
        notes.append(f"the reserve for {driver} {tx:g} is modelled, not measured ({where})")
    basis = max((v for v in (predicted, measured) if v is not None), default=None)
    if basis is None:
        notes.append(f"insufficient data to size the reserve for {driver} {tx:g}: it was not measured and its regime "
                     f"has fewer than {MIN_FIT_SHAPES} shapes to fit")
        return Reserve(tx, m_target, None, None, None, None, None, False), notes
    reserve = int(math.ceil(basis * (1.0 + margin)))
    return Reserve(x=tx, multiplier=m_target, predicted_bytes=None if predicted is None else int(round(predicted)),
                   measured_bytes=None if measured is None else int(measured), reserve_bytes=reserve,
                   fits=bool(reserve <= available), headroom_bytes=int(available - reserve),
                   extrapolated=bool(extrapolated)), notes


def capacity_contract(cap: Capacity, budget_bytes: int | None = None, transient_budget_bytes: int | None = None,
                      margin: float | None = None, concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
                      target_x: float | None = None) -> Contract:
    """Solve the fitted sweep for a device budget (active bytes beside the baseline) and/or a transient budget.

    The `Contract`: driver; budget_bytes; baseline_bytes (the largest measured baseline: weights, KV cache,
    buffers); transient_budget_bytes (what the transient may use; negative when the baseline alone exceeds
    the budget); margin (the fraction added to every modelled transient, default the worst relative residual
    of the total's fits); limits (per concurrency, `ContractLimit`, stopping at the first without an answer);
    reserve (the transient to hold back for the target shape, default the largest measured, with the margin:
    `Reserve`; a target past EXTRAPOLATION_LIMIT × the largest measured is a UsageError); observed (each
    measured point's peak against the budget); notes (what is extrapolated, bounded or lacks data)."""
    if budget_bytes is None and transient_budget_bytes is None:
        raise UsageError("capacity contract: give a device budget and/or a transient budget")
    shapes = cap.sweep.shapes
    baseline = int(shapes["baseline_bytes"].max())
    limits = [b for b in ((budget_bytes - baseline) if budget_bytes is not None else None, transient_budget_bytes)
              if b is not None]
    available = min(limits)
    regs = cap.regimes["total"]
    if margin is None:
        margin = max((f.max_rel_residual for _, _, f in regs if f.usable and math.isfinite(f.max_rel_residual)),
                     default=0.0)
    if margin < 0:
        raise UsageError("capacity contract: the margin must be ≥ 0")
    effective = available / (1.0 + margin)
    notes = []
    rows: list[ContractLimit] = []
    pts = cap.points
    seen_m = pts["multiplier"].to_numpy()
    driver = cap.driver
    if available <= 0:
        notes.append(f"the baseline ({baseline:,} bytes) already exceeds the budget: nothing fits")
    else:
        for c in concurrency:
            found = max_driver_value(cap, effective, float(c))
            measured_c = bool(seen_m.min() <= c <= seen_m.max())
            rows.append(ContractLimit(
                concurrency=int(c), max_x=found.max_x,
                max_total=None if found.max_x is None else int(found.max_x * c),
                predicted_bytes=None if found.predicted_bytes is None else int(round(found.predicted_bytes)),
                extrapolated=bool(found.max_x is not None and (found.extrapolated or not measured_c)),
                unbounded=found.unbounded, bounded=found.bounded, insufficient=found.insufficient))
            if found.max_x is None:
                break
    usable = [(lo, f) for lo, _, f in regs if f.usable]
    if not usable:
        notes.append(f"insufficient data: no regime of the total transient has {MIN_FIT_SHAPES} or more shapes to "
                     f"fit ({len(pts)} measured); measure more shapes")
    elif not regs[-1][2].usable:
        lo, _, f = regs[-1]
        notes.append(f"the total's last regime (from {driver} {lo:g}) has {f.points} measured shape(s), fewer than "
                     f"{MIN_FIT_SHAPES} to fit: the contract stops at the last shape before it")
    if any(lim.bounded for lim in rows):
        x_max, t_max = float(pts["x"].max()), float(pts["t"].max())
        largest = f"{driver} {x_max:g}" + ("" if t_max == x_max else f" per sequence, {t_max:g} across sequences")
        notes.append(f"answers stop at {EXTRAPOLATION_LIMIT:g}× the largest measured shape ({largest}, also "
                     "across concurrent sequences): the fits are not trusted further; measure larger shapes to go "
                     "further")
    total_jumps = cap.jumps[[("total" in list(t)) for t in cap.jumps["targets"]]] if len(cap.jumps) else cap.jumps
    if len(total_jumps):
        last = total_jumps.iloc[-1]
        notes.append(f"{last['category']} jumps between {driver} {last['from_x']:g} and {last['to_x']:g}: "
                     "below the jump the contract trusts each regime only up to its last measured shape")
    reserve, reserve_notes = _reserve(cap, target_x, margin, available)
    notes.extend(reserve_notes)
    observed = tuple(ObservedPoint(r.label, float(px), int(r.peak_bytes),
                                   None if budget_bytes is None else bool(r.peak_bytes <= budget_bytes))
                     for r, px in zip(shapes.itertuples(), _driver_x(shapes, driver)[0]))  # type: ignore[index]
    return Contract(driver=driver, budget_bytes=budget_bytes, baseline_bytes=baseline,
                    transient_budget_bytes=int(available), margin=float(margin), limits=tuple(rows),
                    reserve=reserve, observed=observed, notes=tuple(notes))
