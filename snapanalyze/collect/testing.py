"""Fakes of the collector's outside world, so its tests (and yours) run without torch, CUDA or NVML.

`FakeClock` is a deterministic µs clock; `FakeNvml` implements `nvml.NvmlBackend` from settable numbers;
`FakeCuda` implements `cuda.CudaBackend`, logging every call in `calls` (so a test can check that the final
snapshot came before history was disabled), keeping per-thread allocator metadata and annotation spans the
way torch does, and firing the OOM observer on `trigger_oom`. `fake_backends` assembles them into the
recorder's `Backends`. Nothing here touches a GPU or imports torch.
"""

from __future__ import annotations

import os
import platform
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import CollectorError
from .cuda import DeviceInfo, OomObserver
from .markers import TraceHooks
from .nvml import NvmlBackend
from .recorder import Backends

GIB = 1024**3
EPOCH_2024_US = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z in µs


class FakeClock:
    """µs since the epoch, starting at `start_us` and advancing `step_us` per reading (thread-safe)."""

    def __init__(self, start_us: int = EPOCH_2024_US, step_us: int = 1) -> None:
        self.now_us = start_us
        self.step_us = step_us
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            t = self.now_us
            self.now_us += self.step_us
            return t

    def advance(self, us: int) -> None:
        with self._lock:
            self.now_us += us


class FakeNvml:
    """An NvmlBackend whose devices report `used`/`total` and `procs` as set by the test.

    `procs[d]` lists (pid, used_bytes) on device d (None: NVML cannot list processes); by default it holds
    this process (`pid`, default os.getpid()) using 0 bytes.
    """

    def __init__(self, n_devices: int = 1, *, total_bytes: int = 80 * GIB, pid: int | None = None,
                 driver: str = "999.99") -> None:
        own = os.getpid() if pid is None else pid
        self.total = [total_bytes] * n_devices
        self.used = [0] * n_devices
        self.procs: list[list[tuple[int, int | None]] | None] = [[(own, 0)] for _ in range(n_devices)]
        self.driver = driver
        self.reads = 0
        self.closed = False
        self.fail_reads = False

    def device_count(self) -> int:
        return len(self.total)

    def memory(self, device: int) -> tuple[int, int, int]:
        if self.fail_reads:
            raise RuntimeError("fake NVML read failure")
        self.reads += 1
        used = self.used[device]
        return used, self.total[device] - used, self.total[device]

    def processes(self, device: int) -> list[tuple[int, int | None]] | None:
        procs = self.procs[device]
        return None if procs is None else list(procs)

    def name(self, device: int) -> str:
        return f"Fake GPU {device}"

    def driver_version(self) -> str:
        return self.driver

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeCuda:
    """A CudaBackend with `n_devices` fake GPUs; see the module docstring."""

    n_devices: int = 1
    total_bytes: int = 80 * GIB
    has_metadata: bool = True
    has_oom_observer: bool = True
    fail_snapshot: bool = False
    dist: tuple[int, int] | None = None
    calls: list[str] = field(default_factory=list)
    history_enabled: bool = False
    history_args: dict[str, object] = field(default_factory=dict)
    observers: list[OomObserver] = field(default_factory=list)
    annotations: list[dict[str, object]] = field(default_factory=list)
    allocated: dict[int, int] = field(default_factory=dict)
    reserved: dict[int, int] = field(default_factory=dict)
    metadata_sets: list[tuple[int, str]] = field(default_factory=list)   # (thread ident, value) in call order

    def __post_init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()

    def start_history(self, *, stacks: str, max_entries: int, annotations: bool) -> dict[str, object]:
        self.calls.append("start_history")
        self.history_enabled = True
        self.history_args = {"enabled": "all", "context": "all", "stacks": stacks, "max_entries": max_entries}
        if annotations:
            self.history_args["global_record_annotations"] = True
        return dict(self.history_args)

    def stop_history(self) -> None:
        self.calls.append("stop_history")
        self.history_enabled = False

    def snapshot(self) -> object:
        self.calls.append("snapshot")
        if self.fail_snapshot:
            raise RuntimeError("fake snapshot failure")
        return {
            "segments": [],
            "device_traces": [[] for _ in range(self.n_devices)],
            "allocator_settings": {"fake": True, "history_enabled": self.history_enabled},
            "external_annotations": list(self.annotations),
        }

    def attach_oom_observer(self, fn: OomObserver) -> bool:
        self.calls.append("attach_oom_observer")
        if not self.has_oom_observer:
            return False
        if fn not in self.observers:
            self.observers.append(fn)
        return True

    def trigger_oom(self, device: int = 0, alloc: int = 2 * GIB, device_allocated: int = 78 * GIB,
                    device_free: int = 1 * GIB) -> None:
        """Call the observers as torch's allocator does just before it raises OutOfMemoryError."""
        for fn in list(self.observers):
            fn(device, alloc, device_allocated, device_free)

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(i, "Fake GPU", self.total_bytes, f"fake-uuid-{i}") for i in range(self.n_devices)]

    def allocator_stats(self, device: int) -> tuple[int, int]:
        return self.allocated.get(device, 0), self.reserved.get(device, 0)

    # trace hooks: per-thread metadata, START/END annotation records like torch's external_annotations
    def get_metadata(self) -> str:
        return getattr(self._local, "metadata", "")

    def set_metadata(self, value: str) -> None:
        self._local.metadata = value
        with self._lock:
            self.metadata_sets.append((threading.get_ident(), value))

    @contextmanager
    def annotate(self, label: str) -> Iterator[None]:
        with self._lock:
            self.annotations.append({"name": label, "stage": "START", "device": 0})
        try:
            yield
        finally:
            with self._lock:
                self.annotations.append({"name": label, "stage": "END", "device": 0})

    def trace_hooks(self) -> TraceHooks:
        if not self.has_metadata:
            return TraceHooks(annotate=self.annotate)
        return TraceHooks(annotate=self.annotate, set_metadata=self.set_metadata, get_metadata=self.get_metadata)

    def distributed(self) -> tuple[int, int] | None:
        return self.dist

    def versions(self) -> dict[str, str | None]:
        return {"torch": "fake", "cuda_runtime": None, "python": platform.python_version()}


NvmlFactory = Callable[[Sequence[str | None]], NvmlBackend]


def failing_nvml(message: str = "NVML could not start (fake: no driver)") -> NvmlFactory:
    """A `Backends.nvml` factory that fails like a node without an NVIDIA driver."""

    def open_(_uuids: Sequence[str | None]) -> NvmlBackend:
        raise CollectorError(message)

    return open_


def fake_backends(
    cuda: FakeCuda | None = None,
    nvml: NvmlBackend | None = None,
    *,
    nvml_factory: NvmlFactory | None = None,
    clock: FakeClock | None = None,
    env: Mapping[str, str] | None = None,
    host: str = "fake-host",
) -> Backends:
    """`Backends` built from fakes (a fresh FakeCuda/FakeNvml/FakeClock for each one not given)."""
    cuda_ = cuda if cuda is not None else FakeCuda()
    nvml_ = nvml if nvml is not None else FakeNvml(cuda_.n_devices)
    factory: NvmlFactory = nvml_factory if nvml_factory is not None else (lambda _uuids: nvml_)
    return Backends(
        cuda=lambda: cuda_,
        nvml=factory,
        clock_us=clock if clock is not None else FakeClock(),
        env=env if env is not None else {},
        host=lambda: host,
    )
