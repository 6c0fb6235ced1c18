"""Read the bytes of a snapshot file into plain Python objects, safely, whatever container it came in.

Contract: `read_raw(path)` returns the builtins-only object a snapshot file holds (dict or list) or raises
BadInputError naming the file and the problem. Pickles are untrusted input: the unpickler refuses every
global and every persistent id, so no code from the file ever runs (a real snapshot needs neither).
Containers: plain pickle (any protocol), gzip-compressed pickle or JSON, a `torch.save` zip holding
`data.pkl`, and JSON as accepted by PyTorch's web viewer. The cyclic GC is paused while unpickling: the
object graph is acyclic and millions of containers would otherwise trigger needless collections.
"""

from __future__ import annotations

import gc
import gzip
import json
import pickle
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from ..errors import BadInputError, UnsafePickleError

GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"


class _RefusingUnpickler(pickle.Unpickler):
    """The C unpickler with every way to reach code closed."""

    def __init__(self, file: IO[bytes], path: str) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        raise UnsafePickleError(
            self._path,
            f"refused to load: the pickle asks for the Python global '{module}.{name}'; "
            "a real memory snapshot holds only dicts, lists and numbers, so this file is not one "
            "(or it was tampered with)",
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError(
            self._path, "refused to load: the pickle references external objects (persistent ids)"
        )


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building large acyclic structures."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _unpickle(stream: IO[bytes], path: str) -> Any:
    try:
        with gc_paused():
            return _RefusingUnpickler(stream, path).load()
    except UnsafePickleError:
        raise
    except EOFError:
        raise BadInputError(path, "truncated pickle: the file ends before the snapshot does "
                            "(was the dump interrupted or the copy cut short?)") from None
    except (pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            MemoryError, OverflowError, UnicodeDecodeError, RecursionError) as exc:
        text = str(exc)
        if "truncated" in text or "ran out of input" in text.lower():
            raise BadInputError(path, "truncated pickle: the file ends before the snapshot does") from None
        raise BadInputError(path, "not a snapshot file: not a pickle, gzip, torch.save zip or JSON "
                            f"({type(exc).__name__}: {text})") from None


def _from_json(data: bytes, path: str) -> Any:
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BadInputError(path, f"looks like JSON but does not parse ({exc})") from None


def _from_zip(file: Path, path: str) -> Any:
    try:
        with zipfile.ZipFile(file) as archive:
            names = [n for n in archive.namelist() if n.endswith("data.pkl")]
            if not names:
                raise BadInputError(path, "a zip file without data.pkl: not a torch.save'd snapshot")
            with archive.open(names[0]) as member:
                return _unpickle(member, path)
    except zipfile.BadZipFile as exc:
        raise BadInputError(path, f"damaged zip file ({exc})") from None


def _sniff(head: bytes) -> str:
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"["):
        return "json"
    return "pickle"


def read_raw(path: str | Path) -> tuple[Any, str]:
    """Return (object, container) where container names the format that was read."""
    file = Path(path)
    name = str(path)
    if file.is_dir():
        raise BadInputError(name, "is a directory, expected a snapshot file")
    try:
        with open(file, "rb") as stream:
            head = stream.read(8)
            if not head:
                raise BadInputError(name, "the file is empty (was the snapshot ever written?)")
            if head.startswith(ZIP_MAGIC):
                return _from_zip(file, name), "torch.save zip"
            if head.startswith(GZIP_MAGIC):
                return _read_gzip(file, name)
            stream.seek(0)
            if _sniff(head) == "json":
                return _from_json(stream.read(), name), "json"
            return _unpickle(stream, name), "pickle"
    except FileNotFoundError:
        raise BadInputError(name, "no such file") from None
    except PermissionError:
        raise BadInputError(name, "permission denied") from None
    except IsADirectoryError:
        raise BadInputError(name, "is a directory, expected a snapshot file") from None


def _read_gzip(file: Path, name: str) -> tuple[Any, str]:
    try:
        with gzip.open(file, "rb") as inner:
            head = inner.peek(8)[:8] if hasattr(inner, "peek") else b""
            if _sniff(head) == "json":
                return _from_json(inner.read(), name), "gzip json"
            return _unpickle(inner, name), "gzip pickle"  # type: ignore[arg-type]
    except (OSError, EOFError) as exc:
        raise BadInputError(name, f"damaged gzip stream ({exc})") from None
