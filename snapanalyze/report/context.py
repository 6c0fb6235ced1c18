"""What an HTML report is built from: one snapshot's analyses — or every rank's of a run — computed once and
shared by every section.

Contract: `build_view(snapshot, …)` replays the snapshot (unless given a Timeline), finds the top peaks per
device, resolves the detail instants (every reported peak, or the `at` specs), attributes each of them, each
OOM entry and a bounded number of sampled instants (`analyze.over_time`; each instant once, through a shared
`InstantAttributions`, which the phases' peaks and the OOM entries use too), maps the marked phases onto the
trace (`analyze.phases.phase_table`), explains its OOM entries (`analyze.oom.explain_oom`), lays out the
segment map (`analyze.segment_map`) at each OOM entry (with its failed request) and at each device's main
instant, finds forward-pass tensors kept across training steps at each main instant (`analyze.kept`), and
returns an immutable `RankView` (whose `engine`, the program detected from those attributions, is found on
first use and kept). Given a
`RankInfo` (the rank of a run the snapshot came from) it also uses that rank's markers, NVML samples and
capacity, and reads the memory outside the allocator at each peak (`analyze.outside`). A `Report` holds
the views a report shows and what belongs to the whole report; section functions (`report.sections`) read
it and never recompute.

`build_path_context(path, rank, tag, …)` is the entry point for what a user names: a snapshot file gives
`build_context` (a Report of one view); a run directory (or one `rank=N` directory), opened once through
`session.open_run`, gives one view per rank (at most `MAX_DETAILED_RANKS`: with more ranks, the median
rank, the outliers and the extremes are detailed and the rest appear in the comparison only), the per-rank
comparison (`session.compare_ranks`, when two or more ranks are reported) and the run's problems (missing
NVML parts, ranks without a snapshot), which are reported, not fatal (`Report.run`). `rank` restricts a run
to that rank (no comparison); `tag` picks the snapshot of each rank (default: `final`, else a rank's only
snapshot). A file inside a `rank=N` directory is reported as that rank, with its markers and NVML samples.
Given `compare` (a baseline snapshot or run), each reported snapshot is diffed against the baseline
(`analyze.diff.diff`; Δ = this input − the baseline), rank by rank when the baseline is a run.

`inputs` carries what was asked for: "path" (what was loaded), "rank" and "tag" (the choice inside a run
directory; a run's report carries its first view's), "compare" (the baseline). `progress` is called with a
short step name before each slow step; nothing here prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from .. import layout
from ..analyze.attribute import Attribution
from ..analyze.budget import BudgetCheck
from ..analyze.diff import Diff, diff
from ..analyze.engine import Engine, detect_program
from ..analyze.kept import KeptAcrossStep, kept_across_step
from ..analyze.oom import OomExplanation, explain_oom
from ..analyze.outside import join_samples, outside_at_peaks
from ..analyze.over_time import COLUMNS as OVER_TIME_COLUMNS
from ..analyze.over_time import CURVE_COLUMNS, InstantAttributions, categories_over_time, category_curves
from ..analyze.peaks import find_peaks
from ..analyze.phases import PHASE_COLUMNS, phase_table
from ..analyze.ranks import RankComparison
from ..analyze.rules import RuleSet, shipped_rules
from ..analyze.segment_map import SegmentMap, segment_map
from ..errors import BadInputError, UsageError
from ..model import RunSamples, Snapshot
from ..replay import Timeline, replay
from ..session.inputs import SourceRoots, open_input, source_index
from ..session.runs import RankData, Run, compare_ranks, is_run_path, open_run
from .redact import Redactor

Progress = Callable[[str], None]
REPORT_FRAMES = "allocations"   # every stack the report shows is an allocation's (`load.load`'s `frames`)
CURVE_BUCKETS = 500             # per category curve over time: its min/max in this many runs of events
MAX_DETAILED_RANKS = 8          # ranks of a run with their own timelines, instants and rules in the report
MAX_PHASE_CATEGORIES = 40       # spans per device whose peak is attributed (the largest transients: every row
                                # the phases table shows, MAX_PHASE_ROWS)


@dataclass(frozen=True)
class ReportOptions:
    """What a report shows of each snapshot it details (the `report` command's options).

    top: peaks per device to find, mark and (without `at`) attribute in detail. at: instant specs
    (peak, peak:N, event:I, time:T) to attribute in detail instead. samples: instants per device for the
    categories-over-time chart (every detail instant and OOM entry is added). device: only this one.
    redact_paths: file paths shown as hashes. capacity: the device memory in bytes, overriding the run's
    (and all a lone snapshot can know)."""

    top: int = 3
    at: tuple[str, ...] = ()
    samples: int = 32
    device: int | None = None
    redact_paths: bool = False
    capacity: int | None = None


@dataclass(frozen=True)
class DetailInstant:
    """An instant the report attributes in detail: a peak, or one asked for with `at`."""

    device: int
    event_index: int
    label: str            # "peak 1", "event 12", "time … µs", "the allocator's state" (no trace to peak in)
    slug: str             # stable id fragment: "p1", "e12"


@dataclass(frozen=True, eq=False)
class RankInfo:
    """What a run directory holds about the rank a snapshot came from, beyond the snapshot."""

    rank: int
    tag: str | None
    path: str                                    # the snapshot file (or tables directory) reported
    samples: RunSamples                          # the run's NVML samples, markers and meta (every rank)
    nvml: pd.DataFrame                           # this rank's NVML rows (`load.samples` columns)
    markers: pd.DataFrame                        # this rank's phase and request markers

    def capacity(self, device: int) -> tuple[int | None, str]:
        """The device's total memory and where it came from (NVML total, meta.json, or unknown)."""
        return self.samples.capacity(self.rank, device)

    @property
    def interval_ms(self) -> float | None:
        """The NVML sampling interval meta.json states, if any."""
        return self.samples.nvml_interval_ms(self.rank)


@dataclass(frozen=True, eq=False)
class RunInfo:
    """What a report of a run directory knows beyond its views: the comparison across ranks, the ranks only
    compared, the problems."""

    path: str
    samples: RunSamples
    comparison: RankComparison | None            # None for one rank (or with --rank)
    ranks: tuple[int, ...]                       # every rank with a snapshot
    omitted: tuple[int, ...] = ()                # ranks only in the comparison (beyond MAX_DETAILED_RANKS)
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class BaselineDiff:
    """The diff of one reported snapshot against the baseline: A = the baseline, B = this input."""

    rank: int | None
    baseline: str
    diff: Diff


@dataclass(frozen=True, eq=False)
class RankView:
    """One reported snapshot's analyses, computed once (see the module docstring)."""

    snapshot: Snapshot
    timeline: Timeline
    rules: RuleSet
    devices: list[int]
    peaks: pd.DataFrame                        # find_peaks rows of the reported devices
    details: dict[int, list[DetailInstant]]    # per device, the main instant first
    attributions: InstantAttributions
    series: pd.DataFrame                       # categories_over_time rows
    curves: pd.DataFrame                       # category_curves rows: every event's bytes per category
    redactor: Redactor
    inputs: Mapping[str, Any] = field(default_factory=dict)
    phases: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=PHASE_COLUMNS))
    oom: OomExplanation | None = None          # explain_oom of this snapshot
    rank: RankInfo | None = None               # set when the snapshot is a rank of a run
    outside: pd.DataFrame | None = None        # outside_at_peaks rows at `peaks` (a rank with NVML samples)
    joined: dict[int, pd.DataFrame] = field(default_factory=dict)   # per device: join_samples of its NVML
    given_capacity: int | None = None          # device memory the user gave (--capacity), for every device
    segment_maps: dict[tuple[int, int], SegmentMap] = field(default_factory=dict)   # (device, event index)
    kept: dict[int, KeptAcrossStep] = field(default_factory=dict)   # per device: kept across a step at `main`

    def capacity(self, device: int) -> tuple[int | None, str]:
        """Device memory in bytes and where it came from: given, else the run's NVML/meta.json, else unknown."""
        return _capacity(self.given_capacity, self.rank, device)

    def attribution(self, device: int, event_index: int) -> Attribution:
        """The attribution of `device` right after `event_index` (cached)."""
        return self.attributions.at(device, event_index)

    def main(self, device: int) -> DetailInstant:
        """The instant the verdict speaks about: the first detail instant (the global peak by default)."""
        return self.details[device][0]

    def key(self, device: int) -> str:
        """An id fragment for a device: "d0", or "r1-d0" for a rank of a run."""
        return f"d{device}" if self.rank is None else f"r{self.rank.rank}-d{device}"

    def where(self, device: int) -> str:
        """"device 0"; for a rank of a run "rank 1" (one device) or "rank 1, device 3"."""
        if self.rank is None:
            return f"device {device}"
        if len(self.timeline.devices) <= 1:
            return f"rank {self.rank.rank}"
        return f"rank {self.rank.rank}, device {device}"

    def heading(self, device: int) -> str:
        """"Device 0" or "Rank 1, device 0"."""
        return f"Device {device}" if self.rank is None else f"Rank {self.rank.rank}, device {device}"

    @property
    def source(self) -> str:
        """The snapshot's path, redacted for sharing."""
        return self.redactor.path(self.snapshot.source)

    @cached_property
    def engine(self) -> Engine:
        """The program this snapshot ran (`analyze.engine.detect_program` over the blocks live at the verdict's
        instants: each device's main instant and its OOM entries; else over everything it allocated), found
        once, from the view's own attributions."""
        parts = []
        for device in self.devices:
            indices = [self.main(device).event_index] if self.details.get(device) else []
            if self.oom is not None:
                indices += [int(i) for i in self.oom.ooms.loc[self.oom.ooms["device"] == device, "index"]]
            for index in dict.fromkeys(indices):
                blocks = self.attribution(device, index).blocks
                parts.append(blocks.loc[blocks["device"] == device, ["stack_id", "category", "size"]])
        blocks = (pd.concat(parts, ignore_index=True) if parts
                  else pd.DataFrame({"stack_id": pd.Series(dtype="int64"), "category": [], "size": []}))
        return detect_program(self.snapshot, blocks)


@dataclass(frozen=True, eq=False)
class Report:
    """Everything the sections of one report read: the reported snapshots (`views`, one per rank of a run),
    the run's comparison and problems, the diffs against a baseline, and what was asked for (`inputs`)."""

    views: tuple[RankView, ...]
    run: RunInfo | None = None                 # set for a run directory (or a file inside one)
    diffs: tuple[BaselineDiff, ...] = ()       # against the baseline (--compare)
    problems: tuple[str, ...] = ()             # what the baseline comparison could not do
    inputs: Mapping[str, Any] = field(default_factory=dict)
    budget: BudgetCheck | None = None          # the engine's budget against this input (--engine-log)

    @property
    def rules(self) -> RuleSet:
        return self.views[0].rules

    @property
    def redactor(self) -> Redactor:
        return self.views[0].redactor

    @property
    def source(self) -> str:
        """What the report is of — the snapshot's path, or the run directory — redacted for sharing."""
        if self.run is not None:
            return self.redactor.path(self.run.path)
        return self.views[0].source


def _named(label: str, index: int) -> tuple[str, str]:
    """(label, slug) of a resolved `at` spec: the global peak is peak 1; other instants by event index."""
    if label == "global peak":
        label = "peak 1"
    if label.startswith("peak "):
        return label, "p" + label.split(" ", 1)[1]
    return label, (f"e{index}" if index >= 0 else "start")


def build_context(snapshot: Snapshot, timeline: Timeline | None = None, rules: RuleSet | None = None,
                  options: ReportOptions = ReportOptions(), inputs: Mapping[str, Any] | None = None,
                  progress: Progress | None = None) -> Report:
    """The report of one snapshot: `build_view` of it."""
    view = build_view(snapshot, timeline=timeline, rules=rules, options=options, inputs=inputs, progress=progress)
    return Report(views=(view,), inputs=dict(inputs or {}))


def build_view(snapshot: Snapshot, timeline: Timeline | None = None, rules: RuleSet | None = None,
               options: ReportOptions = ReportOptions(), inputs: Mapping[str, Any] | None = None,
               progress: Progress | None = None, rank: RankInfo | None = None) -> RankView:
    """Run the analyses a report shows for one snapshot (see the module docstring), as `options` say.
    rank: the rank of a run the snapshot is (its markers, NVML samples and capacity join the analyses)."""
    top, at, samples, device = options.top, options.at, options.samples, options.device
    step = progress or (lambda _: None)
    if timeline is None:
        step("replaying")
        timeline = replay(snapshot)
    rules = rules or shipped_rules()
    if device is not None and device not in timeline.devices:
        raise UsageError(f"{snapshot.source}: no device {device} (devices: {sorted(timeline.devices)})")
    devices = [device] if device is not None else sorted(timeline.devices)
    step("finding peaks")
    peaks = find_peaks(timeline, top=top, device=device)
    cache = InstantAttributions(snapshot, timeline, rules, markers=rank.markers if rank is not None else None)
    step("attributing")
    details: dict[int, list[DetailInstant]] = {}
    for d in devices:
        chosen: list[DetailInstant] = []
        if at:
            for spec in at:
                index, label = cache.resolve(d, spec)
                chosen.append(DetailInstant(d, index, *_named(label, index)))
        else:
            for row in peaks[peaks["device"] == d].itertuples():
                index = int(row.event_index)
                cache.at(d, index)
                # a state with at most one trace entry has no peak in it: its instant is the allocator's state
                label = "the allocator's state" if len(timeline[d]) <= 1 else f"peak {int(row.peak)}"
                chosen.append(DetailInstant(d, index, label, f"p{int(row.peak)}"))
        unique: dict[int, DetailInstant] = {}
        for instant in chosen:                      # two specs naming one instant: the first one's label
            unique.setdefault(instant.event_index, instant)
        details[d] = list(unique.values())
    ooms = snapshot.ooms
    include = {d: [i.event_index for i in details[d]]
               + [int(i) for i in ooms.loc[ooms["device"] == d, "index"]] for d in devices}
    step("sampling categories over time")
    parts = [categories_over_time(snapshot, samples=samples, include=include, device=d, cache=cache)
             for d in devices]
    series = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=OVER_TIME_COLUMNS)
    step("drawing categories at every event")
    drawn = [category_curves(cache, d, part["event_index"].unique(), CURVE_BUCKETS) for d, part in zip(devices, parts)]
    curves = pd.concat(drawn, ignore_index=True) if drawn else pd.DataFrame(columns=CURVE_COLUMNS)
    markers = rank.markers if rank is not None else None
    nvml = rank.nvml if rank is not None and len(rank.nvml) else None
    step("mapping phases")
    phases = phase_table(snapshot, timeline, markers, rules=rules, device=device,
                         attribute_largest=MAX_PHASE_CATEGORIES, attribution_at=cache.at)
    step("explaining OOMs")
    capacities = {d: _capacity(options.capacity, rank, d) for d in timeline.devices}
    oom = explain_oom(snapshot, timeline, nvml=nvml, capacity=capacities, markers=markers, rules=rules,
                      attribution_at=cache.at)
    step("laying out segments")
    maps: dict[tuple[int, int], SegmentMap] = {}
    for r in ooms[ooms["device"].isin(devices)].itertuples(index=False):
        maps.setdefault((int(r.device), int(r.index)), segment_map(snapshot, timeline, int(r.device), int(r.index),
                                                                   int(r.size), int(r.stream)))
    for d in devices:
        if details[d]:
            index = details[d][0].event_index
            maps.setdefault((d, index), segment_map(snapshot, timeline, d, index))
    kept = {}
    for d in devices:
        if details[d]:
            index = details[d][0].event_index
            found = kept_across_step(cache.at(d, index), d, index, rules.per_forward)
            if found is not None:
                kept[d] = found
    outside = None
    joined: dict[int, pd.DataFrame] = {}
    if nvml is not None:
        step("joining NVML samples")
        outside = outside_at_peaks(timeline, nvml, peaks)
        joined = {d: join_samples(timeline[d], nvml) for d in devices}
    return RankView(snapshot=snapshot, timeline=timeline, rules=rules, devices=devices, peaks=peaks,
                         details=details, attributions=cache, series=series, curves=curves,
                         redactor=Redactor(enabled=options.redact_paths), inputs=dict(inputs or {}),
                         phases=phases, oom=oom, rank=rank, outside=outside, joined=joined,
                         given_capacity=options.capacity,
                         segment_maps=maps, kept=kept)


def _capacity(given: int | None, rank: RankInfo | None, device: int) -> tuple[int | None, str]:
    if given is not None:
        return given, "given (--capacity)"
    return rank.capacity(device) if rank is not None else (None, "unknown")


def _rank_info(samples: RunSamples, data: RankData) -> RankInfo:
    return RankInfo(rank=data.rank, tag=data.tag or None, path=str(data.path), samples=samples,
                    nvml=samples.nvml_of(data.rank), markers=samples.markers_of(data.rank))


def detail_ranks(comparison: RankComparison, limit: int = MAX_DETAILED_RANKS) -> list[int]:
    """The ranks shown in detail when a run has more than `limit`: the median rank, the outliers (largest
    difference first), the highest and the lowest peak, then the rest in rank order — `limit` of them."""
    table = comparison.table
    ranks = sorted(set(int(r) for r in table["rank"]))
    if len(ranks) <= limit:
        return ranks
    chosen: list[int] = []

    def add(rank: int) -> None:
        if rank not in chosen and len(chosen) < limit:
            chosen.append(rank)

    if comparison.median_rank is not None:
        add(int(comparison.median_rank))
    out = table[table["outlier"]].assign(size=table["difference_bytes"].abs())
    for r in out.sort_values(["size", "rank"], ascending=[False, True], kind="stable")["rank"]:
        add(int(r))
    by_peak = table.sort_values(["active_bytes", "rank"], kind="stable")["rank"]
    if len(by_peak):
        add(int(by_peak.iloc[-1]))
        add(int(by_peak.iloc[0]))
    for r in ranks:
        add(r)
    return sorted(chosen)


def build_run_context(run: Run, rank: int | None = None, tag: str | None = None,
                      rules: RuleSet | None = None, options: ReportOptions = ReportOptions(),
                      inputs: Mapping[str, Any] | None = None, progress: Progress | None = None,
                      snapshot_path: str | Path | None = None, executor: Executor | None = None) -> Report:
    """A run's report (see the module docstring); `options` go to `build_view` for each rank, `inputs` with
    each rank's own rank and tag.
    `snapshot_path`: report this snapshot as the rank whose directory holds it (a file inside a run).
    `executor`: where the comparison measures the ranks when there are more than are detailed (each is then
    read in a worker, and only the detailed ones here); with no more, each rank is read once, here."""
    step = progress or (lambda _: None)
    rules = rules or shipped_rules()
    samples = run.samples
    if snapshot_path is not None:
        chosen, problems = [run.file(snapshot_path)], list(samples.problems)
    else:
        chosen, problems = run.ranks(tag=tag, rank=rank)
    if not chosen:
        raise BadInputError(run.given, "no snapshot to report: " + "; ".join(problems))
    comparison = None
    shown = [e.rank for e in chosen]
    if len(chosen) > 1:
        step("comparing ranks")
        every = len(chosen) <= MAX_DETAILED_RANKS        # every rank is shown: each is read once, for both uses
        comparison = compare_ranks(run, tag=tag, rules=rules, keep=lambda _: every,
                                   executor=None if every else executor, progress=None if every else progress)
        if not every:
            shown = detail_ranks(comparison) or shown[:MAX_DETAILED_RANKS]
    base = dict(inputs or {})
    views = []
    for data in chosen:
        if data.rank not in shown:
            continue
        snapshot, timeline = data.snapshot, data.timeline
        views.append(build_view(snapshot, timeline=timeline, rules=rules, options=options, progress=progress,
                                rank=_rank_info(samples, data),
                                inputs={**base, "rank": data.rank, "tag": data.tag or None}))
    if not views:
        raise BadInputError(run.given, "no snapshot to report: " + "; ".join(problems))
    info_run = RunInfo(path=run.given, samples=samples, comparison=comparison, ranks=tuple(e.rank for e in chosen),
                       omitted=tuple(e.rank for e in chosen if e.rank not in shown), problems=tuple(problems))
    return Report(views=tuple(views), run=info_run, inputs=views[0].inputs)


def build_path_context(path: str | Path, rank: int | None = None, tag: str | None = None,
                       compare: str | Path | None = None, rules: RuleSet | None = None,
                       options: ReportOptions = ReportOptions(), progress: Progress | None = None,
                       executor: Executor | None = None, source: SourceRoots = None) -> Report:
    """The report of what a user names: a snapshot file, a run directory or a rank=N directory (see the
    module docstring); `compare` adds the diff against that baseline. `options` go to each `build_view`;
    `executor` to `build_run_context`; `source` (the program's checkout) to each load."""
    source = source_index(source)
    step = progress or (lambda _: None)
    rules = rules or shipped_rules()
    inputs = {"path": str(path), "rank": rank, "tag": tag, "compare": None if compare is None else str(compare)}
    inside = layout.rank_dir_of(path)
    if is_run_path(path):
        step("reading the run")
        opened = open_run(path, progress, frames=REPORT_FRAMES, source=source)
        context = build_run_context(opened, rank, tag, rules=rules, options=options, progress=progress,
                                    inputs=inputs, executor=executor)
    elif inside is not None:
        step("reading the run")
        context = build_run_context(open_run(inside, progress, frames=REPORT_FRAMES, source=source), rules=rules,
                                    options=options, progress=progress, inputs=inputs, snapshot_path=path)
    else:
        step("loading")
        snapshot = open_input(path, frames=REPORT_FRAMES, source=source).snapshot
        context = build_context(snapshot, rules=rules, options=options, progress=progress, inputs=inputs)
    if compare is not None:
        context = compare_with(context, compare, tag=tag, progress=progress, source=source)
    return context


def compare_with(context: Report, baseline: str | Path, tag: str | None = None,
                 progress: Progress | None = None, source: SourceRoots = None) -> Report:
    """`context` with `diffs`: each reported snapshot against `baseline` (a snapshot, or a run whose same
    rank is taken; a run of one rank serves every rank), loaded with `source`. Ranks the baseline lacks go
    to `problems`."""
    step = progress or (lambda _: None)
    run_baseline = is_run_path(baseline)
    cache: dict[int | None, Snapshot] = {}
    diffs, problems = [], []
    for view in context.views:
        own = view.rank.rank if view.rank is not None else None
        key = own if run_baseline else None
        step("diffing against the baseline" + (f" (rank {own})" if own is not None else ""))
        if key not in cache:
            try:
                cache[key] = open_input(baseline, key if run_baseline else None, tag if run_baseline else None,
                                        frames=REPORT_FRAMES, source=source).snapshot
            except UsageError as exc:
                if key is None:
                    raise UsageError(f"--compare: {exc}") from None
                try:                                     # a baseline run of one rank serves every rank
                    cache[key] = open_input(baseline, None, tag, frames=REPORT_FRAMES, source=source).snapshot
                except UsageError:
                    problems.append(f"rank {own}: the baseline {baseline} has no snapshot for it")
                    continue
        device = view.devices[0] if len(view.devices) == 1 and len(view.timeline.devices) > 1 else None
        try:
            result = diff(cache[key], view.snapshot, device=device, rules=view.rules)
        except UsageError as exc:
            problems.append(f"{'rank ' + str(own) + ': ' if own is not None else ''}{exc}")
            continue
        diffs.append(BaselineDiff(rank=own, baseline=str(baseline), diff=result))
    if not diffs:
        raise UsageError(f"--compare {baseline}: nothing to compare: " + "; ".join(problems))
    return dataclasses.replace(context, diffs=tuple(diffs), problems=tuple(problems))
