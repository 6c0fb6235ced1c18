"""Run directories: Hive layout readable across ranks, selection by rank and tag, clear errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from snapanalyze import BadInputError, UsageError, load
from snapanalyze.load.runs import entries, ranks, resolve

REAL = Path(__file__).parent.parent / "fixtures" / "real"


@pytest.fixture()
def run(tmp_path):
    """Two ranks as the collector writes them, rank 1 with two tags."""
    for rank, name in ((0, "cs336-forward-fp32-t2.6.pickle"), (1, "cs336-forward-bf16-t2.6.pickle")):
        d = tmp_path / "run" / f"rank={rank}"
        d.mkdir(parents=True)
        shutil.copy(REAL / name, d / "snapshot-final.pickle")
    shutil.copy(REAL / "flexgen-oom-t2.0.pickle", tmp_path / "run" / "rank=1" / "snapshot-oom-1.pickle")
    return tmp_path / "run"


def test_entries_and_resolution(run):
    assert [(e.rank, e.tag) for e in entries(run)] == [(0, "final"), (1, "final"), (1, "oom-1")]
    assert ranks(run) == [0, 1]
    assert resolve(run, rank=1) == run / "rank=1" / "snapshot-final.pickle"     # "final" preferred
    assert resolve(run, rank=1, tag="oom-1") == run / "rank=1" / "snapshot-oom-1.pickle"
    assert resolve(run / "rank=0") == run / "rank=0" / "snapshot-final.pickle"
    with pytest.raises(UsageError, match="choose one with --rank"):
        resolve(run)
    with pytest.raises(UsageError, match="no snapshot for rank 7"):
        resolve(run, rank=7)


def test_load_from_run_equals_load_from_pickle(run):
    a, b = load(run, rank=1), load(REAL / "cs336-forward-bf16-t2.6.pickle")
    assert a.segments.equals(b.segments)
    assert len(a.trace(0)) == len(b.trace(0))


def test_empty_directory_is_a_clear_error(tmp_path):
    with pytest.raises(BadInputError, match="without snapshots"):
        load(tmp_path)


def test_converted_run_reads_all_ranks_at_once_with_pyarrow_dataset(run):
    from click.testing import CliRunner

    from snapanalyze.cli import main

    result = CliRunner().invoke(main, ["convert", str(run)])
    assert result.exit_code == 0, result.output
    files = sorted(str(p) for p in run.glob("rank=*/tag=final/events.parquet"))
    assert len(files) == 2
    table = ds.dataset(files, partitioning="hive", partition_base_dir=str(run)).to_table()
    counts = table.group_by("rank").aggregate([("index", "count")]).to_pydict()
    sizes = {r: n for r, n in zip(counts["rank"], counts["index_count"])}
    assert sizes == {0: len(load(REAL / "cs336-forward-fp32-t2.6.pickle").trace(0)),
                     1: len(load(REAL / "cs336-forward-bf16-t2.6.pickle").trace(0))}
    # tables are preferred over the pickle once converted
    assert resolve(run, rank=0) == run / "rank=0" / "tag=final"
