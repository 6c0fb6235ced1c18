"""Turn a sweep over batch shapes into a capacity contract: measure, fit, find jumps, solve for a budget.

Contract: a sweep is a list of `SweepPoint`s, each one snapshot window (a whole trace, or one phase span of
it) with its shape — `tokens` (prompt tokens per sequence), `batch` (sequences per forward), `chunk`
(chunked-prefill tokens per step), `images` — read from file names, a manifest CSV or phase markers
(`sweep_points`). `measure_sweep(points)` replays each window and reports the baseline (active bytes when
the window began), the peak (the window's maximum of active bytes) and the transient (peak − baseline);
per category, and per family of related categories (`FAMILIES`), the bytes live at the peak (exactly as
`attribute` labels them: they sum to the peak), the bytes live when the window began, and the transient
high-water mark (the most bytes of that category allocated inside the window and live at once).
`fit_capacity(sweep)` chooses the driver — the shape variable that best explains the total transient — and
fits transient bytes = a + b·t + c·q per target (t = m·x, q = m·x² for the driver's per-sequence value x
and m sequences) by least squares on relative residuals with non-negative coefficients, choosing the model
by the worst relative residual plus FIT_PENALTY per coefficient. It flags **jumps**: consecutive shapes
where a target grows more than JUMP_FACTOR × what the shapes before it predict (a category absent before
counts as predicted 0), naming the category; a category that only takes over bytes of its own family
(scores labelled `attention` at one length, `fallback_kernel` at the next) is not a jump. Fits start after
a target's last jump. `capacity_contract(...)` solves the fits for a device budget: the largest driver
value per concurrency that fits beside the baseline, the reserve to hold back, the observed points that fit.
Bytes are requested bytes, exact from the replay; fits and contracts are models and say so.

DataFrame columns:
- `Sweep.shapes`: label, source, phase, device, tokens, batch, chunk, images (nullable ints), any extra
  manifest columns, first_index, last_index, peak_event_index, peak_time_us, baseline_bytes, peak_bytes,
  transient_bytes, reserved_bytes (at the peak), max_reserved_bytes (over the window).
- `Sweep.categories`: label, target, kind ("category" | "family"), baseline_bytes, peak_bytes,
  transient_bytes (in-window high-water), max_bytes (high-water of everything live, baseline included).
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

import csv
import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import BadInputError, UsageError
from ..load import load
from ..load.samples import markers_for
from ..model import Snapshot
from ..replay import Timeline, replay
from .attribute import attribute, label_lifetimes
from .diff import phase_spans
from .phases import window_bounds, window_peak
from .rules import RuleSet, load_rules

SHAPE_KEYS = ("tokens", "batch", "chunk", "images")
# Names a shape variable goes by in file names, manifest headers and marker attributes (lower case).
SHAPE_ALIASES: dict[str, tuple[str, ...]] = {
    "tokens": ("tokens", "token", "tok", "ctx", "context", "prompt_tokens", "prompt", "seqlen", "seq_len", "seq",
               "num_tokens", "len", "length"),
    "batch": ("batch_size", "batch", "bs", "concurrency", "conc", "num_seqs"),
    "chunk": ("chunk_size", "chunksize", "chunk"),
    "images": ("num_images", "images", "image", "imgs", "img"),
}
FILE_COLUMNS = ("file", "path", "snapshot", "name")
# Families of categories whose bytes are one thing under different labels (materialised attention scores
# are `attention` or `fallback_kernel` depending on which signal decided); jumps and fits consider the sum.
FAMILIES: dict[str, tuple[str, ...]] = {"attention_related": ("attention", "fallback_kernel")}

FIT_PENALTY = 0.02          # an extra coefficient must cut the worst relative residual by 2 points
JUMP_FACTOR = 2.0           # grown past twice the prediction from the shapes before
MATERIAL_MIN_BYTES = 1 << 20
MATERIAL_SHARE = 0.05       # … and by at least 5 % of that shape's total transient (and ≥ 1 MiB)
DRIVER_ORDER = ("tokens", "chunk", "images", "batch")
DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)

SHAPE_COLUMNS = ["label", "source", "phase", "device", *SHAPE_KEYS]
MEASURE_COLUMNS = ["first_index", "last_index", "peak_event_index", "peak_time_us", "baseline_bytes", "peak_bytes",
                   "transient_bytes", "reserved_bytes", "max_reserved_bytes"]
CATEGORY_COLUMNS = ["label", "target", "kind", "baseline_bytes", "peak_bytes", "transient_bytes", "max_bytes"]
FIT_COLUMNS = ["target", "kind", "model", "intercept_bytes", "linear_bytes", "quadratic_bytes", "max_rel_residual",
               "points", "from_x", "to_x", "jumped"]
JUMP_COLUMNS = ["from_label", "to_label", "from_x", "to_x", "category", "how", "bytes_before", "bytes_after",
                "predicted_bytes", "total_before", "total_after", "total_predicted", "targets"]
DRIVER_COLUMNS = ["driver", "model", "max_rel_residual", "score", "chosen"]
LEVEL_COLUMNS = ["target", "baseline_bytes", "transient_bytes", "max_bytes"]


# ---------------------------------------------------------------------------------------------------------
# Shapes: from file names, a manifest, or phase markers
# ---------------------------------------------------------------------------------------------------------

def _alias_pattern(aliases: Sequence[str]) -> re.Pattern[str]:
    names = "|".join(re.escape(a) for a in sorted(aliases, key=len, reverse=True))
    return re.compile(rf"(?<![A-Za-z])(?:{names})[=_-]?(\d+)([kK])?(?![0-9A-Za-z])", re.IGNORECASE)


_FILENAME_PATTERNS = {key: _alias_pattern(aliases) for key, aliases in SHAPE_ALIASES.items()}


def shape_from_filename(name: str) -> dict[str, int]:
    """Shape variables written in a file name: `ctx1024`, `tokens=32768`, `bs4`, `batch=4`, `chunk=2048`,
    `images=8`, `ctx32k` (k = 1024). Raises UsageError when one variable is given two different values."""
    stem = Path(name).name
    for suffix in (".gz", ".pickle", ".pkl", ".json", ".pt"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
    shape: dict[str, int] = {}
    for key, pattern in _FILENAME_PATTERNS.items():
        values = {int(m.group(1)) * (1024 if m.group(2) else 1) for m in pattern.finditer(stem)}
        if len(values) > 1:
            raise UsageError(f"{name}: the file name gives {key} several values ({sorted(values)})")
        if values:
            shape[key] = values.pop()
    return shape


def _canonical(column: str) -> str | None:
    low = column.strip().lower()
    for key, aliases in SHAPE_ALIASES.items():
        if low in aliases:
            return key
    return None


def _shape_value(where: str, key: str, value: Any) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{where}: {key} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0 or number != int(number):
        raise UsageError(f"{where}: {key} must be a whole number ≥ 0, got {value!r}")
    return int(number)


def read_manifest(path: str | Path) -> pd.DataFrame:
    """A manifest CSV mapping snapshot files to shapes: one column naming the file (`file`, `path`, `snapshot`
    or `name`; relative to the manifest's folder), shape columns by any of their aliases (`SHAPE_ALIASES`),
    and any other columns (kept as text). Returns columns path (resolved), file, the shape keys present,
    then the extra columns. Raises BadInputError for an unreadable or malformed manifest."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(path, f"cannot read the manifest ({exc})") from None
    rows = [r for r in rows if any(c.strip() for c in r)]
    if len(rows) < 2:
        raise BadInputError(path, "the manifest needs a header row and at least one row")
    header = [h.strip() for h in rows[0]]
    file_cols = [i for i, h in enumerate(header) if h.lower() in FILE_COLUMNS]
    if not file_cols:
        raise BadInputError(path, f"no file column (one of {', '.join(FILE_COLUMNS)}) in the header {header}")
    file_col = file_cols[0]
    shape_cols = {i: key for i, h in enumerate(header) if i != file_col and (key := _canonical(h))}
    if len(set(shape_cols.values())) != len(shape_cols):
        raise BadInputError(path, f"two columns name the same shape variable: {header}")
    if not shape_cols:
        raise BadInputError(path, f"no shape column (tokens, batch, chunk, images or an alias) in {header}")
    out = []
    for n, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise BadInputError(path, f"line {n} has {len(row)} fields, the header has {len(header)}")
        file = row[file_col].strip()
        rec: dict[str, Any] = {"path": str((path.parent / file).resolve()), "file": file}
        for i, key in shape_cols.items():
            if row[i].strip():
                rec[key] = _shape_value(f"{path}: line {n}", key, row[i].strip())
        for i, h in enumerate(header):
            if i != file_col and i not in shape_cols:
                rec[h] = row[i].strip()
        out.append(rec)
    df = pd.DataFrame(out)
    if df["path"].duplicated().any():
        raise BadInputError(path, f"a file is listed twice: {sorted(df.loc[df['path'].duplicated(), 'file'])}")
    for key in SHAPE_KEYS:
        if key in df.columns:
            df[key] = df[key].astype("Int64")
    return df


@dataclass(frozen=True, eq=False)
class SweepPoint:
    """One measured shape: a snapshot window (µs bounds; None = open) and the shape it ran."""

    label: str
    source: str
    shape: dict[str, Any]
    snapshot: Snapshot
    window: tuple[int | None, int | None] = (None, None)
    phase: str | None = None


def _attrs_shape(where: str, attrs: dict[str, Any]) -> dict[str, int]:
    shape: dict[str, int] = {}
    for name, value in attrs.items():
        key = _canonical(str(name))
        if key is not None and isinstance(value, int | float) and not isinstance(value, bool):
            shape[key] = _shape_value(where, key, value)
    return shape


def _phase_keys(names: Sequence[str]) -> list[str]:
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    seen: dict[str, int] = {}
    keys = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        keys.append(n if counts[n] == 1 else f"{n}#{seen[n]}")
    return keys


def _points_from_markers(path: str, rank: int | None, tag: str | None) -> list[SweepPoint]:
    snapshot = load(path, rank, tag)
    base = Path(path).name
    markers = markers_for(path, rank, tag)      # the markers of the rank `load` read (empty: none)
    phases = markers[markers["kind"] == "phase"].reset_index(drop=True)
    points = []
    if len(phases):
        for key, row in zip(_phase_keys(list(phases["name"])), phases.itertuples()):
            shape = _attrs_shape(f"{path}: phase {key}", row.attrs)
            if shape:
                end = None if pd.isna(row.end_time_us) else int(row.end_time_us)
                points.append(SweepPoint(f"{base}:{key}", path, shape, snapshot, (int(row.start_time_us), end), key))
        return points
    spans = phase_spans(snapshot)
    for row in spans.itertuples():
        shape = shape_from_filename(row.name)
        if shape:
            start = None if pd.isna(row.start_us) else int(row.start_us)
            end = None if pd.isna(row.end_us) else int(row.end_us)
            points.append(SweepPoint(f"{base}:{row.phase}", path, shape, snapshot, (start, end), row.phase))
    return points


def sweep_points(inputs: Sequence[str], shape_from: str = "filename", rank: int | None = None,
                 tag: str | None = None) -> list[SweepPoint]:
    """Load the sweep: `shape_from` is "filename", "markers" (phase spans of each run's markers files, whose
    attrs carry the shape; for a file or a run without markers, `record_function` spans whose names carry
    it, e.g. `prefill tokens=4096`) or the path of a manifest CSV (with no inputs, every file it lists).
    Points come back sorted by shape. Raises UsageError when a shape is missing or there are no points."""
    points: list[SweepPoint] = []
    if shape_from == "filename":
        if not inputs:
            raise UsageError("capacity: give the snapshot files or runs of the sweep")
        for p in inputs:
            name = Path(p).name if not Path(p).is_dir() or not tag else f"{Path(p).name}-{tag}"
            shape = shape_from_filename(name)
            if not shape:
                raise UsageError(f"{p}: no shape in the file name (expected e.g. ctx1024, tokens=32768, bs4, "
                                 "chunk=2048, images=8); use --shape-from manifest.csv or markers")
            points.append(SweepPoint(Path(p).name, p, shape, load(p, rank, tag)))
    elif shape_from == "markers":
        if not inputs:
            raise UsageError("capacity: give the runs (or snapshot files) whose phases make the sweep")
        for p in inputs:
            found = _points_from_markers(p, rank, tag)
            if not found:
                raise UsageError(f"{p}: no phase with a shape (markers.parquet phases need attrs such as "
                                 "tokens=…; record_function spans need it in their name, e.g. 'prefill tokens=4096')")
            points.extend(found)
    elif shape_from.lower().endswith(".csv"):
        manifest = read_manifest(shape_from)
        by_path = {row["path"]: row for row in manifest.to_dict("records")}
        by_name: dict[str, list[dict[str, Any]]] = {}
        for row in by_path.values():
            by_name.setdefault(Path(row["file"]).name, []).append(row)
        chosen: list[tuple[str, dict[str, Any]]] = []
        if not inputs:
            chosen = [(row["path"], row) for row in by_path.values()]
        for p in inputs:
            row = by_path.get(str(Path(p).resolve()))
            if row is None:
                rows = by_name.get(Path(p).name, [])
                if len(rows) != 1:
                    raise UsageError(f"{p}: not listed in {shape_from}" if not rows else
                                     f"{p}: its name matches several rows of {shape_from}; list it by path")
                row = rows[0]
            chosen.append((p, row))
        for p, row in chosen:
            shape = {k: (int(v) if k in SHAPE_KEYS else v) for k, v in row.items()
                     if k not in ("path", "file") and not (k in SHAPE_KEYS and pd.isna(v))}
            points.append(SweepPoint(Path(p).name, str(p), shape, load(p, rank, tag)))
    else:
        raise UsageError(f"--shape-from {shape_from}: expected filename, markers or a manifest .csv")
    if not points:
        raise UsageError("capacity: the sweep has no points")

    def order(pt: SweepPoint) -> tuple[Any, ...]:
        return tuple((pt.shape.get(k) is None, pt.shape.get(k) or 0) for k in SHAPE_KEYS) + (pt.label,)

    labels = [pt.label for pt in points]
    if len(set(labels)) != len(labels):
        points = [dataclasses.replace(pt, label=pt.source if pt.phase is None else f"{pt.source}:{pt.phase}")
                  for pt in points]
    return sorted(points, key=order)


# ---------------------------------------------------------------------------------------------------------
# Every lifetime labelled, and category levels over a window
# ---------------------------------------------------------------------------------------------------------

def label_window(snapshot: Snapshot, timeline: Timeline, device: int, rules: RuleSet | None = None,
                 first: int = 0, last: int | None = None) -> pd.DataFrame:
    """The block lifetimes of `device` live at some point of events [first, last] (default: the whole
    trace), in `DeviceTimeline.lifetimes` order, with a `category` column, all labelled at once
    (`attribute.label_lifetimes`), with the same rules, signals and heuristics as at a peak.

    Context-dependent signals (the main request, the attention-score floor, vocabulary and MLP size hints)
    are taken over those lifetimes together rather than one instant, so a block's label can differ from
    `attribute` at an instant in rare cases; `attribute` stays the reference for what was live at a peak."""
    dt = timeline[device]
    last = len(dt) - 1 if last is None else last
    lt = dt.lifetimes
    free = lt["free_index"].to_numpy()
    lt = lt[(lt["alloc_index"].to_numpy() <= last) & ((free < 0) | (free >= first))].reset_index(drop=True)
    if len(lt) == 0:
        return lt.assign(category=pd.Series([], dtype=object))
    labelled = label_lifetimes(snapshot, device, lt, rules)
    return lt.assign(category=labelled["category"].to_numpy())


def category_levels(labelled: pd.DataFrame, first: int, last: int, groups: dict[str, str] | None = None) \
        -> pd.DataFrame:
    """Per target (category, or `groups[category]` when given; unmapped categories are skipped) over the
    window of events [first, last]: bytes live just before `first` (baseline_bytes), the high-water mark of
    bytes allocated inside the window (transient_bytes) and of everything live (max_bytes).
    Columns: target, baseline_bytes, transient_bytes, max_bytes."""
    cats = labelled["category"].astype(str).to_numpy()
    targets = np.array([groups.get(c) if groups is not None else c for c in cats], dtype=object)
    alloc = labelled["alloc_index"].to_numpy()
    free = labelled["free_index"].to_numpy()
    size = labelled["size"].to_numpy().astype(np.int64)
    width = max(last - first + 1, 0)
    before = first - 1
    live_before = (alloc <= before) & ((free < 0) | (free > before))
    inside = (alloc >= first) & (alloc <= last)
    rows = []
    for target in sorted({t for t in targets.tolist() if t is not None}):
        mine = targets == target
        base = int(size[mine & live_before].sum())
        grow = np.zeros(width + 1, dtype=np.int64)     # position 0 = before the window, p = event first + p − 1
        fall = np.zeros(width + 1, dtype=np.int64)
        new = mine & inside
        np.add.at(grow, alloc[new] - first + 1, size[new])
        ends = new & (free >= 0) & (free <= last)
        np.add.at(grow, free[ends] - first + 1, -size[ends])
        gone = mine & live_before & (free >= first) & (free <= last)
        np.add.at(fall, free[gone] - first + 1, -size[gone])
        transient = np.cumsum(grow)
        level = base + transient + np.cumsum(fall)
        if not base and not new.any():
            continue
        rows.append({"target": target, "baseline_bytes": base, "transient_bytes": int(max(transient.max(), 0)),
                     "max_bytes": int(level.max())})
    return pd.DataFrame(rows, columns=LEVEL_COLUMNS)


# ---------------------------------------------------------------------------------------------------------
# Measuring the sweep
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Sweep:
    """The measured sweep: one row per point (`shapes`) and per point × target (`categories`)."""

    points: tuple[SweepPoint, ...]
    shapes: pd.DataFrame
    categories: pd.DataFrame
    notes: tuple[str, ...] = ()


def _pick_device(timeline: Timeline, device: int | None, source: str) -> int:
    if device is not None:
        if device not in timeline.devices:
            raise UsageError(f"{source}: no device {device} (devices: {sorted(timeline.devices)})")
        return device
    if not timeline.devices:
        raise UsageError(f"{source}: no devices (no segments and no trace)")
    def peak(d: int) -> int:
        return int(np.max(timeline[d].active, initial=timeline[d].baseline_active))

    return max(sorted(timeline.devices), key=peak)


def measure_sweep(points: Sequence[SweepPoint], rules: RuleSet | None = None, device: int | None = None) -> Sweep:
    """Baseline, peak, transient and per-category bytes of every point (see the module docstring)."""
    if not points:
        raise UsageError("capacity: the sweep has no points")
    rules = rules or load_rules()
    replays: dict[int, Timeline] = {}
    labels: dict[tuple[int, int, int, int], pd.DataFrame] = {}
    family_of = {c: fam for fam, members in FAMILIES.items() for c in members}
    extra_keys = list(dict.fromkeys(k for pt in points for k in pt.shape if k not in SHAPE_KEYS))
    shape_rows: list[dict[str, Any]] = []
    cat_rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for pt in points:
        snap = pt.snapshot
        timeline = replays.get(id(snap))
        if timeline is None:
            timeline = replays[id(snap)] = replay(snap)
        d = _pick_device(timeline, device, pt.source)
        dt = timeline[d]
        first, last = window_bounds(dt, *pt.window) if pt.window != (None, None) else (0, len(dt) - 1)
        peak = window_peak(dt, first, last)
        index = peak["event_index"]
        result = attribute(snap, at=f"event:{index}", rules=rules, device=d, timeline=timeline)
        at_peak = result.summary.set_index("category")["bytes"].to_dict()
        key = (id(snap), d, first, last)
        if key not in labels:
            labels[key] = label_window(snap, timeline, d, rules, first, last)
        levels = category_levels(labels[key], first, last)
        fam_levels = category_levels(labels[key], first, last, family_of)
        reserved = dt.reserved[first:last + 1] if last >= first else np.zeros(0, dtype=np.int64)
        shape_rows.append({
            "label": pt.label, "source": pt.source, "phase": pt.phase, "device": d,
            **{k: pt.shape.get(k) for k in SHAPE_KEYS}, **{k: pt.shape.get(k) for k in extra_keys},
            "first_index": first, "last_index": last, "peak_event_index": index, "peak_time_us": peak["time_us"],
            "baseline_bytes": peak["baseline_active_bytes"], "peak_bytes": peak["active_bytes"],
            "transient_bytes": peak["transient_bytes"], "reserved_bytes": peak["reserved_bytes"],
            "max_reserved_bytes": int(max(np.max(reserved, initial=0), dt.reserved_at(first - 1))),
        })
        seen = set()
        for kind, table in (("category", levels), ("family", fam_levels)):
            for r in table.itertuples():
                members = FAMILIES.get(r.target, (r.target,))
                cat_rows.append({"label": pt.label, "target": r.target, "kind": kind,
                                 "baseline_bytes": int(r.baseline_bytes),
                                 "peak_bytes": int(sum(at_peak.get(m, 0) for m in members)),
                                 "transient_bytes": int(r.transient_bytes), "max_bytes": int(r.max_bytes)})
                seen.add(r.target)
        for category, nbytes in at_peak.items():   # live at the peak but labelled otherwise over the window
            if category not in seen:
                cat_rows.append({"label": pt.label, "target": category, "kind": "category", "baseline_bytes": 0,
                                 "peak_bytes": int(nbytes), "transient_bytes": 0, "max_bytes": int(nbytes)})
    shapes = pd.DataFrame(shape_rows, columns=SHAPE_COLUMNS + extra_keys + MEASURE_COLUMNS)
    for k in SHAPE_KEYS:
        shapes[k] = shapes[k].astype("Int64")
    shapes["peak_time_us"] = shapes["peak_time_us"].astype("Int64")
    return Sweep(points=tuple(points), shapes=shapes, categories=pd.DataFrame(cat_rows, columns=CATEGORY_COLUMNS),
                 notes=tuple(notes))


# ---------------------------------------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fit:
    """bytes = intercept + linear·t + quadratic·q, all coefficients ≥ 0; `model` names the highest term."""

    model: str                  # "constant" | "linear" | "quadratic" | "none" (no points)
    intercept: float
    linear: float
    quadratic: float
    max_rel_residual: float     # max |fit − y| / y over the fitted points (y floored, see `fit_bytes`)
    points: int

    def predict(self, t: Any, q: Any) -> np.ndarray:
        return self.intercept + self.linear * np.asarray(t, dtype=float) + self.quadratic * np.asarray(q, dtype=float)

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


def fit_capacity(sweep: Sweep, driver: str | None = None) -> Capacity:
    """Choose the driver, fit every target, find the jumps (see the module docstring)."""
    shapes = sweep.shapes
    if len(shapes) < 2:
        raise UsageError(f"capacity: a sweep needs at least 2 shapes, got {len(shapes)}")
    total = shapes["transient_bytes"].to_numpy().astype(float)
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
    x, m = candidates[chosen]
    order = np.lexsort((shapes["label"].to_numpy(), m, x))
    x, m, total = x[order], m[order], total[order]
    labels = shapes["label"].to_numpy()[order]
    t, q = m * x, m * x * x

    cats = sweep.categories
    series: dict[str, tuple[str, np.ndarray]] = {"total": ("total", total)}
    for kind in ("family", "category"):
        sub = cats[cats["kind"] == kind]
        for target in sorted(sub["target"].unique()):
            by_label = sub[sub["target"] == target].set_index("label")["transient_bytes"]
            values = np.array([float(by_label.get(lb, 0)) for lb in labels])
            if np.any(values > 0):
                series[target] = (kind, values)
    material = _material(total)

    raw = {target: _target_jumps(x, t, q, y, material) for target, (_, y) in series.items()}
    family_of = {c: fam for fam, members in FAMILIES.items() for c in members}
    kept: dict[str, list[tuple[int, int, float]]] = {}
    for target, js in raw.items():
        fam = family_of.get(target) if series[target][0] == "category" else None
        if fam is not None:                      # a relabel inside a family is no jump
            fam_at = {float(x[j]) for _, j, _ in raw.get(fam, [])}
            js = [jp for jp in js if float(x[jp[1]]) in fam_at]
        kept[target] = js

    def expected_at(target: str, j: int) -> float:
        """What the target's shapes before x[j] (since its last kept jump) predict at point j."""
        starts = [float(x[jj]) for _, jj, _ in kept[target] if x[jj] < x[j]]
        lo = max(starts, default=float(x[0]))
        return _predict_from(np.flatnonzero((x >= lo) & (x < x[j])), t, q, x, series[target][1], t[j], q[j])

    jump_rows = []
    for xj in sorted({float(x[jp[1]]) for js in kept.values() for jp in js}):
        at = {target: jp for target, js in kept.items() for jp in js if float(x[jp[1]]) == xj}
        cat_hits = {tg: jp for tg, jp in at.items() if series[tg][0] == "category"}
        if cat_hits:
            name = max(cat_hits, key=lambda tg: (float(series[tg][1][cat_hits[tg][1]] - cat_hits[tg][2]), tg))
            i, j, pred = cat_hits[name]
        else:                                    # a family or the total jumped: name its largest riser
            i, j, _ = next(iter(at.values()))
            cats = [tg for tg, (kind, _) in series.items() if kind == "category"]
            name = max(cats, key=lambda tg: (float(series[tg][1][j] - series[tg][1][i]), tg)) if cats else "total"
            pred = expected_at(name, j)
        y = series[name][1]
        total_pred = at["total"][2] if "total" in at else expected_at("total", j)
        absent_before = float(np.max(y[x < x[j]], initial=0.0)) < material[j] * 0.2
        jump_rows.append({
            "from_label": labels[i], "to_label": labels[j], "from_x": float(x[i]), "to_x": float(x[j]),
            "category": name, "how": "appears" if absent_before else "grows",
            "bytes_before": int(y[i]), "bytes_after": int(y[j]), "predicted_bytes": int(round(pred)),
            "total_before": int(total[i]), "total_after": int(total[j]), "total_predicted": int(round(total_pred)),
            "targets": sorted(at),
        })

    fit_rows, regimes = [], {}
    for target, (kind, y) in series.items():
        starts = [float(x[0])] + [float(x[j]) for _, j, _ in kept[target]]
        present = np.flatnonzero(y >= material * (0.2 if kind != "total" else 0.0))
        if kind != "total" and len(present):
            first_present = float(x[present[0]])
            starts = [max(s, first_present) for s in starts]
            starts = list(dict.fromkeys(starts))
        bounds = starts[1:] + [math.inf]
        regs = []
        for lo, hi in zip(starts, bounds):
            idx = np.flatnonzero((x >= lo) & (x < hi))
            f = fit_bytes(t[idx], q[idx], y[idx])
            regs.append((lo, float(x[idx].max()) if len(idx) else lo, f))
        regimes[target] = regs
        lo, hi, f = regs[-1]
        fit_rows.append({"target": target, "kind": kind, "model": f.model, "intercept_bytes": f.intercept,
                         "linear_bytes": f.linear, "quadratic_bytes": f.quadratic,
                         "max_rel_residual": f.max_rel_residual, "points": f.points, "from_x": lo, "to_x": hi,
                         "jumped": bool(kept[target])})

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


def max_driver_value(cap: Capacity, available: float, multiplier: float = 1.0) -> dict[str, Any]:
    """The largest driver value whose modelled total transient fits in `available` bytes, across regimes:
    a regime below a jump is only trusted up to its last measured shape (the threshold lies somewhere after
    it). Returns {max_x, regime_from_x, predicted_bytes, extrapolated, unbounded}; max_x is None if nothing fits."""
    regs = cap.regimes["total"]
    observed = cap.points["x"].to_numpy()
    for r in range(len(regs) - 1, -1, -1):
        lo, last, f = regs[r]
        x_star = _solve(f, multiplier, available)
        floor = 0.0 if r == 0 else lo
        if x_star is None or x_star < floor:
            continue
        cap_x = math.inf if r == len(regs) - 1 else last
        best = min(x_star, cap_x)
        if math.isinf(best):
            return {"max_x": None, "regime_from_x": lo, "predicted_bytes": float(f.predict(0, 0)),
                    "extrapolated": True, "unbounded": True}
        best = math.floor(best)
        if best < floor or best < 1:
            continue
        return {"max_x": int(best), "regime_from_x": lo,
                "predicted_bytes": float(f.predict(multiplier * best, multiplier * best * best)),
                "extrapolated": bool(best > observed.max() or best < observed.min()), "unbounded": False}
    return {"max_x": None, "regime_from_x": None, "predicted_bytes": None, "extrapolated": False, "unbounded": False}


def capacity_contract(cap: Capacity, budget_bytes: int | None = None, transient_budget_bytes: int | None = None,
                      margin: float | None = None, concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
                      target_x: float | None = None) -> dict[str, Any]:
    """Solve the fitted sweep for a device budget (active bytes beside the baseline) and/or a transient budget.

    Returns a JSON-ready dict: driver; budget_bytes; baseline_bytes (the largest measured baseline: weights,
    KV cache, buffers); transient_budget_bytes (what the transient may use); margin (the fraction added to
    every modelled transient, default the worst relative residual of the total's fits); limits (per
    concurrency: the largest driver value that fits, driver × concurrency, the modelled transient there,
    whether it extrapolates beyond the measured shapes); reserve (the transient to hold back for the target
    shape, default the largest measured, with the margin; whether baseline + reserve fits); observed (each
    measured point's peak against the budget); notes."""
    if budget_bytes is None and transient_budget_bytes is None:
        raise UsageError("capacity contract: give a device budget and/or a transient budget")
    shapes = cap.sweep.shapes
    baseline = int(shapes["baseline_bytes"].max())
    limits = [b for b in ((budget_bytes - baseline) if budget_bytes is not None else None, transient_budget_bytes)
              if b is not None]
    available = min(limits)
    fits = [f for _, _, f in cap.regimes["total"]]
    if margin is None:
        margin = max((f.max_rel_residual for f in fits if math.isfinite(f.max_rel_residual)), default=0.0)
    if margin < 0:
        raise UsageError("capacity contract: the margin must be ≥ 0")
    effective = available / (1.0 + margin)
    notes = []
    rows = []
    seen_m = cap.points["multiplier"].to_numpy()
    if available <= 0:
        notes.append(f"the baseline ({baseline:,} bytes) already exceeds the budget: nothing fits")
    else:
        for c in concurrency:
            found = max_driver_value(cap, effective, float(c))
            if found["max_x"] is None and not found["unbounded"]:
                rows.append({"concurrency": int(c), "max_x": None, "max_total": None, "predicted_bytes": None,
                             "extrapolated": False, "unbounded": False})
                break
            rows.append({"concurrency": int(c), "max_x": found["max_x"],
                         "max_total": None if found["max_x"] is None else int(found["max_x"] * c),
                         "predicted_bytes": None if found["predicted_bytes"] is None
                         else int(round(found["predicted_bytes"])),
                         "extrapolated": bool(found["extrapolated"] or not seen_m.min() <= c <= seen_m.max()),
                         "unbounded": found["unbounded"]})
    pts = cap.points
    tx = float(pts["x"].max()) if target_x is None else float(target_x)
    at_target = pts[pts["x"] == tx]
    m_target = float(at_target["multiplier"].max()) if len(at_target) else 1.0
    regs = cap.regimes["total"]
    reg = next((f for lo, _, f in reversed(regs) if tx >= lo), regs[0][2])
    predicted = float(reg.predict(m_target * tx, m_target * tx * tx))
    measured = float(at_target["total"].max()) if len(at_target) else 0.0
    reserve = int(math.ceil(max(predicted, measured) * (1.0 + margin)))
    fits_reserve = bool(reserve <= available)
    if cap.jumps is not None and len(cap.jumps):
        last = cap.jumps.iloc[-1]
        notes.append(f"{last['category']} jumps between {cap.driver} {last['from_x']:g} and {last['to_x']:g}: "
                     "below the jump the contract trusts each regime only up to its last measured shape")
    if target_x is not None and (tx > pts["x"].max() or tx < pts["x"].min()):
        notes.append(f"the reserve for {cap.driver} {tx:g} extrapolates beyond the measured shapes")
    observed = [{"label": r.label, "x": float(px), "peak_bytes": int(r.peak_bytes),
                 "fits": None if budget_bytes is None else bool(r.peak_bytes <= budget_bytes)}
                for r, px in zip(shapes.itertuples(), _driver_x(shapes, cap.driver)[0])]  # type: ignore[index]
    return {"driver": cap.driver, "budget_bytes": budget_bytes, "baseline_bytes": baseline,
            "transient_budget_bytes": int(available), "margin": float(margin), "limits": rows,
            "reserve": {"x": tx, "multiplier": m_target, "predicted_bytes": int(round(predicted)),
                        "measured_bytes": int(measured), "reserve_bytes": reserve, "fits": fits_reserve,
                        "headroom_bytes": int(available - reserve)},
            "observed": observed, "notes": notes}


def capacity(inputs: Iterable[str], shape_from: str = "filename", rules: RuleSet | None = None,
             device: int | None = None, rank: int | None = None, tag: str | None = None,
             driver: str | None = None) -> Capacity:
    """Load, measure and fit a sweep in one call (`sweep_points` → `measure_sweep` → `fit_capacity`)."""
    points = sweep_points(list(inputs), shape_from, rank, tag)
    return fit_capacity(measure_sweep(points, rules, device), driver)
