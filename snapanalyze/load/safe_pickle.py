"""Read the bytes of a snapshot file into plain Python objects, safely and at a bounded cost.

Contract: `read_raw(path, limits)` returns a `Raw`: the builtins-only object a snapshot file holds (dict or
list), the container it came in and the bytes of its pickle stream; or raises BadInputError naming the file
and the problem. Pickles are untrusted input: the unpickler refuses every
global and every persistent id, so no code from the file ever runs (a real snapshot needs neither).
Containers: plain pickle (any protocol), gzip-compressed pickle or JSON (its CRC checked), a `torch.save` zip
holding `data.pkl` (stored or deflated, not encrypted), and JSON as accepted by PyTorch's web viewer.

Bounds (`Limits`): only regular files are read — a FIFO, a device or a socket is refused before it is
opened, so nothing blocks; a compressed payload that expands past `expanded_cap` (the larger of 64 × the
file and 64 MiB; real snapshots compress 4–33×) is refused as soon as it does; while unpickling, the
process may grow by at most `growth_cap` (the largest of 12 × the stream read so far, 256 MiB, and, where
the whole stream's size is known before reading — a plain pickle file, a stored zip member — 3 × that size),
measured from the resident set as the stream is read, so a pickle built to explode into objects is refused
before it exhausts the machine; `max_memory_bytes` (`--max-memory`) caps both. A real snapshot takes about
3–4.5 × its pickle, but up to 12 × over its first tens of MiB when it holds a quarter of a million segments
(the segment dicts come first and weigh more per pickled byte than trace entries); the 3 × floor lets such a
file load without letting any file grow the process past what the 12 × bound allows at its end. Tuples and
frozensets can nest no deeper than the pickle has opcodes that build them (counted as the bytes stream in,
refused past MAX_NESTING), and the unpickler runs on a thread with a 1 GiB stack, so hashing the deepest
allowed key cannot overflow the C stack (a segfault, not an exception). An OSError, a zlib or zip error,
MemoryError and RecursionError all become the one BadInputError. The cyclic GC is paused while unpickling:
the object graph is acyclic and millions of containers would otherwise trigger needless collections.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import stat
import sys
import threading
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np

from ..confine import open_confined
from ..errors import BadInputError, UnsafePickleError
from ..gcpause import gc_paused

GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
MiB, GiB = 1 << 20, 1 << 30
MAX_NESTING = 6_000_000          # tuple/frozenset-building opcode bytes a pickle may hold (a 1M-event
                                 # snapshot has about 0.4M; hashing 8M nested tuples fits the 1 GiB stack)
_NESTING_OPCODES = b"\x85\x86\x87t\x91"    # TUPLE1, TUPLE2, TUPLE3, TUPLE, FROZENSET
UNPICKLE_STACK = 1 << 30
_ZIP_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate", zipfile.ZIP_BZIP2: "bzip2",
                zipfile.ZIP_LZMA: "lzma"}


@dataclass(frozen=True)
class Limits:
    """What reading a file may cost (see the module docstring); `max_memory_bytes` caps both bounds."""

    max_memory_bytes: int | None = None

    def _capped(self, default: int) -> int:
        return default if self.max_memory_bytes is None else min(default, self.max_memory_bytes)

    def expanded_cap(self, file_bytes: int) -> int:
        """Bytes a compressed payload may expand to."""
        return self._capped(max(64 * file_bytes, 64 * MiB))

    def decoded_cap(self, file_bytes: int) -> int:
        """Bytes a columnar file's (Parquet's) columns may decode to: real tables decode to under 30× their
        file (measured on converted real snapshots), a crafted one to terabytes."""
        return self._capped(max(256 * file_bytes, 256 * MiB))

    def growth_cap(self, stream_bytes: int, whole_stream: int | None = None) -> int:
        """Bytes the process may grow by once `stream_bytes` of a pickle of `whole_stream` bytes (None: not known
        before it is read) have been read."""
        return self._capped(max(12 * stream_bytes, 3 * (whole_stream or 0), 256 * MiB))


_LIMITS: ContextVar[Limits | None] = ContextVar("snapanalyze_limits", default=None)   # None: Limits()


@contextmanager
def limits_in_effect(limits: Limits) -> Iterator[None]:
    """Make `limits` what `read_raw` applies when it is not given any (the CLI's --max-memory)."""
    token = _LIMITS.set(limits)
    try:
        yield
    finally:
        _LIMITS.reset(token)


def limits_now() -> Limits | None:
    """The limits `limits_in_effect` set here (None: the defaults), for work handed to another process."""
    return _LIMITS.get()


class Raw(NamedTuple):
    data: Any              # the dict or list the file held
    container: str         # pickle, gzip pickle, gzip json, torch.save zip, json
    stream_bytes: int      # bytes of the (decompressed) pickle or JSON stream


def _resident_bytes() -> int | None:
    """The process's resident set now (Linux), its peak elsewhere on Unix; None where neither is known."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except (ImportError, OSError, ValueError):
        return None


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


class _Refused(Exception):
    """Raised by a `_Guard` from inside the unpickler's read: turned into BadInputError by the caller."""


class _Guard(io.RawIOBase):
    """A read-only stream that counts what passes: the bytes (refused past `cap`), the opcode bytes that
    can nest hashable containers (refused past MAX_NESTING; a data byte may count too, which only makes the
    bound safer), and how much the process has grown since it began (refused past `limits.growth_cap`)."""

    def __init__(self, inner: IO[bytes], cap: int | None, what: str, limits: Limits,
                 whole: int | None = None) -> None:
        self.inner, self.cap, self.what, self.limits, self.whole = inner, cap, what, limits, whole
        self.total = 0
        self.nesting = 0
        self.start_rss = _resident_bytes()

    def readable(self) -> bool:
        return True

    def _seen(self, data: bytes | memoryview) -> None:
        self.total += len(data)
        if self.cap is not None and self.total > self.cap:
            raise _Refused(f"the {self.what} expands past {self.cap / GiB:.2f} GiB: a compression bomb, or a "
                           "snapshot larger than --max-memory allows")
        octets = np.frombuffer(data, dtype=np.uint8)     # compared at C speed: 5x faster than bytes.translate
        self.nesting += sum(int(np.count_nonzero(octets == op)) for op in _NESTING_OPCODES)
        if self.nesting > MAX_NESTING:
            raise _Refused(f"the pickle nests tuples deeper than this reader allows ({MAX_NESTING:,} tuple opcodes): "
                           "not a snapshot, or one built to exhaust the reader")
        now = _resident_bytes() if self.start_rss is not None else None
        if now is not None and now - self.start_rss > (allowed := self.limits.growth_cap(self.total, self.whole)):  # type: ignore[operator]
            raise _Refused(f"unpickling {self.total / MiB:,.1f} MiB of pickle took more than {allowed / GiB:.2f} GiB "
                           "of memory: a pickle built to explode into objects, or a snapshot larger than "
                           "--max-memory allows")

    def readinto(self, buffer: Any) -> int:
        n = self.inner.readinto(buffer)  # type: ignore[attr-defined]
        if n:
            self._seen(memoryview(buffer)[:n])
        return n or 0


def _on_big_stack(work: Callable[[], Any]) -> Any:
    """Run `work` on a thread with an UNPICKLE_STACK stack and return (or raise) what it did; run it here
    when no such thread can be made."""
    result: list[Any] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # noqa: B902 - handed to the caller's thread
            error.append(exc)

    try:
        previous = threading.stack_size(UNPICKLE_STACK)
    except (ValueError, RuntimeError):
        return work()
    try:
        thread = threading.Thread(target=run, name="snapanalyze-unpickle")
        thread.start()
    except RuntimeError:
        return work()
    finally:
        threading.stack_size(previous)
    thread.join()
    if error:
        raise error[0]
    return result[0]


def _unpickle(stream: IO[bytes], path: str, limits: Limits, cap: int | None = None,
              what: str = "pickle", whole: int | None = None) -> tuple[Any, int]:
    """The unpickled object and the bytes of pickle it took (`whole`: the stream's size, where it is known)."""
    guard = _Guard(stream, cap, what, limits, whole)
    guarded = io.BufferedReader(guard, 1 << 20)     # peek lets the unpickler read ahead
    ceiling = limits.growth_cap(whole if whole is not None else (cap or 0), whole)

    def load() -> Any:
        with data_limit(ceiling):
            return _RefusingUnpickler(guarded, path).load()
    try:
        _drop_exported_buffer_line()
        with gc_paused():
            return _on_big_stack(load), guard.total
    except UnsafePickleError:
        raise
    except _Refused as exc:
        raise BadInputError(path, f"refused to load: {exc}") from None
    except EOFError:
        raise BadInputError(path, "truncated pickle: the file ends before the snapshot does "
                            "(was the dump interrupted or the copy cut short?)") from None
    except MemoryError:
        if guard.total < 64 * MiB:
            raise BadInputError(path, f"refused to load: after {guard.total:,} bytes of pickle, an opcode asks for "
                                "more memory than reading it may take (a length or a repetition no snapshot holds; "
                                "--max-memory sets the bound): a pickle built to exhaust memory, not a snapshot"
                                ) from None
        raise BadInputError(path, "ran out of memory while reading the pickle: a snapshot larger than this "
                            "machine can hold, or a pickle built to exhaust it") from None
    except (pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            OverflowError, UnicodeDecodeError, RecursionError, zlib.error) as exc:
        text = str(exc)
        if "truncated" in text or "ran out of input" in text.lower():
            raise BadInputError(path, "truncated pickle: the file ends before the snapshot does") from None
        raise BadInputError(path, "not a snapshot file: not a pickle, gzip, torch.save zip or JSON "
                            f"({type(exc).__name__}: {text[:200]})") from None


def _data_bytes() -> int | None:
    """The process's data segment now (VmData: its private writable memory, Linux), None where unknown."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class _DataLimit:
    """The process's RLIMIT_DATA while reads hold it: the first read sets it from what the process holds then plus
    its growth; a read that starts while another holds it adds its own growth (threads, Dask workers); the user's
    own limit comes back when the last one ends, and is never exceeded."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.original: tuple[int, int] | None = None
        self.limit = 0


_DATA = _DataLimit()


@contextmanager
def data_limit(growth: int) -> Iterator[None]:
    """While unpickling, the process may not take more than `growth` bytes of memory beyond what it holds now
    (RLIMIT_DATA, Linux): one opcode that asks for gigabytes at once (a memo index of 134 million slots in a
    9-byte pickle) fails before it allocates, where the stream guard, which measures between reads, would see it
    only after. Concurrent reads each add their growth (`_DataLimit`); the limit is put back afterwards."""
    try:
        import resource
    except ImportError:          # pragma: no cover - not Unix
        yield
        return
    added = 0
    with _DATA.lock:
        now = _data_bytes()
        try:
            soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        except (OSError, ValueError):
            now = None
        if now is not None:
            if _DATA.holders == 0:
                _DATA.original, _DATA.limit = (soft, hard), now + 64 * MiB
            added = growth
            limit = _DATA.limit + added
            original_soft = _DATA.original[0] if _DATA.original is not None else soft
            if hard != resource.RLIM_INFINITY:
                limit = min(limit, hard)
            if original_soft != resource.RLIM_INFINITY:
                limit = min(limit, original_soft)
            try:
                resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
                _DATA.limit += added
                _DATA.holders += 1
            except (OSError, ValueError):
                now, added = None, 0
    if now is None:
        yield
        return
    try:
        yield
    finally:
        with _DATA.lock:
            _DATA.holders -= 1
            _DATA.limit -= added
            # while others read, the limit stays where it is: what this read made is still held, so lowering it
            # could fail a read that is within its own bound
            if _DATA.holders == 0 and _DATA.original is not None:
                resource.setrlimit(resource.RLIMIT_DATA, _DATA.original)
                _DATA.original = None


_EXPORTED = "deallocated bytearray object has exported buffers"


def _drop_exported_buffer_line() -> None:
    """A bytearray the unpickler failed to fill (a pickle claiming more bytes than exist) may be freed while its
    buffer is still exported, and the interpreter then prints "SystemError: deallocated bytearray object has
    exported buffers" through sys.excepthook (PyErr_Print), at once or later: from the first unpickling on, that
    line, and only it, is dropped — the one line naming the file says what went wrong. Idempotent."""
    if getattr(sys.excepthook, "_snapanalyze", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if kind is SystemError and str(value) == _EXPORTED:
            return
        previous(kind, value, tb)
    hook._snapanalyze = True        # type: ignore[attr-defined]
    sys.excepthook = hook


def _from_json(data: bytes, path: str, limits: Limits | None = None) -> Any:
    try:
        with data_limit((limits or Limits()).growth_cap(len(data), len(data))):
            return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BadInputError(path, f"looks like JSON but does not parse ({str(exc)[:200]})") from None
    except MemoryError:
        raise BadInputError(path, "ran out of memory while parsing the JSON") from None


def _read_capped(stream: IO[bytes], cap: int, path: str, what: str) -> bytes:
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise BadInputError(path, f"refused to load: the {what} expands past {cap / GiB:.2f} GiB: a compression "
                            "bomb, or a snapshot larger than --max-memory allows")
    return data


def _from_zip(file: Path | IO[bytes], path: str, limits: Limits, cap: int) -> tuple[Any, int]:
    try:
        with zipfile.ZipFile(file) as archive:
            infos = [i for i in archive.infolist() if i.filename.endswith("data.pkl")]
            if not infos:
                raise BadInputError(path, "a zip file without data.pkl: not a torch.save'd snapshot")
            info = infos[0]
            if info.flag_bits & 0x1:
                raise BadInputError(path, "the zip's data.pkl is encrypted: torch.save never encrypts")
            if info.compress_type not in _ZIP_METHODS:
                raise BadInputError(path, f"the zip's data.pkl uses compression method {info.compress_type}, "
                                    f"which this reader does not open ({', '.join(_ZIP_METHODS.values())} only)")
            # A stored member's size is bounded by the file's, so it is known; a deflated one's is only declared.
            size = file.stat().st_size if isinstance(file, Path) else os.fstat(file.fileno()).st_size
            whole = min(info.file_size, size) if info.compress_type == zipfile.ZIP_STORED else None
            with archive.open(info) as member:
                return _unpickle(member, path, limits, cap, "zip member", whole)  # type: ignore[arg-type]
    except zipfile.BadZipFile as exc:
        raise BadInputError(path, f"damaged zip file ({exc})") from None
    except (NotImplementedError, RuntimeError, zlib.error, EOFError, OSError) as exc:
        raise BadInputError(path, f"damaged or unsupported zip file ({type(exc).__name__}: {exc})") from None


def _sniff(head: bytes) -> str:
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"["):
        return "json"
    return "pickle"


def regular_file(path: str | Path, name: str | None = None) -> os.stat_result:
    """The stat of `path` if it is a regular file (symlinks followed); BadInputError otherwise — a FIFO or a
    device would block or never end, so they are refused before anything opens them."""
    name = str(path) if name is None else name
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise BadInputError(name, "no such file") from None
    except PermissionError:
        raise BadInputError(name, "permission denied") from None
    except (OSError, ValueError) as exc:
        raise BadInputError(name, f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    if stat.S_ISDIR(info.st_mode):
        raise BadInputError(name, "is a directory, expected a snapshot file")
    if not stat.S_ISREG(info.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(info.st_mode) else "a character device" if stat.S_ISCHR(info.st_mode)
                else "a block device" if stat.S_ISBLK(info.st_mode) else "a socket" if stat.S_ISSOCK(info.st_mode)
                else "not a regular file")
        raise BadInputError(name, f"is {kind}, not a regular file: only files are read")
    return info


def read_raw(path: str | Path, limits: Limits | None = None) -> Raw:
    """What the file holds, read within `limits` (see the module docstring)."""
    limits = limits or _LIMITS.get() or Limits()
    file = Path(path)
    name = str(path)
    info = regular_file(file, name)
    if info.st_size == 0:      # also what /proc and /sys files report: never read one (some block forever)
        raise BadInputError(name, "the file is empty (was the snapshot ever written?)")
    cap = limits.expanded_cap(info.st_size)
    try:
        with open_confined(file) as stream:
            head = stream.read(8)
            if not head:
                raise BadInputError(name, "the file is empty (was the snapshot ever written?)")
            if head.startswith(ZIP_MAGIC):               # the file opened and checked, not its path again
                stream.seek(0)
                return Raw(*_with("torch.save zip", _from_zip(stream, name, limits, cap)))
            if head.startswith(GZIP_MAGIC):
                stream.seek(0)
                return _read_gzip(stream, name, limits, cap)
            stream.seek(0)
            if _sniff(head) == "json":
                text = _read_capped(stream, limits._capped(info.st_size), name, "file")
                return Raw(_from_json(text, name, limits), "json", len(text))
            return Raw(*_with("pickle", _unpickle(stream, name, limits, whole=info.st_size)))
    except BadInputError:
        raise
    except OSError as exc:
        raise BadInputError(name, f"cannot be read ({exc.strerror or exc})") from None
    except MemoryError:
        raise BadInputError(name, "ran out of memory while reading the file") from None


def _with(container: str, found: tuple[Any, int]) -> tuple[Any, str, int]:
    return found[0], container, found[1]


def _read_gzip(file: Path | IO[bytes], name: str, limits: Limits, cap: int) -> Raw:
    try:
        with gzip.open(file, "rb") as inner:
            head = inner.peek(8)[:8] if hasattr(inner, "peek") else b""
            if _sniff(head) == "json":
                text = _read_capped(inner, cap, name, "gzip stream")  # type: ignore[arg-type]
                return Raw(_from_json(text, name, limits), "gzip json", len(text))
            found = _unpickle(inner, name, limits, cap, "gzip stream")  # type: ignore[arg-type]
            if inner.read(1 << 16):                 # also makes gzip check the CRC at the end of the stream
                raise BadInputError(name, "the gzip stream holds more after the pickle ends (damaged?)")
            return Raw(*_with("gzip pickle", found))
    except BadInputError:
        raise
    except (OSError, EOFError, zlib.error) as exc:
        raise BadInputError(name, f"damaged gzip stream ({exc})") from None
