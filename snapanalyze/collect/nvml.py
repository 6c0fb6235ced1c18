"""NVML sampling: a background thread reads device memory every few ms and writes numbered Parquet parts.

`NvmlBackend` is the whole interface to NVML (five reads and `close`), indexed by this process's CUDA
ordinal; `open_nvml` builds the real one on ``pynvml`` (nvidia-ml-py, imported lazily) and raises
`CollectorError` when NVML or a GPU is missing. `NvmlSampler` calls it every `interval_ms` per device and
records `NvmlSample` rows (`schemas.NVML_SCHEMA`): device used/free/total, this pid's and every other pid's
per-process usage (null when NVML cannot tell, e.g. in a container whose pids NVML does not see), and
torch's ``memory_allocated``/``memory_reserved`` read at the same instant through the injectable
`allocator_stats`. Rows are buffered and flushed as ``nvml-part-NNNNN.parquet`` every `flush_rows` rows
or `flush_interval_s` seconds, each part written atomically and never rewritten, so a killed process keeps
every earlier part readable and memory stays bounded (at most `max_buffer_rows` rows; the oldest are
dropped and counted if the disk refuses them). `stop()` joins the thread and flushes the rest. The sampler
only reads: it never changes a GPU setting. Errors in the thread never propagate into the workload; they
end sampling (`error`) or are retried at the next flush (`write_error`), and `stop()` reports them as warnings.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from .. import layout
from .. import schema as schemas
from ..errors import CollectorError
from ._common import now_us, warn

AllocatorStats = Callable[[int], tuple[int, int]]
"""(allocated_bytes, reserved_bytes) of this process on a CUDA device, e.g. torch.cuda.memory_allocated/reserved."""


@runtime_checkable
class NvmlBackend(Protocol):
    """The NVML reads the sampler needs; `device` is a CUDA ordinal of this process."""

    def device_count(self) -> int: ...

    def memory(self, device: int) -> tuple[int, int, int]:
        """(used_bytes, free_bytes, total_bytes) of the whole device."""
        ...

    def processes(self, device: int) -> list[tuple[int, int | None]] | None:
        """(pid, used_bytes or None) of each compute process on the device; None if NVML cannot list them."""
        ...

    def name(self, device: int) -> str: ...

    def driver_version(self) -> str: ...

    def close(self) -> None: ...


def _install_hint() -> str:
    return "install it with pip install 'snapanalyze[collect]' (or pip install nvidia-ml-py)"


class PynvmlBackend:
    """`NvmlBackend` on pynvml; `handles[i]` is the NVML handle of CUDA ordinal i. Build it with `open_nvml`."""

    def __init__(self, pynvml: Any, handles: Sequence[Any]) -> None:
        self._nvml = pynvml
        self._handles = list(handles)

    def device_count(self) -> int:
        return len(self._handles)

    def memory(self, device: int) -> tuple[int, int, int]:
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handles[device])
        return int(info.used), int(info.free), int(info.total)

    def processes(self, device: int) -> list[tuple[int, int | None]] | None:
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handles[device])
        except self._nvml.NVMLError:
            return None
        out: list[tuple[int, int | None]] = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), None if used is None or int(used) >= 2**63 else int(used)))
        return out

    def name(self, device: int) -> str:
        return _text(self._nvml.nvmlDeviceGetName(self._handles[device]))

    def driver_version(self) -> str:
        return _text(self._nvml.nvmlSystemGetDriverVersion())

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # shutting down twice or after a driver reset: nothing left to release
            pass


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _norm_uuid(uuid: str) -> str:
    u = uuid.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if u.startswith(prefix):
            u = u[len(prefix):]
    return u


def _visible_indices(count: int, env: dict[str, str] | None = None) -> list[int]:
    raw = (env if env is not None else dict(os.environ)).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(count))
    try:
        indices = [int(x) for x in raw.split(",") if x.strip() != ""]
    except ValueError:
        return list(range(count))
    return [i for i in indices if 0 <= i < count]


def open_nvml(cuda_uuids: Sequence[str | None] = ()) -> PynvmlBackend:
    """Initialise NVML and map each CUDA device (by its UUID, in CUDA order) to its NVML handle.

    Without UUIDs (or when one does not match, e.g. a MIG slice) it falls back to CUDA_VISIBLE_DEVICES order.
    Raises CollectorError when pynvml is missing, NVML cannot start (no driver) or sees no GPU.
    """
    try:
        import pynvml
    except ImportError as e:
        raise CollectorError(
            f"NVML sampling needs the nvidia-ml-py package, which is not installed: {_install_hint()}"
        ) from e
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise CollectorError(
            f"NVML could not start ({e}): sampling device memory needs an NVIDIA driver on a GPU node"
        ) from e
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        if count == 0:
            raise CollectorError("NVML sees no GPU on this node")
        by_uuid = {_norm_uuid(_text(pynvml.nvmlDeviceGetUUID(h))): h for h in handles}
        wanted = [u for u in cuda_uuids]
        if wanted and all(u is not None and _norm_uuid(u) in by_uuid for u in wanted):
            mapped = [by_uuid[_norm_uuid(u)] for u in wanted if u is not None]
        else:
            if wanted:
                warn("snapanalyze.collect: CUDA device UUIDs do not match NVML's; "
                     "mapping devices by CUDA_VISIBLE_DEVICES order")
            mapped = [handles[i] for i in _visible_indices(count)]
            if wanted:
                mapped = mapped[: len(wanted)]
    except CollectorError:
        pynvml.nvmlShutdown()
        raise
    except pynvml.NVMLError as e:
        pynvml.nvmlShutdown()
        raise CollectorError(f"NVML failed while listing devices: {e}") from e
    return PynvmlBackend(pynvml, mapped)


@dataclass(frozen=True, slots=True)
class NvmlSample:
    """One device read at one instant; fields and order are exactly `schemas.NVML_SCHEMA`'s columns."""

    time_us: int
    device: int
    used_bytes: int
    free_bytes: int
    total_bytes: int
    process_used_bytes: int | None
    other_processes_used_bytes: int | None
    torch_allocated_bytes: int | None
    torch_reserved_bytes: int | None


_SAMPLE_FIELDS = [f.name for f in fields(NvmlSample)]
if _SAMPLE_FIELDS != schemas.NVML_SCHEMA.names:  # pragma: no cover - a programming error caught at import
    raise ImportError(f"NvmlSample fields {_SAMPLE_FIELDS} differ from NVML_SCHEMA {schemas.NVML_SCHEMA.names}")


def samples_table(rows: Sequence[NvmlSample]) -> pa.Table:
    """Rows as a `schemas.NVML_SCHEMA` table."""
    columns = list(zip(*(astuple(r) for r in rows), strict=True)) if rows else [()] * len(_SAMPLE_FIELDS)
    by_name = {name: list(col) for name, col in zip(_SAMPLE_FIELDS, columns, strict=True)}
    return schemas.table(schemas.NVML_SCHEMA, by_name)


def split_processes(procs: list[tuple[int, int | None]] | None, pid: int) -> tuple[int | None, int | None]:
    """(this pid's bytes, every other pid's bytes); both None unless `pid` is listed with a known size.

    If our pid is missing (container pid namespace) the others' sum could include us, so it is unknown too.
    """
    if procs is None:
        return None, None
    mine = [used for p, used in procs if p == pid]
    if not mine or any(u is None for u in mine):
        return None, None
    others = [used for p, used in procs if p != pid]
    other_sum = None if any(u is None for u in others) else sum(u for u in others if u is not None)
    return sum(u for u in mine if u is not None), other_sum


class NvmlSampler:
    """Samples every device of `backend` on a background thread and writes Parquet parts into `out_dir`."""

    def __init__(
        self,
        backend: NvmlBackend,
        out_dir: str | os.PathLike[str],
        *,
        interval_ms: float = 20.0,
        flush_rows: int = 4096,
        flush_interval_s: float = 10.0,
        max_buffer_rows: int | None = None,
        allocator_stats: AllocatorStats | None = None,
        clock_us: Callable[[], int] = now_us,
        pid: int | None = None,
        max_consecutive_errors: int = 50,
    ) -> None:
        if interval_ms <= 0:
            raise ValueError(f"interval_ms must be > 0, got {interval_ms}")
        if flush_rows < 1:
            raise ValueError(f"flush_rows must be >= 1, got {flush_rows}")
        self.backend = backend
        self.out_dir = Path(out_dir)
        self.interval_s = interval_ms / 1000.0
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.max_buffer_rows = max(max_buffer_rows or 4 * flush_rows, flush_rows)
        self.allocator_stats = allocator_stats
        self.clock_us = clock_us
        self.pid = os.getpid() if pid is None else pid
        self.max_consecutive_errors = max_consecutive_errors
        self.devices = list(range(backend.device_count()))
        self.parts: list[Path] = []
        self.rows_written = 0
        self.dropped_rows = 0
        self.error: BaseException | None = None
        self.write_error: BaseException | None = None
        self._buffer: list[NvmlSample] = []
        self._buffer_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_flush = time.monotonic()
        self._errors_in_a_row = 0
        self._next_number: int | None = None

    # -- sampling -------------------------------------------------------------------------------------------
    def sample_once(self) -> list[NvmlSample]:
        """Read every device once, buffer the rows and return them (raises what the backend raises)."""
        rows = [self._sample(d) for d in self.devices]
        with self._buffer_lock:
            self._buffer.extend(rows)
            self._bound_buffer()
        return rows

    def _sample(self, device: int) -> NvmlSample:
        t = int(self.clock_us())
        used, free, total = self.backend.memory(device)
        allocated = reserved = None
        if self.allocator_stats is not None:
            try:
                allocated, reserved = self.allocator_stats(device)
            except Exception:  # torch stats are a bonus; NVML's row stands without them
                allocated = reserved = None
        try:
            procs = self.backend.processes(device)
        except Exception:
            procs = None
        mine, others = split_processes(procs, self.pid)
        return NvmlSample(t, device, int(used), int(free), int(total), mine, others, allocated, reserved)

    def _bound_buffer(self) -> None:
        excess = len(self._buffer) - self.max_buffer_rows
        if excess > 0:
            del self._buffer[:excess]
            self.dropped_rows += excess

    @property
    def buffered_rows(self) -> int:
        with self._buffer_lock:
            return len(self._buffer)

    # -- writing --------------------------------------------------------------------------------------------
    def flush(self) -> Path | None:
        """Write the buffered rows as the next part file; returns it, or None when nothing was buffered.

        On a write error the rows go back into the (bounded) buffer and the error propagates.
        """
        with self._write_lock:
            with self._buffer_lock:
                rows, self._buffer = self._buffer, []
            self._last_flush = time.monotonic()
            if not rows:
                return None
            if self._next_number is None:
                self._next_number = self._first_free_number()
            number = self._next_number
            try:
                path = schemas.write_new_table(
                    samples_table(rows),
                    lambda n: self.out_dir / layout.nvml_part_name(number + n),
                    schema=schemas.NVML_SCHEMA,
                )
            except BaseException:
                with self._buffer_lock:
                    self._buffer[:0] = rows
                    self._bound_buffer()
                raise
            self._next_number = int(path.name[len(layout.NVML_PART_PREFIX): -len(".parquet")]) + 1
            self.parts.append(path)
            self.rows_written += len(rows)
            self.write_error = None
            return path

    def _first_free_number(self) -> int:
        existing = layout.nvml_parts(self.out_dir)
        if not existing:
            return 1
        name = existing[-1].name
        return int(name[len(layout.NVML_PART_PREFIX): -len(".parquet")]) + 1

    # -- thread ---------------------------------------------------------------------------------------------
    def start(self) -> NvmlSampler:
        """Start the sampling thread (a daemon: it never keeps the process alive)."""
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="snapanalyze-nvml", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                self.sample_once()
                self._errors_in_a_row = 0
            except Exception as e:
                self._errors_in_a_row += 1
                if self._errors_in_a_row >= self.max_consecutive_errors:
                    self.error = e
                    return
            if self.buffered_rows >= self.flush_rows or time.monotonic() - self._last_flush >= self.flush_interval_s:
                try:
                    self.flush()
                except Exception as e:
                    self.write_error = e  # keep sampling into the bounded buffer; stop() retries the flush
            next_tick += self.interval_s
            delay = next_tick - time.monotonic()
            if delay < 0:  # fell behind (slow NVML or disk): skip the missed ticks, never burst
                next_tick = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)

    def stop(self, timeout: float = 10.0, *, discard: bool = False) -> None:
        """Stop the thread, join it and flush what is buffered; warns (never raises) about sampling errors.

        With `discard` the buffered rows are dropped and the parts this sampler wrote are deleted (used when a
        recording fails to start, so it leaves nothing behind).
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                warn(f"snapanalyze.collect: the NVML sampler did not stop within {timeout} s")
        if discard:
            with self._write_lock, self._buffer_lock:
                self._buffer = []
                for part in self.parts:
                    part.unlink(missing_ok=True)
                self.parts = []
            return
        try:
            self.flush()
        except Exception as e:
            self.write_error = e
        if self.error is not None:
            warn(f"snapanalyze.collect: NVML sampling stopped early: {self.error!r}; the parts written are complete")
        if self.write_error is not None:
            warn(f"snapanalyze.collect: NVML samples could not be written: {self.write_error!r}")
        if self.dropped_rows:
            warn(f"snapanalyze.collect: {self.dropped_rows} NVML rows were dropped (could not be written in time)")
