"""Categories over time: attribute the live set at a bounded number of well-chosen instants and tabulate it.

Contract: `choose_instants(timeline, device, samples, include)` picks the event indices of a device at which to
attribute: the window's start (−1, the state before the first event) and its last event, every peak
`find_peaks` reports, the `include`d ones (detail instants, OOMs), and then at most `samples` more where
the live set changes most. The change is measured exactly: between two chosen instants s < j the live set
differs by D_s(j) = bytes live at exactly one of them (= active[j] − active[s] + 2 × bytes live at s and
freed by j). A chart holding instant s's categories until the next chosen instant e is wrong by D_s(j) for
as long as the state after j lasted; Σ D × duration is the gap's error area (on the chart's x axis: time,
or the event index without timestamps). Greedily, the gap with the largest error area is split at the event
whose change lasts longest to the gap's end (max D_s(j) × (x_e − x_j): a jump splits at the jump, a ramp
at its middle, a spike at its rise and then its fall), so the instants go where memory moved and stayed
moved — not into a burst narrower than RESOLUTION of the window (under a pixel), nor where memory stood
still. Cost: one pass
over the events of the gap per split, columnar; `samples` bounds the attributions.
`held_error(timeline, device, instants)` is that area summed over the gaps of any instants (gaps under
RESOLUTION count 0): what a held chart gets wrong.
`InstantAttributions` attributes one device at one event index with `attribute()` and caches the result, so
an instant shared by several consumers (a sample, a peak, an OOM) is attributed once; each call resolves
only the stacks live at that instant. `categories_over_time(snapshot, …)` attributes every device at its
chosen instants and returns a long DataFrame, one row per (device, instant, category), zero-filled so that
every category seen on a device appears at each of its instants — ready for a stacked chart drawn as steps
(the state after an instant holds until the next event; between two chosen instants it is the earlier
one's, up to D). Its bytes at an instant sum exactly to the active bytes there.

Columns: device, event_index (−1: before the first event), time_us (nullable), category, bytes,
inferred_bytes (bytes of that category decided by a shape heuristic rather than a frame rule).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from ..envelope import envelope_indices
from ..model import Snapshot
from ..replay import DeviceTimeline, Timeline, replay
from .attribute import Attribution, attribute
from .peaks import find_peaks
from .rules import RuleSet, shipped_rules

COLUMNS = ["device", "event_index", "time_us", "category", "bytes", "inferred_bytes"]
RESOLUTION = 1e-3        # of the window's width: a gap narrower than this (under a pixel of a chart) is not split


class _LiveChange:
    """D_s(j) for the events j of a gap after instant s, and the gap's error area (see the module docstring),
    from one device's curves and lifetimes."""

    def __init__(self, dt: DeviceTimeline) -> None:
        self.dt = dt
        lt = dt.lifetimes
        free = lt["free_index"].to_numpy(dtype=np.int64)
        freed = np.flatnonzero(free >= 0)
        order = freed[np.argsort(free[freed], kind="stable")]
        self.free = free[order]
        self.alloc = lt["alloc_index"].to_numpy(dtype=np.int64)[order]
        self.size = lt["size"].to_numpy(dtype=np.int64)[order]
        n = len(dt)
        index = np.arange(n, dtype=np.float64)
        times = dt.time_us
        span = float(times[-1] - times[0]) if times is not None and n else 0.0
        # the x axis the chart is read on: time, events breaking ties (the event index without times)
        self.x = (times - times[0]).astype(np.float64) + index * (span / n * 1e-3) if times is not None and span > 0 \
            else index
        self.resolution = RESOLUTION * float(self.x[-1] - self.x[0]) if n else 0.0

    def split(self, s: int, e: int) -> tuple[float, int]:
        """(the error area of holding instant s's live set until instant e, the event to split at; −1: none)."""
        if e - s < 2:
            return 0.0, -1
        dt = self.dt
        change = dt.active[s + 1:e] - dt.active_at(s)
        lo, hi = np.searchsorted(self.free, [s + 1, e], side="left")
        old = self.alloc[lo:hi] <= s                       # live at s (allocated by then), freed in the gap
        gone = np.bincount(self.free[lo:hi][old] - (s + 1), weights=self.size[lo:hi][old], minlength=e - s - 1)
        d = (change + 2 * np.cumsum(gone)).astype(np.float64)
        x = self.x[s + 1:e + 1]
        if x[-1] - x[0] < self.resolution:
            return 0.0, -1
        area = float((d * np.diff(x)).sum())
        if area <= 0:
            return 0.0, -1
        return area, s + 1 + int(np.argmax(d * (x[-1] - x[:-1])))


def choose_instants(timeline: Timeline, device: int, samples: int, include: Iterable[int] = (),
                    peaks: bool = True) -> list[int]:
    """The event indices of `device` to attribute, ascending: the window's start (−1) and last event, every
    peak of `find_peaks` (when `peaks`), `include`, and at most `samples` more where the live set changes
    most (see the module docstring)."""
    if samples < 0:
        raise ValueError("samples must not be negative")
    dt = timeline[device]
    n = len(dt)
    chosen = {-1} | ({n - 1} if n else set()) | {int(i) for i in include if -1 <= int(i) < n}
    if peaks and n:
        chosen |= {int(i) for i in find_peaks(timeline, device=device)["event_index"]}
    if n < 2 or samples == 0:
        return sorted(chosen)
    change = _LiveChange(dt)
    ordered = sorted(chosen)
    heap: list[tuple[float, int, int, int]] = []
    for s, e in zip(ordered, ordered[1:]):
        largest, at = change.split(s, e)
        if at >= 0:
            heap.append((-largest, s, e, at))
    heapq.heapify(heap)
    for _ in range(samples):
        if not heap:
            break
        _, s, e, at = heapq.heappop(heap)
        chosen.add(at)
        for a, b in ((s, at), (at, e)):
            largest, split = change.split(a, b)
            if split >= 0:
                heapq.heappush(heap, (-largest, a, b, split))
    return sorted(chosen)


def held_error(timeline: Timeline, device: int, instants: Iterable[int]) -> float:
    """The error area of a step chart that holds each of `instants` (ascending event indices) until the next:
    Σ over the gaps of D × duration (bytes × the chart's x unit; see the module docstring)."""
    change = _LiveChange(timeline[device])
    ordered = sorted({int(i) for i in instants})
    return float(sum(change.split(s, e)[0] for s, e in zip(ordered, ordered[1:])))


class InstantAttributions:
    """`attribute()` at (device, event index), computed once per instant and kept."""

    def __init__(self, snapshot: Snapshot, timeline: Timeline | None = None, rules: RuleSet | None = None,
                 markers: pd.DataFrame | None = None) -> None:
        self.snapshot, self.markers = snapshot, markers
        self.timeline = timeline if timeline is not None else replay(snapshot)
        self.rules = rules if rules is not None else shipped_rules()
        self._cache: dict[tuple[int, int], Attribution] = {}

    def at(self, device: int, index: int) -> Attribution:
        """The attribution of `device` right after event `index` (−1: before the first event)."""
        key = (device, int(index))
        found = self._cache.get(key)
        if found is None:
            found = attribute(self.snapshot, at=int(index), rules=self.rules, device=device,
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
    """Bytes per category of each device at its `choose_instants` (`samples` chosen where the live set
    changes most, plus the window's ends, the peaks and `include[device]`).

    `cache` (optional) shares attributions with other consumers; without it one is made from `timeline`
    and `rules`. See the module docstring for the columns."""
    cache = cache or InstantAttributions(snapshot, timeline, rules)
    timeline = cache.timeline
    devices = [device] if device is not None else sorted(timeline.devices)
    include = include or {}
    frames = []
    for d in devices:
        dt = timeline[d]
        indices = choose_instants(timeline, d, samples, include.get(d, ()))
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


UNATTRIBUTED = "not attributed"
CURVE_COLUMNS = ["device", "event_index", "time_us", "category", "bytes"]


def category_curves(cache: InstantAttributions, device: int, instants: Iterable[int], buckets: int) -> pd.DataFrame:
    """The live bytes per category of `device` after every event, exact, drawn from its attributions at
    `instants` (ascending event indices): a block lifetime has, at each event, the category it has at the first
    of `instants` from there on where it is live (after the last one, its last category), so the curves equal
    each instant's attribution at that instant; a lifetime live at none of them (alive only between two
    attributed instants) is UNATTRIBUTED. The categories sum to the active bytes at every event. Returned at
    the window's start (−1), every instant, and the min/max envelope of each category's curve in `buckets`
    runs (`envelope_indices`) and of their sum (the active bytes), so every spike keeps its height; the state
    after an event holds until the next row. Columns: CURVE_COLUMNS, zero-filled per event. Cost: columnar,
    O(lifetimes + events × categories)."""
    dt = cache.timeline[device]
    n = len(dt)
    points = sorted({-1} | {int(i) for i in instants if -1 <= int(i) < n})
    if not n:
        return pd.DataFrame(columns=CURVE_COLUMNS)
    lt = dt.lifetimes
    alloc = lt["alloc_index"].to_numpy(dtype=np.int64)
    free = lt["free_index"].to_numpy(dtype=np.int64)
    size = lt["size"].to_numpy(dtype=np.int64)
    keys = pd.MultiIndex.from_arrays([lt["addr"].to_numpy(dtype=np.uint64), alloc])
    unique = np.flatnonzero(~keys.duplicated())          # an inconsistent trace may repeat a key: its first row
    lifetimes = keys[unique]
    names: list[str] = [UNATTRIBUTED]                   # category codes; 0: no instant saw the lifetime
    first = np.zeros(len(lt), dtype=np.int64)            # per lifetime: its category from its allocation on
    last = np.zeros(len(lt), dtype=np.int64)             # … at the last instant that saw it (so at its free)
    seen_at = np.full(len(lt), -2, dtype=np.int64)       # … that instant
    move_at, move_from, move_to, move_size = [], [], [], []
    for instant in points:                               # one pass per instant over its live blocks, columnar
        blocks = cache.at(device, instant).blocks
        ids = lifetimes.get_indexer(pd.MultiIndex.from_arrays([blocks["address"].to_numpy(dtype=np.uint64),
                                                               blocks["alloc_index"].to_numpy(dtype=np.int64)]))
        labels = blocks["category"].astype(str).to_numpy(dtype=object)
        known, ids = ids >= 0, unique[ids[ids >= 0]]
        names += [c for c in pd.unique(labels[known]) if c not in names]
        codes = pd.Index(names).get_indexer(labels[known])
        fresh = seen_at[ids] == -2
        first[ids[fresh]] = codes[fresh]
        moved = ~fresh & (last[ids] != codes)            # a lifetime whose category changed since the last instant
        move_at.append(seen_at[ids[moved]] + 1)          # from the event after the instant that saw it before
        move_from.append(last[ids[moved]])
        move_to.append(codes[moved])
        move_size.append(size[ids[moved]])
        last[ids], seen_at[ids] = codes, instant
    moves = [np.concatenate(m).astype(np.int64) for m in (move_at, move_from, move_to, move_size)]

    def counts(where: np.ndarray, weights: np.ndarray) -> np.ndarray:
        return np.bincount(where, weights=weights, minlength=n).round().astype(np.int64)

    chosen = np.asarray([p for p in points if p >= 0] + [0, n - 1], dtype=np.int64)
    curves: dict[str, np.ndarray] = {}
    starts: dict[str, int] = {}
    total = np.zeros(n, dtype=np.int64)
    at, came_from, went_to, moved_size = moves
    for code in sorted(np.unique(np.concatenate([first, last, went_to])).tolist(), key=lambda c: names[c]):
        name = names[code]
        mine = first == code
        grow, gone = mine & (alloc >= 0), (last == code) & (free >= 0)
        into, out = went_to == code, came_from == code
        delta = (counts(alloc[grow], size[grow]) - counts(free[gone], size[gone])
                 + counts(at[into], moved_size[into]) - counts(at[out], moved_size[out]))
        starts[name] = int(size[mine & (alloc < 0)].sum())
        curves[name] = starts[name] + np.cumsum(delta)
        total += curves[name]
        chosen = np.union1d(chosen, envelope_indices(curves[name], buckets))
    chosen = np.union1d(chosen, envelope_indices(total, buckets))    # the sum's (the active bytes') spikes too
    index = np.concatenate([[-1], chosen]).astype(np.int64)
    times = pd.array(np.zeros(len(index), dtype=np.int64), dtype="Int64")
    times[:] = pd.NA
    if dt.time_us is not None:
        times[1:] = dt.time_us[chosen].astype(np.int64)              # −1 (before the first event) has no time
    frames = [pd.DataFrame({"device": device, "event_index": index, "time_us": times, "category": name,
                            "bytes": np.concatenate([[starts[name]], curve[chosen]])})
              for name, curve in curves.items()]
    out = pd.concat(frames, ignore_index=True)
    return out[CURVE_COLUMNS].sort_values(["event_index", "category"], kind="stable", ignore_index=True)
