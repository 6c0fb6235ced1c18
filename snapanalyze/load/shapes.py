"""The shape a sweep point ran: read from a file name, a manifest CSV or a phase marker's attributes.

Contract: shape variables are SHAPE_KEYS — `tokens` (prompt tokens per sequence), `batch` (sequences per
forward), `chunk` (chunked-prefill tokens per step), `images` — each known by the aliases in SHAPE_ALIASES.
`shape_from_filename(name)` reads them from a name (`ctx1024`, `tokens=32768`, `bs4`, `ctx32k`);
`read_manifest(path)` reads a CSV mapping snapshot files to shapes (extra columns kept as text);
`attrs_shape(where, attrs)` reads a marker's numeric attributes. Bad values are UsageError, a bad manifest
BadInputError, each naming where.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import BadInputError, UsageError

SHAPE_KEYS = ("tokens", "batch", "chunk", "images")
# Names a shape variable goes by in file names, manifest headers and marker attributes (lower case).
SHAPE_ALIASES: dict[str, tuple[str, ...]] = {
    "tokens": ("tokens", "token", "tok", "ctx", "context", "prompt_tokens", "prompt", "seqlen", "seq_len", "seq",
               "num_tokens", "len", "length"),
    "batch": ("batch_size", "batch", "bs", "concurrency", "conc", "num_seqs"),
    "chunk": ("chunk_size", "chunksize", "chunk"),
    "images": ("num_images", "images", "image", "imgs", "img"),
}
FILE_COLUMNS = ("file", "path", "snapshot", "name")


def _alias_pattern(aliases: Sequence[str]) -> re.Pattern[str]:
    names = "|".join(re.escape(a) for a in sorted(aliases, key=len, reverse=True))
    return re.compile(rf"(?<![A-Za-z])(?:{names})[=_-]?(\d+)([kK])?(?![0-9A-Za-z])", re.IGNORECASE)


_FILENAME_PATTERNS = {key: _alias_pattern(aliases) for key, aliases in SHAPE_ALIASES.items()}


def shape_from_filename(name: str) -> dict[str, int]:
    """Shape variables written in a file name: `ctx1024`, `tokens=32768`, `bs4`, `batch=4`, `chunk=2048`,
    `images=8`, `ctx32k` (k = 1024). Raises UsageError when one variable is given two different values."""
    stem = Path(name).name
    for suffix in (".gz", ".pickle", ".pkl", ".json", ".pt"):
        if stem.lower().endswith(suffix):
            stem = stem[: -len(suffix)]
    shape: dict[str, int] = {}
    for key, pattern in _FILENAME_PATTERNS.items():
        values = {int(m.group(1)) * (1024 if m.group(2) else 1) for m in pattern.finditer(stem)}
        if len(values) > 1:
            raise UsageError(f"{name}: the file name gives {key} several values ({sorted(values)})")
        if values:
            shape[key] = values.pop()
    return shape


def _canonical(column: str) -> str | None:
    low = column.strip().lower()
    for key, aliases in SHAPE_ALIASES.items():
        if low in aliases:
            return key
    return None


def _shape_value(where: str, key: str, value: Any) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"{where}: {key} must be a number, got {value!r}") from None
    if not math.isfinite(number) or number < 0 or number != int(number):
        raise UsageError(f"{where}: {key} must be a whole number ≥ 0, got {value!r}")
    return int(number)


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
    shape_cols = {i: key for i, h in enumerate(header) if i != file_col and (key := _canonical(h))}
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
                rec[key] = _shape_value(f"{path}: line {n}", key, row[i].strip())
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



def attrs_shape(where: str, attrs: dict[str, Any]) -> dict[str, int]:
    shape: dict[str, int] = {}
    for name, value in attrs.items():
        key = _canonical(str(name))
        if key is not None and isinstance(value, int | float) and not isinstance(value, bool):
            shape[key] = _shape_value(where, key, value)
    return shape

