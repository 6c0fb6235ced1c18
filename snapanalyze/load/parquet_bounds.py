"""What a Parquet file will cost to decode, known from its footer before a byte is decoded.

Contract: `check_decoded(reader, path, columns)` raises one BadInputError naming `path` when the columns to be
read (all when None) would decode to more than `Limits.decoded_cap` of the file's size (the --max-memory cap
when it is lower): the estimate is, per row group and column chunk, its rows times the column's physical width
plus its uncompressed bytes — an upper bound for numbers and for plain strings, read from the footer, so a
small file that claims a billion rows (a Parquet bomb) is refused at once. Dictionary-encoded strings can
expand past it; `check_table(table, path)` bounds what was decoded, before anything is built on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import BadInputError
from ..units import fmt_bytes
from .safe_pickle import Limits, limits_now

# Decoded bytes per value of each Parquet physical type (strings: their offsets; their bytes are counted
# from the chunk's uncompressed size).
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "FLOAT": 4, "INT64": 8, "DOUBLE": 8, "INT96": 12, "BYTE_ARRAY": 8,
          "FIXED_LEN_BYTE_ARRAY": 8}


def _cap(path: Path) -> int:
    return (limits_now() or Limits()).decoded_cap(path.stat().st_size)


def decoded_estimate(metadata: pq.FileMetaData, columns: Iterable[str] | None = None) -> int:
    """Bytes `columns` (top-level names; None: all) decode to at most, by the footer (module docstring)."""
    wanted = None if columns is None else set(columns)
    total = 0
    for r in range(metadata.num_row_groups):
        group = metadata.row_group(r)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if wanted is None or chunk.path_in_schema.split(".", 1)[0] in wanted:
                total += max(group.num_rows, 0) * _WIDTH.get(chunk.physical_type, 8)
                total += max(chunk.total_uncompressed_size, 0)
    return total


def _refuse(path: Path, estimate: int, cap: int, what: str) -> BadInputError:
    return BadInputError(path, f"{what} {fmt_bytes(estimate)} ({estimate:,} bytes), more than the "
                         f"{fmt_bytes(cap)} a file of {path.stat().st_size:,} bytes may take (a table "
                         "snapanalyze or its collector wrote decodes to under 30× its file; --max-memory "
                         "lowers the cap): not read")


def check_decoded(reader: pq.ParquetFile, path: Path, columns: Iterable[str] | None = None) -> None:
    """Refuse `path` before decoding when its columns would pass the cap (module docstring)."""
    estimate, cap = decoded_estimate(reader.metadata, columns), _cap(path)
    if estimate > cap:
        raise _refuse(path, estimate, cap, "its columns would decode to")


def check_table(table: pa.Table, path: Path) -> None:
    """Refuse what was decoded from `path` when it passes the cap (dictionary-encoded strings expanded)."""
    cap = _cap(path)
    if table.nbytes > cap:
        raise _refuse(path, table.nbytes, cap, "its columns decoded to")
