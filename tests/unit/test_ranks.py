"""Comparing ranks: each rank's peak with NVML and outside-allocator bytes, the outlier and the categories that
make its difference against the median rank; missing ranks and NVML files reported, not fatal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from snapanalyze.analyze.rank_result import ranks_of
from snapanalyze.analyze.ranks import DIFF_COLUMNS, RANK_COLUMNS, rank_outliers
from snapanalyze.errors import BadInputError
from snapanalyze.session import compare_ranks

RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
TP2 = RUNS / "tp2_vision_encoder"
EXP = json.loads((RUNS / "tp2_vision_encoder.expected.json").read_text())


@pytest.fixture()
def tp2(tmp_path: Path) -> Path:
    return Path(shutil.copytree(TP2, tmp_path / "run"))


def test_one_row_per_rank_at_its_peak() -> None:
    c = compare_ranks(TP2)
    assert list(c.table.columns) == RANK_COLUMNS and c.problems == ()
    assert list(c.table["rank"]) == [0, 1]
    for _, row in c.table.iterrows():
        exp = EXP["ranks"][str(row["rank"])]
        assert row["event_index"] == exp["peak"]["event_index"]
        assert row["time_us"] == exp["peak"]["time_us"] and row["duration_us"] == exp["duration_us"]
        assert row["active_bytes"] == exp["peak"]["active_bytes"]
        assert row["reserved_bytes"] == exp["peak"]["reserved_bytes"]
        assert row["nvml_used_bytes"] == exp["nvml"]["nvml_used_bytes"]
        assert bool(row["nvml_used_measured"]) == exp["nvml"]["measured"]
        assert row["outside_bytes"] == exp["nvml"]["outside_bytes"]
        assert (row["top_category"], row["top_category_bytes"]) == next(iter(exp["categories"].items()))
        mine = c.categories[c.categories["rank"] == row["rank"]]
        assert dict(zip(mine["category"], mine["bytes"])) == exp["categories"]
    assert list(c.table["outside_basis"]) == ["bracketing", "during"]
    assert list(c.table["outside_uncertain"]) == [True, False]


def test_rank_1_is_the_outlier_because_of_its_vision_encoder() -> None:
    c = compare_ranks(TP2)
    assert (c.median_rank, c.median_device) == (EXP["outlier"]["median_rank"], 0)
    assert list(c.table["outlier"]) == [False, True]
    r0, r1 = (EXP["ranks"][k]["categories"] for k in ("0", "1"))
    diff = EXP["ranks"]["1"]["peak"]["active_bytes"] - EXP["ranks"]["0"]["peak"]["active_bytes"]
    assert list(c.table["difference_bytes"]) == [0, diff]
    assert list(c.differences.columns) == DIFF_COLUMNS
    assert c.differences.iloc[0]["category"] == EXP["outlier"]["category"] == "vision_encoder"
    want = {k: r1.get(k, 0) - r0.get(k, 0) for k in set(r0) | set(r1) if r1.get(k, 0) != r0.get(k, 0)}
    assert dict(zip(c.differences["category"], c.differences["difference_bytes"])) == want
    assert int(c.differences["difference_bytes"].sum()) == diff
    assert list(c.differences["difference_bytes"]) == sorted(c.differences["difference_bytes"], reverse=True)


def test_the_typed_result_carries_the_comparison_and_survives_a_pickle() -> None:
    """`ranks` renders one frozen result: its rows are the comparison's, plain values (no numpy), picklable,
    and its JSON is what the expected file says rank by rank."""
    import pickle

    r = ranks_of(compare_ranks(TP2))
    assert pickle.loads(pickle.dumps(r)) == r
    assert [(x.rank, x.outlier) for x in r.ranks] == [(0, False), (1, True)]
    assert [type(x.active_bytes) for x in r.ranks] == [int, int]
    doc = json.loads(json.dumps(r.to_json(), allow_nan=False))
    for row in doc["ranks"]:
        exp = EXP["ranks"][str(row["rank"])]
        assert row["peak"]["active_bytes"] == exp["peak"]["active_bytes"]
        assert row["nvml_used_bytes"] == exp["nvml"]["nvml_used_bytes"]
    assert [o["rank"] for o in doc["outliers"]] == [1]
    assert doc["outliers"][0]["categories"][0]["category"] == EXP["outlier"]["category"]


def test_missing_rank_snapshot_is_reported(tp2: Path) -> None:
    (tp2 / "rank=1" / "snapshot-final.pickle").unlink()
    c = compare_ranks(tp2)
    assert list(c.table["rank"]) == [0] and not c.table["outlier"].any()
    assert [p for p in c.problems if p.startswith("rank 1")] == [f"rank 1: no snapshot in {tp2 / 'rank=1'}"]


def test_missing_nvml_part_is_reported(tp2: Path) -> None:
    (tp2 / "rank=1" / "nvml-part-00001.parquet").unlink()
    c = compare_ranks(tp2)
    row = c.table[c.table["rank"] == 1].iloc[0]
    assert row["nvml_used_bytes"] is pd.NA and row["outside_bytes"] is pd.NA and row["outside_basis"] == "no samples"
    assert bool(row["outlier"])                         # the comparison itself needs no NVML
    assert any(p.startswith("rank 1: no nvml-part-*.parquet") for p in c.problems)


def test_a_rank_missing_from_the_world_is_reported(tp2: Path) -> None:
    for rank in (0, 1):
        meta = json.loads((tp2 / f"rank={rank}" / "meta.json").read_text())
        meta["world_size"] = 3
        (tp2 / f"rank={rank}" / "meta.json").write_text(json.dumps(meta))
    c = compare_ranks(tp2)
    assert "rank 2: no rank=2 directory although meta.json says world_size 3" in c.problems
    assert len(c.table) == 2


def test_no_snapshot_anywhere_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "run" / "rank=0").mkdir(parents=True)
    with pytest.raises(BadInputError, match="no rank has a snapshot to compare: .*rank 0: no snapshot"):
        compare_ranks(tmp_path / "run")


def test_outliers_below_the_median_and_the_tolerance() -> None:
    G = 1 << 30
    table = pd.DataFrame({"rank": [0, 1, 2, 3], "device": [0] * 4,
                          "active_bytes": [60 * G, 61 * G, 60 * G + (100 << 20), 50 * G]})
    cats = pd.DataFrame({"rank": [0, 0, 1, 1, 2, 2, 3, 3], "device": [0] * 8,
                         "category": ["kv_cache", "mlp"] * 4,
                         "bytes": [55 * G, 5 * G, 55 * G, 6 * G, 55 * G, 5 * G + (100 << 20), 45 * G, 5 * G]})
    out, diffs, median = rank_outliers(table, cats, threshold=0.01)
    assert median == (0, 0)                           # the lower median of 50, 60, 60.1, 61 GiB
    # tolerance max(1 % of 60 GiB, 256 MiB) = 614 MiB: rank 1 (+1 GiB) and rank 3 (−10 GiB) stand out, rank 2 not
    assert list(out["outlier"]) == [False, True, False, True]
    assert list(out["difference_bytes"]) == [0, G, 100 << 20, -10 * G]
    assert diffs[diffs["rank"] == 1][["category", "difference_bytes"]].values.tolist() == [["mlp", G]]
    below = diffs[diffs["rank"] == 3]
    assert below.iloc[0]["category"] == "kv_cache" and below.iloc[0]["difference_bytes"] == -10 * G
    out, _, _ = rank_outliers(table, cats, threshold=0.2)
    assert not out["outlier"].any()
    empty, d, m = rank_outliers(table.iloc[0:0], cats, 0.02)
    assert m is None and len(d) == 0 and len(empty) == 0


def test_ranks_a_run_already_loaded_are_not_read_again() -> None:
    """Each rank of a Run is loaded once: a comparison that keeps them serves later readers; one that keeps
    nothing holds one rank at a time (the report detailing more ranks than it shows)."""
    import snapanalyze.session as session

    run = session.open_run(TP2)
    kept = compare_ranks(run, keep=lambda rank: True)
    chosen, _ = run.ranks()
    assert [d.snapshot.source for d in chosen] and run.loads == 2
    forgetful = session.open_run(TP2)
    pd.testing.assert_frame_equal(compare_ranks(forgetful).table, kept.table)
    assert forgetful.loads == 2 and not forgetful._loaded
