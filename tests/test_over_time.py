"""Categories over time: bounded sampling, one attribution per instant, bytes that sum to the active curve."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from snapanalyze import attribute, find_peaks, load, replay
from snapanalyze.analyze.over_time import InstantAttributions, categories_over_time, sample_indices

SCENARIOS = Path(__file__).resolve().parent.parent / "fixtures" / "scenarios"


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
    assert peak in instants and len(instants) <= 9
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
    assert len(cache) == len({-1, 10, index, *sample_indices(len(cache.timeline[0]), 4)})
