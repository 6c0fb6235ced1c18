"""The shape each snapshot of a sweep ran, from a manifest CSV (`read_manifest`); names and attributes are read by
`batch_shape`, the vocabulary this module shares with the analyses.

Contract: `read_manifest(path)` reads a CSV mapping snapshot files to shapes (extra columns kept as text). A
bad manifest is BadInputError, a bad value UsageError, each naming where.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pandas as pd

from ..batch_shape import SHAPE_ALIASES, SHAPE_KEYS, canonical, shape_value
from ..confine import open_confined
from ..errors import BadInputError
from ..stacks import clean_text
from .safe_pickle import regular_file

__all__ = ["FILE_COLUMNS", "SHAPE_ALIASES", "SHAPE_KEYS", "read_manifest"]

FILE_COLUMNS = ("file", "path", "snapshot", "name")
MAX_MANIFEST_BYTES = 16 << 20


def read_manifest(path: str | Path) -> pd.DataFrame:
    """A manifest CSV mapping snapshot files to shapes: one column naming the file (`file`, `path`, `snapshot`
    or `name`; relative to the manifest's folder and inside it: `../` or an absolute path elsewhere is refused),
    shape columns by any of their aliases (`SHAPE_ALIASES`),
    and any other columns (kept as text). Returns columns path (resolved), file, the shape keys present,
    then the extra columns. Raises BadInputError for an unreadable or malformed manifest."""
    path = Path(path)
    regular_file(path)                          # a FIFO or a device would block or never end: refused unopened
    try:
        with open_confined(path) as f:
            data = f.read(MAX_MANIFEST_BYTES + 1)
        if len(data) > MAX_MANIFEST_BYTES:
            raise BadInputError(path, f"a manifest of more than {MAX_MANIFEST_BYTES >> 20} MiB is no sweep's (refused)")
        rows = list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise BadInputError(path, f"cannot read the manifest ({exc})") from None
    folder = path.parent.resolve()
    rows = [r for r in rows if any(c.strip() for c in r)]
    if len(rows) < 2:
        raise BadInputError(path, "the manifest needs a header row and at least one row")
    header = [h.strip() for h in rows[0]]
    file_cols = [i for i, h in enumerate(header) if h.lower() in FILE_COLUMNS]
    if not file_cols:
        raise BadInputError(path, f"no file column (one of {', '.join(FILE_COLUMNS)}) in the header {header}")
    file_col = file_cols[0]
    shape_cols = {i: key for i, h in enumerate(header) if i != file_col and (key := canonical(h))}
    if len(set(shape_cols.values())) != len(shape_cols):
        raise BadInputError(path, f"two columns name the same shape variable: {header}")
    if not shape_cols:
        raise BadInputError(path, f"no shape column (tokens, batch, chunk, images or an alias) in {header}")
    out = []
    for n, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise BadInputError(path, f"line {n} has {len(row)} fields, the header has {len(header)}")
        file = row[file_col].strip()
        resolved = (folder / file).resolve()
        if not resolved.is_relative_to(folder):
            raise BadInputError(path, f"line {n} names {clean_text(file[:200])!r}, outside the manifest's folder: a "
                                "manifest lists the snapshots beside it or below it")
        rec: dict[str, Any] = {"path": str(resolved), "file": file}
        for i, key in shape_cols.items():
            if row[i].strip():
                rec[key] = shape_value(f"{path}: line {n}", key, row[i].strip())
        for i, h in enumerate(header):
            if i != file_col and i not in shape_cols:
                rec[h] = row[i].strip()
        out.append(rec)
    df = pd.DataFrame(out)
    if df["path"].duplicated().any():
        raise BadInputError(path, f"a file is listed twice: {sorted(df.loc[df['path'].duplicated(), 'file'])}")
    for key in SHAPE_KEYS:
        if key in df.columns:
            df[key] = df[key].astype("Int64")
    return df
