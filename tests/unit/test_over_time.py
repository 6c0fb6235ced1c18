"""Categories over time: instants where the live set moved, one attribution per instant, bytes that sum to the
active curve."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import SnapshotBuilder, write_pickle

from snapanalyze import attribute, find_peaks, load, replay
from snapanalyze.analyze.over_time import (
    InstantAttributions,
    categories_over_time,
    category_curves,
    choose_instants,
    held_error,
)
from snapanalyze.replay import Timeline

SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"
RUNS = SCENARIOS.parent / "runs"
MiB = 1 << 20
BASE = 0x7F00_0000_0000
T0 = 1_770_000_000_000_000


def timeline_of(tmp_path: Path, events: list[tuple[str, int, int, int]]) -> Timeline:
    """A one-device trace from (action, block number, MiB, time in ms) events; frees complete at once."""
    b = SnapshotBuilder(frames=False)
    for action, block, mib, ms in events:
        kw = {"time_us": T0 + 1000 * ms}
        if action == "alloc":
            b.alloc(BASE + block * (1 << 32), mib * MiB, **kw)
        else:
            b.free(BASE + block * (1 << 32), mib * MiB, **kw)
    return replay(load(write_pickle(tmp_path / "t.pickle", b.build(n_devices=1))))



def sample_indices(n_events: int, samples: int) -> list[int]:
    """The plain grid the chosen instants are measured against: at most `samples` (≥ 2) distinct event
    indices from −1 to n_events − 1, evenly spread, ascending."""
    if samples < 2:
        raise ValueError("samples must be at least 2")
    if n_events <= 0:
        return [-1]
    points = np.linspace(-1, n_events - 1, num=min(samples, n_events + 1))
    return sorted({int(round(p)) for p in points})


def test_sample_indices_are_bounded_spread_and_include_both_ends() -> None:
    assert sample_indices(0, 10) == [-1]
    assert sample_indices(3, 10) == [-1, 0, 1, 2]
    picked = sample_indices(1_000_000, 32)
    assert len(picked) == 32 and picked[0] == -1 and picked[-1] == 999_999
    gaps = {b - a for a, b in zip(picked, picked[1:])}
    assert max(gaps) - min(gaps) <= 1
    with pytest.raises(ValueError):
        sample_indices(10, 1)


def test_series_sums_to_active_bytes_at_every_instant_and_includes_the_asked_ones() -> None:
    snap = load(SCENARIOS / "concurrent_requests.pickle")
    timeline = replay(snap)
    peak = int(find_peaks(timeline)["event_index"].iloc[0])
    series = categories_over_time(snap, timeline, samples=8, include={0: [peak]})
    instants = sorted(series["event_index"].unique())
    peaks = set(find_peaks(timeline)["event_index"])
    assert peak in instants and peaks <= set(instants) and {-1, len(timeline[0]) - 1} <= set(instants)
    assert len(instants) <= 8 + 2 + len(peaks)              # the budget, the window's ends and the peaks
    for index, part in series.groupby("event_index"):
        assert int(part["bytes"].sum()) == timeline[0].active_at(int(index))
        expected, got = timeline[0].time_at(int(index)), part["time_us"].iloc[0]
        assert (expected is None and pd.isna(got)) if index < 0 else got == expected
    # zero-filled: every category appears at every instant (a stacked chart needs it)
    counts = series.groupby("event_index")["category"].nunique()
    assert counts.nunique() == 1
    at_peak = series[series["event_index"] == peak].set_index("category")["bytes"]
    assert at_peak["concurrent_request"] == 7_880_073_212      # request B's logits, A's allocation reached the peak


def test_inferred_bytes_follow_the_attribution() -> None:
    snap = load(SCENARIOS / "concurrent_requests.pickle")
    timeline = replay(snap)
    peak = int(find_peaks(timeline)["event_index"].iloc[0])
    series = categories_over_time(snap, timeline, samples=2, include={0: [peak]})
    row = series[(series["event_index"] == peak) & (series["category"] == "weights")].iloc[0]
    blocks = attribute(snap, timeline=timeline).blocks
    weights = blocks[blocks["category"] == "weights"]        # frameless weights from before the window
    assert row["inferred_bytes"] == int(weights.loc[weights["inferred"], "size"].sum()) > 0
    assert row["bytes"] == int(weights["size"].sum())


def test_instant_attributions_are_computed_once_and_shared() -> None:
    snap = load(SCENARIOS / "oom_fragmentation.pickle")
    cache = InstantAttributions(snap)
    first = cache.at(0, 10)
    assert cache.at(0, 10) is first and len(cache) == 1
    index, label = cache.resolve(0, "peak")
    assert label == "global peak" and len(cache) == 2
    assert cache.at(0, index).instants[0].event_index == index
    categories_over_time(snap, samples=4, include={0: [10, index]}, cache=cache)
    assert len(cache) == len({10, index, *choose_instants(cache.timeline, 0, 4, [10, index])})


# -- where the instants go ----------------------------------------------------------------------------------

def test_a_jump_is_chosen_and_a_quiet_stretch_gets_nothing(tmp_path: Path) -> None:
    events = [("alloc", i, 1, i) for i in range(5)]                   # small steps over 5 ms
    events += [("alloc", 10, 4096, 6)]                                # the jump, event 5
    events += [("alloc", 11, 1, 2000), ("free", 11, 1, 2001)]         # then nothing for 2 s
    timeline = timeline_of(tmp_path, events)
    picked = choose_instants(timeline, 0, 1, peaks=False)
    assert picked == [-1, 5, len(timeline[0]) - 1]
    assert set(choose_instants(timeline, 0, 50, peaks=False)) <= set(range(-1, 7)) | {len(timeline[0]) - 1}


def test_a_ramp_splits_at_its_middle_and_a_spike_at_its_rise_and_fall(tmp_path: Path) -> None:
    ramp = timeline_of(tmp_path, [("alloc", i, 1, i) for i in range(101)])
    (middle,) = set(choose_instants(ramp, 0, 1, peaks=False)) - {-1, 100}
    assert 45 <= middle <= 55
    spike = timeline_of(tmp_path, [("alloc", 0, 100, 0), ("alloc", 1, 5000, 500), ("free", 1, 5000, 501),
                                   ("alloc", 2, 1, 1000)])
    # events: 0 alloc, 1 the spike's alloc, 2–3 its free (active falls at 3), 4 the last alloc
    assert choose_instants(spike, 0, 2, peaks=False) == [-1, 1, 3, 4]
    assert choose_instants(spike, 0, 3, peaks=False) == [-1, 0, 1, 3, 4]


def test_the_budget_bounds_the_instants_and_beats_an_even_grid() -> None:
    """On the tp2 run (rank 1: kv_cache allocated in a 1 ms burst at 1.49 s, a vision-encoder peak later) the
    chosen instants get the held chart less wrong than as many evenly spread ones."""
    snap = load(RUNS / "tp2_vision_encoder", rank=1)
    timeline = replay(snap)
    n = len(timeline[0])
    for samples in (8, 32):
        chosen = choose_instants(timeline, 0, samples)
        assert len(chosen) <= samples + 2 + len(find_peaks(timeline))
        even = sample_indices(n, len(chosen))
        assert held_error(timeline, 0, chosen) < 0.5 * held_error(timeline, 0, even)


def test_categories_are_exact_at_every_instant_of_a_run() -> None:
    """The stacked total is the replayed active bytes at each instant, and kv_cache never shows before it was
    allocated (the straight lines of an even grid made it climb for a second)."""
    snap = load(RUNS / "tp2_vision_encoder", rank=1)
    timeline = replay(snap)
    series = categories_over_time(snap, timeline, samples=32)
    dt = timeline[0]
    for index, part in series.groupby("event_index"):
        assert int(part["bytes"].sum()) == dt.active_at(int(index))
    kv = series[series["category"] == "kv_cache"].set_index("event_index")["bytes"]
    first = int(kv[kv > 0].index.min())
    blocks = attribute(snap, at=f"event:{first}", timeline=timeline).blocks
    made = blocks.loc[blocks["category"] == "kv_cache", "alloc_index"]
    assert (kv[kv.index < int(made.min())] == 0).all()
    assert int(made.max()) <= first


@pytest.mark.parametrize("name", ["concurrent_requests", "prompt_logprobs_logits", "hf_eager_attention_threshold"])
def test_category_curves_are_exact_at_every_event_and_agree_with_each_attributed_instant(name: str) -> None:
    """Every event's bytes per category sum to its active bytes; at each attributed instant they are that
    instant's table, even for blocks whose category changes between instants (a request's tensors are
    'concurrent_request' only while another request runs); blocks no instant saw are UNATTRIBUTED."""
    snap = load(SCENARIOS / f"{name}.pickle")
    cache = InstantAttributions(snap)
    dt = cache.timeline[0]
    instants = choose_instants(cache.timeline, 0, 12)
    curves = category_curves(cache, 0, instants, buckets=len(dt))           # every event
    wide = curves.pivot(index="event_index", columns="category", values="bytes")
    assert wide.index.tolist() == list(range(-1, len(dt)))
    assert wide.sum(axis=1).tolist() == [dt.baseline_active, *dt.active.tolist()]
    for index in instants:
        table = cache.at(0, index).blocks.groupby("category")["size"].sum()
        row = wide.loc[index]
        assert row[row > 0].sort_index().to_dict() == table[table > 0].sort_index().to_dict()
    if name == "concurrent_requests":
        seen = pd.concat([cache.at(0, i).blocks.assign(at=i) for i in instants])
        assert (seen.groupby(["address", "alloc_index"])["category"].nunique() > 1).any()   # the case is here
    few = category_curves(cache, 0, instants, buckets=20)
    assert len(few) < len(curves)                          # the envelope: fewer events, every instant kept
    assert few["event_index"].isin(instants).sum() == len(instants) * few["category"].nunique()
