"""What an HTML report is built from: one snapshot's analyses, computed once and shared by every section.

Contract: `build_context(snapshot, …)` replays the snapshot (unless given a Timeline), finds the top peaks
per device, resolves the detail instants (every reported peak, or the `at` specs), attributes each of them,
each OOM entry and a bounded number of sampled instants (`analyze.over_time`; each instant once, through a
shared `InstantAttributions`), and returns a `ReportContext`. Section functions (`report.sections`) read it
and never recompute. `inputs` carries whatever later sections need beyond one snapshot (a run directory,
NVML samples, a baseline to diff against) under documented keys: "path" (what was loaded), "rank" and
"tag" (the choice inside a run directory). `progress` is called with a short step name before each slow
step; nothing here prints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..analyze.attribute import Attribution
from ..analyze.over_time import COLUMNS as OVER_TIME_COLUMNS
from ..analyze.over_time import InstantAttributions, categories_over_time
from ..analyze.peaks import find_peaks
from ..analyze.rules import RuleSet, load_rules
from ..errors import UsageError
from ..model import Snapshot
from ..replay import Timeline, replay
from .redact import Redactor

Progress = Callable[[str], None]


@dataclass(frozen=True)
class DetailInstant:
    """An instant the report attributes in detail: a peak, or one asked for with `at`."""

    device: int
    event_index: int
    label: str            # "peak 1", "event 12", "time … µs"
    slug: str             # stable id fragment: "p1", "e12"


@dataclass
class ReportContext:
    """Everything the sections of one report read (see the module docstring)."""

    snapshot: Snapshot
    timeline: Timeline
    rules: RuleSet
    devices: list[int]
    peaks: pd.DataFrame                        # find_peaks rows of the reported devices
    details: dict[int, list[DetailInstant]]    # per device, the main instant first
    attributions: InstantAttributions
    series: pd.DataFrame                       # categories_over_time rows
    redactor: Redactor
    inputs: Mapping[str, Any] = field(default_factory=dict)

    def attribution(self, device: int, event_index: int) -> Attribution:
        """The attribution of `device` right after `event_index` (cached)."""
        return self.attributions.at(device, event_index)

    def main(self, device: int) -> DetailInstant:
        """The instant the verdict speaks about: the first detail instant (the global peak by default)."""
        return self.details[device][0]

    @property
    def source(self) -> str:
        """The snapshot's source path, redacted when the report is for sharing."""
        return self.redactor.path(self.snapshot.source)


def _named(label: str, index: int) -> tuple[str, str]:
    """(label, slug) of a resolved `at` spec: the global peak is peak 1; other instants by event index."""
    if label == "global peak":
        label = "peak 1"
    if label.startswith("peak "):
        return label, "p" + label.split(" ", 1)[1]
    return label, (f"e{index}" if index >= 0 else "start")


def build_context(snapshot: Snapshot, timeline: Timeline | None = None, rules: RuleSet | None = None,
                  top: int = 3, at: Sequence[str] = (), samples: int = 32, device: int | None = None,
                  redact_paths: bool = False, inputs: Mapping[str, Any] | None = None,
                  progress: Progress | None = None) -> ReportContext:
    """Run the analyses a report shows (see the module docstring).

    top: peaks per device to find, mark and (without `at`) attribute in detail. at: instant specs
    (peak, peak:N, event:I, time:T) to attribute in detail instead. samples: instants per device for the
    categories-over-time chart (every detail instant and OOM entry is added). device: only this one."""
    step = progress or (lambda _: None)
    if timeline is None:
        step("replaying")
        timeline = replay(snapshot)
    rules = rules or load_rules()
    if device is not None and device not in timeline.devices:
        raise UsageError(f"{snapshot.source}: no device {device} (devices: {sorted(timeline.devices)})")
    devices = [device] if device is not None else sorted(timeline.devices)
    step("finding peaks")
    peaks = find_peaks(timeline, top=top, device=device)
    cache = InstantAttributions(snapshot, timeline, rules)
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
                chosen.append(DetailInstant(d, index, f"peak {int(row.rank)}", f"p{int(row.rank)}"))
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
    return ReportContext(snapshot=snapshot, timeline=timeline, rules=rules, devices=devices, peaks=peaks,
                         details=details, attributions=cache, series=series,
                         redactor=Redactor(snapshot, enabled=redact_paths), inputs=dict(inputs or {}))
