"""Categories over time: attribute the live set at a bounded number of instants and tabulate it.

Contract: `sample_indices(n_events, samples)` picks at most `samples` event indices spread evenly over a
trace of `n_events` events (−1, the state before the first event, and the last event included).
`InstantAttributions` attributes one device at one event index with `attribute()` and caches the result, so
an instant shared by several consumers (a sample, a peak, an OOM) is attributed once; each call resolves
only the stacks live at that instant. `categories_over_time(snapshot, …)` attributes every device at its
sampled instants plus the `include`d ones (peaks, OOMs) and returns a long DataFrame, one row per
(device, instant, category), zero-filled so that every category seen on a device appears at each of its
instants — ready for a stacked chart. Its bytes at an instant sum exactly to the active bytes there.

Columns: device, event_index (−1: before the first event), time_us (nullable), category, bytes,
inferred_bytes (bytes of that category decided by a shape heuristic rather than a frame rule).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from ..model import Snapshot
from ..replay import Timeline, replay
from .attribute import Attribution, attribute
from .rules import RuleSet, load_rules

COLUMNS = ["device", "event_index", "time_us", "category", "bytes", "inferred_bytes"]


def sample_indices(n_events: int, samples: int) -> list[int]:
    """At most `samples` (≥ 2) distinct event indices from −1 to n_events − 1, evenly spread, ascending."""
    if samples < 2:
        raise ValueError("samples must be at least 2")
    if n_events <= 0:
        return [-1]
    points = np.linspace(-1, n_events - 1, num=min(samples, n_events + 1))
    return sorted({int(round(p)) for p in points})


class InstantAttributions:
    """`attribute()` at (device, event index), computed once per instant and kept."""

    def __init__(self, snapshot: Snapshot, timeline: Timeline | None = None, rules: RuleSet | None = None,
                 markers: pd.DataFrame | None = None) -> None:
        self.snapshot, self.markers = snapshot, markers
        self.timeline = timeline if timeline is not None else replay(snapshot)
        self.rules = rules if rules is not None else load_rules()
        self._cache: dict[tuple[int, int], Attribution] = {}

    def at(self, device: int, index: int) -> Attribution:
        """The attribution of `device` right after event `index` (−1: before the first event)."""
        key = (device, int(index))
        found = self._cache.get(key)
        if found is None:
            found = attribute(self.snapshot, at=f"event:{int(index)}", rules=self.rules, device=device,
                              timeline=self.timeline, markers=self.markers)
            self._cache[key] = found
        return found

    def resolve(self, device: int, at: str) -> tuple[int, str]:
        """The event index and label an `--at` spec (peak, peak:N, event:I, time:T) names on `device`.

        The attribution made to resolve it is kept, under its event index."""
        result = attribute(self.snapshot, at=at, rules=self.rules, device=device, timeline=self.timeline,
                           markers=self.markers)
        instant = result.instants[device]
        self._cache.setdefault((device, instant.event_index), result)
        return instant.event_index, instant.label

    def __len__(self) -> int:
        return len(self._cache)


def categories_over_time(snapshot: Snapshot, timeline: Timeline | None = None, samples: int = 48,
                         include: Mapping[int, Iterable[int]] | None = None, rules: RuleSet | None = None,
                         device: int | None = None, cache: InstantAttributions | None = None) -> pd.DataFrame:
    """Bytes per category at `samples` evenly spread instants (plus `include[device]`) of each device.

    `cache` (optional) shares attributions with other consumers; without it one is made from `timeline`
    and `rules`. See the module docstring for the columns."""
    cache = cache or InstantAttributions(snapshot, timeline, rules)
    timeline = cache.timeline
    devices = [device] if device is not None else sorted(timeline.devices)
    include = include or {}
    frames = []
    for d in devices:
        dt = timeline[d]
        indices = sorted(set(sample_indices(len(dt), samples)) | {int(i) for i in include.get(d, ())})
        rows = []
        for index in indices:
            blocks = cache.at(d, index).blocks
            sizes = blocks["size"].to_numpy()
            inferred = blocks["inferred"].to_numpy(dtype=bool)
            for category, where in blocks.groupby("category", sort=True).indices.items():
                rows.append((d, index, dt.time_at(index), str(category), int(sizes[where].sum()),
                             int(sizes[where][inferred[where]].sum())))
        part = pd.DataFrame(rows, columns=COLUMNS)
        if len(part):
            full = pd.MultiIndex.from_product([indices, sorted(part["category"].unique())],
                                              names=["event_index", "category"])
            part = (part.set_index(["event_index", "category"]).reindex(full).reset_index())
            part["device"] = d
            part["time_us"] = [dt.time_at(int(i)) for i in part["event_index"]]
            part[["bytes", "inferred_bytes"]] = part[["bytes", "inferred_bytes"]].fillna(0)
        frames.append(part[COLUMNS])
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=COLUMNS)
    out = out.astype({"device": "int64", "event_index": "int64", "bytes": "int64", "inferred_bytes": "int64"})
    out["time_us"] = out["time_us"].astype("Int64")
    return out.sort_values(["device", "event_index", "category"], kind="stable", ignore_index=True)
