"""Memory outside the allocator: NVML joined to the trace on the µs clock, measured when a sample fell inside
the peak, estimated (and flagged) from the bracketing samples when the sampler was slower than the peak."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from snapanalyze import load, replay
from snapanalyze.analyze.outside import OUTSIDE_COLUMNS, join_samples, outside_at_instant, outside_at_peaks
from snapanalyze.analyze.peaks import find_peaks
from snapanalyze.load.samples import read_run

RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
MiB = 1 << 20


def expected(name: str) -> dict:
    return json.loads((RUNS / f"{name}.expected.json").read_text())


def run_rank(name: str, rank: int = 0):
    samples = read_run(RUNS / name)
    timeline = replay(load(RUNS / name, rank=rank))
    return timeline, samples.nvml_of(rank)


def test_join_uses_torch_reserved_and_agrees_with_the_replay() -> None:
    timeline, nvml = run_rank("tp2_vision_encoder", 1)
    dt = timeline[0]
    joined = join_samples(dt, nvml)
    assert (joined["reserved_source"] == "torch_reserved_bytes").all()
    replayed = join_samples(dt, nvml.drop(columns=["torch_reserved_bytes"]))
    inside = replayed["in_window"].to_numpy()
    assert inside.sum() > 50 and (~inside).sum() >= 1          # samples before the first event exist
    assert (replayed["reserved_source"][inside] == "replay").all() and replayed["reserved_bytes"][~inside].isna().all()
    # the replayed reserved curve at each sample's instant is what torch reported there
    assert (replayed["reserved_bytes"][inside] == joined["reserved_bytes"][inside]).all()
    # the construction: 512 MiB CUDA context, +1,088 MiB NCCL 0.5 s in; no other process, nothing unattributed
    assert set(joined["outside_bytes"].dropna()) == {512 * MiB, 1600 * MiB}
    assert (joined["other_processes_bytes"] == 0).all() and (joined["unattributed_bytes"] == 0).all()
    assert (joined["own_outside_bytes"] == joined["outside_bytes"]).all()


def test_a_peak_held_longer_than_the_interval_is_measured() -> None:
    exp = expected("tp2_vision_encoder")["ranks"]["1"]
    timeline, nvml = run_rank("tp2_vision_encoder", 1)
    row = outside_at_peaks(timeline, nvml, find_peaks(timeline, top=1)).iloc[0]
    assert row["basis"] == "during" and not row["uncertain"] and bool(row["nvml_used_measured"])
    assert row["samples_during"] == exp["nvml"]["samples_during"] == 3
    assert row["duration_us"] == exp["duration_us"] == 150_003
    assert row["outside_bytes"] == exp["nvml"]["outside_bytes"] == 1600 * MiB
    assert row["nvml_used_bytes"] == exp["nvml"]["nvml_used_bytes"] == 66_467_135_488
    assert row["reserved_bytes"] == exp["peak"]["reserved_bytes"]


def test_a_peak_shorter_than_the_interval_is_estimated_and_flagged() -> None:
    exp = expected("tp2_vision_encoder")["ranks"]["0"]
    timeline, nvml = run_rank("tp2_vision_encoder", 0)
    row = outside_at_peaks(timeline, nvml).iloc[0]
    assert row["basis"] == "bracketing" and row["uncertain"] and not row["nvml_used_measured"]
    assert row["sample_before_us"] < row["time_us"] < row["sample_after_us"]
    assert row["sample_after_us"] - row["sample_before_us"] > row["duration_us"] == exp["duration_us"]
    assert row["nvml_used_bytes"] == exp["nvml"]["nvml_used_bytes"] == row["reserved_bytes"] + row["outside_bytes"]
    assert "the peak held 4 µs" in row["note"] and "sampled every 50.0 ms" in row["note"]
    assert "not what it is" in row["note"]      # how much, never what: no cause is named from NVML


def test_a_spike_nvml_never_saw() -> None:
    exp = expected("slow_nvml_spike")["ranks"]["0"]
    timeline, nvml = run_rank("slow_nvml_spike")
    rows = outside_at_peaks(timeline, nvml)
    assert list(rows.columns) == OUTSIDE_COLUMNS
    row = rows.iloc[0]
    assert row["event_index"] == exp["peak"]["event_index"] and row["duration_us"] == exp["duration_us"] == 6004
    assert row["basis"] == "bracketing" and row["uncertain"]
    assert abs(row["interval_us"] - 200_000) < 1_000        # the sampler's period, scheduling jitter aside
    # the cuDNN handle created between the two samples: the bracket spans 612 → 644 MiB
    assert (row["outside_low_bytes"], row["outside_high_bytes"]) == (612 * MiB, 644 * MiB)
    assert row["outside_bytes"] == 612 * MiB == exp["nvml"]["outside_bytes"]     # the nearest sample: before
    assert row["nvml_used_bytes"] == exp["nvml"]["nvml_used_bytes"]
    # the estimate is far above anything the sampler recorded: the samples alone would have missed the peak
    assert int(nvml["used_bytes"].max()) == exp["nvml"]["max_used_sampled"] < row["nvml_used_bytes"] - 10 * 2**30
    assert "200.0 ms" in row["note"] and "6.0 ms" in row["note"] and "vary by 33,554,432 bytes" in row["note"]


def test_no_samples_far_samples_and_no_timestamps() -> None:
    timeline, nvml = run_rank("tp2_vision_encoder", 0)
    dt = timeline[0]
    peak = int(find_peaks(timeline, top=1)["event_index"].iloc[0])
    empty = outside_at_instant(dt, join_samples(dt, nvml.iloc[0:0]), peak, 5)
    assert empty["basis"] == "no samples" and empty["outside_bytes"] is None and empty["uncertain"]
    early = nvml[nvml["time_us"] < int(dt.time_us[0]) + 1_000_000]          # only samples seconds before the peak
    far = outside_at_instant(dt, join_samples(dt, early), peak, 5)
    assert far["basis"] == "none near" and far["nvml_used_bytes"] is None
    wide = outside_at_instant(dt, join_samples(dt, early), peak, 5, max_gap_us=10**8)
    assert wide["basis"] == "one side" and wide["outside_bytes"] == 1600 * MiB
    untimed = type(dt)(**{**dt.__dict__, "time_us": None})
    assert outside_at_instant(untimed, join_samples(dt, nvml), peak, 5)["basis"] == "no timestamps"


def test_per_process_split_with_another_process() -> None:
    exp = expected("oom_other_process")
    timeline, nvml = run_rank("oom_other_process")
    joined = join_samples(timeline[0], nvml)
    others = joined["other_processes_bytes"].to_numpy(dtype=np.int64)
    t = joined["time_us"].to_numpy()
    assert (others[t < exp["other_process_from_us"]] == 0).all()
    assert (others[t >= exp["other_process_from_us"]] == exp["ranks"]["0"]["nvml"]["other_processes_bytes"]).all()
    assert (joined["own_outside_bytes"] == 420 * MiB).all()
    assert (joined["outside_bytes"] == joined["own_outside_bytes"] + joined["other_processes_bytes"]).all()


def test_unknown_per_process_data_stays_unknown() -> None:
    timeline, nvml = run_rank("tp2_vision_encoder", 1)
    blind = nvml.assign(process_used_bytes=pd.array([pd.NA] * len(nvml), dtype="Int64"),
                        other_processes_used_bytes=pd.array([pd.NA] * len(nvml), dtype="Int64"))
    row = outside_at_peaks(timeline, blind).iloc[0]
    assert row["outside_bytes"] == 1600 * MiB
    assert row["own_outside_bytes"] is pd.NA and row["other_processes_bytes"] is pd.NA


@pytest.mark.parametrize("name", ["tp2_vision_encoder", "slow_nvml_spike", "admission_rejected", "oom_other_process"])
def test_measured_flag_matches_the_construction(name: str) -> None:
    for rank, exp in expected(name)["ranks"].items():
        timeline, nvml = run_rank(name, int(rank))
        row = outside_at_peaks(timeline, nvml, find_peaks(timeline, top=1)).iloc[0]
        assert bool(row["nvml_used_measured"]) == exp["nvml"]["measured"]
        assert row["nvml_used_bytes"] == exp["nvml"]["nvml_used_bytes"]
