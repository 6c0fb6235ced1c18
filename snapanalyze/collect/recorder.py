"""The recorder: `record()` turns on allocator history, NVML sampling and markers, and writes one rank's files.

``with record(run, ...) as rec:`` (or ``rec = record(run, ...)`` … ``rec.stop()``) checks the environment
first (torch, CUDA, NVML when ``nvml="required"``) and raises `CollectorError` before creating anything,
so a failed start leaves no run directory behind. Then it creates ``RUN/rank=N/`` (`layout.rank_dir`; the
rank from `rank.detect_rank`), enables ``_record_memory_history(enabled="all", context="all", stacks=…,
max_entries=…)``, writes ``meta.json``, starts the `nvml.NvmlSampler`, routes `markers.phase`/`request`
into this recording and attaches the OOM observer, which dumps ``snapshot-oom-<n>.pickle`` before the
failing allocation's exception unwinds (it never raises; failures become warnings). `dump(tag)` writes
``snapshot-<tag>.pickle`` (atomically, never overwriting: a repeated tag gets ``-1``, ``-2``, …) and
refreshes markers, NVML parts and meta. On exit, even when the body raised, it dumps ``final`` *then*
disables history (disabling empties torch's buffer), stops the sampler and writes the last markers and meta;
a failure there is a CollectorError after a clean exit and a warning during an exception. One recording
per process at a time (allocator history is process-wide). Everything outside the run directory is reached
through `Backends`, the single injection point tests use: `collect.testing` assembles one from fakes, for
this package's tests and for yours (`record(..., _backends=fake_backends())`).
"""

from __future__ import annotations

import atexit
import os
import pickle
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Literal

from .. import layout
from ..atomic import write_new
from ..errors import CollectorError
from ..schema import MARKERS_SCHEMA, write_table
from . import markers
from ._common import now_us, warn
from .cuda import CudaBackend, TorchCudaBackend
from .meta import RunMeta, meta_document, snapanalyze_version, write_meta, write_new_meta
from .modules import ModuleHooks
from .modules import modules as module_hooks
from .nvml import NvmlBackend, NvmlSampler, open_nvml
from .rank import RankInfo, detect_rank

NvmlMode = Literal["required", "optional", "off"]
Stacks = Literal["python", "all"]


@dataclass(frozen=True)
class RecordOptions:
    """How to record; every field is also a keyword of `record()` and is stored in meta.json."""

    max_entries: int = 1_000_000          # allocator trace ring buffer (older entries are evicted)
    stacks: Stacks = "python"             # "all" adds C++ frames; dumps can then take minutes
    nvml: NvmlMode = "required"           # "optional": warn and go on without NVML; "off": do not sample
    nvml_interval_ms: float = 20.0
    oom_snapshot: bool = True             # dump snapshot-oom-<n>.pickle from the OOM observer
    max_oom_snapshots: int = 3            # later OOMs are listed in meta.json without a snapshot
    annotations: bool = True              # global_record_annotations=True where torch has it
    nvml_flush_rows: int = 4096
    nvml_flush_interval_s: float = 10.0

    def __post_init__(self) -> None:
        if self.stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', not {self.stacks!r}")
        if self.nvml not in ("required", "optional", "off"):
            raise ValueError(f"nvml must be 'required', 'optional' or 'off', not {self.nvml!r}")
        if self.max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {self.max_entries}")
        if self.nvml_interval_ms <= 0:
            raise ValueError(f"nvml_interval_ms must be > 0, got {self.nvml_interval_ms}")
        if self.max_oom_snapshots < 0:
            raise ValueError(f"max_oom_snapshots must be >= 0, got {self.max_oom_snapshots}")


@dataclass(frozen=True)
class Backends:
    """Everything a recording touches outside its run directory; tests replace fields (see `testing`).

    `cuda()` returns the torch side (raises CollectorError when unusable), `nvml(cuda_uuids)` opens NVML for
    those devices in CUDA order (raises CollectorError), `clock_us` stamps meta and markers, `env` is read
    for RANK/LOCAL_RANK/WORLD_SIZE (None: os.environ), `host` names the node.
    """

    cuda: Callable[[], CudaBackend] = TorchCudaBackend.load
    nvml: Callable[[Sequence[str | None]], NvmlBackend] = open_nvml
    clock_us: Callable[[], int] = now_us
    env: Mapping[str, str] | None = None
    host: Callable[[], str] = field(default=socket.gethostname)


_registry_lock = threading.Lock()
_current: Recording | None = None


def _on_oom(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    """The process-wide OOM observer: forwards to the active recording; never raises into torch."""
    try:
        rec = _current
        if rec is not None:
            rec._on_oom(device, alloc, device_allocated, device_free)
    except BaseException as e:  # an exception here would replace the OOM the user should see
        try:
            warn(f"snapanalyze.collect: the OOM snapshot failed: {e!r}")
        except BaseException:
            pass


class Recording:
    """A running (then stopped) recording of one rank; created and started by `record()`."""

    def __init__(self, run: str | os.PathLike[str], options: RecordOptions, backends: Backends | None = None) -> None:
        self.run_dir = Path(run)
        self.options = options
        self._backends = backends or Backends()
        self.rank: RankInfo | None = None
        self.rank_dir: Path | None = None
        self.snapshots: list[Path] = []
        self.ooms: list[dict[str, object]] = []
        self.warnings: list[str] = []
        self.markers_path: Path | None = None
        self.meta_path: Path | None = None
        self.oom_observer = False
        self._state: Literal["new", "running", "stopping", "stopped"] = "new"
        self._lock = threading.RLock()
        self._cuda: CudaBackend | None = None
        self._nvml: NvmlBackend | None = None
        self._nvml_reason: str | None = None
        self._sampler: NvmlSampler | None = None
        self._markers: markers.MarkerLog | None = None
        self._module_hooks: list[ModuleHooks] = []
        self._meta: RunMeta | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._state == "running"

    def start(self) -> Recording:
        """Check the environment, create the rank directory and start recording (see the module docstring)."""
        global _current
        with _registry_lock:
            if self._state != "new":
                raise CollectorError("this recording was started already; call collect.record(...) for a new one")
            if _current is not None:
                raise CollectorError(
                    f"a recording into {_current.run_dir} is already active in this process; allocator history "
                    "is process-wide, so stop that one first"
                )
            try:
                self._start()
            except CollectorError:
                raise
            except Exception as e:
                raise CollectorError(f"starting the recording into {self.run_dir} failed: {e!r}") from e
            self._state = "running"
            _current = self
        atexit.register(self._stop_at_exit)
        return self

    def _start(self) -> None:
        b = self._backends
        opts = self.options
        cuda = b.cuda()
        devices = cuda.devices()
        nvml = self._open_nvml([d.uuid for d in devices])
        created: list[Path] = []
        history_on = False
        try:
            rank = detect_rank(os.environ if b.env is None else b.env, cuda.distributed())
            rdir = layout.rank_dir(self.run_dir, rank.rank)
            created = _mkdirs(rdir)
            history_args = cuda.start_history(
                stacks=opts.stacks, max_entries=opts.max_entries, annotations=opts.annotations
            )
            history_on = True
            nvml_names, driver = _nvml_facts(nvml, len(devices))
            versions = {**cuda.versions(), "driver": driver, "snapanalyze": snapanalyze_version()}
            session = layout.next_session(rdir)
            self._meta = RunMeta(
                host=b.host(), pid=os.getpid(), rank=rank, devices=tuple(devices), nvml_devices=nvml_names,
                versions=versions, options=asdict(opts), history_args=history_args,
                start_time_us=int(b.clock_us()), session=session,
            )
            self.rank, self.rank_dir, self._cuda, self._nvml = rank, rdir, cuda, nvml
            self.meta_path = self._claim_meta(rdir, session)
            self.markers_path = rdir / layout.markers_name(self._meta.session)
            self._markers = markers.MarkerLog(rank.rank, clock_us=b.clock_us, hooks=cuda.trace_hooks())
            self._write_markers()
            if nvml is not None:
                self._sampler = NvmlSampler(
                    nvml, rdir, interval_ms=opts.nvml_interval_ms, flush_rows=opts.nvml_flush_rows,
                    flush_interval_s=opts.nvml_flush_interval_s, allocator_stats=cuda.allocator_stats,
                    clock_us=b.clock_us,
                ).start()
            if opts.oom_snapshot:
                self.oom_observer = cuda.attach_oom_observer(_on_oom)
                if not self.oom_observer:
                    self._warn("this torch cannot observe CUDA OOMs: no OOM snapshot will be taken")
            markers.set_active(self._markers)
        except BaseException:
            if self._sampler is not None:
                self._sampler.stop(discard=True)
            if history_on:
                try:
                    cuda.stop_history()
                except Exception:
                    pass
            if nvml is not None:
                nvml.close()
            for written in (self.meta_path, self.markers_path):
                if written is not None:
                    written.unlink(missing_ok=True)
            for d in reversed(created):
                _rmdir_if_empty(d)
            raise

    def _open_nvml(self, uuids: list[str | None]) -> NvmlBackend | None:
        mode = self.options.nvml
        if mode == "off":
            self._nvml_reason = "nvml='off'"
            return None
        try:
            return self._backends.nvml(uuids)
        except CollectorError as e:
            if mode == "required":
                raise CollectorError(f"{e}. Pass nvml='optional' to record without NVML samples.") from e
            self._nvml_reason = str(e)
            self._warn(f"recording without NVML samples (no nvml-part files): {e}")
            return None

    def _claim_meta(self, rdir: Path, session: int) -> Path:
        """Write the first meta document under a name no other recording holds; updates the session number."""
        assert self._meta is not None
        path = write_new_meta(lambda n: rdir / layout.meta_name(session + n), self._document(end_time_us=None))
        claimed = next(s for s in range(session, session + 100_000) if layout.meta_name(s) == path.name)
        if claimed != session:  # another process with this rank took `session` meanwhile
            self._meta = replace(self._meta, session=claimed)
            write_meta(path, self._document(end_time_us=None))
        return path

    def __enter__(self) -> Recording:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(_exception=exc)

    def stop(self, *, _exception: BaseException | None = None) -> None:
        """Dump ``final``, disable history, stop NVML and write markers and meta. Idempotent."""
        global _current
        with _registry_lock:
            if self._state != "running":
                return
            self._state = "stopping"
        failures: list[tuple[str, BaseException]] = []
        try:
            self.dump(layout.FINAL_TAG)
        except Exception as e:
            failures.append(("the final snapshot", e))
        assert self._cuda is not None and self._markers is not None
        try:
            self._cuda.stop_history()
        except Exception as e:
            failures.append(("disabling allocator history", e))
        if markers.active() is self._markers:
            markers.set_active(None)
        for hooks in self._module_hooks:
            hooks.remove()
        self._module_hooks = []
        with _registry_lock:
            _current = None
        if self._sampler is not None:
            self._sampler.stop()
        if self._nvml is not None:
            self._nvml.close()
        with self._lock:
            for what, write in (("markers", self._write_markers), ("meta.json", self._write_final_meta)):
                try:
                    write()
                except Exception as e:
                    failures.append((what, e))
            self._state = "stopped"
        atexit.unregister(self._stop_at_exit)
        if failures:
            message = "; ".join(f"{what} failed: {e!r}" for what, e in failures)
            if _exception is None:
                raise CollectorError(f"{self.rank_dir}: {message}") from failures[0][1]
            warn(f"snapanalyze.collect: {self.rank_dir}: {message}")

    def _stop_at_exit(self) -> None:
        try:
            self.stop(_exception=RuntimeError("interpreter exit"))
        except Exception as e:
            warn(f"snapanalyze.collect: stopping the recording at exit failed: {e!r}")

    # -- dumping --------------------------------------------------------------------------------------------
    def dump(self, tag: str) -> Path:
        """Write ``snapshot-<tag>.pickle`` now (never overwriting) and refresh markers, NVML parts and meta."""
        layout.check_tag(tag)
        with self._lock:
            if self._state not in ("running", "stopping"):
                raise CollectorError(f"cannot dump {tag!r}: the recording into {self.run_dir} is not running")
            try:
                path = self._dump_snapshot(tag)
                self._refresh()
            except Exception as e:
                raise CollectorError(f"{self.rank_dir}: writing snapshot {tag!r} failed: {e!r}") from e
            return path

    def _dump_snapshot(self, tag: str) -> Path:
        assert self._cuda is not None and self.rank_dir is not None
        snapshot = self._cuda.snapshot()
        rdir = self.rank_dir

        def write(f: BinaryIO) -> None:
            pickle.dump(snapshot, f)

        path = write_new(lambda n: rdir / layout.snapshot_name(tag, n), write)
        self.snapshots.append(path)
        return path

    def _refresh(self) -> None:
        if self._sampler is not None:
            try:
                self._sampler.flush()
            except Exception as e:
                self._warn(f"flushing NVML samples failed: {e!r}")
        self._write_markers()
        assert self.meta_path is not None
        write_meta(self.meta_path, self._document(end_time_us=None))

    def _on_oom(self, device: int, alloc: int, device_allocated: int, device_free: int) -> None:
        with self._lock:
            if self._state != "running":
                return
            n = len(self.ooms) + 1
            event: dict[str, object] = {
                "n": n,
                "time_us": int(self._backends.clock_us()),
                "device": int(device),
                "alloc_bytes": int(alloc),
                "device_allocated_bytes": int(device_allocated),
                "device_free_bytes": int(device_free),
                "snapshot": None,
            }
            self.ooms.append(event)
            if n > self.options.max_oom_snapshots:
                return
            path = self._dump_snapshot(f"{layout.OOM_TAG_PREFIX}{n}")
            event["snapshot"] = path.name
            self._refresh()

    # -- files ----------------------------------------------------------------------------------------------
    def _write_markers(self) -> None:
        if self._markers is not None and self.markers_path is not None:
            write_table(self._markers.table(), self.markers_path, schema=MARKERS_SCHEMA)

    def _write_final_meta(self) -> None:
        assert self.meta_path is not None
        write_meta(self.meta_path, self._document(end_time_us=int(self._backends.clock_us())))

    def _document(self, *, end_time_us: int | None) -> dict[str, object]:
        assert self._meta is not None
        s = self._sampler
        nvml: dict[str, object] = {
            "enabled": s is not None,
            "reason": self._nvml_reason,
            "interval_ms": self.options.nvml_interval_ms,
            "parts": [p.name for p in s.parts] if s else [],
            "rows": s.rows_written if s else 0,
            "dropped_rows": s.dropped_rows if s else 0,
            "error": repr(s.error) if s and s.error else None,
        }
        return meta_document(
            self._meta, end_time_us=end_time_us, snapshots=[p.name for p in self.snapshots], ooms=self.ooms,
            nvml=nvml, oom_observer=self.oom_observer, warnings=self.warnings,
        )

    def _warn(self, message: str) -> None:
        self.warnings.append(message)
        warn(f"snapanalyze.collect: {message}", stacklevel=4)


def _nvml_facts(nvml: NvmlBackend | None, n_devices: int) -> tuple[tuple[str, ...], str | None]:
    if nvml is None:
        return (), None
    names: list[str] = []
    for i in range(min(n_devices, nvml.device_count())):
        try:
            names.append(nvml.name(i))
        except Exception:
            names.append("")
    try:
        driver: str | None = nvml.driver_version()
    except Exception:
        driver = None
    return tuple(names), driver


def _mkdirs(path: Path) -> list[Path]:
    """mkdir -p; returns the directories it created, outermost first."""
    missing = [p for p in (path, *path.parents) if not p.exists()][::-1]
    path.mkdir(parents=True, exist_ok=True)
    return missing


def _rmdir_if_empty(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass


def record(
    run: str | os.PathLike[str],
    *,
    max_entries: int = 1_000_000,
    stacks: Stacks = "python",
    nvml_interval_ms: float = 20.0,
    nvml: NvmlMode = "required",
    oom_snapshot: bool = True,
    max_oom_snapshots: int = 3,
    annotations: bool = True,
    nvml_flush_rows: int = 4096,
    nvml_flush_interval_s: float = 10.0,
    modules: Any = None,
    _backends: Backends | None = None,
) -> Recording:
    """Start recording this rank into ``run/rank=N/`` and return the running `Recording` (a context manager).

    Raises CollectorError, creating nothing, when torch, CUDA or (with ``nvml="required"``) NVML is missing.
    The keywords are `RecordOptions`' fields; `modules` (an nn.Module, or several) gets module-span hooks
    (`collect.modules`) for as long as the recording runs; `_backends` replaces the outside world in tests
    (see `testing`).
    """
    options = RecordOptions(
        max_entries=max_entries, stacks=stacks, nvml=nvml, nvml_interval_ms=nvml_interval_ms,
        oom_snapshot=oom_snapshot, max_oom_snapshots=max_oom_snapshots, annotations=annotations,
        nvml_flush_rows=nvml_flush_rows, nvml_flush_interval_s=nvml_flush_interval_s,
    )
    models = [] if modules is None else list(modules) if isinstance(modules, (list, tuple)) else [modules]
    hooks = [module_hooks(m) for m in models]          # a wrong type fails before anything starts
    try:
        rec = Recording(run, options, _backends).start()
    except BaseException:
        for h in hooks:
            h.remove()
        raise
    rec._module_hooks = hooks
    return rec


def active() -> Recording | None:
    """The running recording of this process, if any."""
    return _current


def dump(tag: str) -> Path:
    """Write ``snapshot-<tag>.pickle`` of the active recording now; CollectorError when none is running."""
    rec = _current
    if rec is None:
        raise CollectorError(f"collect.dump({tag!r}) needs an active collect.record(...)")
    return rec.dump(tag)
