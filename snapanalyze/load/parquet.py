"""Columnar snapshot tables on disk: write a Snapshot as Parquet, read it back as the same Snapshot.

Contract: `write_tables(snapshot, directory)` writes the tables named in `schema.SNAPSHOT_TABLES` plus
`snapshot.json` into `directory` atomically (a temporary sibling directory renamed into place) and refuses
to replace an existing one unless `force=True`; `read_tables(directory)` returns a Snapshot whose replay,
peaks and attribution equal those of the original pickle. Stacks are stored interned (frames + stacks
tables, a stack_id per event and block), so reading never touches a frame dict.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import layout, schema
from ..atomic import write_directory
from ..errors import BadInputError, UsageError
from ..model import ACTION_CODE, BLOCK_COLUMNS, SEGMENT_COLUMNS, DeviceTrace, Format, Snapshot, TraceDetails
from ..stacks import StackInterner

if TYPE_CHECKING:                 # reading what `peaks` needs makes no DataFrame: pandas loads on first use
    import pandas as pd


def _write(table: pa.Table, path: Path) -> None:
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **schema.metadata()})
    pq.write_table(table, path, compression="zstd")


def write_tables(snapshot: Snapshot, directory: str | Path, force: bool = False) -> Path:
    """Write `snapshot` as Parquet tables into `directory` (see the module docstring)."""
    if Path(directory).exists() and not force:
        raise UsageError(f"{directory}: already exists (use --force to replace it)")
    return write_directory(directory, lambda staging: _fill(snapshot, staging), replace=True)


def _fill(snapshot: Snapshot, staging: Path) -> None:
    import pandas as pd

    events = snapshot.events.copy()
    events["device_free"] = pd.array([None] * len(events), dtype="Int64")
    for device, trace in snapshot.traces.items():
        for index, free in trace.device_free.items():
            events.loc[(events["device"] == device) & (events["index"] == index), "device_free"] = free
    _write(pa.Table.from_pandas(events, schema=schema.EVENTS, preserve_index=False), staging / "events.parquet")
    blocks = snapshot.blocks.copy()
    blocks["stack_id"] = snapshot.block_stack_ids(np.arange(len(blocks)))
    for name, df in (("segments", snapshot.segments), ("blocks", blocks), ("annotations", snapshot.annotations)):
        _write(pa.Table.from_pandas(df, preserve_index=False), staging / f"{name}.parquet")
    _write(pa.Table.from_pandas(snapshot.frames_table(), schema=schema.FRAMES, preserve_index=False),
           staging / "frames.parquet")
    _write(pa.Table.from_pandas(snapshot.stacks_table(), schema=schema.STACKS, preserve_index=False),
           staging / "stacks.parquet")
    meta = {"schema_version": layout.SCHEMA_VERSION, "source": snapshot.source,
            "format": dataclasses.asdict(snapshot.format), "allocator_settings": snapshot.allocator_settings,
            "trace_devices": sorted(snapshot.traces),
            "action_names": {str(d): list(t.action_names) for d, t in snapshot.traces.items()}}
    (staging / layout.TABLES_META).write_text(json.dumps(meta, indent=1, default=str))


def _read_arrow(directory: Path, name: str, columns: list[str] | None = None) -> pa.Table:
    path = directory / f"{name}.parquet"
    try:
        with pq.ParquetFile(path) as reader:   # not read_table: its dataset layer costs ~0.4 s per process
            table = reader.read(columns=columns)
    except FileNotFoundError:
        raise BadInputError(directory, f"incomplete snapshot tables: {name}.parquet is missing") from None
    except (pa.ArrowException, OSError) as exc:
        raise BadInputError(path, f"unreadable Parquet file ({exc})") from None
    version = (table.schema.metadata or {}).get(b"schema_version", b"0").decode()
    if version != str(layout.SCHEMA_VERSION):
        raise BadInputError(path, f"schema version {version}, this snapanalyze reads {layout.SCHEMA_VERSION}: "
                            "convert the pickle again")
    return table


def _read(directory: Path, name: str) -> pd.DataFrame:
    return _read_arrow(directory, name).to_pandas()


def _bits(buffer: pa.Buffer, offset: int, n: int) -> np.ndarray:
    return np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), count=offset + n, bitorder="little")[offset:] \
        .astype(bool)


def _values(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray | None]:
    """(values, valid — None when nothing is null) of a fixed-width column, read from its Arrow buffers.

    pyarrow's own `to_numpy` goes through its pandas conversion layer, which imports pandas (≈ 0.3 s a
    process) even for plain integers; reading the buffers keeps `peaks` on a converted run free of it."""
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        raise TypeError(f"a column of {kind} where numbers belong")
    dtype = np.dtype(bool) if pa.types.is_boolean(kind) else np.dtype(kind.to_pandas_dtype())
    parts, valid_parts = [], []
    for array in column.chunks if isinstance(column, pa.ChunkedArray) else [column]:
        n, offset = len(array), array.offset
        if not n:
            continue
        validity, data = array.buffers()[:2]
        if dtype.kind == "b":
            parts.append(_bits(data, offset, n))
        else:
            parts.append(np.frombuffer(data, dtype=dtype, count=n, offset=offset * dtype.itemsize))
        valid_parts.append(_bits(validity, offset, n) if array.null_count else np.ones(n, dtype=bool))
    if not parts:
        return np.zeros(0, dtype=dtype), None
    values = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return values, (np.concatenate(valid_parts) if column.null_count else None)


def _columns(table: pa.Table, spec: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every column of an end-state table as numpy (strings as object arrays), typed as `spec` says."""
    out = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_dictionary(column.type) or pa.types.is_string(column.type):
            found = _dictionary(column)                  # None: all null
            values = np.full(len(column), "", dtype=object) if found is None or not found[1] else \
                np.array(found[1], dtype=object)[found[0]]
        else:
            values = _numpy(column, spec.get(name, np.int64))
        out[name] = values.astype(spec.get(name, values.dtype), copy=False)
    return out


def _annotations(directory: Path) -> pd.DataFrame:
    annotations = _read(directory, "annotations")
    annotations["time_us"] = annotations["time_us"].astype("Int64")
    return annotations


def _numpy(column: pa.ChunkedArray | pa.Array, dtype: Any, fill: int = 0) -> np.ndarray:
    """A fixed-width column as numpy of `dtype`, nulls as `fill`."""
    values, valid = _values(column)
    if valid is not None:
        values = np.where(valid, values, fill)
    return values.astype(dtype, copy=False)


def _dictionary(column: pa.ChunkedArray) -> tuple[np.ndarray, tuple[str, ...]] | None:
    """(codes, names) of a dictionary-encoded string column; None when it is all null."""
    if column.null_count == len(column):
        return None
    array = column.unify_dictionaries().combine_chunks() if column.num_chunks > 1 else column.chunk(0)
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()
    names = tuple("" if v is None else str(v) for v in array.dictionary.to_pylist())
    return _numpy(array.indices, np.int32), names


# What replay and peaks need is read at once; the rest of the events table on first use (TraceDetails).
REPLAY_COLUMNS = ["device", "index", "action", "addr", "size", "stream", "time_us"]
DETAIL_COLUMNS = ["stack_id", "user_metadata", "compile_context", "device_free"]


def _pick(values: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    return values if rows is None else values[rows]


def _details(directory: Path, table: Callable[[], pa.Table], rows: np.ndarray | None,
             index: np.ndarray) -> TraceDetails:
    """The detail columns of one device's events (`rows` of the table, in trace order; None: all)."""
    try:
        return _detail_columns(table(), rows, index)
    except TypeError as exc:
        raise BadInputError(directory, f"damaged snapshot tables ({exc}): convert the pickle again") from None


def _detail_columns(ev: pa.Table, rows: np.ndarray | None, index: np.ndarray) -> TraceDetails:
    um = _dictionary(ev.column("user_metadata"))
    cc = _dictionary(ev.column("compile_context"))
    free = ev.column("device_free")                     # null except on oom entries
    values, valid = _values(free)
    free_rows = np.flatnonzero(valid) if valid is not None else np.arange(len(values))
    free_values = values[free_rows].astype(np.int64, copy=False)
    if rows is not None:                                 # table row → position in this device's trace
        position = np.full(len(ev), -1, dtype=np.int64)
        position[rows] = np.arange(len(rows))
        free_rows = position[free_rows]
    device_free = {int(index[i]): int(v) for i, v in zip(free_rows.tolist(), free_values.tolist()) if i >= 0}
    return TraceDetails(
        user_metadata=_pick(um[0], rows) if um else None, user_metadata_names=um[1] if um else (),
        compile_context=_pick(cc[0], rows) if cc else None, compile_context_names=cc[1] if cc else (),
        device_free=device_free, stack_ids=_pick(_numpy(ev.column("stack_id"), np.int64, -1), rows))


def _interner(directory: Path) -> StackInterner:
    return StackInterner.from_tables(_read(directory, "frames"), _read(directory, "stacks"))


def read_tables(directory: str | Path) -> Snapshot:
    """The Snapshot stored in `directory` by `write_tables`.

    Only the event columns replay needs are read here; request ids, compile context, OOM free bytes and
    stacks are read from the same files when an analysis first asks for them.
    """
    directory = Path(directory)
    try:
        meta: dict[str, Any] = json.loads((directory / layout.TABLES_META).read_text())
    except FileNotFoundError:
        raise BadInputError(directory, f"not a converted snapshot: {layout.TABLES_META} is missing") from None
    except ValueError as exc:
        raise BadInputError(directory / layout.TABLES_META, f"damaged ({exc})") from None
    try:
        return _read_tables(directory, meta)
    except (TypeError, KeyError) as exc:
        raise BadInputError(directory, f"damaged snapshot tables ({exc}): convert the pickle again") from None


def _read_tables(directory: Path, meta: dict[str, Any]) -> Snapshot:
    events = _read_arrow(directory, "events", REPLAY_COLUMNS)
    found = _dictionary(events.column("action"))
    if found is None and len(events):
        raise BadInputError(directory / "events.parquet", "events without an action")
    codes, names = found or (np.zeros(0, dtype=np.int32), ())
    device_column = _numpy(events.column("device"), np.int64)
    index_column = _numpy(events.column("index"), np.int64)
    columns = {name: _numpy(events.column(name), dtype) for name, dtype in
               (("addr", np.uint64), ("size", np.int64), ("stream", np.int64))}
    times = events.column("time_us")
    time_column = None if times.null_count == len(times) else _numpy(times, np.int64)
    detail_table = functools.cache(functools.partial(_read_arrow, directory, "events", DETAIL_COLUMNS))
    traces: dict[int, DeviceTrace] = {}
    if len(device_column) and device_column.min() == device_column.max():
        devices = [int(device_column[0])]                # the common case, without sorting 1M values
    else:
        devices = np.unique(device_column).tolist()
    for device in devices:
        rows = np.flatnonzero(device_column == device) if len(devices) > 1 else None
        index = _pick(index_column, rows)
        if len(index) and not (np.diff(index) > 0).all():
            order = np.argsort(index, kind="stable")
            rows = order if rows is None else rows[order]
            index = index[order]
        table = dict(ACTION_CODE)
        for name in meta.get("action_names", {}).get(str(device), []):
            table.setdefault(name, len(table))
        mapping = np.array([table.setdefault(n, len(table)) for n in names] or [0], dtype=np.int16)
        traces[int(device)] = DeviceTrace(
            device=int(device), action=mapping[_pick(codes, rows)],
            addr=_pick(columns["addr"], rows), size=_pick(columns["size"], rows),
            stream=_pick(columns["stream"], rows),
            time_us=None if time_column is None else _pick(time_column, rows),
            frames=[], action_names=tuple(table),
            details_source=functools.partial(_details, directory, detail_table, rows, index))
    fmt = meta["format"]
    return Snapshot(
        source=str(directory), traces=traces, block_frames=[],
        segment_columns=_columns(_read_arrow(directory, "segments"), SEGMENT_COLUMNS),
        block_columns=_columns(_read_arrow(directory, "blocks"), {**BLOCK_COLUMNS, "stack_id": np.int64}),
        annotations_source=functools.partial(_annotations, directory),
        allocator_settings=meta.get("allocator_settings"),
        format=Format(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in fmt.items()}),  # type: ignore[arg-type]
        interner_source=functools.partial(_interner, directory),
    )
