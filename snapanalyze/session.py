"""Orchestration: what a user names (a snapshot, a run directory, a sweep) → loaded data → the analyses.

Contract: this is the one layer that turns paths into data for the commands (`cli/`) and the reports
(`report/`); the analyses below it (`analyze/`) take snapshots, timelines and tables, never a path.
`open_run(path)` returns a `Run` — a run directory (or one ``rank=N`` directory) whose NVML samples,
markers and meta.json are read once (`load.samples.read_run`) and whose snapshots are each loaded and
replayed at most once, when first asked for (`Run.loads` counts the loads). `Run.ranks(tag, rank,
prefer_oom)` picks one snapshot per rank (`load.samples.choose_snapshots`) as `RankData` — the rank, its
snapshot and timeline, its NVML rows and markers — plus the problems (ranks without a snapshot, missing
NVML parts), which are reported, not fatal. The path-level entry points: `compare_ranks(run, …)`
(`analyze.ranks`), `explain_path(path, …)` (`analyze.oom`), `sweep_points(inputs, …)` and `capacity(inputs,
…)` (`analyze.sweep`, `analyze.capacity`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from . import layout
from .analyze import ranks as rank_analysis
from .analyze.capacity import Capacity, fit_capacity
from .analyze.oom import SnapshotOoms, explain_oom
from .analyze.rules import RuleSet
from .analyze.sweep import SweepPoint, measure_sweep, order_points, points_from_phases
from .errors import BadInputError, UsageError
from .load import load
from .load.runs import RunEntry
from .load.runs import entries as run_entries
from .load.samples import RunSamples, choose_snapshots, markers_for, rank_directories, rank_of, rank_path, read_run
from .load.shapes import SHAPE_KEYS, read_manifest, shape_from_filename
from .model import Snapshot
from .replay import Timeline, replay


@dataclass(eq=False)
class Run:
    """A run directory, read once: its samples now, each snapshot (and its replay) when first asked for."""

    path: Path
    samples: RunSamples
    entries: list[RunEntry]
    directories: dict[int, Path]
    progress: Callable[[str], None] | None = None     # told "loading rank N" before each load
    given: str = ""                                   # the path as the user wrote it, for messages
    loads: int = 0
    _loaded: dict[Path, tuple[Snapshot, Timeline]] = field(default_factory=dict, repr=False)

    def load(self, entry: RunEntry) -> tuple[Snapshot, Timeline]:
        """The snapshot of `entry` and its replay, loaded once."""
        found = self._loaded.get(entry.path)
        if found is None:
            if self.progress is not None:
                self.progress(f"loading rank {entry.rank}")
            snapshot = load(entry.path)
            found = self._loaded[entry.path] = (snapshot, replay(snapshot))
            self.loads += 1
        return found

    def forget(self, entry: RunEntry) -> None:
        """Drop the loaded snapshot of `entry` (a caller done with it keeps memory to one rank at a time)."""
        self._loaded.pop(entry.path, None)

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


def open_run(path: str | Path, progress: Callable[[str], None] | None = None) -> Run:
    """The run directory (or rank=N directory) at `path` (see the module docstring); `progress` hears of each
    snapshot load."""
    root = Path(path)
    return Run(path=root, samples=read_run(root), entries=run_entries(root), directories=rank_directories(root),
               progress=progress, given=str(path))


def is_run_path(path: str | Path) -> bool:
    """Whether `path` names a run directory (or one rank=N directory) rather than one snapshot."""
    p = Path(path)
    return p.is_dir() and not layout.is_tables_dir(p)


# -- ranks ----------------------------------------------------------------------------------------------------

def compare_ranks(run: str | Path | Run, tag: str | None = None, rules: RuleSet | None = None,
                  threshold: float = 0.02, min_bytes: int = 256 << 20,
                  keep: Callable[[int], bool] = lambda rank: False) -> rank_analysis.RankComparison:
    """`analyze.ranks.compare_ranks` over one snapshot per rank of `run` (tag ``final`` unless told). Each
    rank is loaded once; ranks `keep` does not name are dropped once compared, so one is held at a time."""
    opened = run if isinstance(run, Run) else open_run(run)
    chosen, problems = opened.ranks(tag=tag)
    if not chosen:
        raise BadInputError(opened.given, "no rank has a snapshot to compare: " + "; ".join(problems))

    def each() -> Iterator[RankData]:
        for data in chosen:
            yield data
            if not keep(data.rank):
                opened.forget(data.entry)

    return rank_analysis.compare_ranks(each(), rules=rules, threshold=threshold, min_bytes=min_bytes,
                                       problems=problems, run=opened.path, samples=opened.samples)


# -- OOMs -----------------------------------------------------------------------------------------------------

def explain_path(path: str | Path, rank: int | None = None, tag: str | None = None, rules: RuleSet | None = None,
                 capacity: int | None = None) -> tuple[list[SnapshotOoms], list[str]]:
    """Explain the OOMs of a snapshot file, or of every rank of a run (its ``oom-<n>`` snapshots first, else
    ``final``), with each rank's NVML samples, markers and capacity; returns the explanations and the
    problems found (missing ranks, NVML parts, snapshots), which are not fatal."""
    p = Path(path)
    if is_run_path(p):
        run = open_run(p)
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
    snapshot = load(p, rank, tag)
    if owner is None:
        return [SnapshotOoms(None, None, p, explain_oom(snapshot, capacity=capacity, rules=rules))], []
    found = rank_path(p)
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
            found = points_from_phases(Path(p).name, p, load(p, rank, tag), markers_for(p, rank, tag))
            if not found:
                raise UsageError(f"{p}: no phase with a shape (markers.parquet phases need attrs such as "
                                 "tokens=…; record_function spans need it in their name, e.g. 'prefill tokens=4096')")
            points.extend(found)
    elif shape_from.lower().endswith(".csv"):
        points = _manifest_points(inputs, shape_from, rank, tag)
    else:
        raise UsageError(f"--shape-from {shape_from}: expected filename, markers or a manifest .csv")
    if not points:
        raise UsageError("capacity: the sweep has no points")
    return order_points(points)


def _manifest_points(inputs: Sequence[str], manifest_path: str, rank: int | None, tag: str | None
                     ) -> list[SweepPoint]:
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
    points = []
    for p, row in chosen:
        shape = {k: (int(v) if k in SHAPE_KEYS else v) for k, v in row.items()
                 if k not in ("path", "file") and not (k in SHAPE_KEYS and pd.isna(v))}
        points.append(SweepPoint(Path(p).name, str(p), shape, load(p, rank, tag)))
    return points


def capacity(inputs: Iterable[str], shape_from: str = "filename", rules: RuleSet | None = None,
             device: int | None = None, rank: int | None = None, tag: str | None = None,
             driver: str | None = None) -> Capacity:
    """Load, measure and fit a sweep in one call (`sweep_points` → `measure_sweep` → `fit_capacity`)."""
    points = sweep_points(list(inputs), shape_from, rank, tag)
    return fit_capacity(measure_sweep(points, rules, device), driver)
