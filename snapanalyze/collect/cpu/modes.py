"""The two torch modes of the CPU capture: one emulates the CUDA device's placement, one sees every allocation.

Contract: `DeviceMode(capture)` is a TorchFunctionMode: ``scaled_dot_product_attention`` with attention dropout runs
as on CUDA, in a fused kernel (`_as_on_cuda`), as does F.dropout's (CUDA's native_dropout keeps a one-byte mask:
`_fused_dropout`); ``.to("cuda")`` / ``.cuda()`` of a host tensor copies it to the
device (a new device storage), of a device tensor changes at most its dtype; ``.cpu()`` / ``.to("cpu")`` of a device
tensor copies it to the host; ``device="cuda"`` in any call becomes the CPU with the result on the device. After
each call it tags the autograd nodes the call made with the call's context (`CpuCapture.tag_nodes`).
`AllocMode(capture)` is a TorchDispatchMode: after each aten op, the storages of its outputs that the device did not
hold yet are new blocks (`CpuCapture.allocate`) when the op runs on the device (a device input, or no tensor input
at all outside ``host()``); an autocast cast of a parameter is marked (whether autocast is on is read by
`DeviceMode`, above autocast's dispatch key); a composite op that reaches it whole (autograd off) runs decomposed
under it, so the ops it is made of allocate one by one as on a GPU; the record_function enter/exit ops open and
close spans. Both call the op itself unchanged.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from .tracker import _is_cuda, _storage, _tensors

if TYPE_CHECKING:
    from .tracker import CpuCapture

_TO, _CUDA, _CPU = torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu
_MOVES = {_TO, _CUDA, _CPU}
_TO_COPY = torch.ops.aten._to_copy.default
_SOFTMAX = ("_softmax", "softmax", "_safe_softmax")
_SDPA = torch.nn.functional.scaled_dot_product_attention
_MHA = torch.nn.functional.multi_head_attention_forward
_DROPOUT_AT = {_SDPA: 4, _MHA: 10}            # the position of dropout_p
_F_DROPOUT = torch.nn.functional.dropout
_DEVICE_GET, _IS_CUDA_GET = torch.Tensor.device.__get__, torch.Tensor.is_cuda.__get__  # type: ignore[attr-defined]
_CUDA0 = torch.device("cuda", 0)
_EXPLICIT_CASTS = frozenset({"to", "type", "type_as", "float", "half", "bfloat16", "double", "_to_copy"})


def _as_on_cuda(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """scaled_dot_product_attention as a CUDA device would run it: its fused kernels (flash, memory-efficient)
    take attention dropout, the CPU's fused kernel does not and falls back to the math path, which materialises
    the scores. Unless the program forced the math backend (sdpa_kernel), the call runs without dropout, so the
    CPU's fused kernel runs where CUDA's would (the values differ by the dropout, the memory as on CUDA). The same
    holds for F.multi_head_attention_forward without attention weights (nn.MultiheadAttention, the nn.Transformer
    layers), which calls SDPA inside (out of this mode's sight) with its dropout."""
    at = _DROPOUT_AT[func]
    if func is _MHA and kwargs.get("need_weights", args[15] if len(args) > 15 else True):
        return args, kwargs                   # the explicit path: its dropout of the weights runs on CUDA too
    dropout = kwargs.get("dropout_p", args[at] if len(args) > at else 0.0)
    if not dropout or not (torch._C._get_flash_sdp_enabled() or torch._C._get_mem_efficient_sdp_enabled()):
        return args, kwargs
    if "dropout_p" in kwargs:
        return args, {**kwargs, "dropout_p": 0.0}
    return (*args[:at], 0.0, *args[at + 1:]), kwargs


def _fused_dropout(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """F.dropout as CUDA runs it: at::dropout calls the fused native_dropout on a CUDA tensor, which keeps a
    one-byte mask for the backward; the CPU's path multiplies by a mask of the input's dtype (4× the bytes in
    float32). In training, out of place, the call runs as native_dropout (the same values' distribution, the
    memory CUDA's has); else None (the call as it is)."""
    names = ("input", "p", "training", "inplace")
    given = {**dict(zip(names, args)), **kwargs}
    p, training, inplace = given.get("p", 0.5), given.get("training", True), given.get("inplace", False)
    if not training or inplace or not 0.0 < p < 1.0 or not isinstance(given.get("input"), torch.Tensor):
        return None
    return lambda *_, **__: torch.native_dropout(given["input"], p, True)[0]


class DeviceMode(TorchFunctionMode):
    def __init__(self, capture: CpuCapture) -> None:
        super().__init__()
        self.cap = capture

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        cap = self.cap
        if func in _MOVES:
            return self._move(func, args, kwargs)
        if cap.cuda_identity and (func == _DEVICE_GET or func == _IS_CUDA_GET) and args \
                and cap.is_device(args[0]):
            return _CUDA0 if func == _DEVICE_GET else True     # the program asks where its tensor lives
        if func in _DROPOUT_AT:
            args, kwargs = _as_on_cuda(func, args, kwargs)
        elif func is _F_DROPOUT:
            func = _fused_dropout(args, kwargs) or func
        forced = "device" in kwargs and _is_cuda(kwargs["device"])
        if forced:
            kwargs = {**kwargs, "device": "cpu"}
            cap._force_device += 1
        name = getattr(func, "__name__", "")
        cap._functions.append(name)
        was, cap._autocast = cap._autocast, _autocasting()   # read here: autocast hides itself below its own key
        try:
            out = func(*args, **kwargs)
        finally:
            cap._functions.pop()
            cap._autocast = was
            if forced:
                cap._force_device -= 1
        if torch.is_grad_enabled() and not name.startswith("__"):
            cap.tag_nodes(out, name)
        return out

    def _move(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        cap = self.cap
        t = args[0]
        copy = bool(kwargs.pop("copy", False)) if func is _TO else False
        if func is _TO:
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
        elif func is _CUDA:
            device, dtype, memory_format = torch.device("cuda"), None, None
        else:
            device, dtype, memory_format = torch.device("cpu"), None, None
        options: dict[str, Any] = {}
        if dtype is not None:
            options["dtype"] = dtype
        if memory_format is not None:
            options["memory_format"] = memory_format
        on_device = cap.is_device(t)
        if device is None or _is_cuda(device) == on_device:
            if not options and not copy:
                return t
            cap._functions.append("to")
            try:
                return t.to(copy=copy, **options)
            finally:
                cap._functions.pop()
        cap._functions.append("to")
        try:
            if _is_cuda(device):                      # host → device: a copy the device holds
                cap._force_device += 1
                cap._copy_in += 1
                try:
                    out = t.to("cpu", copy=True, **options)
                finally:
                    cap._force_device -= 1
                    cap._copy_in -= 1
            else:                                     # device → host: a copy the device does not hold
                with cap.host():
                    out = t.to("cpu", copy=True, **options)
        finally:
            cap._functions.pop()
        if torch.is_grad_enabled():
            cap.tag_nodes(out, "to")
        return out


class AllocMode(TorchDispatchMode):
    def __init__(self, capture: CpuCapture) -> None:
        super().__init__()
        self.cap = capture

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        cap = self.cap
        name = str(func)
        if name.startswith("profiler._record_function_enter"):
            cap.annotate("START", str(args[0]))
            return func(*args, **kwargs)
        if name.startswith("profiler._record_function_exit"):
            cap.annotate("END")
            return func(*args, **kwargs)
        if func.namespace != "aten":
            return func(*args, **kwargs)      # prim::device, prim::layout … (a fake mode below asks them): no storage
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            # Where autograd is off (inference_mode) a composite op reaches the mode whole; on a GPU its kernel
            # runs the ops it is made of, each allocating through the allocator: run it the same way, with this
            # mode on, so that they are seen one by one (as they are where autograd decomposes them).
            with self, _autocast_again(cap._autocast):
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        inputs = [*_tensors(args), *_tensors(kwargs)]
        if cap._force_device:
            on_device = True
        elif cap._host:
            on_device = False
        else:
            on_device = (not inputs and cap.default_device) or any(cap.is_device(t) for t in inputs)
        # autocast's own cast (not the program's .to()): CUDA records it under at::autocast::cached_cast, of a
        # parameter (a weight copy, cached) or of an activation alike
        cast = func is _TO_COPY and bool(inputs) and bool(cap._autocast) and \
            (not cap._functions or cap._functions[-1] not in _EXPLICIT_CASTS)
        autocast = cast and _is_parameter(cap, inputs[0])
        out = func(*args, **kwargs)
        if not on_device:
            return out
        cap._drain()          # a storage freed just now may have left its StorageImpl's address to an output
        new, seen = [], set()
        for t in _tensors(out):
            st = _storage(t)
            if st is None or st.nbytes() == 0:
                continue
            key = st._cdata
            if key in seen:
                continue
            seen.add(key)
            hit = cap.live.get(key)
            if hit is None:
                new.append((st, t))
            elif int(st.nbytes()) != hit[0].size:
                cap.resize(key, st, t, name, sys._getframe(0))
        if new:
            cap.allocate(new, name, sys._getframe(0), factory=not inputs, autocast=autocast, cast=cast)
        if name.split(".")[1] in _SOFTMAX and isinstance(out, torch.Tensor):
            cap.softmax(out)
        return out


def _autocasting() -> tuple[tuple[str, Any], ...]:
    """The autocasts on (device type, dtype); empty when none."""
    try:
        return tuple((kind, torch.get_autocast_dtype(kind)) for kind in ("cpu", "cuda")
                     if torch.is_autocast_enabled(kind))
    except TypeError:   # pragma: no cover - torch < 2.4 takes no device type
        return (("cuda", torch.get_autocast_gpu_dtype()),) if torch.is_autocast_enabled() else ()


@contextlib.contextmanager
def _autocast_again(autocasts: tuple[tuple[str, Any], ...]) -> Iterator[None]:
    """Autocast as it was above this mode: a composite op reaching the mode whole is below autocast's key, where a
    GPU's composite kernel is not — its ops dispatch from the top again, through autocast."""
    with contextlib.ExitStack() as stack:
        for kind, dtype in autocasts:
            stack.enter_context(torch.amp.autocast_mode.autocast(kind, dtype=dtype))
        yield


def _is_parameter(cap: CpuCapture, t: Any) -> bool:
    st = _storage(t)
    hit = cap.live.get(st._cdata) if st is not None else None
    return hit is not None and ("parameter" in hit[0].roles or "buffer" in hit[0].roles)
