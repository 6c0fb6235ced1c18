"""Phase and request markers: spans with µs epoch times, kept per thread, written to ``markers.parquet``.

`phase(name, **attrs)` and `request(req_id, **attrs)` are context managers that append one span
{kind, name, start_time_us, end_time_us, attrs (JSON), rank, thread_id, depth} to the active recording's
`MarkerLog`; spans still open when the log is written have a null end. Times come from the log's clock
(`now_us`, the clock of a snapshot's ``time_us``), so spans join the trace directly. They also mark the trace
itself through `TraceHooks`: a phase runs inside ``annotate("phase:<name>")`` (torch's ``record_function``,
which lands in the snapshot's ``external_annotations`` where torch records them), and a request sets the
thread's allocator metadata to ``req=<id>`` (``torch.cuda.memory._set_memory_metadata``, torch ≥ 2.10) and
restores the previous value on exit. Nesting and metadata are per thread (asyncio tasks sharing a thread
share them). With no active recording both are cheap no-ops, so library code may keep them in place. A
failing hook is reported once as a warning and never breaks the workload.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from .. import schema as schemas
from ._common import now_us, warn

MarkerKind = Literal["phase", "request", "module"]


@dataclass(frozen=True)
class TraceHooks:
    """How markers reach the allocator trace; each hook is optional (None: that torch lacks it).

    `annotate(label)` returns a context manager spanning the phase; `set_metadata(s)` / `get_metadata()` set
    and read the calling thread's allocator metadata string ("" = none).
    """

    annotate: Callable[[str], AbstractContextManager[object]] | None = None
    set_metadata: Callable[[str], None] | None = None
    get_metadata: Callable[[], str] | None = None


@dataclass(frozen=True)
class Marker:
    """One span; `end_time_us` is None while it is open."""

    kind: MarkerKind
    name: str
    start_time_us: int
    end_time_us: int | None
    attrs: str
    rank: int
    thread_id: int
    depth: int


class MarkerLog:
    """Thread-safe store of the spans of one recording (closed ones and those still open)."""

    def __init__(self, rank: int, *, clock_us: Callable[[], int] = now_us, hooks: TraceHooks | None = None) -> None:
        self.rank = rank
        self.clock_us = clock_us
        self.hooks = hooks or TraceHooks()
        self._lock = threading.Lock()
        self._next_id = 0
        # Spans as plain tuples in Marker's field order (module hooks open thousands per second); the
        # Marker objects are made only when asked for.
        self._closed: list[tuple[int, tuple[object, ...]]] = []
        self._open: dict[int, tuple[object, ...]] = {}
        self._local = threading.local()
        self._warned: set[str] = set()

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    def begin(self, kind: MarkerKind, name: str, attrs: Mapping[str, object]) -> int:
        """Open a span on the calling thread; returns its token for `end`."""
        return self.begin_json(kind, str(name), json.dumps(dict(attrs), sort_keys=True, default=str))

    def begin_json(self, kind: MarkerKind, name: str, attrs: str) -> int:
        """`begin` with the attrs already as JSON (module hooks serialise theirs once, not per call)."""
        local = self._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        row = (kind, name, int(self.clock_us()), None, attrs, self.rank, threading.get_native_id(), depth)
        with self._lock:
            token = self._next_id
            self._next_id += 1
            self._open[token] = row
        return token

    def end(self, token: int) -> None:
        """Close the span `token` (from `begin` on this thread) at the current time."""
        end = int(self.clock_us())
        local = self._local
        local.depth = max(0, getattr(local, "depth", 0) - 1)
        with self._lock:
            row = self._open.pop(token, None)
            if row is not None:
                self._closed.append((token, (*row[:3], end, *row[4:])))

    def markers(self) -> list[Marker]:
        """Every span, open ones included, in the order they began."""
        with self._lock:
            items = list(self._closed) + list(self._open.items())
        return [Marker(*row) for _, row in sorted(items, key=lambda item: item[0])]  # type: ignore[arg-type]

    def table(self) -> pa.Table:
        """The spans as a `schemas.MARKERS_SCHEMA` table."""
        rows = self.markers()
        names = schemas.MARKERS_SCHEMA.names
        cols: dict[str, list[object]] = {name: [getattr(m, name) for m in rows] for name in names}
        return schemas.table(schemas.MARKERS_SCHEMA, cols)

    def hook_failed(self, hook: str, error: BaseException) -> None:
        """Warn once per hook that it failed; markers keep being recorded."""
        if hook not in self._warned:
            self._warned.add(hook)
            warn(f"snapanalyze.collect: trace hook {hook} failed ({error!r}); markers.parquet still records the spans")


_active: MarkerLog | None = None
_metadata = threading.local()


def set_active(log: MarkerLog | None) -> None:
    """Make `log` the target of `phase`/`request` (the recorder calls this; None detaches)."""
    global _active
    _active = log


def active() -> MarkerLog | None:
    """The log markers currently go to, if a recording is active."""
    return _active


@contextmanager
def phase(name: str, /, **attrs: object) -> Iterator[None]:
    """Mark a phase of the workload (``with phase("prefill", tokens=32768): …``); a no-op outside a recording."""
    log = _active
    if log is None:
        yield
        return
    token = log.begin("phase", name, attrs)
    annotation = _enter_annotation(log, f"phase:{name}")
    try:
        yield
    finally:
        if annotation is not None:
            try:
                annotation.__exit__(None, None, None)
            except Exception as e:  # a marker must never break the workload
                log.hook_failed("annotate", e)
        log.end(token)


def _enter_annotation(log: MarkerLog, label: str) -> AbstractContextManager[object] | None:
    if log.hooks.annotate is None:
        return None
    try:
        cm = log.hooks.annotate(label)
        cm.__enter__()
    except Exception as e:
        log.hook_failed("annotate", e)
        return None
    return cm


@contextmanager
def request(req_id: str, /, **attrs: object) -> Iterator[None]:
    """Mark the handling of one request; sets the thread's allocator metadata to ``req=<id>`` meanwhile."""
    log = _active
    if log is None:
        yield
        return
    token = log.begin("request", str(req_id), attrs)
    previous = _set_request_metadata(log, f"req={req_id}")
    try:
        yield
    finally:
        if previous is not None:
            _restore_metadata(log, previous)
        log.end(token)


def _stack() -> list[str]:
    stack: list[str] | None = getattr(_metadata, "stack", None)
    if stack is None:
        stack = _metadata.stack = []
    return stack


def _set_request_metadata(log: MarkerLog, value: str) -> str | None:
    """Set the metadata; returns the value to restore, or None when nothing was set."""
    hooks = log.hooks
    if hooks.set_metadata is None:
        return None
    stack = _stack()
    try:
        previous = hooks.get_metadata() if hooks.get_metadata is not None else (stack[-1] if stack else "")
        hooks.set_metadata(value)
    except Exception as e:
        log.hook_failed("set_metadata", e)
        return None
    stack.append(value)
    return previous


def _restore_metadata(log: MarkerLog, previous: str) -> None:
    stack = _stack()
    if stack:
        stack.pop()
    if log.hooks.set_metadata is None:
        return
    try:
        log.hooks.set_metadata(previous)
    except Exception as e:
        log.hook_failed("set_metadata", e)
