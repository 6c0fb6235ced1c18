"""Converted Parquet tables give the same answers as the pickle they came from, carry their schema
version, are written atomically and never replace existing tables without force."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import BASE, SnapshotBuilder, write_pickle

from snapanalyze import BadInputError, UsageError, attribute, load, replay
from snapanalyze.analyze.attribute.compact import attribution_result
from snapanalyze.analyze.peaks import peaks_of
from snapanalyze.load.parquet import TABLE_COLUMNS, read_tables, write_tables

GiB, MiB = 1 << 30, 1 << 20
REAL = Path(__file__).resolve().parents[2] / "fixtures" / "real"


def _answers(snapshot):
    timeline = replay(snapshot)
    peaks = peaks_of(timeline, top=5).to_json()
    attributed = attribution_result(attribute(snapshot, timeline=timeline), explain=True).to_json()
    for doc in (peaks, attributed):
        doc.pop("source")
    return peaks, attributed


@pytest.mark.parametrize("path", sorted(REAL.glob("*.pickle")), ids=lambda p: p.name)
def test_tables_answer_exactly_like_the_pickle(tmp_path, path):
    original = load(path)
    write_tables(original, tmp_path / "t")
    assert _answers(read_tables(tmp_path / "t")) == _answers(load(path))


def test_events_table_has_schema_version_and_units(tmp_path):
    write_tables(load(REAL / "cs336-step-user-metadata-t2.11.pickle"), tmp_path / "t")
    table = pq.read_table(tmp_path / "t" / "events.parquet")
    assert table.schema.metadata[b"schema_version"] == b"1"
    assert {"time_us", "size", "addr", "stack_id", "user_metadata"} <= set(table.column_names)
    assert str(table.schema.field("addr").type) == "uint64"


def test_existing_tables_are_kept_without_force(tmp_path):
    snap = load(REAL / "cs336-forward-fp32-t2.6.pickle")
    write_tables(snap, tmp_path / "t")
    before = (tmp_path / "t" / "events.parquet").read_bytes()
    with pytest.raises(UsageError, match="already exists"):
        write_tables(load(REAL / "cs336-forward-bf16-t2.6.pickle"), tmp_path / "t")
    assert (tmp_path / "t" / "events.parquet").read_bytes() == before
    write_tables(load(REAL / "cs336-forward-bf16-t2.6.pickle"), tmp_path / "t", force=True)
    assert (tmp_path / "t" / "events.parquet").read_bytes() != before
    assert [p.name for p in tmp_path.iterdir()] == ["t"]          # no staging leftovers


def test_damaged_tables_are_a_clear_error(tmp_path):
    write_tables(load(REAL / "cs336-forward-fp32-t2.6.pickle"), tmp_path / "t")
    (tmp_path / "t" / "blocks.parquet").write_bytes(b"not parquet")
    with pytest.raises(BadInputError, match="blocks.parquet: unreadable Parquet file"):
        read_tables(tmp_path / "t")
    (tmp_path / "t" / "segments.parquet").unlink()
    with pytest.raises(BadInputError, match="segments.parquet is missing"):
        read_tables(tmp_path / "t")


def test_detail_columns_round_trip_per_device(tmp_path):
    """Request ids, compile context, OOM free bytes and stacks are read on first use, per device, and
    equal the pickle's: two devices interleaved, an OOM on each, the second device's trace longer."""
    b = SnapshotBuilder()
    for device in (0, 1):
        b.segment(BASE + device * GiB, [(2 * MiB, 0, "inactive")], device=device)
    b.alloc(BASE + GiB, 100, device=1, user_metadata="req=B")
    b.alloc(BASE, 200, device=0, user_metadata="req=A", compile_context="Torch-Compiled Region: 0/0")
    b.event("oom", None, 20 * MiB, device=1, device_free=5 * MiB)
    b.free(BASE + GiB, 100, device=1)
    b.event("oom", None, 30 * MiB, device=0, device_free=3 * MiB)
    b.free(BASE, 200, device=0)
    original = load(write_pickle(tmp_path / "two.pickle", b.build()))
    write_tables(original, tmp_path / "t")
    converted = read_tables(tmp_path / "t")
    for device in (0, 1):
        want, got = original.trace(device), converted.trace(device)
        assert got.device_free == want.device_free
        assert [got.user_metadata_names[c] for c in got.user_metadata] == \
            [want.user_metadata_names[c] for c in want.user_metadata]
        assert [got.compile_context_names[c] for c in got.compile_context] == \
            [want.compile_context_names[c] for c in want.compile_context]
        every = np.arange(len(want))
        assert [converted.stack(s) for s in converted.event_stack_ids(device, every)] == \
            [original.stack(s) for s in original.event_stack_ids(device, every)]
    assert converted.ooms.to_dict("records") == original.ooms.to_dict("records")
    assert converted.ooms["device_free"].tolist() == [3 * MiB, 5 * MiB]


def _with_text_column(directory, column):
    """Converted tables of a real file whose events `column` was rewritten as strings."""
    import pyarrow as pa

    write_tables(load(REAL / "cs336-forward-fp32-t2.6.pickle"), directory)
    path = directory / "events.parquet"
    table = pq.read_table(path)
    i = table.schema.get_field_index(column)
    pq.write_table(table.set_column(i, column, table.column(column).cast(pa.string()))
                   .replace_schema_metadata(table.schema.metadata), path)
    return directory


def test_a_column_of_the_wrong_type_is_a_clear_error(tmp_path):
    with pytest.raises(BadInputError, match=r"t/events.parquet: damaged snapshot tables \(column size holds string, "
                       r"expected integers\)"):
        read_tables(_with_text_column(tmp_path / "t", "size"))
    # A detail column is read on first use, but its type is checked up front: the error comes at once.
    with pytest.raises(BadInputError, match=r"u/events.parquet: damaged snapshot tables \(column stack_id holds "):
        read_tables(_with_text_column(tmp_path / "u", "stack_id"))


def test_tables_in_many_row_groups_answer_alike(tmp_path):
    """Large runs come back from Parquet in several chunks (row groups): every column reader joins them."""
    path = REAL / "cs336-step-user-metadata-t2.11.pickle"
    write_tables(load(path), tmp_path / "t")
    for name in ("events", "blocks", "segments"):
        table = pq.read_table(tmp_path / "t" / f"{name}.parquet")
        pq.write_table(table, tmp_path / "t" / f"{name}.parquet", row_group_size=7)
    chunked = read_tables(tmp_path / "t")
    assert chunked.trace(0).user_metadata is not None
    assert _answers(chunked) == _answers(load(path))


def test_column_buffers_read_like_to_numpy_across_chunks_nulls_and_offsets():
    import pyarrow as pa

    from snapanalyze.load.parquet import _numpy, _values

    whole = pa.array([1, None, 3, 4, None, 6, 7, 8, 9, 10], type=pa.int64())
    column = pa.chunked_array([whole.slice(1, 4), whole.slice(5, 5), whole.slice(0, 0)])   # offsets, an empty chunk
    values, valid = _values(column)
    assert valid.tolist() == [False, True, True, False, True, True, True, True, True]
    assert values[valid].tolist() == [3, 4, 6, 7, 8, 9, 10]
    assert _numpy(column, np.int64, fill=-1).tolist() == [-1, 3, 4, -1, 6, 7, 8, 9, 10]
    flags = pa.chunked_array([pa.array([True, False, True, True, False, False, True, False, True]).slice(3)])
    assert _numpy(flags, bool).tolist() == [True, False, False, True, False, True]
    assert _values(pa.chunked_array([], type=pa.uint64()))[0].dtype == np.uint64


# -- damaged tables: one BadInputError naming the file and the problem, also for what is read on first use ----

@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tables") / "t"
    write_tables(load(REAL / "cs336-forward-fp32-t2.6.pickle"), directory)
    return directory


def _copy(converted, tmp_path):
    import shutil

    return Path(shutil.copytree(converted, tmp_path / "t"))


def _use(directory):
    """Read the tables and everything an analysis reads from them later."""
    snapshot = read_tables(directory)
    snapshot.annotations  # noqa: B018  (reading it is the point)
    snapshot.frames_table()
    for device in snapshot.traces:
        snapshot.trace(device).stack_ids  # noqa: B018
    return snapshot


def _rewrite(path, change):
    table = pq.read_table(path)
    pq.write_table(change(table).replace_schema_metadata(table.schema.metadata), path)


@pytest.mark.parametrize(("table", "column"), [(t, c) for t, cols in TABLE_COLUMNS.items() for c in cols])
def test_a_dropped_column_names_the_table_and_the_column(converted, tmp_path, table, column):
    directory = _copy(converted, tmp_path)
    _rewrite(directory / f"{table}.parquet", lambda t: t.drop([column]))
    with pytest.raises(BadInputError, match=rf"t/{table}.parquet: damaged snapshot tables: missing column\(s\) "
                                            rf"{column}: convert the pickle again"):
        _use(directory)


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: {**m, "format": {**m["format"], "container": 5}}, "field format.container: expected a string, got 5"),
    (lambda m: {**m, "format": {**m["format"], "entry_keys": "action"}},
     'field format.entry_keys: expected a list of strings, got "action"'),
    (lambda m: {**m, "format": {**m["format"], "trace_included": "yes"}},
     'field format.trace_included: expected true or false, got "yes"'),
    (lambda m: {k: v for k, v in m.items() if k != "format"}, "field format: expected an object, got null"),
    (lambda m: {**m, "action_names": ["alloc"]}, 'field action_names: expected an object of lists of action names'),
    (lambda m: {**m, "allocator_settings": "expandable"}, 'field allocator_settings: expected an object'),
    (lambda m: {**m, "schema_version": 99}, r"field schema_version: expected 1 \(convert the pickle again\), got 99"),
    (lambda m: [m], r"not a snapshot.json document \(expected a JSON object\)"),
])
def test_a_wrong_type_in_snapshot_json_names_the_field(converted, tmp_path, change, message):
    import json

    directory = _copy(converted, tmp_path)
    meta = directory / "snapshot.json"
    meta.write_text(json.dumps(change(json.loads(meta.read_text()))))
    with pytest.raises(BadInputError, match=f"t/snapshot.json: {message}"):
        read_tables(directory)


def test_files_that_are_not_regular_are_refused_at_once(converted, tmp_path):
    import os
    import time

    directory = _copy(converted, tmp_path)
    meta = directory / "snapshot.json"
    meta.unlink()
    meta.symlink_to("/dev/zero")
    started = time.monotonic()
    with pytest.raises(BadInputError, match="snapshot.json: is a character device, not a regular file"):
        read_tables(directory)
    assert time.monotonic() - started < 10
    meta.unlink()
    os.mkfifo(meta)
    with pytest.raises(BadInputError, match="snapshot.json: is a FIFO, not a regular file"):
        read_tables(directory)
    meta.unlink()
    meta.write_bytes((converted / "snapshot.json").read_bytes())
    (directory / "events.parquet").unlink()
    os.mkfifo(directory / "events.parquet")
    with pytest.raises(BadInputError, match="events.parquet: is a FIFO, not a regular file"):
        read_tables(directory)


def test_ids_that_point_outside_their_tables_are_refused(converted, tmp_path):
    import pyarrow as pa

    def set_column(name, values):
        return lambda t: t.set_column(t.schema.get_field_index(name), name, pa.array(values, t.schema.field(name).type))

    directory = _copy(converted, tmp_path)
    blocks = pq.read_table(directory / "blocks.parquet")
    _rewrite(directory / "blocks.parquet", set_column("stack_id", [10**12] * blocks.num_rows))
    with pytest.raises(BadInputError, match="blocks.parquet: damaged snapshot tables: stack_id 1000000000000 points "
                                            "outside the stacks table"):
        read_tables(directory)
    directory = _copy(converted, tmp_path / "u")
    stacks = pq.read_table(directory / "stacks.parquet")
    _rewrite(directory / "stacks.parquet", set_column("frame_id", [2**40] * stacks.num_rows))
    snapshot = read_tables(directory)                   # stacks are read on first use: refused then, as clearly
    with pytest.raises(BadInputError, match=r"stacks.parquet: damaged snapshot tables: frame_id 1099511627776 points "
                                            r"past the \d+ frames"):
        snapshot.frames_table()
    directory = _copy(converted, tmp_path / "v")
    events = pq.read_table(directory / "events.parquet")
    _rewrite(directory / "events.parquet", set_column("device", [None] * events.num_rows))
    with pytest.raises(BadInputError, match=r"events.parquet: damaged snapshot tables: nulls where the writer writes "
                                            r"none: device \("):
        read_tables(directory)


def test_force_replaces_only_converted_tables(tmp_path):
    import os

    snap = load(REAL / "cs336-forward-fp32-t2.6.pickle")
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "todo.txt").write_text("keep me")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, what in ((mine, "a directory without snapshot.json"), (fifo, "a FIFO")):
        with pytest.raises(UsageError, match=f"is {what}, not tables `snapanalyze convert` wrote"):
            write_tables(snap, target, force=True)
    assert (mine / "todo.txt").read_text() == "keep me" and fifo.is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "notes"]


def test_warnings_and_what_tables_leave_out_survive_conversion(tmp_path: Path) -> None:
    import pickle
    import warnings

    from snapanalyze.errors import InputWarning

    scenario = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios" / "torch214_graph_pools_host.pickle"
    raw = pickle.loads(scenario.read_bytes())
    trace = raw["device_traces"][0]
    trace[3]["time_us"], trace[4]["time_us"] = trace[4]["time_us"], trace[3]["time_us"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InputWarning)
        snapshot = load(write_pickle(tmp_path / "s.pickle", raw))
        write_tables(snapshot, tmp_path / "tables")
        again = load(tmp_path / "tables")
    assert again.trace(0).time_us is None                       # withheld times stay withheld
    assert again.warnings[0] == snapshot.warnings[0] and "runs backwards" in again.warnings[0]
    assert any("pinned host memory (4 host segments) is not kept" in w for w in again.warnings)
    assert any("runs backwards" in str(w.message) for w in caught)


def _bomb(path, rows):
    """`path` rewritten as `rows` copies of its first row, in row groups that compress to almost nothing."""
    import pyarrow as pa

    table = pq.read_table(path)
    group = table.take(pa.array(np.zeros(min(rows, 1 << 20), dtype=np.int64)))
    with pq.ParquetWriter(path, table.schema, compression="zstd") as writer:
        for _ in range(rows // group.num_rows):
            writer.write_table(group, row_group_size=group.num_rows)


def test_a_parquet_bomb_is_refused_from_its_footer_before_decoding(converted, tmp_path):
    """A small events.parquet that claims millions of rows would decode to gigabytes: refused from the footer
    alone, with the sizes named, and refused sooner under --max-memory."""
    import resource

    from snapanalyze.load.safe_pickle import Limits, limits_in_effect

    directory = _copy(converted, tmp_path)
    events = directory / "events.parquet"
    _bomb(events, 6 << 20)
    assert events.stat().st_size < 1 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(BadInputError, match=r"events.parquet: its columns would decode to [\d.]+ MiB \([\d,]+ bytes\), "
                                            r"more than the 256.00 MiB a file of [\d,]+ bytes may take"):
        _use(directory)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 << 10     # KiB: nothing decoded
    with limits_in_effect(Limits(max_memory_bytes=4096)), pytest.raises(BadInputError, match="more than the 4.00 KiB"):
        _use(_copy(converted, tmp_path / "small"))
