"""Atomic file writes: a reader sees either the previous complete file or the new complete file, never a torn one.

`write_atomic` streams the content into a temporary file named ``.<final>.<pid>.<random>.tmp`` in the target's
directory (same filesystem, so the rename is atomic), fsyncs it, then renames it over the target
(``os.replace``). It replaces only a regular file (or a link to one): a FIFO, a device, a socket, a directory
or a link to any of them at the target is refused with UsageError, so ``--force`` never turns ``/dev/…`` or a
pipe into a file. `write_new` does the same but never replaces an existing file: it links the finished
temporary file to the first free name ``name_for(0)``, ``name_for(1)``, … (``os.link`` fails instead of
overwriting), so two writers racing for one name both keep their data. `write_directory` does it for a
directory of files (converted tables): built in a sibling ``.<final>.<pid>.<random>.tmp`` directory, then
renamed into place; an existing one (a real directory, never a link or a file) is replaced only when asked,
moved aside to ``.<final>.<pid>.<random>.old`` and removed. On any error the temporary is removed and the
error propagates unchanged. A writer killed mid-way leaves at most such a dot-named temporary, which readers
ignore (and `load.runs` reports); every later write into the same directory first removes the stale ones
(`sweep`): those whose writer pid is not a live process on this machine and that nothing has modified for
`STALE_AFTER_S` (an hour; a live writer on another host sharing the directory keeps touching its file). It is
the one atomic writer of the package: the collector's files, converted runs and HTML reports all go through it.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from .errors import UsageError

Writer = Callable[[BinaryIO], object]

STALE_AFTER_S = 3600.0

_LINK_UNSUPPORTED = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}
_LEFTOVER_RE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>[0-9]{1,10})\.[0-9a-f]{8}\.(?:tmp|old)$")


def _temp_path(final: Path, suffix: str = "tmp") -> Path:
    return final.with_name(f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.{suffix}")


def is_leftover(path: str | os.PathLike[str]) -> bool:
    """Whether `path`'s name is one of this module's temporaries (``.<final>.<pid>.<random>.tmp`` / ``.old``)."""
    return _LEFTOVER_RE.match(Path(path).name) is not None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError, OSError):
        return True          # alive (someone else's), or not a pid this platform can ask about: keep it
    return True


def sweep(directory: str | os.PathLike[str], now: float | None = None) -> list[Path]:
    """Remove the stale temporaries of killed writers in `directory` (see the module docstring) and return
    them; never raises (what cannot be removed stays, and readers ignore it)."""
    now = time.time() if now is None else now
    removed: list[Path] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = _LEFTOVER_RE.match(name)
        if m is None or _pid_alive(int(m.group("pid"))):
            continue
        path = Path(directory) / name
        try:
            info = path.lstat()
            if now - info.st_mtime < STALE_AFTER_S:
                continue
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:
            continue
        removed.append(path)
    return removed


def describe(path: str | os.PathLike[str]) -> str:
    """What is at `path`, in words ("a regular file", "a FIFO", "a symbolic link to a character device", …)."""
    p = Path(path)
    try:
        info = p.lstat()
    except OSError:
        return "nothing"
    if stat.S_ISLNK(info.st_mode):
        try:
            return f"a symbolic link to {_kind(p.stat().st_mode)}"
        except OSError:
            return "a dangling symbolic link"
    return _kind(info.st_mode)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _check_replaceable(final: Path) -> None:
    """UsageError unless `final` is absent, a regular file, a link to one or a dangling link."""
    what = describe(final)
    if what in ("nothing", "a regular file", "a symbolic link to a regular file", "a dangling symbolic link"):
        return
    raise UsageError(f"{final}: is {what}, not a regular file: refusing to replace it (write somewhere else)")


def _write_temp(final: Path, write: Writer) -> Path:
    tmp = _temp_path(final)
    try:
        with open(tmp, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], write: Writer) -> Path:
    """Write `path` through `write(file)` atomically, replacing a previous version (a regular file only, see
    the module docstring); returns the path."""
    final = Path(path)
    _check_replaceable(final)
    sweep(final.parent)
    tmp = _write_temp(final, write)
    try:
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(final.parent)
    return final


def write_new(name_for: Callable[[int], str | os.PathLike[str]], write: Writer, *, limit: int = 100_000) -> Path:
    """Write a new file at the first free path among ``name_for(0)``, ``name_for(1)``, …; never overwrites."""
    first = Path(name_for(0))
    sweep(first.parent)
    tmp = _write_temp(first, write)
    try:
        for counter in itertools.count():
            if counter >= limit:
                raise FileExistsError(f"{first}: {limit} files of that name exist already")
            target = Path(name_for(counter))
            try:
                os.link(tmp, target)
            except FileExistsError:
                continue
            except OSError as e:
                if e.errno not in _LINK_UNSUPPORTED:
                    raise
                # No hard links on this filesystem: check, then rename (a narrow race, same-process only).
                if target.exists():
                    continue
                os.replace(tmp, target)
            _fsync_dir(target.parent)
            return target
        raise AssertionError("unreachable")
    finally:
        tmp.unlink(missing_ok=True)


def write_directory(path: str | os.PathLike[str], build: Callable[[Path], object], *, replace: bool = False) -> Path:
    """Make the directory `path` through `build(staging_dir)` atomically: `build` fills a temporary sibling,
    which is then renamed to `path`. An existing `path` raises FileExistsError unless `replace`, and is
    replaced only when it is a directory (UsageError for a file, a link or anything else)."""
    target = Path(path)
    if os.path.lexists(target):
        if not replace:
            raise FileExistsError(str(target))
        if target.is_symlink() or not target.is_dir():
            raise UsageError(f"{target}: is {describe(target)}, not a directory: refusing to replace it")
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep(target.parent)
    staging = _temp_path(target)
    staging.mkdir()
    try:
        build(staging)
        if os.path.lexists(target):
            old = _temp_path(target, "old")
            os.replace(target, old)
            os.replace(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _fsync_dir(target.parent)
    return target
