"""Arrow schemas of every Parquet file in a run directory, and the one function that writes the collector's.

The collector's files (`NVML_SCHEMA`, `MARKERS_SCHEMA`): column names carry their unit (``_us`` = microseconds
since the Unix epoch, ``_bytes`` = bytes); nullable columns say "unknown" with null, never with 0 or -1. Each
schema's key-value metadata holds ``schema_version`` (`layout.SCHEMA_VERSION`) and ``kind`` (``"nvml"`` or
``"markers"``), and `write_table` refuses a table whose columns differ from the schema, so every file of a kind
has exactly these columns in this order. Readers add ``rank`` from the Hive directory (``rank=N``); markers
also store it.

A converted snapshot (`snapanalyze convert`): `RUN/rank=N/tag=<tag>/<table>.parquet` for the tables in
SNAPSHOT_TABLES (events, segments, blocks, frames, stacks, annotations) plus `layout.TABLES_META` (format facts,
allocator settings), beside the collector's files. Every Parquet file carries `schema_version` in its
key/value metadata (`metadata()`). Units are in the column names' meaning: bytes for sizes, µs since the Unix
epoch for time_us.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .atomic import write_atomic, write_new
from .layout import KIND_KEY, SCHEMA_VERSION, SCHEMA_VERSION_KEY

SNAPSHOT_TABLES = ("events", "segments", "blocks", "frames", "stacks", "annotations")

EVENTS = pa.schema([
    ("device", pa.int64()), ("index", pa.int64()), ("action", pa.dictionary(pa.int32(), pa.string())),
    ("addr", pa.uint64()), ("size", pa.int64()), ("stream", pa.int64()), ("time_us", pa.int64()),
    ("stack_id", pa.int64()), ("user_metadata", pa.dictionary(pa.int32(), pa.string())),
    ("compile_context", pa.dictionary(pa.int32(), pa.string())), ("device_free", pa.int64()),
    ("pool_id", pa.dictionary(pa.int32(), pa.string())),
])
FRAMES = pa.schema([("frame_id", pa.int64()), ("filename", pa.string()), ("line", pa.int64()),
                    ("name", pa.string())])
STACKS = pa.schema([("stack_id", pa.int64()), ("depth", pa.int64()), ("frame_id", pa.int64())])


def metadata() -> dict[bytes, bytes]:
    """The key/value metadata of a converted snapshot's tables."""
    return {b"schema_version": str(SCHEMA_VERSION).encode(), b"producer": b"snapanalyze"}


def _versioned(kind: str, fields: list[pa.Field]) -> pa.Schema:
    return pa.schema(fields, metadata={SCHEMA_VERSION_KEY: str(SCHEMA_VERSION), KIND_KEY: kind})


NVML_SCHEMA = _versioned(
    "nvml",
    [
        pa.field("time_us", pa.int64(), nullable=False),          # when this device was read
        pa.field("device", pa.int32(), nullable=False),           # CUDA ordinal in this process
        pa.field("used_bytes", pa.int64(), nullable=False),       # NVML: used by everything on the device
        pa.field("free_bytes", pa.int64(), nullable=False),
        pa.field("total_bytes", pa.int64(), nullable=False),
        pa.field("process_used_bytes", pa.int64()),               # NVML per-process: this pid (null: unknown)
        pa.field("other_processes_used_bytes", pa.int64()),       # NVML per-process: every other pid
        pa.field("torch_allocated_bytes", pa.int64()),            # torch.cuda.memory_allocated(device)
        pa.field("torch_reserved_bytes", pa.int64()),             # torch.cuda.memory_reserved(device)
    ],
)
"""One row per device per sampling tick."""

MARKERS_SCHEMA = _versioned(
    "markers",
    [
        pa.field("kind", pa.string(), nullable=False),            # "phase" | "request" | "module"
        pa.field("name", pa.string(), nullable=False),            # phase name, request id or module path
        pa.field("start_time_us", pa.int64(), nullable=False),
        pa.field("end_time_us", pa.int64()),                      # null: still open when the file was written
        pa.field("attrs", pa.string(), nullable=False),           # JSON object of the marker's attributes
        pa.field("rank", pa.int32(), nullable=False),
        pa.field("thread_id", pa.int64(), nullable=False),        # threading.get_native_id()
        pa.field("depth", pa.int32(), nullable=False),            # nesting depth within its thread, 0 = outermost
    ],
)
"""One row per phase, request or module span, in start order."""


def table(schema: pa.Schema, columns: dict[str, list[object]]) -> pa.Table:
    """Build a table of exactly `schema`'s columns (metadata included) from Python lists."""
    if list(columns) != schema.names:
        raise ValueError(f"columns {list(columns)} do not match schema {schema.names}")
    return pa.table(columns, schema=schema)


def _writer(tbl: pa.Table) -> Callable[[object], None]:
    def write(f: object) -> None:
        pq.write_table(tbl, f, compression="zstd")

    return write


def write_table(tbl: pa.Table, path: str | os.PathLike[str], *, schema: pa.Schema) -> Path:
    """Write `tbl` (which must have `schema`) to `path` atomically, replacing a previous version."""
    _check(tbl, schema)
    return write_atomic(path, _writer(tbl))


def write_new_table(tbl: pa.Table, name_for: Callable[[int], str | os.PathLike[str]], *, schema: pa.Schema) -> Path:
    """Write `tbl` atomically to the first free path of `name_for(0)`, `name_for(1)`, …; never overwrites."""
    _check(tbl, schema)
    return write_new(name_for, _writer(tbl))


def _check(tbl: pa.Table, schema: pa.Schema) -> None:
    if not tbl.schema.equals(schema, check_metadata=True):
        raise ValueError(f"table schema {tbl.schema} is not {schema}")
