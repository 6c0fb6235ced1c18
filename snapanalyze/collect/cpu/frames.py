"""The stack an allocation records, as `torch.cuda.memory._record_memory_history` would have recorded it on a GPU.

Contract: `python_stack(frame, capture_code, in_backward)` walks the interpreter's frames from `frame` outward and
returns the program's Python frames, innermost first, as (filename, line, function) — what CUDA's recorder keeps with
``stacks="python"``. It leaves out what only the capture put there: its own mode and hook frames, the
``torch.compile``-disabling wrappers around a dispatch mode, the composite op it ran decomposed, the
``handle_torch_function`` detour (and the second entry into the same function) that a TorchFunctionMode causes, and
``Module._call_impl``'s ``inner`` closure where only the capture's global hooks made the call take it (``_call_impl``
then shows the line of its fast path). In a backward pass it keeps only the frames entered from the autograd engine:
on a GPU the engine runs a backward's ops on its own device thread, so an op of a C++ node has no Python frames at
all, and a custom Function's backward or a checkpoint's recomputation shows only its own frames (`device_thread`).

`cpp_frames(...)` makes the C++ frames of ``stacks="all"``: the snapshot's own capture and the caching allocator, the
ATen op (and the torch function around it), the autograd node, the engine's thread, the interpreter between Python
frames and the process entry — the names CUDA builds record (read from torch 2.11's recorded stacks in the cs336
corpus files), emulated, since a CPU run has no CUDA frames. Both return plain tuples; nothing here allocates a
tensor."""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from types import CodeType, FrameType

Frame = tuple[str, int, str]

# Wrappers that only the capture's modes put between a dispatch and the program (torch.compile's
# disable-wrapper around __torch_dispatch__, the mode-stack helpers) and the __torch_function__ detour.
_AROUND_MODE = re.compile(r"(^|/)torch/(utils/_python_dispatch|_compile|_dynamo/eval_frame|overrides)\.py$")
_OPS_PY = re.compile(r"(^|/)torch/_ops\.py$")        # OpOverload.decompose: the dispatch mode runs a composite
_MODULE_PY = re.compile(r"(^|/)torch/nn/modules/module\.py$")
_ENGINE_ENTRY = re.compile(r"(^|/)torch/autograd/graph\.py$")
_AUTOGRAD_API = re.compile(r"(^|/)torch/autograd/__init__\.py$")


def _fast_path_line() -> int:
    """The line of `Module._call_impl`'s fast path (`return forward_call(*args, **kwargs)`), which a call without
    hooks records; 0 where it cannot be read."""
    try:
        import torch.nn.modules.module as module
        lines, start = inspect.getsourcelines(module.Module._call_impl)
    except (ImportError, OSError, TypeError):  # pragma: no cover - torch without source
        return 0
    return next((start + i for i, line in enumerate(lines) if "return forward_call(*args, **kwargs)" in line), 0)


class StackReader:
    """Reads the program's frames for one capture (see the module docstring). `own` are the code objects and
    files of the capture itself; `function_mode` the code of its TorchFunctionMode's `__torch_function__`;
    `outermost` files whose frames end the stack (what ran the program: runpy, a runner of its own);
    `other_global_hooks()` says whether global module hooks other than the capture's exist."""

    def __init__(self, own_files: set[str], function_mode: CodeType | None, outermost: set[str] | None = None) -> None:
        self.own_files = own_files
        self.outermost = outermost if outermost is not None else set()
        self.function_mode = function_mode
        self.fast_line = _fast_path_line()
        self.other_global_hooks = lambda: False     # set by the capture: whether hooks other than its own exist

    def python_stack(self, frame: FrameType | None, in_backward: bool) -> tuple[Frame, ...]:
        out: list[Frame] = []
        f = frame
        last_kept: FrameType | None = None
        stripped_inner = False                        # the capture's hooks alone sent the call through `inner`
        while f is not None:
            code = f.f_code
            filename = code.co_filename
            if filename in self.outermost:
                break                                 # the runner's frames: the program's stack ends here
            if filename in self.own_files:
                inner = last_kept if last_kept is not None and last_kept.f_back is f else None
                is_function_mode = code is self.function_mode
                f = f.f_back
                while f is not None and (_AROUND_MODE.search(f.f_code.co_filename) or (
                        f.f_code.co_name == "decompose" and _OPS_PY.search(f.f_code.co_filename))):
                    f = f.f_back
                if is_function_mode and inner is not None and f is not None and f.f_code is inner.f_code:
                    f = f.f_back                      # has_torch_function → handle_torch_function → the same function
                continue
            if code.co_name == "inner" and _MODULE_PY.search(filename) and f.f_back is not None \
                    and not self._hooked(f.f_back):
                stripped_inner = True
                f = f.f_back
                continue
            line = f.f_lineno or 0
            if stripped_inner and code.co_name == "_call_impl" and self.fast_line:
                line = self.fast_line
            stripped_inner = False
            out.append((filename, line, code.co_name))
            last_kept = f
            f = f.f_back
        if in_backward:
            return device_thread(out)
        return tuple(out)

    def _hooked(self, call: FrameType) -> bool:
        """Whether the module of a `Module._call_impl` frame has hooks of its own (or other global hooks exist):
        then its call takes `inner` without the capture too."""
        module = call.f_locals.get("self")
        if module is None:
            return True
        return bool(getattr(module, "_forward_hooks", None) or getattr(module, "_forward_pre_hooks", None)
                    or getattr(module, "_backward_hooks", None) or getattr(module, "_backward_pre_hooks", None)
                    or self.other_global_hooks())


def device_thread(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """The frames a backward's allocation shows on a GPU: those inside the outermost call into the autograd
    engine (`_engine_run_backward`, or `torch.autograd.backward`/`grad` where torch has no such helper)."""
    cut = -1
    for i, (filename, _, name) in enumerate(frames):
        if name == "_engine_run_backward" and _ENGINE_ENTRY.search(filename):
            cut = i
    if cut < 0:
        for i, (filename, _, name) in enumerate(frames):
            if name in ("backward", "grad") and _AUTOGRAD_API.search(filename):
                cut = i
    return tuple(frames[:cut]) if cut >= 0 else tuple(frames)


# -- C++ frames of stacks="all" ----------------------------------------------------------------------------------

_VEC = "std::vector<at::Tensor, std::allocator<at::Tensor> >"
_CAPTURE = (
    ("??", 0, "torch::unwind::unwind()"),
    ("??", 0, "torch::CapturedTraceback::gather(bool, bool, bool)"),
    ("memory_snapshot.cpp", 0, "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
    ("CUDACachingAllocator.cpp", 0,
     "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)"),
    ("", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, "
            "unsigned long, CUstream_st*)"),
    ("", 0, "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)"),
)
_EMPTY = (
    ("??", 0, "at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, "
              "c10::ScalarType, std::optional<c10::MemoryFormat>)"),
    ("??", 0, "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, "
              "std::optional<c10::MemoryFormat>)"),
)
_WORKSPACE = (
    ("??", 0, "at::cuda::getNewWorkspace()"),
    ("??", 0, "at::cuda::getCurrentCUDABlasHandle()"),
)
_AUTOCAST = (("??", 0, "at::autocast::cached_cast(c10::ScalarType, at::Tensor const&, c10::DeviceType)"),)
_SDPA_MATH = (("??", 0, "at::native::_scaled_dot_product_attention_math(at::Tensor const&, at::Tensor const&, "
                        "at::Tensor const&, std::optional<at::Tensor> const&, double, bool, "
                        "std::optional<at::Tensor> const&, std::optional<double>, bool)"),)
_ENGINE = (
    ("", 0, f"torch::autograd::Node::operator()({_VEC}&&)"),
    ("??", 0, "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, "
              "torch::autograd::Node*, torch::autograd::InputBuffer&, "
              "std::shared_ptr<torch::autograd::ReadyQueue> const&)"),
    ("??", 0, "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
    ("??", 0, "torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, "
              "bool)"),
    ("", 0, "torch::autograd::python::PythonEngine::thread_init(int, "
            "std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)"),
    ("??", 0, "start_thread"),
    ("??", 0, "__clone3"),
)
_PROCESS = (("??", 0, "Py_RunMain"), ("??", 0, "Py_BytesMain"), ("??", 0, "__libc_start_main"), ("??", 0, "_start"))
_EVAL = ("??", 0, "_PyEval_EvalFrameDefault")

# aten overload names as at::_ops names them: `aten.add.Tensor` → add_Tensor, `aten.mm.default` → mm
_OVERLOAD = re.compile(r"^(?:\w+)\.(\w+)\.(\w+)$")


def op_name(op: str) -> str:
    """`at::_ops` name of an aten overload (`aten.add.Tensor` → `add_Tensor`, `aten.mm.default` → `mm`)."""
    m = _OVERLOAD.match(op)
    if m is None:
        return op.rsplit(".", 1)[-1]
    name, overload = m.groups()
    return name if overload == "default" else f"{name}_{overload}"


def cpp_frames(python: Sequence[Frame], *, op: str, function: str | None, node: str | None, python_node: bool,
               workspace: bool = False, autocast: bool = False, sdpa_math: bool = False) -> tuple[Frame, ...]:
    """The whole ``stacks="all"`` stack of an allocation: C++ frames around its Python frames (see the module
    docstring). `node` is the autograd node running (None: the main thread's forward); `python_node` whether it
    is a Python custom Function's (its backward's Python frames then run on the device thread)."""
    ops: list[Frame] = [*_CAPTURE, *(_WORKSPACE if workspace else _EMPTY)]
    name = op_name(op)
    ops.append(("??", 0, f"at::_ops::{name}::call()"))
    if autocast:
        ops.extend(_AUTOCAST)
    if sdpa_math:
        ops.extend(_SDPA_MATH)
    if function and function != name:
        ops.append(("??", 0, f"at::_ops::{function}::call()"))
    if node is not None:
        if python_node:
            interleaved = [x for f in python for x in (f, _EVAL)]
            return (*ops, *interleaved, ("??", 0, f"torch::autograd::PyNode::apply({_VEC}&&)"), *_ENGINE)
        apply = "torch::autograd::AccumulateGrad::apply" if node == "AccumulateGrad" else \
            f"torch::autograd::generated::{node}::apply"
        return (*ops, ("??", 0, f"{apply}({_VEC}&&)"), *_ENGINE)
    binding = ("python_torch_functions_0.cpp", 0,
               f"torch::autograd::THPVariable_{function or name}(_object*, _object*, _object*)")
    if not python:
        return (*ops, binding, *_PROCESS)
    interleaved = [x for f in python[:-1] for x in (f, _EVAL)]
    return (*ops, binding, *interleaved, *_PROCESS, python[-1])


def own_files(*modules: object) -> set[str]:
    """The source files of the given modules (the capture's own frames)."""
    return {getattr(m, "__file__", "") for m in modules} - {""}
