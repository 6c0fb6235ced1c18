"""Run-directory layout (names written, and names read back checked), atomic writes (never onto what is not a
regular file, stale leftovers removed) and the collector's Parquet schemas."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from snapanalyze import layout
from snapanalyze import schema as schemas
from snapanalyze.atomic import STALE_AFTER_S, is_leftover, write_atomic, write_directory, write_new
from snapanalyze.errors import BadInputError, UsageError

SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"


def test_rank_dir_is_a_hive_partition(tmp_path: Path) -> None:
    assert layout.rank_dir(tmp_path, 3) == tmp_path / "rank=3"
    assert layout.parse_rank_dir(tmp_path / "rank=12") == 12
    assert layout.parse_rank_dir("rank=x") is None
    with pytest.raises(ValueError):
        layout.rank_dir(tmp_path, -1)
    for r in (2, 0, 10):
        layout.rank_dir(tmp_path, r).mkdir()
    (tmp_path / "notes").mkdir()
    assert list(layout.rank_dirs(tmp_path)) == [0, 2, 10]
    assert layout.rank_dirs(tmp_path / "missing") == {}


def test_file_names() -> None:
    assert layout.snapshot_name("final") == "snapshot-final.pickle"
    assert layout.snapshot_name("final", 2) == "snapshot-final-2.pickle"
    assert layout.nvml_part_name(1) == "nvml-part-00001.parquet"
    assert layout.nvml_part_name(123456) == "nvml-part-123456.parquet"
    assert layout.markers_name() == "markers.parquet" and layout.markers_name(1) == "markers-1.parquet"
    assert layout.meta_name() == "meta.json" and layout.meta_name(2) == "meta-2.json"
    assert layout.SCHEMA_VERSION == 1
    with pytest.raises(ValueError):
        layout.nvml_part_name(0)


@pytest.mark.parametrize("tag", ["../escape", "a/b", "", ".hidden", "x" * 129, "sp ace"])
def test_unsafe_tags_are_refused(tag: str) -> None:
    with pytest.raises(ValueError, match="tag"):
        layout.snapshot_name(tag)


def test_nvml_parts_sort_by_number_and_skip_temporaries(tmp_path: Path) -> None:
    for name in ("nvml-part-00002.parquet", "nvml-part-100000.parquet", "nvml-part-00010.parquet",
                 ".nvml-part-00011.parquet.1.ab.tmp", "nvml.parquet"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in layout.nvml_parts(tmp_path)] == [
        "nvml-part-00002.parquet", "nvml-part-00010.parquet", "nvml-part-100000.parquet"]
    assert layout.is_temporary(".nvml-part-00011.parquet.1.ab.tmp")


def test_next_session_skips_taken_names(tmp_path: Path) -> None:
    assert layout.next_session(tmp_path) == 0
    (tmp_path / "meta.json").write_text("{}")
    assert layout.next_session(tmp_path) == 1
    (tmp_path / "markers-1.parquet").write_bytes(b"")
    assert layout.next_session(tmp_path) == 2
    assert [p.name for p in layout.session_files(tmp_path, "meta")] == ["meta.json"]


def test_write_atomic_replaces_and_leaves_no_temporaries(tmp_path: Path) -> None:
    target = tmp_path / "x.bin"
    write_atomic(target, lambda f: f.write(b"one"))
    write_atomic(target, lambda f: f.write(b"two"))
    assert target.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["x.bin"]


def test_write_atomic_failure_keeps_the_previous_file(tmp_path: Path) -> None:
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")

    def broken(f: object) -> None:
        f.write(b"partial")  # type: ignore[attr-defined]
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, broken)
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["x.bin"]


def test_write_new_never_overwrites(tmp_path: Path) -> None:
    def name(n: int) -> Path:
        return tmp_path / layout.snapshot_name("final", n)

    def writer(i: int) -> Callable[[BinaryIO], object]:
        return lambda f: f.write(bytes([i]))

    paths = [write_new(name, writer(i)) for i in range(3)]
    assert [p.name for p in paths] == ["snapshot-final.pickle", "snapshot-final-1.pickle", "snapshot-final-2.pickle"]
    assert [p.read_bytes() for p in paths] == [b"\x00", b"\x01", b"\x02"]
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in paths)


def test_schemas_carry_units_and_version() -> None:
    for schema, kind in ((schemas.NVML_SCHEMA, "nvml"), (schemas.MARKERS_SCHEMA, "markers")):
        assert schema.metadata[b"schema_version"] == str(layout.SCHEMA_VERSION).encode()
        assert schema.metadata[b"kind"] == kind.encode()
        for f in schema:
            if f.name.endswith(("_us", "_bytes")):
                assert f.type == pa.int64(), f.name
    assert schemas.NVML_SCHEMA.field("process_used_bytes").nullable
    assert not schemas.NVML_SCHEMA.field("used_bytes").nullable


def test_write_table_refuses_a_foreign_schema(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        schemas.write_table(pa.table({"x": [1]}), tmp_path / "x.parquet", schema=schemas.NVML_SCHEMA)
    with pytest.raises(ValueError):
        schemas.table(schemas.MARKERS_SCHEMA, {"kind": []})


def _markers_table(rank: int) -> pa.Table:
    cols: dict[str, list[object]] = {
        "kind": ["phase"], "name": ["prefill"], "start_time_us": [1], "end_time_us": [None], "attrs": ["{}"],
        "rank": [rank], "thread_id": [7], "depth": [0],
    }
    return schemas.table(schemas.MARKERS_SCHEMA, cols)


def test_dataset_reads_every_rank_with_a_rank_column(tmp_path: Path) -> None:
    for rank in (0, 1):
        d = layout.rank_dir(tmp_path, rank)
        d.mkdir()
        schemas.write_table(_markers_table(rank), d / layout.markers_name(), schema=schemas.MARKERS_SCHEMA)
        (d / layout.snapshot_name("final")).write_bytes(b"not parquet")
        (d / "meta.json").write_text("{}")
    table = layout.dataset(tmp_path, "markers").to_table()
    assert sorted(table.column("rank").to_pylist()) == [0, 1]
    read_back = pq.read_table(layout.rank_dir(tmp_path, 1) / "markers.parquet")
    assert read_back.schema.metadata[b"schema_version"] == b"1"
    plain = ds.dataset([str(p) for p in layout.rank_files(tmp_path, "markers")], partitioning="hive",
                       partition_base_dir=str(tmp_path))
    assert "rank" in plain.schema.names


# -- names read back are checked ------------------------------------------------------------------------------

def test_rank_names_are_ascii_digits_below_the_bound(tmp_path: Path) -> None:
    assert layout.parse_rank_dir("rank=0000") == 0
    assert layout.parse_rank_dir("rank=\u0663") is None                 # an Arabic-Indic digit: not a rank name
    past = "rank=" + "9" * 30                                           # past int64, too
    assert layout.parse_rank_dir(past) is None
    assert "past the largest rank" in (layout.rank_name_problem(past) or "")
    assert layout.rank_name_problem("rank=999999") is None and layout.rank_name_problem("notes") is None
    (tmp_path / "rank=0").mkdir()
    (tmp_path / "rank=0000").mkdir()
    with pytest.raises(BadInputError, match=r"rank=0 and rank=0000 both name rank 0"):
        layout.rank_dirs(tmp_path)
    (tmp_path / "rank=0000").rmdir()
    (tmp_path / past).mkdir()
    with pytest.raises(BadInputError, match=r"names rank 9+\.\.\., past the largest rank this reader accepts"):
        layout.rank_dirs(tmp_path)


def test_tags_from_names_are_made_valid() -> None:
    assert layout.sanitize_tag("we ird/na:me!") == "we_ird_na_me_"
    assert layout.sanitize_tag("..hidden") == "hidden"
    assert layout.sanitize_tag("...") is None and layout.sanitize_tag("x" * 300) == "x" * 128
    for tag in ("final", "oom-1", "1758551300.159891", "iteration_10_exit"):
        assert layout.is_valid_tag(tag) and layout.sanitize_tag(tag) == tag
    assert layout.is_oom_tag("oom-2") and layout.is_oom_tag("iteration_9_exit")
    assert not layout.is_oom_tag("iteration_10") and not layout.is_oom_tag("final")


@pytest.mark.parametrize(("path", "expected"), [
    # SGLang: {time.time() or profile id}-TP-{tp rank}-memory[-{stage}].pickle, in one directory
    ("prof/1758551300.159891-TP-0-memory.pickle", ("sglang", 0, "1758551300.159891")),
    ("prof/1758551300.16-TP-3-memory-prefill.pickle", ("sglang", 3, "1758551300.16-prefill")),
    ("prof/run 7-TP-12-memory-ForwardMode.EXTEND.pickle", ("sglang", 12, "run_7-ForwardMode.EXTEND")),
    # torchtitan: memory_snapshot/iteration_<N>[_exit]/rank<R>_memory_snapshot.pickle
    ("memory_snapshot/iteration_10/rank3_memory_snapshot.pickle", ("torchtitan", 3, "iteration_10")),
    ("memory_snapshot/iteration_9_exit/rank0_memory_snapshot.pickle", ("torchtitan", 0, "iteration_9_exit")),
    # torchtitan's name outside its folders: a pickle named with its rank, the rest of the name its tag
    ("elsewhere/rank0_memory_snapshot.pickle", ("rank-named", 0, "memory_snapshot")),
    ("prof/1758551300.1-TP-0.trace.json.gz", None),                     # SGLang's trace, not a memory snapshot
    ("run/rank=0/snapshot-final.pickle", None),
])
def test_engine_names(path: str, expected: tuple[str, int, str] | None) -> None:
    assert layout.engine_snapshot(path) == expected


# -- atomic writes never replace what is not a regular file, and clean up after killed writers ----------------

def test_write_atomic_refuses_to_replace_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    device = tmp_path / "null"
    device.symlink_to("/dev/null")
    (tmp_path / "dir").mkdir()
    for target, what in ((fifo, "a FIFO"), (device, "a symbolic link to a character device"),
                         (tmp_path / "dir", "a directory")):
        with pytest.raises(UsageError, match=f"is {what}, not a regular file: refusing to replace it"):
            write_atomic(target, lambda f: f.write(b"report"))
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and device.is_symlink() and (tmp_path / "dir").is_dir()
    regular = tmp_path / "old.html"
    regular.write_text("old")
    link = tmp_path / "latest.html"
    link.symlink_to(regular)
    write_atomic(link, lambda f: f.write(b"new"))                       # a link to a regular file: replaced
    assert link.read_bytes() == b"new" and regular.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "fifo", "latest.html", "null", "old.html"]


def test_cli_report_force_onto_a_fifo_is_refused(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from snapanalyze.cli import main

    fifo = tmp_path / "report.html"
    os.mkfifo(fifo)
    result = CliRunner().invoke(main, ["report", str(SCENARIOS / "oom_fragmentation.pickle"), "-o", str(fifo),
                                       "--force"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        f"snapanalyze: error: {fifo}: is a FIFO, not a regular file: refusing to replace it (write somewhere else)"]
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and os.listdir(tmp_path) == ["report.html"]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_stale_leftovers_of_killed_writers_are_removed_on_the_next_write(tmp_path: Path) -> None:
    dead = _dead_pid()
    stale = tmp_path / f".meta.json.{dead}.0123abcd.tmp"                # a killed write_atomic
    staging = tmp_path / f".tag=final.{dead}.89abcdef.tmp"              # a killed write_directory
    fresh = tmp_path / f".markers.parquet.{dead}.00000000.tmp"          # dead writer, but touched a minute ago
    mine = tmp_path / f".nvml-part-00001.parquet.{os.getpid()}.11111111.tmp"   # a live writer (this process)
    other = tmp_path / ".notes.swp"                                      # not ours
    staging.mkdir()
    (staging / "events.parquet").write_bytes(b"half")
    for path in (stale, fresh, mine, other):
        path.write_bytes(b"partial")
    for path in (stale, staging, mine, other):
        _age(path, 2 * STALE_AFTER_S)
    _age(fresh, 60)
    assert all(is_leftover(p) for p in (stale, staging, fresh, mine)) and not is_leftover(other)
    write_atomic(tmp_path / "meta.json", lambda f: f.write(b"{}"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["meta.json", fresh.name, mine.name, other.name])
    _age(fresh, 2 * STALE_AFTER_S)
    write_directory(tmp_path / "tag=final", lambda d: (d / "x").write_bytes(b"x"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["meta.json", "tag=final", mine.name, other.name])


def test_write_directory_replaces_only_a_directory_and_leaves_no_staging(tmp_path: Path) -> None:
    target = tmp_path / "tag=final"
    write_directory(target, lambda d: (d / "a").write_bytes(b"1"))
    write_directory(target, lambda d: (d / "b").write_bytes(b"2"), replace=True)
    assert [p.name for p in target.iterdir()] == ["b"] and os.listdir(tmp_path) == ["tag=final"]

    def broken(d: Path) -> None:
        (d / "c").write_bytes(b"3")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_directory(target, broken, replace=True)
    assert [p.name for p in target.iterdir()] == ["b"] and os.listdir(tmp_path) == ["tag=final"]
    fifo = tmp_path / "tag=fifo"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="is a FIFO, not a directory: refusing to replace it"):
        write_directory(fifo, lambda d: None, replace=True)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
