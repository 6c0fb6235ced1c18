"""The CPU capture: run real PyTorch code on the CPU as if its tensors lived on a CUDA device, and record what the
CUDA caching allocator would have recorded, with the truth about every block.

Contract: ``with CpuCapture(...) as cap:`` emulates one CUDA device for the code inside it. Tensors made inside
it are the device's (as if ``torch.set_default_device("cuda")``; with ``default_device=False`` only those made
with ``device="cuda"``, as a plain program's), except inside ``cap.host()`` and for ops whose tensor inputs all live
on the host; tensors made before it are the host's. ``.to("cuda")`` / ``.cuda()`` of a
host tensor (``Module.to`` included) copies it onto the device, of a device tensor is a no-op; ``.cpu()`` /
``.to("cpu")`` of a device tensor copies it to the host; ``device="cuda"`` in any torch call means the device.
Every storage made on the device is a block: the caching-allocator model (`snapanalyze.allocator`) places it
as CUDA would (rounding, pools, segments, addresses) and its frees, segment reservations and, past a
`capacity`, an out-of-memory (an ``oom`` entry, then ``torch.OutOfMemoryError`` in the program) become trace
entries. `record_memory_history(enabled, stacks, max_entries)` starts recording stacks as
``torch.cuda.memory._record_memory_history`` does (`frames`: the program's Python frames; a backward's on the
autograd device thread); blocks made before it predate the window. `empty_cache()` is
``torch.cuda.empty_cache()``. `snapshot(torch_version)` is ``torch.cuda.memory._snapshot()`` in that version's
layout (`snapshot.write`), `facts()` what the capture knows of each block (`truth.BlockFacts`).

What it records of each block, from the objects themselves: its roles (a module's parameter or buffer, a
parameter's ``.grad``, an optimizer's state, a KV cache object's tensor, an input of the outermost module,
a tensor an autograd node saved, an autocast copy of a parameter, a cuBLAS workspace) and the context of its
allocation (forward, backward, optimizer step or outside them; the module path and classes running — in a
backward, those of the forward call that made the autograd node; the torch function, aten op and node; the
program's Python stack; the record_function spans open). A cuBLAS workspace (`cublas_workspace` bytes, by
default PyTorch's pre-Hopper 8,519,680) is allocated at the first matrix multiply of each thread (the program's
and the autograd device thread's), as CUDA builds do; CPU kernels' own scratch memory is invisible here, as
is everything outside the allocator.
"""

from __future__ import annotations

import inspect
import re
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from ...allocator.settings import AllocatorSettings, with_changes
from ...allocator.state import Allocator, Block, Driver
from ...errors import CollectorError
from . import frames as frames_mod
from .frames import Frame, StackReader, cpp_frames

MiB = 1 << 20
CUBLAS_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8       # PyTorch's default per handle and stream before Hopper
# ops that call cuBLAS (a composite such as einsum or linear reaches the mode whole where autograd is off)
_MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "addmv", "mv", "_addmm_activation", "dot",
                      "vdot", "addr", "matmul", "einsum", "linear", "bilinear", "tensordot", "chain_matmul"})
_SDPA_FUSED = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
               "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_fused_attention")
_SAVED = "_saved_"
_BACKWARD_CALLS = ("backward", "grad", "_engine_run_backward")
_TORCH_OPTIM = re.compile(r"(^|/)torch/optim/")
_TORCH = re.compile(r"(^|/)torch/")
_TAG = "snapanalyze.context"


@dataclass(frozen=True)
class Context:
    """Where an allocation happened (interned: blocks share them)."""

    phase: str                      # "forward", "backward", "optimizer" or "outside"
    module: str = ""                # the innermost module's path ("" outside modules)
    classes: tuple[str, ...] = ()   # the module classes running, outermost first (module.qualname)
    code: int = -1                  # the program's full Python stack (a stack id; the device thread does not cut it)
    function: str = ""              # the torch function running
    op: str = ""                    # the aten overload that allocated
    node: str = ""                  # the autograd node running (backward)
    forward: int = -1               # backward: the context of the forward call that made the node
    optimizer: str = ""             # the optimizer whose step runs
    spans: tuple[str, ...] = ()     # record_function spans open
    host_copy: bool = False         # a host → device copy (.to / .cuda)
    autocast: bool = False          # autocast's cast of a parameter
    factory: bool = False           # an op without tensor inputs (torch.randint, zeros, arange …)
    recompute: bool = False         # a forward module ran inside a backward (activation checkpointing)
    calls: tuple[int, ...] = ()     # the module calls running (ids), outermost first


@dataclass
class Tracked:
    """One block: a device storage (or a workspace) and what is known of it."""

    sid: int
    size: int
    addr: int
    alloc: int                              # index of its alloc entry in `CpuCapture.entries`
    context: int
    frames: int = -1                        # the recorded stack (an id of `CpuCapture.stacks`; −1: not recorded)
    free: int = -1                          # index of its free_completed entry (−1: live)
    roles: dict[str, str] = field(default_factory=dict)   # role → detail (the first seen)
    shape: tuple[int, ...] = ()             # the shape of the first tensor made on it
    dtype: str = ""


@dataclass(frozen=True)
class Entry:
    """A trace entry as the allocator records it (the snapshot's `device_traces` row, before layout)."""

    action: str
    addr: int
    size: int
    time_us: int
    frames: int = -1                        # stack id, −1: none recorded
    sid: int = -1                           # the block, for alloc/free entries
    device_free: int = 0                    # oom entries


class _Device(Driver):
    """cudaMalloc as the model sees it: segments at rising addresses, refused past `capacity` bytes reserved."""

    def __init__(self, capacity: int | None) -> None:
        self.total = capacity
        self.next = 0x7F3A_0000_0000

    def reserve(self, n: int, reserved: int) -> int | None:
        if self.total is not None and reserved + n > self.total:
            return None
        addr = self.next
        self.next += -(-n // (2 * MiB)) * (2 * MiB)
        return addr

    def map(self, n: int, reserved: int) -> bool:
        return self.total is None or reserved + n <= self.total

    def address_range(self, n: int) -> int:
        addr = self.next
        self.next += n
        return addr


def _storage(t: Any) -> Any | None:
    """A tensor's untyped storage, None for tensors without one the device would hold (meta, sparse, nested)."""
    try:
        if t.is_meta or t.layout is not _torch().strided:
            return None
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None


def _torch() -> Any:
    import torch
    return torch


def _is_cuda(device: Any) -> bool:
    if device is None:
        return False
    if isinstance(device, str):
        return device.startswith("cuda")
    return getattr(device, "type", None) == "cuda"


def _tensors(obj: Any, depth: int = 0) -> Iterator[Any]:
    """Tensors in an argument: itself, or inside lists, tuples and dicts (a few levels deep)."""
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x, depth + 1)


def _cache_tensors(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Iterator[Any]:
    """The tensors of KV cache objects inside a module's outputs or arguments: objects whose class is named
    *Cache (transformers' Cache classes and their layers) and the legacy `past_key_values` tuples."""
    torch = _torch()
    seen = set() if seen is None else seen
    if depth > 4 or id(obj) in seen:
        return
    seen.add(id(obj))
    if type(obj).__name__.endswith("Cache"):
        yield from _all_tensors(obj, 0, seen)
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key == "past_key_values" and not isinstance(value, torch.Tensor):
                yield from _all_tensors(value, 0, seen)
            else:
                yield from _cache_tensors(value, depth + 1, seen)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _cache_tensors(x, depth + 1, seen)


def _all_tensors(obj: Any, depth: int, seen: set[int]) -> Iterator[Any]:
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if depth > 4 or id(obj) in seen and depth:
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        items: Any = obj.values()
    elif isinstance(obj, (list, tuple)):
        items = obj
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        items = vars(obj).values()
    else:
        return
    for x in items:
        yield from _all_tensors(x, depth + 1, seen)


class CpuCapture:
    """See the module docstring."""

    def __init__(self, *, settings: str | AllocatorSettings = "", capacity: int | None = None,
                 cublas_workspace: int | None = CUBLAS_WORKSPACE, clock: Callable[[], int] | None = None,
                 default_device: bool = True, cuda_identity: bool = False) -> None:
        self.settings = settings if isinstance(settings, AllocatorSettings) else \
            with_changes(AllocatorSettings(), [s for s in settings.split(",") if s.strip()])
        self.capacity = capacity
        self.default_device = default_device    # a factory without device= makes a device tensor (else a host one)
        self.cuda_identity = cuda_identity      # a device tensor's .device is cuda:0 and .is_cuda True to the program
        self.cublas_workspace = cublas_workspace
        self.clock = clock or (lambda: time.time_ns() // 1000)     # µs since the epoch, as `time_us`
        self.allocator = Allocator(self.settings, _Device(capacity))
        self.entries: list[Entry] = []
        self.blocks: list[Tracked] = []
        self.live: dict[int, tuple[Tracked, Any]] = {}        # storage key → (block, its weakref)
        self.contexts: list[Context] = []
        self._context_ids: dict[Context, int] = {}
        self.stacks: list[tuple[Frame, ...]] = []
        self._stack_ids: dict[tuple[Frame, ...], int] = {}
        self.annotations: list[dict[str, Any]] = []
        self.recording_from: int | None = None
        self.stacks_kind = "python"
        self.max_entries = sys.maxsize
        self._pending: list[tuple[int, tuple[Frame, ...] | None]] = []   # frees weakref callbacks saw: key, stack
        self._modules: list[tuple[Any, str, int]] = []       # module stack: (module, path, call id)
        self._calls = 0
        self.softmax_shapes: dict[int, set[tuple[int, ...]]] = {}   # module call → its softmaxes' (L, S, numel)
        self._paths: dict[int, str] = {}                      # id(module) → path under its outermost module
        self._roots: weakref.WeakSet[Any] = weakref.WeakSet()
        self._params: Any = None                              # parameters hooked (a WeakIdKeyDictionary)
        self._optimizers: list[str] = []
        self._optimizer_files: set[str] = set()
        self._spans: list[str] = []
        self._host = 0
        self._force_device = 0
        self._copy_in = 0
        self._autocast: tuple[tuple[str, Any], ...] = ()     # autocasts on in the torch call running (DeviceMode)
        self._workspaces: set[str] = set()
        self._functions: list[str] = []
        self._saved_names: dict[str, tuple[str, ...]] = {}
        self._last_time = 0
        self._handles: list[Any] = []
        self._modes: list[Any] = []
        self.active = False
        self.reader: StackReader | None = None
        self.outermost: set[str] = set()      # files whose frames end a stack (a runner's: runpy, the estimate's)
        self.peak_allocated = self.peak_reserved = 0   # max_memory_allocated / max_memory_reserved since reset

    # -- entering and leaving ----------------------------------------------------------------------------------
    def __enter__(self) -> CpuCapture:
        try:
            import torch  # noqa: F401
        except ImportError as e:   # pragma: no cover - the collect extra
            raise CollectorError("the CPU capture needs torch: pip install 'snapanalyze[collect]'") from e
        from torch.nn.modules import module as module_mod
        from torch.optim import optimizer as optimizer_mod
        from torch.utils.weak import WeakIdKeyDictionary

        from . import modes
        from . import tracker as this
        self._params = WeakIdKeyDictionary()
        device_mode, alloc_mode = modes.DeviceMode(self), modes.AllocMode(self)
        self.reader = StackReader(frames_mod.own_files(this, modes, frames_mod),
                                  type(device_mode).__torch_function__.__code__, self.outermost)

        def others() -> bool:   # global module hooks besides the capture's two
            return len(module_mod._global_forward_pre_hooks) + len(module_mod._global_forward_hooks) \
                + len(module_mod._global_backward_hooks) + len(module_mod._global_backward_pre_hooks) > 2
        self.reader.other_global_hooks = others
        self._handles = [
            module_mod.register_module_forward_pre_hook(self._forward_pre),
            module_mod.register_module_forward_hook(self._forward_post, with_kwargs=True, always_call=True),
            optimizer_mod.register_optimizer_step_pre_hook(self._step_pre),
            optimizer_mod.register_optimizer_step_post_hook(self._step_post),
        ]
        self._modes = [device_mode, alloc_mode]
        self.active = True
        device_mode.__enter__()
        alloc_mode.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(None, None, None)
        self._modes = []
        for h in self._handles:
            h.remove()
        self._handles = []
        self._drain()
        self.scan_roles()
        self.active = False

    # -- the public controls -------------------------------------------------------------------------------------
    def record_memory_history(self, enabled: str | None = "all", *, stacks: str = "python",
                              max_entries: int = sys.maxsize) -> None:
        """`torch.cuda.memory._record_memory_history`: from now on, allocations record their stacks and the trace
        keeps the last `max_entries` entries (``enabled=None`` stops recording)."""
        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', not {stacks!r}")
        self._drain()
        if enabled is None:
            self.recording_from = None
            return
        if self.recording_from is None:
            self.recording_from = len(self.entries)
        self.stacks_kind, self.max_entries = stacks, max_entries

    def reset_peaks(self) -> None:
        """`torch.cuda.reset_peak_memory_stats()`: the peaks start again from what is allocated and reserved now."""
        self._drain()
        self.peak_allocated, self.peak_reserved = self.allocator.allocated_bytes, self.allocator.reserved

    @contextmanager
    def host(self) -> Iterator[None]:
        """Tensors made inside live on the host: the device does not hold them."""
        self._host += 1
        try:
            yield
        finally:
            self._host -= 1

    def empty_cache(self) -> None:
        """`torch.cuda.empty_cache()`: cached segments go back to the driver."""
        self._drain()
        before = len(self.allocator.events)
        self.allocator.release_cached()
        self._segment_entries(before, self._stack_now() if self.recording else -1)

    def scan_roles(self) -> None:
        """Look at every module and optimizer the program holds (found through the garbage collector: a module
        that never ran, such as an autoencoder's unused encoder, holds device memory too) and note the roles of
        their blocks: parameters, buffers, grads, optimizer state. Run at each snapshot and at the end; the
        outermost module calls and optimizer steps scan theirs as they run."""
        import gc
        torch = _torch()
        self._drain()
        module, optimizer = torch.nn.Module, torch.optim.Optimizer
        for obj in gc.get_objects():
            kind = type(obj)                  # not isinstance: some objects warn when asked for __class__
            if issubclass(kind, module):
                self._scan_module(obj)
            elif issubclass(kind, optimizer):
                self._scan_optimizer(obj)

    def snapshot(self, torch_version: str = "2.13", paths: Any = None) -> dict[str, Any]:
        """`torch.cuda.memory._snapshot()` now, in that torch's layout, file paths mapped by `paths`
        (`snapshot.write`)."""
        from .snapshot import write
        self.scan_roles()
        return write(self, torch_version, paths)

    def facts(self, index: int) -> list[Any]:
        """What each block live right after the snapshot trace's entry `index` is (`truth.facts`)."""
        from .truth import facts
        self.scan_roles()
        return facts(self, index)

    def rows(self, index: int, labeller: Any = None) -> list[dict[str, object]]:
        """The labels table at that instant (`truth.rows`), labelled by `labeller` (default: lifecycles)."""
        from .truth import lifecycle_label, rows
        self.scan_roles()
        return rows(self, index, labeller or lifecycle_label)

    @property
    def recording(self) -> bool:
        return self.recording_from is not None

    # -- what the modes call ---------------------------------------------------------------------------------
    def is_device(self, t: Any) -> bool:
        """Whether the device holds the tensor's storage (frees seen so far applied first: a storage freed just
        now may have left its address to another)."""
        self._drain()
        st = _storage(t)
        return st is not None and st._cdata in self.live

    def context_id(self, ctx: Context) -> int:
        found = self._context_ids.get(ctx)
        if found is None:
            found = self._context_ids[ctx] = len(self.contexts)
            self.contexts.append(ctx)
        return found

    def stack_id(self, stack: tuple[Frame, ...]) -> int:
        found = self._stack_ids.get(stack)
        if found is None:
            found = self._stack_ids[stack] = len(self.stacks)
            self.stacks.append(stack)
        return found

    def _time(self) -> int:
        self._last_time = max(self.clock(), self._last_time)
        return self._last_time

    def _stack_now(self) -> int:
        assert self.reader is not None
        return self.stack_id(self.reader.python_stack(sys._getframe(1), self._in_backward()))

    @staticmethod
    def _in_backward() -> bool:
        return _torch()._C._current_autograd_node() is not None

    def module_now(self) -> tuple[str, tuple[str, ...]]:
        """The innermost module's path and the classes of the modules running, outermost first."""
        if not self._modules:
            return "", ()
        return self._modules[-1][1], tuple(_qualname(m) for m, _, _ in self._modules)

    def calls_now(self) -> tuple[int, ...]:
        """The module calls running, outermost first."""
        return tuple(c for _, _, c in self._modules)

    def forward_context(self, function: str) -> int:
        """The context of a forward call now (what its autograd nodes are tagged with)."""
        assert self.reader is not None
        module, classes = self.module_now()
        code = self.stack_id(self.reader.python_stack(sys._getframe(1), False))
        return self.context_id(Context("forward" if module else "outside", module, classes, code, function,
                                       calls=self.calls_now()))

    def allocation_context(self, op: str, *, factory: bool, autocast: bool, full_stack: int) -> Context:
        torch = _torch()
        node = torch._C._current_autograd_node()
        module, classes = self.module_now()
        function = self._functions[-1] if self._functions else ""
        spans = tuple(self._spans)
        if node is not None:
            forward = node.metadata.get(_TAG, -1) if hasattr(node, "metadata") else -1
            return Context("backward", module, classes, full_stack, function, op, _node_name(node), forward,
                           "", spans, False, autocast, factory, recompute=bool(module), calls=self.calls_now())
        phase = "forward" if module else ("optimizer" if self._optimizers and self._optimizer_code(full_stack)
                                          else "outside")
        return Context(phase, module, classes, full_stack, function, op, "", -1,
                       self._optimizers[-1] if self._optimizers else "", spans, self._copy_in > 0, autocast,
                       factory, calls=self.calls_now())

    def _optimizer_code(self, stack_id: int) -> bool:
        """Whether an allocation inside an optimizer step is the step's own (its innermost frame of code other than
        torch's plumbing is the optimizer's: torch.optim or the optimizer class's file), not a closure's that the
        step called (LBFGS, Lightning's automatic optimisation)."""
        for filename, _, _ in self.stacks[stack_id]:
            if filename in self._optimizer_files or _TORCH_OPTIM.search(filename):
                return True
            if not _TORCH.search(filename):
                return False
        return False

    def allocate(self, storages: list[tuple[Any, Any]], op: str, frame: Any, *, factory: bool,
                 autocast: bool, cast: bool = False) -> None:
        """New device storages an op made, each with the first tensor made on it (its caller's frame: `frame`):
        place each as a block and record its entries; then, at a thread's first matrix multiply, its cuBLAS
        workspace. `autocast`: autocast's copy of a parameter (a role); `cast`: any cast autocast made (its C++
        frames, as CUDA records them)."""
        assert self.reader is not None
        self._drain()
        torch = _torch()
        in_backward = self._in_backward()
        full = self.reader.python_stack(frame, False)
        recorded = self.reader.python_stack(frame, True) if in_backward else full
        ctx = self.allocation_context(op, factory=factory, autocast=autocast, full_stack=self.stack_id(full))
        ctx_id = self.context_id(ctx)
        node = torch._C._current_autograd_node() if in_backward else None
        python_node = node is not None and _is_python_node(node)
        function = self._functions[-1] if self._functions else None
        if in_backward and function in _BACKWARD_CALLS:
            function = None                               # the call that ran the backward, not an op's
        name = _op_short(op)
        sdpa_math = function == "scaled_dot_product_attention" and not name.startswith(_SDPA_FUSED)

        def stack(workspace: bool = False) -> int:
            if not self.recording:
                return -1
            if self.stacks_kind == "python":
                return self.stack_id(recorded)
            return self.stack_id(cpp_frames(recorded, op=op, function=function, node=ctx.node or None,
                                            python_node=python_node, workspace=workspace,
                                            autocast=autocast or cast,
                                            sdpa_math=sdpa_math))
        for st, t in storages:
            key = st._cdata
            block = self._place(int(st.nbytes()), ctx_id, stack())
            block.shape, block.dtype = tuple(t.shape), str(t.dtype).removeprefix("torch.")
            self.live[key] = (block, weakref.ref(st, self._make_callback(key)))
            if ctx.host_copy and ctx.phase == "outside" and not _moved_by_module(full):
                block.roles.setdefault("input", "copied to the device")
            if autocast:
                block.roles.setdefault("autocast_copy", op)
        if self.cublas_workspace and name in _MATMULS:
            thread = "device" if in_backward else "main"
            if thread not in self._workspaces:
                self._workspaces.add(thread)
                ws = self._place(self.cublas_workspace, ctx_id, stack(workspace=True))
                ws.roles["workspace"] = f"cuBLAS workspace of the {thread} thread"

    def resize(self, key: int, st: Any, t: Any, op: str, frame: Any) -> None:
        """A device storage changed size in place (resize_, an out= argument): CUDA frees the old block and
        allocates the new size, and the storage keeps its roles."""
        block, _ = self.live.pop(key)
        self._free(block, -1)
        self.allocate([(st, t)], op, frame, factory=False, autocast=False)
        self.live[key][0].roles.update(block.roles)

    def _place(self, size: int, ctx_id: int, stack: int) -> Tracked:
        before = len(self.allocator.events)
        got: Block | None = self.allocator.malloc(size, 0)
        if got is None:
            self._segment_entries(before, stack)      # the cached segments it released trying, then the oom
            self._oom(size, stack)
        assert got is not None
        self._segment_entries(before, stack)
        self.peak_allocated = max(self.peak_allocated, self.allocator.allocated_bytes)
        self.peak_reserved = max(self.peak_reserved, self.allocator.reserved)
        block = Tracked(len(self.blocks), size, got.addr, len(self.entries), ctx_id, stack)
        self.blocks.append(block)
        self.entries.append(Entry("alloc", got.addr, size, self._time(), stack if self.recording else -1, block.sid))
        return block

    def _oom(self, size: int, stack: int) -> None:
        torch = _torch()
        rounded = self.settings.round_size(size)
        free = max(0, (self.capacity or 0) - self.allocator.reserved)
        self.entries.append(Entry("oom", free, rounded, self._time(), stack if self.recording else -1,
                                  device_free=free))
        raise torch.OutOfMemoryError(
            f"CUDA out of memory (emulated by snapanalyze's CPU capture). Tried to allocate {rounded} bytes; "
            f"{self.allocator.reserved} bytes reserved of {self.capacity}")

    def _segment_entries(self, before: int, stack: int) -> None:
        for ev in self.allocator.events[before:]:
            self.entries.append(Entry(ev.action, ev.addr, ev.size, self._time(), stack if self.recording else -1))

    def _make_callback(self, key: int) -> Callable[[Any], None]:
        def freed(_: Any) -> None:
            if not self.active:
                return
            stack = None
            if self.recording and self.reader is not None:
                stack = self.reader.python_stack(sys._getframe(0), self._in_backward())
            self._pending.append((key, stack))
        return freed

    def _drain(self) -> None:
        """Frees the weakref callbacks saw, in their order, after the allocations before them."""
        while self._pending:
            pending, self._pending = self._pending, []
            for key, stack in pending:
                hit = self.live.pop(key, None)
                if hit is None:
                    continue
                self._free(hit[0], self.stack_id(stack) if stack is not None else -1)

    def _free(self, block: Tracked, stack: int) -> None:
        self.allocator.free(block.addr)
        now = self._time()
        self.entries.append(Entry("free_requested", block.addr, block.size, now, stack, block.sid))
        block.free = len(self.entries)                  # the free_completed entry: live until it
        self.entries.append(Entry("free_completed", block.addr, block.size, now, stack, block.sid))

    # -- roles from the objects ------------------------------------------------------------------------------------
    def note(self, t: Any, role: str, detail: str) -> None:
        """Note a role of the block holding the tensor's storage, if the device holds it."""
        self._drain()
        st = _storage(t)
        if st is None:
            return
        hit = self.live.get(st._cdata)
        if hit is not None:
            hit[0].roles.setdefault(role, detail)

    def _scan_module(self, root: Any) -> None:
        for name, p in root.named_parameters(remove_duplicate=True):
            self.note(p, "parameter", name)
            if p.grad is not None:
                self.note(p.grad, "grad", name)
            if p not in self._params and p.requires_grad:
                self._params[p] = True
                p.register_post_accumulate_grad_hook(self._grad_hook(name))
        for name, b in root.named_buffers(remove_duplicate=True):
            self.note(b, "buffer", name)

    def _grad_hook(self, name: str) -> Callable[[Any], None]:
        def hook(p: Any) -> None:
            if self.active and p.grad is not None:
                self.note(p.grad, "grad", name)
        return hook

    def _forward_pre(self, module: Any, args: Any) -> None:
        if not self.active:
            return
        if not self._modules:
            if module not in self._roots:
                self._roots.add(module)
                root = _qualname(module).rsplit(".", 1)[-1]
                for name, m in module.named_modules(remove_duplicate=False):
                    self._paths.setdefault(id(m), name or root)
            self._scan_module(module)
        self._calls += 1
        self._modules.append((module, self._paths.get(id(module), type(module).__name__), self._calls))

    def _forward_post(self, module: Any, args: Any, *rest: Any) -> None:
        """(module, args, kwargs, output), or (module, args, output) where a forward raised (torch calls the
        always-called hooks without their kwargs then)."""
        kwargs, output = rest if len(rest) == 2 else ({}, rest[0] if rest else None)
        if not self.active:
            return
        if _torch().is_grad_enabled():
            # Nodes a torch function did not tag (an autograd.Function's, a recomputation's in a backward,
            # where the function mode is off) are this module's.
            self.tag_nodes(output, "")
        if self._modules and self._modules[-1][0] is module:
            self._modules.pop()
        if self._modules:
            return
        self._drain()
        for t in _cache_tensors([args, kwargs, output]):
            self.note(t, "kv_cache", type(module).__name__)
        for t in (*_tensors(args), *_tensors(kwargs)):
            st = _storage(t)
            hit = self.live.get(st._cdata) if st is not None else None
            if hit is not None and self.contexts[hit[0].context].phase == "outside":
                hit[0].roles.setdefault("input", f"an argument of {type(module).__name__}")
        self._scan_module(module)

    def _step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.active:
            return
        self._scan_optimizer(optimizer)
        self._optimizers.append(type(optimizer).__name__)
        base = _torch().optim.Optimizer
        for cls in type(optimizer).__mro__:
            if isinstance(cls, type) and issubclass(cls, base):
                try:
                    self._optimizer_files.add(inspect.getsourcefile(cls) or "")
                except TypeError:
                    pass

    def _step_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.active:
            return
        if self._optimizers:
            self._optimizers.pop()
        self._drain()
        self._scan_optimizer(optimizer)

    def _scan_optimizer(self, optimizer: Any) -> None:
        name = type(optimizer).__name__
        for group in optimizer.param_groups:
            for p in group["params"]:
                self.note(p, "parameter", "")
                if p.grad is not None:
                    self.note(p.grad, "grad", "")
        for state in optimizer.state.values():
            for t in _tensors(state):
                self.note(t, "optimizer_state", name)

    # -- autograd nodes: the forward context of their backward ------------------------------------------------
    def tag_nodes(self, outputs: Any, function: str) -> None:
        """Tag the autograd nodes made by a torch function call (those its outputs reach that carry no tag yet)
        with the call's context, and note the tensors they saved for backward."""
        roots = [t.grad_fn for t in _tensors(outputs) if getattr(t, "grad_fn", None) is not None]
        if not roots:
            return
        todo = [n for n in roots if _TAG not in n.metadata]
        if not todo:
            return
        ctx = self.forward_context(function)
        seen: set[int] = set()
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            meta = node.metadata
            if _TAG in meta:
                continue
            meta[_TAG] = ctx
            self._note_saved(node)
            for nxt, _ in node.next_functions:
                if nxt is not None and type(nxt).__name__ != "AccumulateGrad":
                    todo.append(nxt)

    def _note_saved(self, node: Any) -> None:
        if _torch()._C._autograd._top_saved_tensors_default_hooks(False) is not None:
            return          # reading a saved tensor would run saved-tensor hooks (a checkpoint recomputes)
        kind = type(node).__name__
        names = self._saved_names.get(kind)
        if names is None:
            names = self._saved_names[kind] = tuple(a for a in dir(node) if a.startswith(_SAVED))
        for name in names:
            try:
                value = getattr(node, name)
            except (RuntimeError, AttributeError):
                continue
            for t in _tensors(value):
                self.note(t, "saved", _node_name(node))

    def softmax(self, t: Any) -> None:
        """A softmax's output: its trailing two dims and its element count are the attention scores' in the calls
        running (the heads flattened into the batch or not)."""
        if t.dim() >= 2 and not self._in_backward():
            shape = (*t.shape[-2:], t.numel())
            for _, _, call in self._modules:
                self.softmax_shapes.setdefault(call, set()).add(shape)

    def annotate(self, stage: str, name: str = "") -> None:
        """A record_function span opened or closed (`external_annotations`); spans close in the order they nest."""
        if stage == "START":
            self._spans.append(name)
        elif self._spans:
            name = self._spans.pop()
        else:
            return
        if self.recording:
            self.annotations.append({"stage": stage, "name": name, "device": 0, "time_us": self._time()})


def _moved_by_module(stack: tuple[Frame, ...]) -> bool:
    """Whether a copy was made by `Module._apply` (`.to()` / `.cuda()` of a module: its parameters, buffers and
    their grads, not a batch)."""
    return any(name == "_apply" and filename.endswith("torch/nn/modules/module.py") for filename, _, name in stack)


def _qualname(module: Any) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _op_short(op: str) -> str:
    """An aten overload's op name: `aten.mm.default` → mm."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 3 else parts[-1]


def _node_name(node: Any) -> str:
    name = node.name() if hasattr(node, "name") else type(node).__name__
    return name.rsplit("::", 1)[-1]


def _is_python_node(node: Any) -> bool:
    from torch.autograd.function import BackwardCFunction
    return isinstance(node, BackwardCFunction)
