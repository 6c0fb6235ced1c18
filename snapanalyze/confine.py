"""Confinement of what a process reads: the directories an agent's server lets its children read.

Contract: with `ENV` set (``snapanalyze mcp`` sets it for each command it runs: its roots, joined by os.pathsep),
`opened(file, name)` checks the file a process actually opened — by its descriptor, so a path swapped for a link
after any check is still caught — and raises BadInputError naming it when it lies outside every root (a link out
of a root, a run directory whose files point elsewhere); `open_confined(path)` opens for reading and checks;
`reopenable(file)` is a path to the already-opened, already-checked file for libraries that open by name (Arrow).
Without `ENV` nothing is checked. Needs /proc (Linux); elsewhere the check falls back to the path's resolution.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

from .errors import BadInputError

ENV = "SNAPANALYZE_CONFINE"


def roots() -> tuple[Path, ...]:
    value = os.environ.get(ENV, "")
    return tuple(Path(p) for p in value.split(os.pathsep) if p)


def _real(fd: int, name: str | os.PathLike[str]) -> Path:
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return Path(name).resolve()


def opened(file: IO[Any] | int, name: str | os.PathLike[str]) -> None:
    """BadInputError when the opened file lies outside every root (see the module docstring)."""
    allowed = roots()
    if not allowed:
        return
    fd = file if isinstance(file, int) else file.fileno()
    real = _real(fd, name)
    if not any(real == root or real.is_relative_to(root) for root in allowed):
        raise BadInputError(name, "outside the directories this server reads (it is, or leads through, a link "
                            "out of them)")


def open_confined(path: str | os.PathLike[str], mode: str = "rb", **kwargs: Any) -> IO[Any]:
    f = open(path, mode, **kwargs)          # noqa: SIM115 - the caller closes it
    try:
        opened(f, path)
    except BaseException:
        f.close()
        raise
    return f


def reopenable(file: IO[Any]) -> str:
    """A name that opens the very file `file` has open (its descriptor's /proc entry), for a library that takes a
    path: no path swapped in between can change what it reads."""
    proc = f"/proc/self/fd/{file.fileno()}"
    return proc if os.path.exists(proc) else str(getattr(file, "name", ""))
