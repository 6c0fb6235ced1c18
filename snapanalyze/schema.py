"""Arrow schemas of a converted snapshot's Parquet tables, and where they go in a run directory.

Contract: `snapanalyze convert` writes one snapshot as `RUN/rank=N/tag=<tag>/<table>.parquet` for the
tables in SNAPSHOT_TABLES (events, segments, blocks, frames, stacks, annotations) plus `snapshot.json`
(format facts, allocator settings), beside the collector's files (see `layout`). Every Parquet file
carries `schema_version` (layout.SCHEMA_VERSION) in its key/value metadata. Units are in the column
names' meaning: bytes for sizes, µs since the Unix epoch for time_us.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa

from .layout import SCHEMA_VERSION, rank_dir

SNAPSHOT_TABLES = ("events", "segments", "blocks", "frames", "stacks", "annotations")
RANK_DIR = re.compile(r"^rank=(\d+)$")
TAG_DIR = re.compile(r"^tag=(.+)$")
SNAPSHOT_FILE = re.compile(r"^snapshot-(.+)\.pickle$")

EVENTS = pa.schema([
    ("device", pa.int64()), ("index", pa.int64()), ("action", pa.dictionary(pa.int32(), pa.string())),
    ("addr", pa.uint64()), ("size", pa.int64()), ("stream", pa.int64()), ("time_us", pa.int64()),
    ("stack_id", pa.int64()), ("user_metadata", pa.dictionary(pa.int32(), pa.string())),
    ("compile_context", pa.dictionary(pa.int32(), pa.string())), ("device_free", pa.int64()),
])
FRAMES = pa.schema([("frame_id", pa.int64()), ("filename", pa.string()), ("line", pa.int64()),
                    ("name", pa.string())])
STACKS = pa.schema([("stack_id", pa.int64()), ("depth", pa.int64()), ("frame_id", pa.int64())])


def tag_dir(run: str | Path, rank: int, tag: str) -> Path:
    return rank_dir(run, rank) / f"tag={tag}"


def metadata() -> dict[bytes, bytes]:
    return {b"schema_version": str(SCHEMA_VERSION).encode(), b"producer": b"snapanalyze"}
