"""Columnar snapshot tables on disk: write a Snapshot as Parquet, read it back as the same Snapshot.

Contract: `write_tables(snapshot, directory)` writes the tables named in `schema.SNAPSHOT_TABLES` plus
`snapshot.json` into `directory` atomically (a temporary sibling directory renamed into place) and refuses
to replace an existing one unless `force=True` — and even then replaces only converted tables (a directory
holding `snapshot.json`), never a file, a link, a FIFO or a device (`check_replaceable`). `read_tables(directory)`
returns a Snapshot whose replay, peaks and attribution equal those of the original pickle. Stacks are stored
interned (frames + stacks tables, a stack_id per event and block), so reading never touches a frame dict.

Reading trusts nothing it reads: only regular files are opened; `snapshot.json` is read by `jsonfile` (size
cap, JSON errors) and its ``schema_version``, ``format`` (every `Format` field, typed), ``action_names`` and
``allocator_settings`` are checked; each table must hold the columns `TABLE_COLUMNS` lists, of that kind,
without nulls where the writer writes none, with ids that cannot be negative non-negative (`NON_NEGATIVE`),
frame ids 0, 1, … in row order, and stack ids, depths and frame ids that point inside their tables (what
the values mean together — sizes, devices, overlaps — is `validate`'s, after loading). Any failure, also one
met later by a column read on first use — OSError, pyarrow errors, a wrong type, MemoryError,
RecursionError — is one BadInputError naming the file (or the directory) and what was wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import layout, schema
from ..atomic import describe, write_directory
from ..confine import open_confined, reopenable
from ..errors import BadInputError, UsageError
from ..model import ACTION_CODE, BLOCK_COLUMNS, SEGMENT_COLUMNS, DeviceTrace, Format, Snapshot, TraceDetails
from ..stacks import StackInterner
from .jsonfile import expect, read_json
from .parquet_bounds import check_decoded, check_table
from .safe_pickle import regular_file

if TYPE_CHECKING:                 # reading what `peaks` needs makes no DataFrame: pandas loads on first use
    import pandas as pd


def _write(table: pa.Table, path: Path) -> None:
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **schema.metadata()})
    pq.write_table(table, path, compression="zstd")


T = TypeVar("T")


def check_replaceable(directory: str | Path) -> None:
    """UsageError unless `directory` is absent or converted tables (a real directory holding `snapshot.json`):
    --force replaces those only."""
    target = Path(directory)
    if not os.path.lexists(target):
        return
    if target.is_symlink() or not target.is_dir() or not layout.is_tables_dir(target):
        what = describe(target)
        what = f"a directory without {layout.TABLES_META}" if what == "a directory" else what
        raise UsageError(f"{target}: is {what}, not tables `snapanalyze convert` wrote: --force replaces only "
                         "those (move it away, or choose another --tag)")


def write_tables(snapshot: Snapshot, directory: str | Path, force: bool = False) -> Path:
    """Write `snapshot` as Parquet tables into `directory` (see the module docstring)."""
    if os.path.lexists(directory):
        if not force:
            raise UsageError(f"{directory}: already exists (use --force to replace it)")
        check_replaceable(directory)
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
            "action_names": {str(d): list(t.action_names) for d, t in snapshot.traces.items()},
            "warnings": [*snapshot.warnings, *_not_kept(snapshot)], layout.ESTIMATE_KEY: snapshot.estimate}
    (staging / layout.TABLES_META).write_text(json.dumps(meta, indent=1, default=str))


def _not_kept(snapshot: Snapshot) -> list[str]:
    """What the tables leave out of the snapshot, said once in snapshot.json and on every read."""
    if snapshot.host is None:
        return []
    return [f"pinned host memory ({len(snapshot.host.segment_columns['address']):,} host segments) is not kept "
            "in converted tables: analyse the pickle to see it"]


# The columns a reader uses, per table: name → (kind, nullable). Kinds: "int" (an integer type), "bool", "str"
# (string, or a dictionary of strings). A column of Arrow's null type (only nulls) passes the kind check and
# then the null check. Columns not listed are read when present, never required.
_KIND = {object: "str", np.bool_: "bool"}


def _spec(columns: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    return {name: (_KIND.get(dtype, "int"), _KIND.get(dtype) == "str") for name, dtype in columns.items()}


TABLE_COLUMNS: dict[str, dict[str, tuple[str, bool]]] = {
    "events": {"device": ("int", False), "index": ("int", False), "action": ("str", False), "addr": ("int", False),
               "size": ("int", False), "stream": ("int", False), "time_us": ("int", True), "stack_id": ("int", True),
               "user_metadata": ("str", True), "compile_context": ("str", True), "device_free": ("int", True)},
    "segments": _spec(SEGMENT_COLUMNS),
    "blocks": {**_spec(BLOCK_COLUMNS), "stack_id": ("int", True)},
    "frames": {"frame_id": ("int", False), "filename": ("str", False), "line": ("int", False), "name": ("str", False)},
    "stacks": {"stack_id": ("int", False), "depth": ("int", False), "frame_id": ("int", False)},
    "annotations": {"device": ("int", False), "name": ("str", True), "stage": ("str", True), "time_us": ("int", True)},
}
# Columns newer writers add, read when present (older tables lack them): the events' pool ids (torch ≥ 2.12).
OPTIONAL_COLUMNS: dict[str, dict[str, tuple[str, bool]]] = {"events": {"pool_id": ("str", True)}}
NON_NEGATIVE: dict[str, tuple[str, ...]] = {"stacks": ("stack_id", "depth", "frame_id")}
_KIND_CHECK: dict[str, Callable[[pa.DataType], bool]] = {
    "int": pa.types.is_integer,
    "bool": pa.types.is_boolean,
    "str": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t) or (
        pa.types.is_dictionary(t) and (pa.types.is_string(t.value_type) or pa.types.is_large_string(t.value_type))),
}
_KIND_WORDS = {"int": "integers", "bool": "booleans", "str": "strings"}
# What a damaged file can make reading raise, beside BadInputError: each becomes one BadInputError.
_DAMAGE = (TypeError, KeyError, ValueError, IndexError, OverflowError, RecursionError, OSError, pa.ArrowException)


def _guarded(directory: Path, read: Callable[[], T]) -> T:
    """`read()`, with every damage it meets turned into one BadInputError naming `directory`."""
    try:
        return read()
    except BadInputError:
        raise
    except MemoryError:
        raise BadInputError(directory, "ran out of memory reading the snapshot tables") from None
    except _DAMAGE as exc:
        why = str(exc)[:200] or type(exc).__name__
        raise BadInputError(directory, f"damaged snapshot tables ({why}): convert the pickle again") from None


def _table_file(directory: Path, name: str) -> Path:
    path = directory / f"{name}.parquet"
    if not os.path.lexists(path):
        raise BadInputError(directory, f"incomplete snapshot tables: {name}.parquet is missing")
    regular_file(path)
    return path


def _read_arrow(directory: Path, name: str, columns: list[str] | None = None) -> pa.Table:
    """Table `name` of a tables directory (only `columns`, when given), checked against TABLE_COLUMNS: the
    schema of every listed column (it is in the footer), the nulls of the columns read."""
    path = _table_file(directory, name)
    optional = OPTIONAL_COLUMNS.get(name, {})
    try:
        with open_confined(path) as f, pq.ParquetFile(reopenable(f)) as reader:   # not read_table: its dataset
            # layer costs ~0.4 s per process; by the opened file's name, so no swapped path changes what is read
            schema = reader.schema_arrow
            present = {c: spec for c, spec in optional.items() if schema.get_field_index(c) >= 0}
            _check_schema(path, schema, {**TABLE_COLUMNS[name], **present})
            if columns is not None:
                columns = [c for c in columns if c not in optional or c in present]
            check_decoded(reader, path, columns)
            table = reader.read(columns=columns)
            check_table(table, path)
        spec = {**TABLE_COLUMNS[name], **present}
        wanted = spec if columns is None else {c: spec[c] for c in columns}
    except BadInputError:
        raise
    except MemoryError:
        raise BadInputError(path, "ran out of memory reading the table") from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise BadInputError(path, f"unreadable Parquet file ({str(exc)[:200]})") from None
    version = (table.schema.metadata or {}).get(b"schema_version", b"0").decode(errors="replace")
    if version != str(layout.SCHEMA_VERSION):
        raise BadInputError(path, f"schema version {version[:20]}, this snapanalyze reads {layout.SCHEMA_VERSION}: "
                            "convert the pickle again")
    nulls = [f"{c} ({table.column(c).null_count:,})" for c, (_, nullable) in wanted.items()
             if not nullable and table.column(c).null_count]
    if nulls:
        raise BadInputError(path, f"damaged snapshot tables: nulls where the writer writes none: {', '.join(nulls)}")
    return table


def _check_schema(path: Path, found: pa.Schema, wanted: dict[str, tuple[str, bool]]) -> None:
    missing = [c for c in wanted if found.get_field_index(c) < 0]
    if missing:
        raise BadInputError(path, f"damaged snapshot tables: missing column(s) {', '.join(missing)}: convert the "
                            "pickle again")
    for column, (kind, _) in wanted.items():
        kind_of = found.field(column).type
        if not (pa.types.is_null(kind_of) or _KIND_CHECK[kind](kind_of)):
            raise BadInputError(path, f"damaged snapshot tables (column {column} holds {kind_of}, expected "
                                f"{_KIND_WORDS[kind]}): convert the pickle again")


def _check_non_negative(path: Path, table: str, columns: dict[str, np.ndarray]) -> None:
    negative = [c for c in NON_NEGATIVE.get(table, ()) if c in columns and len(columns[c]) and columns[c].min() < 0]
    if negative:
        raise BadInputError(path, f"damaged snapshot tables: negative values in {', '.join(negative)}")


def _check_stack_ids(path: Path, ids: np.ndarray, bound: int) -> None:
    """Stack ids are -1 (none) or point into the stacks table (fewer than `bound`)."""
    if len(ids) and (ids.min() < -1 or ids.max() >= bound):
        bad = int(ids.min() if ids.min() < -1 else ids.max())
        raise BadInputError(path, f"damaged snapshot tables: stack_id {bad} points outside the stacks table "
                            f"({bound - 1:,} stacks at most)")


def _stack_bound(directory: Path) -> int:
    """One more than the largest stack id the stacks table can define (a stack per row, and the empty one)."""
    path = _table_file(directory, "stacks")
    try:
        with open_confined(path) as f, pq.ParquetFile(reopenable(f)) as reader:
            return int(reader.metadata.num_rows) + 1
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise BadInputError(path, f"unreadable Parquet file ({str(exc)[:200]})") from None


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
    if pa.types.is_null(kind):                           # only nulls: no buffers to read
        n = len(column)
        return np.zeros(n, dtype=np.int64), (np.zeros(n, dtype=bool) if n else None)
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
    def read() -> pd.DataFrame:
        annotations = _read(directory, "annotations")
        annotations["time_us"] = annotations["time_us"].astype("Int64")
        return annotations

    return _guarded(directory, read)


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
DETAIL_COLUMNS = ["stack_id", "user_metadata", "compile_context", "device_free", "pool_id"]


def _pick(values: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    return values if rows is None else values[rows]


def _details(directory: Path, table: Callable[[], pa.Table], rows: np.ndarray | None,
             index: np.ndarray) -> TraceDetails:
    """The detail columns of one device's events (`rows` of the table, in trace order; None: all)."""
    def read() -> TraceDetails:
        details = _detail_columns(table(), rows, index)
        if details.stack_ids is not None:
            _check_stack_ids(directory / "events.parquet", details.stack_ids, _stack_bound(directory))
        return details

    return _guarded(directory, read)


def _detail_columns(ev: pa.Table, rows: np.ndarray | None, index: np.ndarray) -> TraceDetails:
    um = _dictionary(ev.column("user_metadata"))
    cc = _dictionary(ev.column("compile_context"))
    pools = _dictionary(ev.column("pool_id")) if "pool_id" in ev.column_names else None
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
        device_free=device_free, stack_ids=_pick(_numpy(ev.column("stack_id"), np.int64, -1), rows),
        pool_id=_pick(pools[0], rows) if pools else None, pool_id_names=pools[1] if pools else ())


def _interner(directory: Path) -> StackInterner:
    return _guarded(directory, lambda: _checked_interner(directory))


def _checked_interner(directory: Path) -> StackInterner:
    frames, stacks = _read_arrow(directory, "frames"), _read_arrow(directory, "stacks")
    frame_ids = _numpy(frames.column("frame_id"), np.int64)
    if not np.array_equal(frame_ids, np.arange(len(frame_ids))):
        raise BadInputError(directory / "frames.parquet", "damaged snapshot tables: frame_id is not 0, 1, 2, … in "
                            "row order")
    columns = {name: _numpy(stacks.column(name), np.int64) for name in TABLE_COLUMNS["stacks"]}
    path = directory / "stacks.parquet"
    _check_non_negative(path, "stacks", columns)
    if len(columns["frame_id"]) and columns["frame_id"].max() >= len(frame_ids):
        raise BadInputError(path, f"damaged snapshot tables: frame_id {int(columns['frame_id'].max())} points past "
                            f"the {len(frame_ids):,} frames")
    _check_stack_ids(path, columns["stack_id"], stacks.num_rows + 1)
    return StackInterner.from_tables(frames.to_pandas(), stacks.to_pandas())


def read_tables(directory: str | Path) -> Snapshot:
    """The Snapshot stored in `directory` by `write_tables`.

    Only the event columns replay needs are read here; request ids, compile context, OOM free bytes and
    stacks are read from the same files when an analysis first asks for them.
    """
    directory = Path(directory)
    meta_path = directory / layout.TABLES_META
    if not os.path.lexists(meta_path):
        raise BadInputError(directory, f"not a converted snapshot: {layout.TABLES_META} is missing")
    meta = check_tables_meta(read_json(meta_path, layout.TABLES_META), meta_path)
    return _guarded(directory, lambda: _read_tables(directory, meta))


_FORMAT_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63, "a non-negative integer"),
    "tuple[str, ...]": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings"),
}


def check_tables_meta(meta: Any, path: Path) -> dict[str, Any]:
    """`meta` if the snapshot.json fields readers use are what `write_tables` writes; BadInputError naming the
    field otherwise."""
    if not isinstance(meta, dict):
        raise BadInputError(path, f"not a {layout.TABLES_META} document (expected a JSON object)")
    version = meta.get("schema_version")
    expect(version is None or version == layout.SCHEMA_VERSION and not isinstance(version, bool), path,
           "schema_version", f"{layout.SCHEMA_VERSION} (convert the pickle again)", version)
    fmt = meta.get("format")
    expect(isinstance(fmt, dict), path, "format", "an object", fmt)
    assert isinstance(fmt, dict)
    for f in dataclasses.fields(Format):
        if f.name not in fmt:
            expect(f.default is not dataclasses.MISSING, path, f"format.{f.name}", "to be present", None)
            continue
        check, words = _FORMAT_FIELDS.get(str(f.type), (lambda v: True, ""))
        expect(check(fmt[f.name]), path, f"format.{f.name}", words, fmt[f.name])
    names = meta.get("action_names", {})
    expect(isinstance(names, dict) and all(isinstance(v, list) and all(isinstance(x, str) for x in v)
                                           for v in names.values()),
           path, "action_names", "an object of lists of action names", names)
    settings = meta.get("allocator_settings")
    expect(settings is None or isinstance(settings, dict), path, "allocator_settings", "an object", settings)
    made = meta.get(layout.ESTIMATE_KEY)
    expect(made is None or isinstance(made, dict), path, layout.ESTIMATE_KEY, "an object", made)
    warnings = meta.get("warnings", [])
    expect(isinstance(warnings, list) and all(isinstance(w, str) for w in warnings), path, "warnings",
           "a list of strings", warnings)
    return meta


def _read_tables(directory: Path, meta: dict[str, Any]) -> Snapshot:
    events_path = directory / "events.parquet"
    events = _read_arrow(directory, "events", REPLAY_COLUMNS)
    found = _dictionary(events.column("action"))
    if found is None and len(events):
        raise BadInputError(events_path, "events without an action")
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
            action_names=tuple(table),
            details_source=functools.partial(_details, directory, detail_table, rows, index))
    segments = _columns(_read_arrow(directory, "segments"), SEGMENT_COLUMNS)
    blocks = _columns(_read_arrow(directory, "blocks"), {**BLOCK_COLUMNS, "stack_id": np.int64})
    _check_stack_ids(directory / "blocks.parquet", blocks["stack_id"], _stack_bound(directory))
    fmt = {f.name: meta["format"][f.name] for f in dataclasses.fields(Format) if f.name in meta["format"]}
    return Snapshot(
        source=str(directory), traces=traces,
        segment_columns=segments, block_columns=blocks,
        annotations_source=functools.partial(_annotations, directory),
        allocator_settings=meta.get("allocator_settings"),
        estimate=meta.get(layout.ESTIMATE_KEY),
        warnings=tuple(meta.get("warnings", [])),
        format=Format(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in fmt.items()}),  # type: ignore[arg-type]
        interner_source=functools.partial(_interner, directory),
    )
