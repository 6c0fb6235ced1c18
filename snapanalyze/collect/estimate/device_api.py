"""`torch.cuda` as a program sees it during an estimate: one device whose memory is the capture's.

Contract: ``with emulated_cuda(cap, total, on_snapshot):`` makes the calls a GPU program makes of ``torch.cuda``
answer from the capture `cap` (`collect.cpu.CpuCapture`) on a build of torch without CUDA: ``is_available()`` is
True with one device; the memory statistics (``memory_allocated``, ``max_memory_reserved``, ``mem_get_info``,
``reset_peak_memory_stats`` …) are the allocator model's; ``empty_cache`` is the capture's;
``memory._record_memory_history`` starts or stops the capture's recording with the program's own arguments (its
first call starts the trace's window where a GPU run's starts; blocks made before keep the stacks the estimate
recorded from the start); ``memory._snapshot`` returns the capture's snapshot and
``memory._dump_snapshot(path)`` hands it to `on_snapshot` instead of writing the program's file (the estimate
writes one file, where the user asked); ``synchronize``, NVTX ranges, seeds and events do nothing (no kernel runs);
``torch.autocast("cuda")`` autocasts the CPU tensors that stand for the device's. Everything is restored on exit.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

NAME = "estimate (snapanalyze, no GPU)"


class _Event:
    """torch.cuda.Event: nothing runs, so no time passes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, *args: Any, **kwargs: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def wait(self, *args: Any, **kwargs: Any) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0


class _Properties:
    def __init__(self, total: int, capability: tuple[int, int]) -> None:
        self.name = NAME
        self.total_memory = total
        self.major, self.minor = capability
        self.multi_processor_count = 132


@contextlib.contextmanager
def emulated_cuda(cap: Any, total: int, on_snapshot: Callable[[dict[str, Any]], None],
                  torch_version: str = "2.13", capability: tuple[int, int] = (9, 0)) -> Iterator[None]:
    import torch
    import torch.cuda.memory as memory
    import torch.cuda.nvtx as nvtx

    def snapshot(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return cap.snapshot(torch_version)

    def dump(filename: Any = "dump_snapshot.pickle", *args: Any, **kwargs: Any) -> None:
        on_snapshot(cap.snapshot(torch_version))

    first = [True]

    def record(enabled: Any = "all", context: Any = "all", stacks: str = "all", max_entries: int = sys.maxsize,
               *args: Any, **kwargs: Any) -> None:
        if enabled is True:                  # the legacy signature: _record_memory_history(True, ...)
            enabled = "all"
        if not enabled:
            cap.record_memory_history(None)
            return
        if first.pop() if first else False:  # the program's own window starts here, as on its GPU
            cap._drain()
            cap.recording_from = len(cap.entries)
        cap.record_memory_history(stacks="python" if stacks == "python" else "all", max_entries=int(max_entries))

    def allocated(device: Any = None) -> int:
        cap._drain()
        return int(cap.allocator.allocated_bytes)

    def reserved(device: Any = None) -> int:
        cap._drain()
        return int(cap.allocator.reserved)

    def peak_allocated(device: Any = None) -> int:
        cap._drain()
        return int(max(cap.peak_allocated, cap.allocator.allocated_bytes))

    def peak_reserved(device: Any = None) -> int:
        cap._drain()
        return int(max(cap.peak_reserved, cap.allocator.reserved))

    def stats(device: Any = None) -> dict[str, int]:
        return {"allocated_bytes.all.current": allocated(), "allocated_bytes.all.peak": peak_allocated(),
                "reserved_bytes.all.current": reserved(), "reserved_bytes.all.peak": peak_reserved(),
                "active_bytes.all.current": allocated(), "active_bytes.all.peak": peak_allocated(),
                "num_ooms": sum(1 for e in cap.entries if e.action == "oom")}

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    @contextlib.contextmanager
    def no_range(*args: Any, **kwargs: Any) -> Iterator[None]:
        yield

    original_autocast = torch.autocast

    class autocast(original_autocast):  # type: ignore[misc, valid-type]
        """torch.autocast("cuda", …): the CPU tensors stand for the device's, so the CPU's autocast runs."""

        def __init__(self, device_type: str = "cuda", *args: Any, **kwargs: Any) -> None:
            super().__init__("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    patches: list[tuple[Any, str, Any]] = [
        (torch.cuda, "is_available", lambda: True),
        (torch.cuda, "is_initialized", lambda: True),
        (torch.cuda, "device_count", lambda: 1),
        (torch.cuda, "current_device", lambda: 0),
        (torch.cuda, "set_device", nothing),
        (torch.cuda, "init", nothing),
        (torch.cuda, "_lazy_init", nothing),
        (torch.cuda, "get_device_name", lambda *a, **k: NAME),
        (torch.cuda, "get_device_capability", lambda *a, **k: capability),
        (torch.cuda, "get_device_properties", lambda *a, **k: _Properties(total, capability)),
        (torch.cuda, "is_bf16_supported", lambda *a, **k: capability >= (8, 0)),
        (torch.cuda, "synchronize", nothing),
        (torch.cuda, "manual_seed", nothing),
        (torch.cuda, "manual_seed_all", nothing),
        (torch.cuda, "seed", nothing),
        (torch.cuda, "seed_all", nothing),
        (torch.cuda, "Event", _Event),
        (torch.cuda, "empty_cache", lambda: cap.empty_cache()),
        (torch.cuda, "mem_get_info", lambda *a, **k: (max(0, total - reserved()), total)),
        (torch.cuda, "memory_allocated", allocated),
        (torch.cuda, "memory_reserved", reserved),
        (torch.cuda, "max_memory_allocated", peak_allocated),
        (torch.cuda, "max_memory_reserved", peak_reserved),
        (torch.cuda, "memory_stats", stats),
        (torch.cuda, "reset_peak_memory_stats", lambda *a, **k: cap.reset_peaks()),
        (torch.cuda, "reset_max_memory_allocated", lambda *a, **k: cap.reset_peaks()),
        (memory, "_record_memory_history", record),
        (memory, "_snapshot", snapshot),
        (memory, "_dump_snapshot", dump),
        (nvtx, "range_push", nothing),
        (nvtx, "range_pop", nothing),
        (nvtx, "mark", nothing),
        (nvtx, "range", no_range),
        (torch, "autocast", autocast),
    ]
    # torch.cuda re-exports these from torch.cuda.memory: a program may call either name
    on_cuda = {name: value for obj, name, value in patches if obj is torch.cuda}
    patches += [(memory, name, on_cuda[name]) for name in (
        "empty_cache", "mem_get_info", "memory_allocated", "memory_reserved", "max_memory_allocated",
        "max_memory_reserved", "memory_stats", "reset_peak_memory_stats", "reset_max_memory_allocated")]
    amp = getattr(torch, "amp", None)
    if amp is not None and getattr(amp, "autocast", None) is original_autocast:
        patches.append((amp, "autocast", autocast))
    saved = [(obj, name, obj.__dict__.get(name, _MISSING)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in reversed(saved):
            if value is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, value)


_MISSING = object()
