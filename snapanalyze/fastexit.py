"""Fast exit: the command line ends without tearing down its heap, so nothing it read need be freed.

Contract: `exit(code)` flushes stdout and stderr and ends the process with `os._exit`, skipping the
interpreter's teardown, which after loading a million-event snapshot frees millions of objects one by one
(about half a second; mypy's --fast-exit does the same). Only the console entry point calls it (`cli.run`),
after the command has closed every file, pool and browser it opened.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


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
