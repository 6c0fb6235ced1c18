"""A batch shape's variables as names and attributes write them: neutral vocabulary for the loader (file names,
manifests) and the analyses (phase names and marker attributes).

Contract: shape variables are SHAPE_KEYS — `tokens` (prompt tokens per sequence), `batch` (sequences per
forward), `chunk` (chunked-prefill tokens per step), `images` — each known by the aliases in SHAPE_ALIASES.
`shape_from_filename(name)` reads them from a name (`ctx1024`, `tokens=32768`, `bs4`, `ctx32k`);
`attrs_shape(where, attrs)` reads a marker's numeric attributes; `canonical(column)` names the variable an
alias stands for and `shape_value(where, key, value)` checks one value. Bad values are UsageError naming where.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import UsageError
from .units import fmt_untrusted_int

SHAPE_KEYS = ("tokens", "batch", "chunk", "images")
# Names a shape variable goes by in file names, manifest headers and marker attributes (lower case).
SHAPE_ALIASES: dict[str, tuple[str, ...]] = {
    "tokens": ("tokens", "token", "tok", "ctx", "context", "prompt_tokens", "prompt", "seqlen", "seq_len", "seq",
               "num_tokens", "len", "length"),
    "batch": ("batch_size", "batch", "bs", "concurrency", "conc", "num_seqs"),
    "chunk": ("chunk_size", "chunksize", "chunk"),
    "images": ("num_images", "images", "image", "imgs", "img"),
}


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
        values = set()
        for m in pattern.finditer(stem):
            if len(m.group(1)) > 15:
                raise UsageError(f"{name}: the file name's {key} has {len(m.group(1))} digits, out of range "
                                 f"(0 … {MAX_SHAPE:,})")
            values.add(shape_value(name, key, int(m.group(1)) * (1024 if m.group(2) else 1)))
        if len(values) > 1:
            raise UsageError(f"{name}: the file name gives {key} several values ({sorted(values)})")
        if values:
            shape[key] = values.pop()
    return shape


def canonical(column: str) -> str | None:
    low = column.strip().lower()
    for key, aliases in SHAPE_ALIASES.items():
        if low in aliases:
            return key
    return None


MAX_SHAPE = 1 << 40          # no batch, prompt or chunk has a trillion of anything


def shape_value(where: str, key: str, value: Any) -> int:
    """A shape variable's value, a whole number from 0 to MAX_SHAPE; UsageError naming `where` otherwise (never
    repeating an unbounded value)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value <= MAX_SHAPE:
            raise UsageError(f"{where}: {key} is {fmt_untrusted_int(value)}, out of range (0 … {MAX_SHAPE:,})")
        return value
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise UsageError(f"{where}: {key} must be a number, got {_shown(value)}") from None
    if not math.isfinite(number) or number < 0 or number != int(number):
        raise UsageError(f"{where}: {key} must be a whole number ≥ 0, got {_shown(value)}")
    if number > MAX_SHAPE:
        raise UsageError(f"{where}: {key} is {_shown(value)}, out of range (0 … {MAX_SHAPE:,})")
    return int(number)


def _shown(value: Any) -> str:
    text = str(value) if isinstance(value, (str, float)) else type(value).__name__
    return repr(text if len(text) <= 40 else text[:40] + "…")


def attrs_shape(where: str, attrs: dict[str, Any]) -> dict[str, int]:
    shape: dict[str, int] = {}
    for name, value in attrs.items():
        key = canonical(str(name))
        if key is not None and isinstance(value, int | float) and not isinstance(value, bool):
            shape[key] = shape_value(where, key, value)
    return shape
