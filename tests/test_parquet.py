"""Converted Parquet tables give the same answers as the pickle they came from, carry their schema
version, are written atomically and never replace existing tables without force."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import BASE, SnapshotBuilder, write_pickle

from snapanalyze import BadInputError, UsageError, attribute, find_peaks, load, replay
from snapanalyze.load.parquet import read_tables, write_tables
from snapanalyze.report.documents import attribution_document, peaks_document

GiB, MiB = 1 << 30, 1 << 20
REAL = Path(__file__).parent.parent / "fixtures" / "real"


def _answers(snapshot):
    timeline = replay(snapshot)
    peaks = peaks_document(timeline, find_peaks(timeline, top=5))
    attributed = attribution_document(attribute(snapshot, timeline=timeline), explain=True)
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
    with pytest.raises(BadInputError, match=r"damaged snapshot tables \(a column of string where numbers belong\)"):
        read_tables(_with_text_column(tmp_path / "t", "size"))
    # A detail column is read on first use: its damage is reported then, as clearly.
    snapshot = read_tables(_with_text_column(tmp_path / "u", "stack_id"))
    with pytest.raises(BadInputError, match=r"u: damaged snapshot tables"):
        snapshot.trace(0).stack_ids  # noqa: B018  (reading it is the point)


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
