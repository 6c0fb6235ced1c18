"""Run-directory layout, atomic writes and the collector's Parquet schemas."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from snapanalyze import layout
from snapanalyze import schema as schemas
from snapanalyze.atomic import write_atomic, write_new


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
