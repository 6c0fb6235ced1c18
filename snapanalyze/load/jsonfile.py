"""The small JSON documents of a run directory (``meta.json``, a tables directory's ``snapshot.json``), read safely.

Contract: `read_json(path, what)` returns the parsed document or raises one BadInputError naming the file and
the problem. Only a regular file is read (a FIFO, a device such as a link to ``/dev/zero``, a socket or a
directory is refused before anything waits on it; the file is opened non-blocking and checked again, so a
swap after the check cannot block either), at most `MAX_JSON_BYTES` (16 MiB: the collector's documents are a
few KiB; ``meta.json`` may take 4 MiB), as UTF-8, and parsing it may take at most 24 × its size (RLIMIT_DATA);
an OSError, a decoding or parsing error, RecursionError (nesting) and MemoryError all become the BadInputError.
What the document must hold is the caller's to check (`expect` says it in one line); `shown` renders a found value
for such a message.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from ..confine import opened
from ..errors import BadInputError
from .safe_pickle import data_limit, regular_file

MAX_JSON_BYTES = 16 << 20


def read_json(path: str | Path, what: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """The JSON document in the regular file `path` (`what` names it in messages, e.g. "meta.json")."""
    path = Path(path)
    info = regular_file(path)
    too_big = f"larger than the {max_bytes >> 20} MiB a {what} may be: not one snapanalyze wrote"
    if info.st_size > max_bytes:
        raise BadInputError(path, f"{info.st_size:,} bytes, {too_big}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            opened(f, path)
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise BadInputError(path, "is no longer a regular file: only files are read")
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise BadInputError(path, f"cannot be read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise BadInputError(path, too_big)
    try:
        with data_limit(max(24 * len(data), 64 << 20)):    # a JSON of numbers or nested lists explodes into objects
            return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadInputError(path, f"not a readable {what}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:   # JSONDecodeError, an integer of too many digits, deep nesting
        text = str(exc) or type(exc).__name__
        raise BadInputError(path, f"not a readable {what} ({text[:200]})") from None
    except MemoryError:
        raise BadInputError(path, f"ran out of memory parsing the {what}") from None


def shown(value: Any) -> str:
    """`value` as JSON, cut to 60 characters, for "expected …, got …" messages."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def expect(ok: bool, path: str | Path, field: str, expected: str, value: Any) -> None:
    """Raise BadInputError(path, "field F: expected E, got V") unless `ok`."""
    if not ok:
        raise BadInputError(path, f"field {field}: expected {expected}, got {shown(value)}")
