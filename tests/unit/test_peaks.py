"""peaks: the global maximum first (first occurrence, −1 for the baseline), further peaks separated by a
real valley, highest first; plateaus and long rises report once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import BASE, REAL_FILES, SnapshotBuilder, naive_replay, real_ids
from hypothesis import given, settings
from hypothesis import strategies as st

from snapanalyze.analyze.peaks import COLUMNS, find_peaks, global_peak_index
from snapanalyze.load import load
from snapanalyze.load.columns import to_snapshot
from snapanalyze.replay import DeviceTimeline, Timeline, replay

MiB = 1024 * 1024
T0 = 1_700_000_000_000_000


def curve_timeline(active: list[int], baseline: int = 0, device: int = 0, times: bool = True,
                   reserved: list[int] | None = None) -> DeviceTimeline:
    """A DeviceTimeline with a hand-made active curve (time_us = T0 + 10·index)."""
    n = len(active)
    res = np.array(reserved if reserved is not None else [10**9] * n, dtype=np.int64)
    return DeviceTimeline(device=device, active=np.array(active, dtype=np.int64),
                          allocated_est=np.array(active, dtype=np.int64) + 7, reserved=res,
                          time_us=(T0 + 10 * np.arange(n, dtype=np.int64)) if times else None,
                          baseline_active=baseline, baseline_allocated_est=baseline + 7,
                          baseline_reserved=10**9, lifetimes_source=pd.DataFrame())


def timeline_of(*dts: DeviceTimeline) -> Timeline:
    return Timeline(snapshot=None, devices={dt.device: dt for dt in dts})  # type: ignore[arg-type]


def peaks_of(active: list[int], baseline: int = 0, **kw: Any) -> pd.DataFrame:
    return find_peaks(timeline_of(curve_timeline(active, baseline)), **kw)


# -- the global peak ----------------------------------------------------------------------------------------

def test_columns_and_types() -> None:
    df = peaks_of([0, 5, 0])
    assert list(df.columns) == COLUMNS
    assert str(df["time_us"].dtype) == "Int64" and str(df["duration_us"].dtype) == "Int64"


def test_global_peak_first_occurrence_on_ties() -> None:
    df = peaks_of([10, 50, 20, 50, 10], top=5)
    assert df.iloc[0]["event_index"] == 1
    assert df.iloc[0]["peak"] == 1
    # The later equal hump is a separate peak (the valley at 20 is deep), ranked after the first.
    assert df["event_index"].tolist() == [1, 3]
    assert df["active_bytes"].tolist() == [50, 50]


def test_global_peak_is_the_baseline_when_the_window_only_frees() -> None:
    b = SnapshotBuilder()
    b.segment(BASE, [(4096, 4000, "inactive"), (4096, 3000, "inactive"), (2 * MiB - 8192, 0, "inactive")])
    b.free(BASE, 4000)
    b.free(BASE + 4096, 3000)
    tl = replay(to_snapshot(b.build(), "frees", "pickle"))
    assert tl[0].baseline_active == 7000
    df = find_peaks(tl)
    assert len(df) == 1
    row = df.iloc[0]
    assert row["event_index"] == -1
    assert row["active_bytes"] == 7000
    assert row["transient_bytes"] == 0
    assert row["baseline_active_bytes"] == 7000
    assert pd.isna(row["time_us"])
    assert row["until_index"] == 1            # the first event that changed active bytes (free_completed)
    assert global_peak_index(tl[0]) == -1


def test_baseline_tie_counts_as_the_baseline() -> None:
    # Rising back to exactly the baseline is no new peak.
    df = peaks_of([50, 100, 50], baseline=100)
    assert df.iloc[0]["event_index"] == -1
    assert df.iloc[0]["active_bytes"] == 100


def test_empty_trace_reports_the_baseline() -> None:
    df = peaks_of([], baseline=1234)
    assert df[["peak", "event_index", "until_index", "active_bytes", "transient_bytes"]].values.tolist() == \
        [[1, -1, -1, 1234, 0]]
    assert pd.isna(df.iloc[0]["time_us"]) and pd.isna(df.iloc[0]["duration_us"])


def test_flat_curve_reports_the_baseline_once() -> None:
    df = peaks_of([5, 5, 5], baseline=5)
    assert df["event_index"].tolist() == [-1]


# -- several peaks ------------------------------------------------------------------------------------------

THREE_HUMPS = [100, 100, 0, 300, 290, 300, 0, 0, 150, 200, 0]   # the dip to 290 is too shallow to split
#              0    1    2  3    4    5    6  7  8    9    10


def test_three_separated_humps_in_height_order() -> None:
    df = peaks_of(THREE_HUMPS, top=3)
    assert df["peak"].tolist() == [1, 2, 3]
    assert df["event_index"].tolist() == [3, 9, 0]
    assert df["active_bytes"].tolist() == [300, 200, 100]
    assert df["transient_bytes"].tolist() == [300, 200, 100]
    # Each peak holds until the next change of active bytes.
    assert df["until_index"].tolist() == [4, 10, 2]
    assert df["time_us"].tolist() == [T0 + 30, T0 + 90, T0]
    assert df["duration_us"].tolist() == [10, 10, 20]


def test_top_limits_the_rows_and_keeps_the_order() -> None:
    assert peaks_of(THREE_HUMPS, top=1)["event_index"].tolist() == [3]
    assert peaks_of(THREE_HUMPS, top=2)["event_index"].tolist() == [3, 9]
    assert peaks_of(THREE_HUMPS, top=10)["event_index"].tolist() == [3, 9, 0]


def test_plateau_reports_once() -> None:
    df = peaks_of([0, 100, 100, 100, 100, 0], top=5)
    assert df["event_index"].tolist() == [1]
    assert df.iloc[0]["until_index"] == 5
    assert df.iloc[0]["duration_us"] == 40


def test_long_rise_reports_once() -> None:
    df = peaks_of(list(range(1, 101)) + [0], top=5)
    assert df["event_index"].tolist() == [99]
    assert df.iloc[0]["active_bytes"] == 100


def test_shallow_dips_are_not_separate_peaks() -> None:
    # 98 is within 5 % of the curve's range below the hump: the same peak.
    df = peaks_of([0, 100, 98, 99, 97, 100, 0], top=5)
    assert df["event_index"].tolist() == [1]
    # A deep enough dip separates them.
    df = peaks_of([0, 100, 98, 99, 50, 90, 0], top=5)
    assert df["event_index"].tolist() == [1, 5]


def test_min_prominence_is_a_fraction_of_the_range() -> None:
    curve = [0, 100, 80, 95, 0]
    assert peaks_of(curve, top=5, min_prominence=0.1)["event_index"].tolist() == [1, 3]
    assert peaks_of(curve, top=5, min_prominence=0.2)["event_index"].tolist() == [1]


def test_peak_reports_reserved_and_allocated_at_that_event() -> None:
    dt = curve_timeline([0, 100, 0], reserved=[10, 20, 30])
    row = find_peaks(timeline_of(dt)).iloc[0]
    assert (row["reserved_bytes"], row["allocated_est_bytes"]) == (20, 107)


def test_without_times() -> None:
    df = find_peaks(timeline_of(curve_timeline([0, 5, 0], times=False)))
    assert pd.isna(df.iloc[0]["time_us"]) and pd.isna(df.iloc[0]["duration_us"])


def test_devices_and_device_filter() -> None:
    tl = timeline_of(curve_timeline([0, 5, 0], device=0), curve_timeline([1, 9, 3, 9, 0], device=1))
    df = find_peaks(tl, top=3)
    assert df["device"].tolist() == [0, 1, 1]
    assert df.groupby("device")["peak"].apply(list).to_dict() == {0: [1], 1: [1, 2]}
    only = find_peaks(tl, device=1)
    assert set(only["device"]) == {1}
    assert only.iloc[0]["event_index"] == 1


def test_top_must_be_positive() -> None:
    with pytest.raises(ValueError):
        peaks_of([0, 1, 0], top=0)


# -- properties ---------------------------------------------------------------------------------------------

def _check_peak_properties(active: list[int], baseline: int, df: pd.DataFrame, min_prominence: float) -> None:
    curve = np.array([baseline] + active, dtype=np.int64)            # position = event index + 1
    top = int(curve.max())
    first = int(np.argmax(curve)) - 1
    assert df.iloc[0]["event_index"] == first
    assert df.iloc[0]["active_bytes"] == top
    heights = df["active_bytes"].tolist()
    assert heights == sorted(heights, reverse=True)
    assert df["peak"].tolist() == list(range(1, len(df) + 1))
    positions = df["event_index"].to_numpy() + 1
    assert len(set(positions.tolist())) == len(positions)
    assert (curve[positions] == df["active_bytes"].to_numpy()).all()
    need = max(1, int(int(curve.max() - curve.min()) * min_prominence))
    # Every pair of reported peaks is separated by a valley at least `need` below the lower of the two.
    for i in range(len(positions)):
        for j in range(i + 1, len(positions)):
            lo, hi = sorted((int(positions[i]), int(positions[j])))
            lower = min(int(curve[lo]), int(curve[hi]))
            assert lower - int(curve[lo:hi + 1].min()) >= need


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=60), st.integers(0, 50), st.integers(1, 6))
def test_random_curves_satisfy_the_peak_contract(active: list[int], baseline: int, top: int) -> None:
    df = peaks_of(active, baseline=baseline, top=top)
    assert 1 <= len(df) <= top
    _check_peak_properties(active, baseline, df, 0.05)


@pytest.mark.parametrize("path", [p for p in REAL_FILES if "cs336" in p.name],
                         ids=real_ids(p for p in REAL_FILES if "cs336" in p.name))
def test_real_peaks_against_the_reference_curve(path: Path, real_raw: dict[str, Any]) -> None:
    tl = replay(load(path))
    ref = naive_replay(real_raw[path.name], 0)
    df = find_peaks(tl, top=5)
    _check_peak_properties(ref.active, ref.baseline_active, df, 0.05)
    # Reserved at the peak is the reference's reserved at that event.
    i = int(df.iloc[0]["event_index"])
    assert df.iloc[0]["reserved_bytes"] == (ref.reserved[i] if i >= 0 else ref.baseline_reserved)


def test_candidates_come_highest_first_across_batches():
    """The growing batches give exactly the full sort's order, ties broken by the earlier event."""
    from snapanalyze.analyze.peaks import _highest_first

    rng = np.random.default_rng(3)
    heights = rng.integers(0, 50, size=6000)          # many ties, and far more candidates than one batch
    tops = np.sort(rng.choice(10**6, size=6000, replace=False))
    assert list(_highest_first(tops, heights, batch=64)) == np.lexsort((tops, -heights)).tolist()
    assert list(_highest_first(tops[:3], heights[:3])) == np.lexsort((tops[:3], -heights[:3])).tolist()


def test_the_peaks_result_is_the_dataframe_the_terminal_and_the_json_show() -> None:
    """`peaks_of` returns one frozen, picklable `Peaks`: its peaks are `find_peaks`' rows, its JSON is
    `to_json()` (strict JSON) and the terminal renders the object, with the replay's problems as a warning only
    there."""
    import json
    import pickle

    from snapanalyze.analyze.peaks import peaks_of
    from snapanalyze.report.terminal import render_peaks
    from snapanalyze.units import fmt_bytes

    path = REAL_FILES[0]
    timeline = replay(load(path))
    result = peaks_of(timeline, top=3)
    assert pickle.loads(pickle.dumps(result)) == result
    frame = find_peaks(timeline, top=3)
    for d in result.devices:
        rows = frame[frame["device"] == d.device]
        assert [p.event_index for p in d.peaks] == rows["event_index"].tolist()
        assert [p.active_bytes for p in d.peaks] == rows["active_bytes"].tolist()
    doc = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert "replay_problems" not in doc
    assert doc["devices"][0]["peak"] == doc["devices"][0]["peaks"][0]
    assert doc["devices"][0]["peak"]["active_bytes"] == result.devices[0].peaks[0].active_bytes
    assert fmt_bytes(result.devices[0].peaks[0].active_bytes) in render_peaks(result)
    broken = type(result)(result.source, result.devices, None, ("segment 0x10 differs",))
    assert "the replay does not match the end state:\n  segment 0x10 differs" in render_peaks(broken)
