"""The shape each snapshot of a sweep ran, from a manifest CSV (`read_manifest`); names and attributes are read by
`batch_shape`, the vocabulary this module shares with the analyses.

Contract: `read_manifest(path)` reads a CSV mapping snapshot files to shapes (extra columns kept as text). A
bad manifest is BadInputError, a bad value UsageError, each naming where.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pandas as pd

from ..batch_shape import SHAPE_ALIASES, SHAPE_KEYS, canonical, shape_value
from ..errors import BadInputError

__all__ = ["FILE_COLUMNS", "SHAPE_ALIASES", "SHAPE_KEYS", "read_manifest"]

FILE_COLUMNS = ("file", "path", "snapshot", "name")


def read_manifest(path: str | Path) -> pd.DataFrame:
    """A manifest CSV mapping snapshot files to shapes: one column naming the file (`file`, `path`, `snapshot`
    or `name`; relative to the manifest's folder), shape columns by any of their aliases (`SHAPE_ALIASES`),
    and any other columns (kept as text). Returns columns path (resolved), file, the shape keys present,
    then the extra columns. Raises BadInputError for an unreadable or malformed manifest."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(path, f"cannot read the manifest ({exc})") from None
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
        rec: dict[str, Any] = {"path": str((path.parent / file).resolve()), "file": file}
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
