"""Fast exit: the command line ends without tearing down its heap, so nothing it read need be freed.

Contract: `exit(code)` flushes stdout and stderr and ends the process with `os._exit`, skipping the
interpreter's teardown, which after loading a million-event snapshot frees millions of objects one by one
(about half a second; mypy's --fast-exit does the same). Only the console entry point calls it (`cli.run`),
after the command has closed every file, pool and browser it opened, and it calls `enable()` first. Within
`single_input()`, which the command line enters around the work of one snapshot (or one pair, for a diff),
`keep(obj)` keeps `obj` referenced until that exit and returns True, so the loader can leave a snapshot's raw
objects unfreed instead of spending as long freeing them as it spent building its columns; anywhere else —
the Python API, the tests' in-process command line, the ranks of a run — it keeps nothing and returns False.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

_enabled = False       # the process will end through `exit`
_keeping = False       # inside `single_input` of such a process
_kept: list[Any] = []


def enable() -> None:
    """Say that this process ends through `exit` (the console entry point, before the command runs)."""
    global _enabled
    _enabled = True


@contextmanager
def single_input() -> Iterator[None]:
    """While the command works on one input: `keep` keeps what it is given, if the process exits fast."""
    global _keeping
    before, _keeping = _keeping, _enabled
    try:
        yield
    finally:
        _keeping = before


def keep(obj: Any) -> bool:
    """Keep `obj` alive until the process exits, when that exit frees nothing (True); else keep nothing."""
    if _keeping:
        _kept.append(obj)
    return _keeping


def exit(code: int | str | None) -> NoReturn:  # noqa: A001 - sys.exit's counterpart
    """End the process now with `code` (as sys.exit reads it), its output flushed, its heap not freed."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # the reader went away (a closed pipe): Python's own exit says 120
            status = status or 120
    os._exit(status)
