"""A real CPU torch program's allocations as a snapshot, for rules that read a training loop's frames.

`CpuTrace` is a `TorchDispatchMode`: every op's output with new storage is an allocation (its size rounded to
512 bytes, a fresh address in one segment, the real Python stack innermost first) and the storage's end a free
(`weakref.finalize` on the storage, which torch keeps alive as long as anything in C++ holds it: a saved tensor
of the autograd graph too). `snapshot()` is the dict torch 2.11's `_snapshot()` writes: the trace, and the end
state laid out from what is still live. It stands in for CUDA, which this machine lacks; the frames are real
(torch's optimizer, module calls, autograd), the sizes are the CPU's.
"""

from __future__ import annotations

import traceback
import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

BASE = 0x7F00_0000_0000
T0 = 1_770_000_000_000_000


class CpuTrace(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int, int, list[dict[str, Any]]]] = []
        self.next = BASE
        self.layout: list[tuple[int, int]] = []
        self.live: dict[int, int] = {}
        self.by_ptr: dict[int, int] = {}

    @staticmethod
    def _frames() -> list[dict[str, Any]]:
        here = traceback.extract_stack()[:-2]                # without _frames and the method asking for it
        return [{"filename": f.filename, "line": f.lineno, "name": f.name} for f in reversed(here)]

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in inputs or ptr in self.by_ptr or storage.nbytes() == 0:
                continue
            size = -(-storage.nbytes() // 512) * 512
            addr, self.next = self.next, self.next + size
            self.by_ptr[ptr] = addr
            self.live[addr] = size
            self.layout.append((addr, size))
            self.events.append(("alloc", addr, size, self._frames()))
            weakref.finalize(storage, self._free, ptr, addr, size)
        return out

    def _free(self, ptr: int, addr: int, size: int) -> None:
        if self.by_ptr.get(ptr) == addr:
            del self.by_ptr[ptr]
        if self.live.pop(addr, None) is not None:
            frames = self._frames()
            self.events += [("free_requested", addr, size, frames), ("free_completed", addr, size, frames)]

    def snapshot(self) -> dict[str, Any]:
        def entry(k: int, action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
            return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": T0 + k,
                    "compile_context": "N/A", "user_metadata": "", "frames": frames}

        total = self.next - BASE
        trace = [entry(0, "segment_alloc", BASE, total, [])]
        trace += [entry(k, *e) for k, e in enumerate(self.events, start=1)]
        blocks: list[dict[str, Any]] = []
        for addr, size in self.layout:
            on = addr in self.live
            if not on and blocks and blocks[-1]["state"] == "inactive":
                blocks[-1]["size"] += size
                continue
            blocks.append({"address": addr, "size": size, "requested_size": size if on else 0,
                           "state": "active_allocated" if on else "inactive", "frames": []})
        held = sum(b["size"] for b in blocks if b["state"] != "inactive")
        segment = {"device": 0, "address": BASE, "total_size": total, "allocated_size": held, "active_size": held,
                   "requested_size": held, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                   "is_expandable": False, "frames": [], "blocks": blocks}
        return {"segments": [segment], "device_traces": [trace], "external_annotations": [],
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                                       "expandable_segments": False, "garbage_collection_threshold": 0.0,
                                       "roundup_power2_divisions": {"1": 0}}}
