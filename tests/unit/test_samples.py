"""Reading a run's collector files: NVML parts, markers and meta.json of every rank, missing files reported,
files that are not the collector's refused with the file named, and which snapshot each rank contributes."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from snapanalyze import layout
from snapanalyze import schema as schemas
from snapanalyze.errors import BadInputError
from snapanalyze.load.samples import (
    MARKER_COLUMNS,
    NVML_COLUMNS,
    markers_for,
    pick_snapshots,
    rank_of,
    read_run,
)

RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
TP2 = RUNS / "tp2_vision_encoder"


def expected(name: str) -> dict:
    return json.loads((RUNS / f"{name}.expected.json").read_text())


@pytest.fixture()
def tp2(tmp_path: Path) -> Path:
    return Path(shutil.copytree(TP2, tmp_path / "run"))


def test_reads_every_rank_of_a_run() -> None:
    s = read_run(TP2)
    assert s.ranks == (0, 1) and s.nvml_ranks == (0, 1) and s.problems == ()
    assert list(s.nvml.columns) == NVML_COLUMNS and list(s.markers.columns) == MARKER_COLUMNS
    assert s.world_size == 2
    for rank in (0, 1):
        meta = s.meta[rank][0]
        rows = s.nvml_of(rank)
        # the collector's own count of rows in meta.json, and the part as written, agree with what we read
        part = TP2 / f"rank={rank}" / "nvml-part-00001.parquet"
        assert len(rows) == meta["nvml"]["rows"] == pq.read_table(part).num_rows
        assert rows["time_us"].is_monotonic_increasing
        assert str(rows["process_used_bytes"].dtype) == "Int64" and str(rows["time_us"].dtype) == "int64"
        assert s.capacity(rank, 0) == (85_899_345_920, "NVML total")
        assert s.nvml_interval_ms(rank) == 50.0
    marks = s.markers_of(1)
    assert list(marks["name"][marks["kind"] == "phase"]) == ["load_model", "initialize_kv_cache", "prefill",
                                                             "decode", "prefill"]
    req1 = marks[marks["name"] == "req-1"].iloc[0]
    assert req1["attrs"] == {"images": 8, "prompt_tokens": 6144} and req1["depth"] == 1
    assert (marks["rank"] == 1).all()


def test_open_markers_have_no_end() -> None:
    s = read_run(RUNS / "oom_other_process")
    marks = s.markers_of(0)
    assert marks["end_time_us"].isna().sum() == 2          # step 2's phase and request: the process died
    assert s.meta[0][0]["end_time_us"] is None and s.meta[0][0]["ooms"][0]["snapshot"] == "snapshot-oom-1.pickle"


def test_a_rank_directory_reads_as_a_run_of_one_rank() -> None:
    s = read_run(TP2 / "rank=1")
    assert s.ranks == (1,) and set(s.nvml["rank"]) == {1} and s.problems == ()


def test_missing_files_are_reported_not_fatal(tp2: Path) -> None:
    (tp2 / "rank=1" / "nvml-part-00001.parquet").unlink()
    (tp2 / "rank=0" / "markers.parquet").unlink()
    s = read_run(tp2)
    assert s.nvml_ranks == (0,) and set(s.nvml["rank"]) == {0}
    assert any(p.startswith("rank 1: no nvml-part-*.parquet") and "outside the allocator are unknown" in p
               for p in s.problems)
    assert any(p.startswith("rank 0: no markers.parquet") for p in s.problems)
    assert s.capacity(1, 0) == (85_899_345_920, "meta.json total_memory_bytes")


def test_a_rank_missing_from_the_world_is_reported(tp2: Path) -> None:
    shutil.rmtree(tp2 / "rank=1")
    meta = json.loads((tp2 / "rank=0" / "meta.json").read_text())
    meta["world_size"] = 3
    (tp2 / "rank=0" / "meta.json").write_text(json.dumps(meta))
    s = read_run(tp2)
    assert s.ranks == (0,)
    assert [p for p in s.problems if "world_size" in p] == [
        "rank 1: no rank=1 directory although meta.json says world_size 3",
        "rank 2: no rank=2 directory although meta.json says world_size 3"]


def test_capacity_unknown_without_nvml_or_meta(tp2: Path) -> None:
    (tp2 / "rank=1" / "nvml-part-00001.parquet").unlink()
    (tp2 / "rank=1" / "meta.json").unlink()
    s = read_run(tp2)
    total, source = s.capacity(1, 0)
    assert total is None and source.startswith("unknown")


def test_files_that_are_not_the_collectors_are_refused_by_name(tp2: Path) -> None:
    part = tp2 / "rank=0" / "nvml-part-00002.parquet"
    part.write_bytes(b"PAR1 truncated")
    with pytest.raises(BadInputError, match="nvml-part-00002.parquet: not a readable Parquet file"):
        read_run(tp2)
    pq.write_table(pa.table({"time_us": [1], "device": [0]}), part)
    with pytest.raises(BadInputError, match="missing column.*used_bytes"):
        read_run(tp2)
    part.unlink()
    (tp2 / "rank=1" / "meta.json").write_text("{not json")
    with pytest.raises(BadInputError, match=r"rank=1/meta.json: not a readable meta.json"):
        read_run(tp2)


def test_later_parts_and_sessions_are_concatenated(tp2: Path) -> None:
    rdir = tp2 / "rank=0"
    first = pq.read_table(rdir / "nvml-part-00001.parquet")
    later = first.slice(0, 3).set_column(0, "time_us", pa.array([t + 10**9 for t in first["time_us"].to_pylist()[:3]],
                                                                    pa.int64()))
    schemas.write_table(later.cast(schemas.NVML_SCHEMA), rdir / layout.nvml_part_name(2), schema=schemas.NVML_SCHEMA)
    marks = pq.read_table(rdir / "markers.parquet").slice(0, 1)
    schemas.write_table(marks, rdir / layout.markers_name(1), schema=schemas.MARKERS_SCHEMA)
    s = read_run(tp2)
    assert len(s.nvml_of(0)) == first.num_rows + 3 and s.nvml_of(0)["time_us"].is_monotonic_increasing
    assert list(s.markers_of(0)["session"]).count(1) == 1


def test_pick_snapshots(tp2: Path) -> None:
    chosen, problems = pick_snapshots(tp2)
    assert [(e.rank, e.tag) for e in chosen] == [(0, "final"), (1, "final")] and problems == []
    shutil.copy(tp2 / "rank=1" / "snapshot-final.pickle", tp2 / "rank=1" / "snapshot-oom-1.pickle")
    chosen, _ = pick_snapshots(tp2, prefer_oom=True)
    assert [(e.rank, e.tag) for e in chosen] == [(0, "final"), (1, "oom-1")]
    chosen, _ = pick_snapshots(tp2)
    assert [(e.rank, e.tag) for e in chosen] == [(0, "final"), (1, "final")]
    (tp2 / "rank=1" / "snapshot-final.pickle").rename(tp2 / "rank=1" / "snapshot-after-prefill.pickle")
    chosen, problems = pick_snapshots(tp2)
    assert [(e.rank, e.tag) for e in chosen] == [(0, "final")]
    assert problems == ["rank 1: several snapshots (after-prefill, oom-1) and none tagged 'final'; "
                        "choose one with --tag"]
    chosen, problems = pick_snapshots(tp2, tag="oom-1")
    assert [(e.rank, e.tag) for e in chosen] == [(1, "oom-1")]
    assert problems == ["rank 0: no snapshot tagged 'oom-1' (has: final)"]
    (tp2 / "rank=0" / "snapshot-final.pickle").unlink()
    chosen, problems = pick_snapshots(tp2, rank=0)
    assert chosen == [] and problems[0].startswith("rank 0: no snapshot in")


def test_markers_for_and_rank_of() -> None:
    pickle = TP2 / "rank=1" / "snapshot-final.pickle"
    assert rank_of(pickle) == 1 and rank_of(TP2 / "rank=0") == 0 and rank_of(TP2) is None
    by_run = markers_for(TP2, rank=1)
    assert by_run.equals(markers_for(pickle)) and set(by_run["rank"]) == {1}
    lone = markers_for(Path(__file__).resolve().parents[2] / "fixtures" / "scenarios" / "oom_fragmentation.pickle")
    assert list(lone.columns) == MARKER_COLUMNS and len(lone) == 0
    assert isinstance(lone, pd.DataFrame)


# -- damaged run directories: one clear error naming the file and the field, never a traceback or a hang -------

def _meta(tp2: Path, rank: int = 0, **changes: object) -> Path:
    path = tp2 / f"rank={rank}" / "meta.json"
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))
    return path


def _one_error_line(*args: object) -> str:
    from click.testing import CliRunner

    from snapanalyze.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapanalyze: error: ") and "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize(("changes", "message"), [
    ({"world_size": "2"}, 'field world_size: expected an integer from 1 to 1,000,000, got "2"'),
    ({"world_size": 1e9}, "field world_size: expected an integer from 1 to 1,000,000, got 1000000000.0"),
    ({"world_size": 10**9}, "field world_size: expected an integer from 1 to 1,000,000, got 1000000000"),
    ({"world_size": 0}, "field world_size: expected an integer from 1 to 1,000,000, got 0"),
    ({"world_size": True}, "field world_size: expected an integer from 1 to 1,000,000, got true"),
    ({"devices": {"index": 0}}, 'field devices: expected a list of device objects, got {"index": 0}'),
    ({"devices": [7]}, "field devices\\[0\\]: expected an object, got 7"),
    ({"devices": [{"index": 0, "total_memory_bytes": -1}]},
     "field devices\\[0\\].total_memory_bytes: expected a non-negative integer, got -1"),
    ({"nvml": "on"}, 'field nvml: expected an object, got "on"'),
    ({"nvml": {"interval_ms": "fast"}}, 'field nvml.interval_ms: expected a positive number, got "fast"'),
    ({"nvml": {"interval_ms": float("nan")}}, "field nvml.interval_ms: expected a positive number, got NaN"),
    ({"nvml": {"reason": ["x"]}}, 'field nvml.reason: expected a string, got \\["x"\\]'),
])
def test_a_wrong_type_in_meta_json_names_the_field(tp2: Path, changes: dict, message: str) -> None:
    path = _meta(tp2, 1, **changes)
    with pytest.raises(BadInputError, match=f"^{re.escape(str(path))}: {message}$"):
        read_run(tp2)
    assert re.search(message, _one_error_line("ranks", tp2))


def test_meta_json_that_is_not_a_regular_file_is_refused_at_once(tp2: Path) -> None:
    meta = tp2 / "rank=0" / "meta.json"
    meta.unlink()
    meta.symlink_to("/dev/zero")                       # read() would never end, then MemoryError
    started = time.monotonic()
    with pytest.raises(BadInputError, match=r"rank=0/meta.json: is a character device, not a regular file"):
        read_run(tp2)
    assert "is a character device, not a regular file" in _one_error_line("ranks", tp2)
    assert time.monotonic() - started < 10
    meta.unlink()
    os.mkfifo(meta)                                    # open() would wait for a writer forever
    done: list[BaseException] = []

    def read() -> None:
        try:
            read_run(tp2)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            done.append(exc)

    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(timeout=10)
    if worker.is_alive():                              # unblock the reader before failing
        os.close(os.open(meta, os.O_WRONLY | os.O_NONBLOCK))
    assert not worker.is_alive() and isinstance(done[0], BadInputError)
    assert "meta.json: is a FIFO, not a regular file" in str(done[0])


def test_meta_json_has_a_size_cap(tp2: Path) -> None:
    meta = tp2 / "rank=0" / "meta.json"
    with open(meta, "r+b") as f:
        f.truncate(65 << 20)                           # sparse: 65 MiB of zeros
    with pytest.raises(BadInputError, match=r"meta.json: 68,157,440 bytes, larger than the 4 MiB a meta.json may be"):
        read_run(tp2)
    meta.write_bytes(b"\xff\xfe{}")
    with pytest.raises(BadInputError, match="meta.json: not a readable meta.json: not UTF-8 text"):
        read_run(tp2)
    meta.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BadInputError, match="meta.json: not a readable meta.json"):
        read_run(tp2)


def test_a_huge_world_size_is_summarised_not_listed(tp2: Path) -> None:
    _meta(tp2, 0, world_size=1_000_000)
    started = time.monotonic()
    s = read_run(tp2)
    assert time.monotonic() - started < 10
    assert [p for p in s.problems if "world_size" in p] == [
        "999,998 ranks of 1,000,000 (rank 2 to 999999) have no rank=N directory although meta.json says world_size "
        "1000000"]
    _meta(tp2, 0, world_size=1)
    _meta(tp2, 1, world_size=1)
    assert [p for p in read_run(tp2).problems if "world_size" in p] == [
        "rank=1: past the world_size 1 that meta.json states"]


def test_damaged_nvml_and_markers_columns_are_refused(tp2: Path) -> None:
    part = tp2 / "rank=0" / "nvml-part-00001.parquet"
    table = pq.read_table(part)
    used = table.schema.get_field_index("used_bytes")
    pq.write_table(table.set_column(used, "used_bytes", pa.array([None] * table.num_rows, pa.int64())), part)
    with pytest.raises(BadInputError, match=r"nvml-part-00001.parquet: an NVML part: null values where the collector "
                                            r"always writes one: used_bytes \(87\)"):
        read_run(tp2)
    pq.write_table(table.set_column(used, "used_bytes", pa.array([-1] * table.num_rows, pa.int64())), part)
    with pytest.raises(BadInputError, match="an NVML part: negative values in used_bytes"):
        read_run(tp2)
    pq.write_table(table.set_column(used, "used_bytes", pa.array([2**64 - 1] * table.num_rows, pa.uint64())), part)
    with pytest.raises(BadInputError, match="an NVML part: column types differ"):
        read_run(tp2)
    part.unlink()
    os.mkfifo(part)
    with pytest.raises(BadInputError, match="nvml-part-00001.parquet: is a FIFO, not a regular file"):
        read_run(tp2)
    part.unlink()
    marks = tp2 / "rank=1" / "markers.parquet"
    table = pq.read_table(marks)
    pq.write_table(table.drop(["start_time_us"]), marks)
    with pytest.raises(BadInputError, match="markers.parquet: not a markers file as the collector writes it: missing "
                                            "column.s. start_time_us"):
        read_run(tp2)


def test_marker_attrs_nested_past_the_recursion_limit_are_kept_raw(tp2: Path) -> None:
    marks = tp2 / "rank=1" / "markers.parquet"
    table = pq.read_table(marks)
    deep = "[" * 100_000 + "]" * 100_000
    attrs = table.schema.get_field_index("attrs")
    pq.write_table(table.set_column(attrs, "attrs", pa.array([deep] * table.num_rows, pa.string())), marks)
    first = read_run(tp2).markers_of(1)["attrs"].iloc[0]
    assert first == {"_raw": deep}


def test_a_markers_table_past_the_memory_cap_is_refused_before_decoding(tmp_path: Path) -> None:
    """Millions of spans in a markers.parquet of a few KB: the footer says what they would decode to, and
    under --max-memory the run is refused at once, naming the file, instead of growing past the cap."""
    import subprocess
    import sys

    run = Path(shutil.copytree(Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "admission_rejected",
                               tmp_path / "run"))
    markers = run / "rank=0" / "markers.parquet"
    table = pq.read_table(markers)
    group = table.take(pa.array([0] * (1 << 20)))
    with pq.ParquetWriter(markers, table.schema, compression="zstd") as writer:
        for _ in range(2):
            writer.write_table(group)
    assert markers.stat().st_size < 1 << 20
    done = subprocess.run([sys.executable, "-m", "snapanalyze", "--max-memory", "64MiB", "phases", str(run)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "markers.parquet: its columns would decode to" in lines[0], done.stderr
    assert "more than the 64.00 MiB a file of" in lines[0]
