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

import numpy as np
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


def decoded_bytes(table: pa.Table) -> int:
    """Bytes `table` takes with its dictionary-encoded columns expanded, counted without expanding them: per
    dictionary chunk, the lengths of the values its indices pick (a 1 MiB string picked by every row of a 6 KB
    file counts a MiB per row)."""
    total = 0
    for column in table.columns:
        for chunk in column.chunks:
            if not pa.types.is_dictionary(chunk.type):
                total += chunk.nbytes
                continue
            values = chunk.dictionary
            total += len(chunk) * 8
            if not (pa.types.is_string(values.type) or pa.types.is_binary(values.type)) or not len(values) \
                    or not len(chunk):
                total += chunk.nbytes
                continue
            offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset:values.offset + len(values) + 1]
            lengths = np.diff(offsets.astype(np.int64))
            indices = chunk.indices                    # read from its buffer: Arrow's to_numpy imports pandas
            width = indices.type.bit_width // 8
            start = indices.offset
            picked = np.frombuffer(indices.buffers()[1], dtype=f"<i{width}")[start:start + len(indices)]
            # a null slot holds any value: clipped into the dictionary, which can only overcount
            total += int(lengths[np.clip(picked.astype(np.int64), 0, len(lengths) - 1)].sum())
    return total


def check_table(table: pa.Table, path: Path) -> None:
    """Refuse what was decoded from `path` when it passes the cap, dictionary-encoded strings counted as they
    would expand (`decoded_bytes`) — read them with `read_dictionary` so that nothing expanded them yet."""
    cap = _cap(path)
    size = decoded_bytes(table)
    if size > cap:
        raise _refuse(path, size, cap, "its columns decode to")
