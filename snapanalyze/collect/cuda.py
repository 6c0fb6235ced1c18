"""The recorder's view of torch and CUDA: one protocol, one real implementation that imports torch lazily.

`CudaBackend` is everything `record()` asks of torch: start/stop allocator history, take a snapshot,
attach the out-of-memory observer, describe the devices, read allocator stats, provide the marker
`TraceHooks`, and report an initialised ``torch.distributed`` group. `TorchCudaBackend.load()` builds the real
one and turns the two environment failures into `CollectorError`: torch missing (install
``snapanalyze[collect]``) and CUDA unavailable (a CPU-only build or no GPU: collecting needs a GPU node).
Optional torch features are probed, never assumed: ``global_record_annotations`` (passed when the installed
``_record_memory_history`` accepts it), ``_set_memory_metadata``/``_get_memory_metadata`` (torch ≥ 2.10)
and ``_cuda_attach_out_of_memory_observer``. Tests substitute `testing.FakeCuda`.
"""

from __future__ import annotations

import inspect
import platform
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..errors import CollectorError
from .markers import TraceHooks

OomObserver = Callable[[int, int, int, int], None]
"""torch calls it as fn(device, alloc_bytes, device_allocated_bytes, device_free_bytes) before raising."""


@dataclass(frozen=True)
class DeviceInfo:
    """A CUDA device as this process numbers it."""

    index: int
    name: str
    total_memory_bytes: int
    uuid: str | None = None


@runtime_checkable
class CudaBackend(Protocol):
    """What the recorder needs from torch + CUDA."""

    def start_history(self, *, stacks: str, max_entries: int, annotations: bool) -> dict[str, object]:
        """Enable allocator history ("all" events and contexts); returns the arguments actually passed."""
        ...

    def stop_history(self) -> None: ...

    def snapshot(self) -> object:
        """``torch.cuda.memory._snapshot()``: a dict of builtins, ready to pickle."""
        ...

    def attach_oom_observer(self, fn: OomObserver) -> bool:
        """Have `fn` called on every CUDA OOM; False if this torch cannot. Observers cannot be detached."""
        ...

    def devices(self) -> list[DeviceInfo]: ...

    def allocator_stats(self, device: int) -> tuple[int, int]:
        """(memory_allocated, memory_reserved) of this process on `device`."""
        ...

    def trace_hooks(self) -> TraceHooks: ...

    def distributed(self) -> tuple[int, int] | None:
        """(rank, world_size) of an initialised torch.distributed group, else None."""
        ...

    def versions(self) -> dict[str, str | None]: ...


_oom_lock = threading.Lock()
_oom_attached: set[int] = set()


class TorchCudaBackend:
    """`CudaBackend` on the installed torch; build it with `load()`."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    @classmethod
    def load(cls) -> TorchCudaBackend:
        """Import torch and check CUDA; raises CollectorError with what to do when either is missing."""
        try:
            import torch
        except ImportError as e:
            raise CollectorError(
                "torch is not installed: collecting snapshots needs torch with CUDA on the GPU node; "
                "pip install 'snapanalyze[collect]' there (analysing snapshots needs neither)"
            ) from e
        if not torch.cuda.is_available():
            cuda_build = getattr(torch.version, "cuda", None)
            if not cuda_build:
                why = f"torch {torch.__version__} is a CPU-only build"
            else:
                why = (f"torch {torch.__version__} (CUDA {cuda_build}) sees no GPU "
                       "(no driver, or CUDA_VISIBLE_DEVICES hides every device)")
            raise CollectorError(
                f"CUDA is not available: {why}; collecting needs a GPU node with a CUDA build of torch. "
                "Analysing snapshots (snapanalyze load/attribute/…) works anywhere."
            )
        return cls(torch)

    def start_history(self, *, stacks: str, max_entries: int, annotations: bool) -> dict[str, object]:
        record = self._torch.cuda.memory._record_memory_history
        kwargs: dict[str, object] = {"enabled": "all", "context": "all", "stacks": stacks, "max_entries": max_entries}
        if annotations and _accepts(record, "global_record_annotations"):
            kwargs["global_record_annotations"] = True
        try:
            record(**kwargs)
        except Exception as e:
            raise CollectorError(f"enabling allocator history failed: {e}") from e
        return kwargs

    def stop_history(self) -> None:
        self._torch.cuda.memory._record_memory_history(enabled=None)

    def snapshot(self) -> object:
        return self._torch.cuda.memory._snapshot()

    def attach_oom_observer(self, fn: OomObserver) -> bool:
        attach = getattr(self._torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return False
        with _oom_lock:  # torch keeps every observer forever: attach each function once per process
            if id(fn) not in _oom_attached:
                attach(fn)
                _oom_attached.add(id(fn))
        return True

    def devices(self) -> list[DeviceInfo]:
        cuda = self._torch.cuda
        out = []
        for i in range(cuda.device_count()):
            props = cuda.get_device_properties(i)
            uuid = getattr(props, "uuid", None)
            out.append(DeviceInfo(i, str(props.name), int(props.total_memory), None if uuid is None else str(uuid)))
        return out

    def allocator_stats(self, device: int) -> tuple[int, int]:
        cuda = self._torch.cuda
        return int(cuda.memory_allocated(device)), int(cuda.memory_reserved(device))

    def trace_hooks(self) -> TraceHooks:
        torch = self._torch
        memory = torch.cuda.memory

        def annotate(label: str) -> Any:
            return torch.autograd.profiler.record_function(label)

        return TraceHooks(
            annotate=annotate,
            set_metadata=getattr(memory, "_set_memory_metadata", None),
            get_metadata=getattr(memory, "_get_memory_metadata", None),
        )

    def distributed(self) -> tuple[int, int] | None:
        dist = getattr(self._torch, "distributed", None)
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return int(dist.get_rank()), int(dist.get_world_size())

    def versions(self) -> dict[str, str | None]:
        torch = self._torch
        return {
            "torch": str(torch.__version__),
            "cuda_runtime": getattr(torch.version, "cuda", None),
            "python": platform.python_version(),
        }


def _accepts(fn: Callable[..., object], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
