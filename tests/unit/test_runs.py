"""Run directories: Hive layout readable across ranks, selection by rank and tag, clear errors for damaged
names, and the directories engines dump snapshots into (SGLang, torchtitan) read as runs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from snapanalyze import BadInputError, UsageError, load
from snapanalyze.load.runs import entries, ranks, resolve

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "real"
TP2 = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "tp2_vision_encoder"


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


def test_one_file_and_every_rank_choose_a_snapshot_by_one_policy(run: Path) -> None:
    """`load(run, rank, tag)` (one snapshot) and the per-rank commands (`choose_snapshots`) pick the same
    snapshot of each rank for every tag asked, and a rank whose choice is open is never settled by another
    rank's tags: with ranks 1 and 2 only, rank 2 holding `a` and `b` but no `final`, the run is ambiguous (it
    used to resolve to rank 1's `final`, as if rank 2 were not there)."""
    from snapanalyze.load.samples import choose_snapshots, rank_directories

    shutil.copytree(run / "rank=1", run / "rank=2")
    for name, new in (("snapshot-final.pickle", "snapshot-a.pickle"), ("snapshot-oom-1.pickle", "snapshot-b.pickle")):
        (run / "rank=2" / name).rename(run / "rank=2" / new)
    found, dirs = entries(run), rank_directories(run)
    for tag in (None, "final", "oom-1", "a"):
        chosen, _ = choose_snapshots(found, dirs, run, tag)
        for rank in (0, 1, 2):
            mine = [e.path for e in chosen if e.rank == rank]
            if mine:
                assert [resolve(run, rank, tag)] == mine
            else:
                with pytest.raises(UsageError):
                    resolve(run, rank, tag)
    assert resolve(run, tag="a") == run / "rank=2" / "snapshot-a.pickle"   # the one rank holding it
    with pytest.raises(UsageError, match="holds several snapshots"):
        resolve(run / "rank=2")
    assert choose_snapshots(found, dirs, run, None, rank=2)[1] == [
        "rank 2: several snapshots (a, b) and none tagged 'final'; choose one with --tag"]
    shutil.rmtree(run / "rank=0")
    with pytest.raises(UsageError, match="holds several snapshots"):
        resolve(run)


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


def _cli(*args: object):
    from click.testing import CliRunner

    from snapanalyze.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapanalyze: error: "), result.stderr
    return lines[0]


def test_two_directories_for_one_rank_are_a_clear_error(run):
    (run / "rank=0000").mkdir()
    shutil.copy(REAL / "cs336-forward-fp32-t2.6.pickle", run / "rank=0000" / "snapshot-final.pickle")
    with pytest.raises(BadInputError, match="rank=0 and rank=0000 both name rank 0: keep one"):
        entries(run)
    for command in (["ranks", run], ["peaks", run, "--rank", "1"], ["convert", run]):
        assert "rank=0 and rank=0000 both name rank 0" in _one_error_line(_cli(*command))
    assert not list(run.glob("rank=*/tag=*"))                       # convert wrote nothing


def test_a_lone_rank_0000_directory_is_rank_0(tmp_path):
    (tmp_path / "rank=0000").mkdir()
    shutil.copy(REAL / "cs336-forward-fp32-t2.6.pickle", tmp_path / "rank=0000" / "snapshot-final.pickle")
    assert [(e.rank, e.tag) for e in entries(tmp_path)] == [(0, "final")]
    assert _cli("convert", tmp_path).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank=0000"]      # tables beside the pickle, no rank=0
    assert resolve(tmp_path) == tmp_path / "rank=0000" / "tag=final"


@pytest.mark.parametrize("digits", ["1000000", str(2**63), "9" * 40])
def test_a_rank_past_the_bound_is_refused_in_one_line(run, digits):
    (run / f"rank={digits}").mkdir()
    with pytest.raises(BadInputError, match="past the largest rank this reader accepts"):
        entries(run)
    assert "past the largest rank this reader accepts (999,999)" in _one_error_line(_cli("ranks", run))
    with pytest.raises(BadInputError, match="past the largest rank"):
        load(run / f"rank={digits}")


def test_names_that_are_not_snapanalyzes_are_skipped_and_reported(run):
    from snapanalyze.load.runs import scan
    from snapanalyze.load.samples import read_run

    rank0 = run / "rank=0"
    shutil.copy(rank0 / "snapshot-final.pickle", rank0 / "snapshot-a b.pickle")   # a tag no writer makes
    (rank0 / "tag=.hidden").mkdir()
    (rank0 / "tag=half").mkdir()                                                    # no snapshot.json
    os.mkfifo(rank0 / "snapshot-pipe.pickle")
    (rank0 / "snapshot-dev.pickle").symlink_to("/dev/zero")
    (rank0 / ".snapshot-final.pickle.4242.0123abcd.tmp").write_bytes(b"cut")      # a killed dump
    listing = scan(run)
    assert [(e.rank, e.tag) for e in listing.entries] == [(0, "final"), (1, "final"), (1, "oom-1")]
    problems = "\n".join(listing.problems)
    assert "rank=0/snapshot-a b.pickle: skipped (its tag 'a b' is not one snapanalyze writes" in problems
    assert "rank=0/tag=.hidden: skipped" in problems
    assert "rank=0/tag=half: skipped (incomplete tables: no snapshot.json" in problems
    assert "rank=0/snapshot-pipe.pickle: skipped (not a regular file)" in problems
    assert "rank=0/snapshot-dev.pickle: skipped (not a regular file)" in problems
    assert "rank=0: leftovers of an interrupted write (.snapshot-final.pickle.4242.0123abcd.tmp)" in problems
    assert set(listing.problems) <= set(read_run(run).problems)        # what `ranks` and `report` warn about
    result = _cli("ranks", run)
    assert result.exit_code == 0 and "warning: rank=0/snapshot-pipe.pickle: skipped" in result.stdout


def _sglang(directory, stamps=("1758551300.159891", "1758551300.160012")):
    """A directory as SGLang's profiler leaves it with activities MEM, two TP ranks (the tp2 fixture's pickles)."""
    directory.mkdir()
    for rank, stamp in enumerate(stamps):
        shutil.copy(TP2 / f"rank={rank}" / "snapshot-final.pickle", directory / f"{stamp}-TP-{rank}-memory.pickle")
        (directory / f"{stamp}-TP-{rank}.trace.json.gz").write_bytes(b"")        # its trace, not a snapshot
    return directory


def test_an_sglang_profile_directory_is_a_run(tmp_path):
    prof = _sglang(tmp_path / "prof")
    assert [(e.rank, e.tag) for e in entries(prof)] == [(0, "1758551300.159891"), (1, "1758551300.160012")]
    assert resolve(prof, rank=1) == prof / "1758551300.160012-TP-1-memory.pickle"
    with pytest.raises(UsageError, match="choose one with --rank"):
        resolve(prof)
    result = _cli("ranks", prof, "--format", "json")
    assert result.exit_code == 0, result.output
    by_rank = {r["rank"]: r for r in json.loads(result.stdout)["ranks"]}
    expected = json.loads((TP2.parent / "tp2_vision_encoder.expected.json").read_text())["ranks"]
    assert sorted(by_rank) == [0, 1]
    assert all(by_rank[r]["peak"]["active_bytes"] == expected[str(r)]["peak"]["active_bytes"] for r in (0, 1))
    assert json.loads(_cli("peaks", prof, "--rank", "1", "--format", "json").stdout)["source"].endswith(
        "1758551300.160012-TP-1-memory.pickle")
    # converted in place: tables inside the directory given, read instead of the pickles from then on
    assert _cli("convert", prof).exit_code == 0
    assert sorted(str(p.relative_to(prof)) for p in prof.glob("rank=*/tag=*")) == [
        "rank=0/tag=1758551300.159891", "rank=1/tag=1758551300.160012"]
    assert resolve(prof, rank=0) == prof / "rank=0" / "tag=1758551300.159891"
    assert [(e.rank, e.tables is not None, e.pickle is not None) for e in entries(prof)] == [(0, True, True),
                                                                                            (1, True, True)]


def test_sglang_stages_and_two_files_claiming_one_rank(tmp_path):
    prof = _sglang(tmp_path / "prof", stamps=("p1", "p1"))
    shutil.copy(prof / "p1-TP-0-memory.pickle", prof / "p1-TP-0-memory-decode.pickle")
    assert [(e.rank, e.tag) for e in entries(prof)] == [(0, "p1"), (0, "p1-decode"), (1, "p1")]
    assert resolve(prof, rank=0, tag="p1-decode") == prof / "p1-TP-0-memory-decode.pickle"
    shutil.copy(prof / "p1-TP-0-memory.pickle", prof / "p 1-TP-0-memory.pickle")    # also tag p_1 …
    shutil.copy(prof / "p1-TP-0-memory.pickle", prof / "p_1-TP-0-memory.pickle")    # … and this one
    with pytest.raises(BadInputError, match="p 1-TP-0-memory.pickle and p_1-TP-0-memory.pickle both claim rank 0 "
                                            "tag p_1"):
        entries(prof)
    (prof / "p 1-TP-0-memory.pickle").unlink()
    shutil.copy(prof / "p1-TP-0-memory.pickle", prof / f"p1-TP-{2**64}-memory.pickle")
    assert "the name says rank 18446744073709551616, past the largest rank" in _one_error_line(_cli("ranks", prof))


def _torchtitan(root):
    """torchtitan's memory_snapshot/ folder: a regular dump at step 10 and one on the OOM at step 12."""
    for folder in ("iteration_10", "iteration_12_exit"):
        (root / folder).mkdir(parents=True)
        for rank in (0, 1):
            shutil.copy(TP2 / f"rank={rank}" / "snapshot-final.pickle",
                        root / folder / f"rank{rank}_memory_snapshot.pickle")
    return root


def test_torchtitan_memory_snapshot_folders_are_a_run(tmp_path):
    from snapanalyze.load.samples import pick_snapshots

    snaps = _torchtitan(tmp_path / "outputs" / "memory_snapshot")
    assert [(e.rank, e.tag) for e in entries(snaps)] == [(0, "iteration_10"), (0, "iteration_12_exit"),
                                                          (1, "iteration_10"), (1, "iteration_12_exit")]
    assert resolve(snaps, rank=1, tag="iteration_10") == snaps / "iteration_10" / "rank1_memory_snapshot.pickle"
    assert resolve(snaps / "iteration_12_exit", rank=0) == snaps / "iteration_12_exit" / "rank0_memory_snapshot.pickle"
    chosen, problems = pick_snapshots(snaps, prefer_oom=True)          # explain-oom reads the OOM dump
    assert [(e.rank, e.tag) for e in chosen] == [(0, "iteration_12_exit"), (1, "iteration_12_exit")] and not problems
    result = _cli("ranks", snaps, "--tag", "iteration_10", "--format", "json")
    assert result.exit_code == 0, result.output
    assert [r["rank"] for r in json.loads(result.stdout)["ranks"]] == [0, 1]
    result = _cli("ranks", snaps)
    assert "several snapshots (iteration_10, iteration_12_exit) and none tagged 'final'; choose one with --tag" \
        in result.stderr
    out = tmp_path / "converted"
    assert _cli("convert", snaps, "-o", out).exit_code == 0
    assert sorted(str(p.relative_to(out)) for p in out.glob("rank=*/tag=*")) == [
        "rank=0/tag=iteration_10", "rank=0/tag=iteration_12_exit", "rank=1/tag=iteration_10",
        "rank=1/tag=iteration_12_exit"]


@pytest.mark.parametrize("name, rank, tag", [
    ("rank0_oom.pickle", 0, "oom"), ("snapshot_rank1.pickle", 1, "snapshot"), ("mem-rank-3-step10.pickle", 3,
     "mem-step10"), ("rank2.pickle", 2, "final"), ("RANK4_x.pickle", 4, "x"), ("frank0.pickle", None, None),
    ("snapshot-final.pickle", None, None), ("model.pickle", None, None)])
def test_a_pickle_named_with_its_rank_says_its_rank_and_tag(name: str, rank: int | None, tag: str | None) -> None:
    from snapanalyze.layout import engine_snapshot
    found = engine_snapshot(Path("/run") / name)
    assert (found.rank, found.tag) == (rank, tag) if found is not None else rank is None


def test_a_folder_of_rank_named_pickles_is_a_run(tmp_path: Path) -> None:
    """rank0_….pickle, rank1_….pickle in one folder, as scripts dump one file per rank: every run command reads
    them as ranks, and convert puts each at its rank."""
    for r in (0, 1):
        shutil.copy(TP2 / f"rank={r}" / "snapshot-final.pickle", tmp_path / f"rank{r}_oom.pickle")
    assert [(e.rank, e.tag) for e in entries(tmp_path)] == [(0, "oom"), (1, "oom")]
    done = _cli("ranks", tmp_path, "--format", "json")
    assert done.exit_code == 0, done.output
    assert [r["rank"] for r in json.loads(done.stdout)["ranks"]] == [0, 1]
    done = _cli("convert", tmp_path)
    assert done.exit_code == 0, done.output
    assert sorted(p.parent.name + "/" + p.name for p in tmp_path.glob("rank=*/tag=*")) == \
        ["rank=0/tag=oom", "rank=1/tag=oom"]


def test_a_pickle_without_a_rank_in_a_folder_is_named_with_the_reason(tmp_path: Path) -> None:
    shutil.copy(TP2 / "rank=0" / "snapshot-final.pickle", tmp_path / "model.pickle")
    refused = _cli("ranks", tmp_path)
    assert refused.exit_code == 2
    assert "model.pickle: skipped (its name gives no rank: analyse the file itself" in refused.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = _cli("ranks", empty)
    assert refused.exit_code == 2 and "pickles whose names give their rank (rank0_oom.pickle" in refused.stderr
