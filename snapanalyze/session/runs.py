"""Runs, sweeps and budgets: a run directory read once, its ranks compared, each OOM explained, shapes measured.

Contract: `open_run(path)` returns a `Run` — a run directory (or one ``rank=N`` directory) whose NVML samples,
markers and meta.json are read once (`load.samples.read_run`) and whose snapshots are each loaded and
replayed at most once, when first asked for (`Run.loads` counts the loads). `Run.ranks(tag, rank,
prefer_oom)` picks one snapshot per rank (`load.samples.choose_snapshots`) as `RankData` — the rank, its
snapshot and timeline, its NVML rows and markers — plus the problems (ranks without a snapshot, missing
NVML parts), which are reported, not fatal. The path-level entry points: `compare_ranks(run, …)`
(`analyze.ranks`), `explain_path(path, …)` (`analyze.oom`), `sweep_points(inputs, …)` and `capacity(inputs,
…)` (`analyze.sweep`, `analyze.capacity`), `budget(inputs, …)` (`analyze.budget`), `convert_file(job)` (one
snapshot's tables and its `layout.PEAK_TABLE`). The per-rank work of `compare_ranks` and `convert` is a
module-level function of picklable inputs (`measure_task` of a `RankTask`, `convert_file`) returning a small
result, so that an `executor=` (a process pool, Dask's, Ray's) can run it; `parallel.map_ranks` keeps the
rank order and turns a rank that fails on its input into a problem naming it.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from .. import layout
from ..analyze import ranks as rank_analysis
from ..analyze.budget import BudgetCheck, check_budget, engine_budget
from ..analyze.capacity import Capacity, fit_capacity
from ..analyze.oom import SnapshotOoms, explain_oom
from ..analyze.rules import RuleSet, shipped_rules
from ..analyze.sweep import (
    MeasuredPoint,
    Sweep,
    SweepPoint,
    assemble_sweep,
    measure_points,
    measure_sweep,
    order_points,
    points_from_phases,
)
from ..batch_shape import SHAPE_KEYS, shape_from_filename
from ..engine_config import EngineConfig
from ..errors import BadInputError, UsageError
from ..load import SourceIndex, SourceRoots, load
from ..load.runs import NO_SNAPSHOTS, RunEntry
from ..load.runs import entries as run_entries
from ..load.samples import (
    RunSamples,
    choose_snapshots,
    empty_nvml,
    markers_for,
    nvml_for,
    rank_directories,
    rank_of,
    read_run,
)
from ..load.shapes import read_manifest
from ..model import Snapshot
from ..parallel import map_ranks
from ..replay import Timeline, replay


@dataclass(eq=False)
class Run:
    """A run directory, read once: its samples now, each snapshot (and its replay) when first asked for."""

    path: Path
    samples: RunSamples
    entries: list[RunEntry]
    directories: dict[int, Path]
    progress: Callable[[str], None] | None = None     # told "loading rank N" before each load
    given: str = ""                                   # the path as the user wrote it, for messages
    frames: bool | str = True                         # which stacks each load keeps (`load.load`)
    source: SourceIndex | None = None                 # the program's source each load resolves frames with
    loads: int = 0
    _loaded: dict[Path, tuple[Snapshot, Timeline]] = field(default_factory=dict, repr=False)

    def load(self, entry: RunEntry) -> tuple[Snapshot, Timeline]:
        """The snapshot of `entry` and its replay, loaded once."""
        found = self._loaded.get(entry.path)
        if found is None:
            if self.progress is not None:
                self.progress(f"loading rank {entry.rank}")
            snapshot = load(entry.path, frames=self.frames, source=self.source)
            found = self._loaded[entry.path] = (snapshot, replay(snapshot))
            self.loads += 1
        return found

    def forget(self, entry: RunEntry) -> None:
        """Drop the loaded snapshot of `entry` (a caller done with it keeps memory to one rank at a time)."""
        self._loaded.pop(entry.path, None)

    def file(self, path: str | Path) -> RankData:
        """A snapshot file inside this run's rank directory, as that rank (its tag from its name, else "")."""
        p = Path(path)
        tag = layout.parse_snapshot_file(p) or layout.parse_tag_dir(p) or ""
        return RankData(self, RunEntry(self.samples.ranks[0], tag, None, p))

    def ranks(self, tag: str | None = None, rank: int | None = None,
              prefer_oom: bool = False) -> tuple[list[RankData], list[str]]:
        """One snapshot per rank (see `load.samples.choose_snapshots`), and the run's problems."""
        chosen, problems = choose_snapshots(self.entries, self.directories, self.path, tag, rank, prefer_oom)
        return [RankData(self, e) for e in chosen], [*self.samples.problems, *problems]


@dataclass(frozen=True, eq=False)
class RankData:
    """One rank's snapshot of a run, with what the run holds about that rank (`analyze.ranks.RankInput`)."""

    run: Run
    entry: RunEntry

    @property
    def rank(self) -> int:
        return self.entry.rank

    @property
    def tag(self) -> str:
        return self.entry.tag

    @property
    def path(self) -> Path:
        return self.entry.path

    @property
    def snapshot(self) -> Snapshot:
        return self.run.load(self.entry)[0]

    @property
    def timeline(self) -> Timeline:
        return self.run.load(self.entry)[1]

    @cached_property
    def nvml(self) -> pd.DataFrame:
        return self.run.samples.nvml_of(self.rank)

    @cached_property
    def markers(self) -> pd.DataFrame:
        return self.run.samples.markers_of(self.rank)


def open_run(path: str | Path, progress: Callable[[str], None] | None = None, frames: bool | str = True,
             source: SourceRoots = None) -> Run:
    """The run directory (or rank=N directory) at `path` (see the module docstring); `progress` hears of each
    snapshot load; `frames` says which stacks each load keeps and `source` what each resolves them with (as
    `load.load`'s)."""
    root = Path(path)
    return Run(path=root, samples=read_run(root), entries=run_entries(root), directories=rank_directories(root),
               progress=progress, given=str(path), frames=frames, source=SourceIndex.of(source))


def is_run_path(path: str | Path) -> bool:
    """Whether `path` names a run directory (or one rank=N directory) rather than one snapshot."""
    p = Path(path)
    return p.is_dir() and not layout.is_tables_dir(p)


# -- ranks ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class RankTask:
    """One rank's snapshot as a worker process reads it: its path, tag and NVML rows and markers, which pickle.
    It never holds the snapshot: an executor may keep a task's arguments until its result is taken (Dask
    does), and a worker must hold one rank's snapshot at a time."""

    rank: int
    tag: str
    path: Path
    nvml: pd.DataFrame
    markers: pd.DataFrame
    frames: bool | str = True
    source: SourceIndex | None = None

    def loaded(self) -> LoadedRank:
        """The rank loaded and replayed here (an `analyze.ranks.RankInput`)."""
        snapshot = load(self.path, frames=self.frames, source=self.source)
        return LoadedRank(self.rank, self.tag, self.path, self.nvml, self.markers, snapshot, replay(snapshot))


@dataclass(frozen=True, eq=False)
class LoadedRank:
    """A `RankTask` loaded: what `analyze.ranks.measure_rank` reads, dropped once it has."""

    rank: int
    tag: str
    path: Path
    nvml: pd.DataFrame
    markers: pd.DataFrame
    snapshot: Snapshot
    timeline: Timeline


def rank_task(data: RankData) -> RankTask:
    """What a worker needs to read `data`'s rank on its own."""
    return RankTask(data.rank, data.tag, data.path, data.nvml, data.markers, data.run.frames, data.run.source)


def measure_task(task: RankTask, rules: RuleSet) -> rank_analysis.RankMeasure:
    """`analyze.ranks.measure_rank` of one rank, loaded here and let go when it returns (the per-rank work of
    `compare_ranks`)."""
    return rank_analysis.measure_rank(task.loaded(), rules)


def compare_ranks(run: str | Path | Run, tag: str | None = None, rules: RuleSet | None = None,
                  threshold: float = 0.02, min_bytes: int = 256 << 20,
                  keep: Callable[[int], bool] = lambda rank: False, executor: Executor | None = None,
                  progress: Callable[[str], None] | None = None) -> rank_analysis.RankComparison:
    """`analyze.ranks.compare_ranks` over one snapshot per rank of `run` (tag ``final`` unless told). Each
    rank is loaded once; ranks `keep` does not name are dropped once compared, so one is held at a time.
    With an `executor` (a process pool, Dask's, …) each rank is measured in a worker (`measure_task`) and
    only its rows come back (`keep` then keeps nothing here); the result is the same. A rank whose snapshot
    cannot be read is a problem naming it, and the others are still compared (`parallel.map_ranks`)."""
    opened = run if isinstance(run, Run) else open_run(run)
    chosen, problems = opened.ranks(tag=tag)
    if not chosen:
        raise BadInputError(opened.given, "no rank has a snapshot to compare: "
                            + ("; ".join(problems) if problems else NO_SNAPSHOTS))
    rules = rules or shipped_rules()

    def here(data: RankData) -> rank_analysis.RankMeasure:
        try:
            return rank_analysis.measure_rank(data, rules)
        finally:
            if not keep(data.rank):
                opened.forget(data.entry)

    outcomes = map_ranks(here, chosen, progress=progress) if executor is None else \
        map_ranks(functools.partial(measure_task, rules=rules), [rank_task(d) for d in chosen], executor, progress)
    measures = []
    for data, outcome in zip(chosen, outcomes):
        if outcome.result is not None:
            measures.append(outcome.result)
        else:
            problems.append(f"rank {data.rank}: {outcome.error}")
    if not measures:
        raise BadInputError(opened.given, "no rank could be compared: " + "; ".join(problems))
    return rank_analysis.combine_ranks(measures, threshold=threshold, min_bytes=min_bytes, problems=problems,
                                       run=opened.path, samples=opened.samples)


# -- convert ----------------------------------------------------------------------------------------------------

PEAK_COLUMNS = ["device", "event_index", "time_us", "active_bytes", "reserved_bytes", "category", "bytes", "share"]


@dataclass(frozen=True)
class Converted:
    """What converting one snapshot wrote (for the command's line about it)."""

    events: int
    stacks: int
    seconds: float


@dataclass(frozen=True, eq=False)
class _Loaded:
    """A snapshot already in memory, as `analyze.ranks.measure_rank` reads a rank (no NVML)."""

    rank: int
    tag: str
    path: Path
    snapshot: Snapshot
    timeline: Timeline
    markers: pd.DataFrame
    nvml: pd.DataFrame = field(default_factory=empty_nvml)


def peak_table(snapshot: Snapshot, source: str | Path, rules: RuleSet | None = None,
               markers: pd.DataFrame | None = None) -> pd.DataFrame:
    """The categories at each device's peak (`analyze.ranks.measure_rank`, as `ranks` finds them), one row per
    device and category with the peak's event, time and active/reserved bytes: PEAK_COLUMNS."""
    timeline = replay(snapshot)
    m = rank_analysis.measure_rank(_Loaded(0, "", Path(source), snapshot, timeline,
                                           markers if markers is not None else markers_for(source)), rules)
    peaks = pd.DataFrame(list(m.rows), columns=["device", "event_index", "time_us", "active_bytes", "reserved_bytes"])
    if not len(peaks):
        return pd.DataFrame({c: pd.Series(dtype="int64" if c not in ("category", "share") else
                                          "object" if c == "category" else "float64") for c in PEAK_COLUMNS})
    table = peaks.merge(m.categories.drop(columns="rank"), on="device", how="left", sort=False)
    return table.astype({"time_us": "Int64", "category": "object", "bytes": "Int64"})[PEAK_COLUMNS]


def convert_file(job: tuple[Path, Path], force: bool = False, rules: RuleSet | None = None) -> Converted:
    """Convert one snapshot (`session.convert.convert_plan`'s (source, target) pair): its tables
    (`load.parquet.write_tables`), then `layout.PEAK_TABLE` beside them (`peak_table`, written atomically),
    so that SQL over the run directory can ask what was live at each rank's peak. The per-file work of
    `convert`, for `parallel.map_ranks`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..atomic import write_atomic
    from ..load.parquet import write_tables

    started = time.perf_counter()
    source, target = job
    snapshot = load(source)
    write_tables(snapshot, target, force=force)
    table = pa.Table.from_pandas(peak_table(snapshot, source, rules), preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"producer": b"snapanalyze",
                                           b"schema_version": str(layout.SCHEMA_VERSION).encode()})
    write_atomic(target / layout.PEAK_TABLE, lambda f: pq.write_table(table, f))
    return Converted(sum(len(t) for t in snapshot.traces.values()), len(snapshot.interner.stacks),
                     time.perf_counter() - started)


# -- OOMs -----------------------------------------------------------------------------------------------------

def explain_path(path: str | Path, rank: int | None = None, tag: str | None = None, rules: RuleSet | None = None,
                 capacity: int | None = None, source: SourceRoots = None) -> tuple[list[SnapshotOoms], list[str]]:
    """Explain the OOMs of a snapshot file, or of every rank of a run (its ``oom-<n>`` snapshots first, else
    ``final``), with each rank's NVML samples, markers and capacity; returns the explanations and the
    problems found (missing ranks, NVML parts, snapshots), which are not fatal. `source`: the program's
    checkout, which each load resolves frames with."""
    p = Path(path)
    if is_run_path(p):
        run = open_run(p, source=source)
        chosen, problems = run.ranks(tag=tag, rank=rank, prefer_oom=True)
        if not chosen:
            raise BadInputError(p, "no snapshot to explain: " + "; ".join(problems))
        out = []
        for data in chosen:
            out.append(_explain(data.snapshot, data.rank, data.tag, data.path, run.samples, rules, capacity,
                                data.timeline))
            run.forget(data.entry)
        return out, problems
    owner = rank_of(p)
    snapshot = load(p, rank, tag, source=source)
    if owner is None:
        return [SnapshotOoms(None, None, p, explain_oom(snapshot, capacity=capacity, rules=rules))], []
    found = layout.rank_dir_of(p)
    assert found is not None
    samples = read_run(found)
    return [_explain(snapshot, owner, None, p, samples, rules, capacity)], list(samples.problems)


def _explain(snapshot: Snapshot, rank: int, tag: str | None, path: Path, samples: RunSamples,
             rules: RuleSet | None, capacity: int | None, timeline: Timeline | None = None) -> SnapshotOoms:
    devices = sorted(set(snapshot.devices) | set(snapshot.traces))
    caps: dict[int, tuple[int | None, str]] = {
        d: (capacity, "given") if capacity is not None else samples.capacity(rank, d) for d in devices}
    explanation = explain_oom(snapshot, timeline, nvml=samples.nvml_of(rank), capacity=caps,
                              markers=samples.markers_of(rank), rules=rules)
    return SnapshotOoms(rank, tag, path, explanation)


# -- sweeps ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SweepInput:
    """One input of a sweep, before it is loaded: its path, its label, and its shape (None: its phases give
    the shapes, `--shape-from markers`)."""

    path: str
    label: str
    shape: dict[str, Any] | None
    rank: int | None = None
    tag: str | None = None
    source: SourceIndex | None = None       # the program's source its load resolves frames with


def sweep_inputs(inputs: Sequence[str], shape_from: str = "filename", rank: int | None = None,
                 tag: str | None = None, source: SourceRoots = None) -> list[SweepInput]:
    """The inputs of a sweep and their shapes, read from names or the manifest without loading a snapshot
    (see `sweep_points`); `source`: the program's checkout each load resolves frames with. Raises
    UsageError when a shape is missing or there is no input."""
    index = SourceIndex.of(source)
    return [dataclasses.replace(item, source=index) for item in _sweep_inputs(inputs, shape_from, rank, tag)]


def _sweep_inputs(inputs: Sequence[str], shape_from: str, rank: int | None, tag: str | None) -> list[SweepInput]:
    if shape_from == "filename":
        if not inputs:
            raise UsageError("capacity: give the snapshot files or runs of the sweep")
        found = []
        for p in inputs:
            name = Path(p).name if not Path(p).is_dir() or not tag else f"{Path(p).name}-{tag}"
            shape = shape_from_filename(name)
            if not shape:
                raise UsageError(f"{p}: no shape in the file name (expected e.g. ctx1024, tokens=32768, bs4, "
                                 "chunk=2048, images=8); use --shape-from manifest.csv or markers")
            found.append(SweepInput(p, Path(p).name, shape, rank, tag))
        return found
    if shape_from == "none":             # each input as it is: its peak, no shape (a budget check of one file)
        if not inputs:
            raise UsageError("give the snapshot files or runs to measure")
        found = []
        for p in inputs:                 # a run of several ranks: each rank's snapshot, as its own input
            ranks = layout.rank_dirs(p) if rank is None else {}
            if len(ranks) > 1:
                found += [SweepInput(p, f"{Path(p).name} rank {r}", {}, r, tag) for r in ranks]
            else:
                found.append(SweepInput(p, Path(p).name, {}, rank, tag))
        return found
    if shape_from == "markers":
        if not inputs:
            raise UsageError("capacity: give the runs (or snapshot files) whose phases make the sweep")
        return [SweepInput(p, Path(p).name, None, rank, tag) for p in inputs]
    if shape_from.lower().endswith(".csv"):
        return _manifest_inputs(inputs, shape_from, rank, tag)
    raise UsageError(f"--shape-from {shape_from}: expected filename, markers, none or a manifest .csv")


def input_points(item: SweepInput) -> list[SweepPoint]:
    """The points of one input, loaded: the input itself with its shape, or its shaped phases."""
    snapshot = load(item.path, item.rank, item.tag, source=item.source)
    nvml = nvml_for(item.path, item.rank, item.tag)
    if item.shape is not None:
        return [SweepPoint(item.label, item.path, item.shape, snapshot, nvml=nvml)]
    found = [dataclasses.replace(pt, nvml=nvml) for pt in
             points_from_phases(item.label, item.path, snapshot, markers_for(item.path, item.rank, item.tag))]
    if not found:
        raise UsageError(f"{item.path}: no phase with a shape (markers.parquet phases need attrs such as "
                         "tokens=…; record_function spans need it in their name, e.g. 'prefill tokens=4096')")
    return found


def measure_input(item: SweepInput, rules: RuleSet | None = None, device: int | None = None) -> list[MeasuredPoint]:
    """One input's points, loaded and measured here (the per-input work of `measure_sweep_inputs`)."""
    return measure_points(input_points(item), rules, device)


def sweep_points(inputs: Sequence[str], shape_from: str = "filename", rank: int | None = None,
                 tag: str | None = None) -> list[SweepPoint]:
    """Load the sweep: `shape_from` is "filename", "markers" (phase spans of each run's markers files, whose
    attrs carry the shape; for a file or a run without markers, `record_function` spans whose names carry
    it, e.g. `prefill tokens=4096`) or the path of a manifest CSV (with no inputs, every file it lists).
    Points come back sorted by shape. Raises UsageError when a shape is missing or there are no points."""
    points = [pt for item in sweep_inputs(inputs, shape_from, rank, tag) for pt in input_points(item)]
    if not points:
        raise UsageError("capacity: the sweep has no points")
    return order_points(points)


def measure_sweep_inputs(inputs: Sequence[str], shape_from: str = "filename", rank: int | None = None,
                         tag: str | None = None, rules: RuleSet | None = None, device: int | None = None,
                         executor: Executor | None = None, progress: Callable[[str], None] | None = None,
                         source: SourceRoots = None) -> Sweep:
    """`measure_sweep(sweep_points(...))`, each input loaded and measured on its own (`measure_input`: on
    `executor` when given, where only its rows come back) — the same Sweep, but for `Sweep.points`, which
    are then `MeasuredPoint`s. An input that cannot be read or placed fails the sweep once the others are
    done, with every such input named."""
    items = sweep_inputs(inputs, shape_from, rank, tag, source)
    rules = rules or shipped_rules()
    work = functools.partial(measure_input, rules=rules, device=device)
    measured: list[MeasuredPoint] = []
    failed = []
    for outcome in map_ranks(work, items, executor, progress, unit="inputs"):
        if outcome.result is None:
            failed.append(outcome)
        else:
            measured.extend(outcome.result)
    if failed:
        error = UsageError("; ".join(str(o.error) for o in failed))
        error.exit_code = failed[0].exit_code
        raise error
    return assemble_sweep(order_points(measured))


def _manifest_inputs(inputs: Sequence[str], manifest_path: str, rank: int | None, tag: str | None
                     ) -> list[SweepInput]:
    manifest = read_manifest(manifest_path)
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
                raise UsageError(f"{p}: not listed in {manifest_path}" if not rows else
                                 f"{p}: its name matches several rows of {manifest_path}; list it by path")
            row = rows[0]
        chosen.append((p, row))
    found = []
    for p, row in chosen:
        shape = {k: (int(v) if k in SHAPE_KEYS else v) for k, v in row.items()
                 if k not in ("path", "file") and not (k in SHAPE_KEYS and pd.isna(v))}
        found.append(SweepInput(str(p), Path(p).name, shape, rank, tag))
    return found


def capacity(inputs: Iterable[str], shape_from: str = "filename", rules: RuleSet | None = None,
             device: int | None = None, rank: int | None = None, tag: str | None = None,
             driver: str | None = None, executor: Executor | None = None) -> Capacity:
    """Load, measure and fit a sweep in one call (`sweep_points` → `measure_sweep` → `fit_capacity`); with an
    `executor`, each input is loaded and measured there (`measure_sweep_inputs`)."""
    if executor is not None:
        return fit_capacity(measure_sweep_inputs(list(inputs), shape_from, rank, tag, rules, device, executor), driver)
    points = sweep_points(list(inputs), shape_from, rank, tag)
    return fit_capacity(measure_sweep(points, rules, device), driver)


def budget(inputs: Sequence[str], engine_log: str | Path | None = None, *, engine: str | None = None,
           figures: Mapping[str, float] | None = None, shape_from: str = "filename", rank: int | None = None,
           tag: str | None = None, rules: RuleSet | None = None, device: int | None = None,
           driver: str | None = None, executor: Executor | None = None,
           progress: Callable[[str], None] | None = None, source: SourceRoots = None) -> BudgetCheck:
    """A serving engine's budget (its start-up log at `engine_log`, and/or `engine` with `figures`: names of
    `engine_config.FIGURES`, bytes for *_bytes, each replacing the log's) against the shapes measured in
    `inputs` (`shape_from` as for a sweep; "none": each input's peak, no shape limit); the capacity fit
    gives the shape limit when at least two inputs have a shape."""
    from ..load.engine_log import engine_config

    config = engine_config(engine_log, engine, figures)
    return budget_of(config, inputs, shape_from, rank, tag, rules, device, driver, executor, progress, source)


def budget_of(config: EngineConfig, inputs: Sequence[str], shape_from: str = "filename", rank: int | None = None,
              tag: str | None = None, rules: RuleSet | None = None, device: int | None = None,
              driver: str | None = None, executor: Executor | None = None,
              progress: Callable[[str], None] | None = None, source: SourceRoots = None) -> BudgetCheck:
    """`budget` with the engine's figures already read (`config`)."""
    sweep = measure_sweep_inputs(inputs, shape_from, rank, tag, rules, device, executor, progress, source)
    shaped = sweep.shapes[[k for k in SHAPE_KEYS if k in sweep.shapes]].notna().any(axis=1)
    cap = fit_capacity(sweep, driver) if int(shaped.sum()) >= 2 else None
    return check_budget(engine_budget(config), sweep, cap)
