"""Atomic file writes: a reader sees either the previous complete file or the new complete file, never a torn one.

`write_atomic` streams the content into a temporary file named ``.<final>.<pid>.<random>.tmp`` in the target's
directory (same filesystem, so the rename is atomic), fsyncs it, then renames it over the target
(``os.replace``). `write_new` does the same but never replaces an existing file: it links the finished
temporary file to the first free name ``name_for(0)``, ``name_for(1)``, … (``os.link`` fails instead of
overwriting), so two writers racing for one name both keep their data. A writer killed mid-way leaves at
most a dot-named temporary file, which readers ignore; on any error the temporary file is removed and the
error propagates unchanged. `write_directory` does it for a directory of files (converted tables): built in a
dot-named sibling, then renamed into place (an existing one is replaced only when asked). It is the one
atomic writer of the package: the collector's files, converted runs and HTML reports all go through it.
"""

from __future__ import annotations

import errno
import itertools
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

Writer = Callable[[BinaryIO], object]

_LINK_UNSUPPORTED = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}


def _temp_path(final: Path) -> Path:
    return final.with_name(f".{final.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


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
    """Write `path` through `write(file)` atomically, replacing any previous version; returns the path."""
    final = Path(path)
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
    which is then renamed to `path`. An existing `path` raises FileExistsError unless `replace`."""
    target = Path(path)
    if target.exists() and not replace:
        raise FileExistsError(str(target))
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(staging)
        if target.exists():
            old = target.with_name(f".{target.name}.replaced")
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
