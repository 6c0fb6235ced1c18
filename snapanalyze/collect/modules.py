"""Module spans: hooks that mark every call of a model's modules as a ``module`` marker.

`modules(model, prefix="model", backward=False, max_depth=None)` registers, on `model` and each of its
submodules (down to `max_depth`), a forward pre-hook that opens a span {kind "module", name = the module's
qualified path (``model.layers.3.mlp``), attrs {"class": its class name}} in the active recording's
`markers.MarkerLog` and a forward hook that closes it; like `phase`/`request` they cost one attribute lookup
outside a recording. With `backward=True` it also registers full backward pre-hooks and hooks (torch ≥ 2.0),
whose spans carry attrs {"pass": "backward"}: they wrap the module's inputs and outputs in autograd
functions, which some in-place code rejects, so they are opt-in. The spans of a module call are matched per
thread (a thread-local stack of open calls); a call that raised before its forward hook ran is closed by the
next hook of an enclosing call. The returned `ModuleHooks` removes every hook on `remove()` or when its
``with`` block ends. The analysis labels each allocation made inside the innermost span by that module's
path and class (`analyze.modules`).
"""

from __future__ import annotations

import json
import threading
from types import TracebackType
from typing import Any

from . import markers


class ModuleHooks:
    """The hooks `modules()` registered; `remove()` takes them all off."""

    def __init__(self, handles: list[Any]) -> None:
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def __enter__(self) -> ModuleHooks:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.remove()


_open = threading.local()       # per thread: [(module id, pass, log, token)] of calls whose span is open


def _calls() -> list[tuple[int, str, markers.MarkerLog, int]]:
    stack: list[tuple[int, str, markers.MarkerLog, int]] | None = getattr(_open, "stack", None)
    if stack is None:
        stack = _open.stack = []
    return stack


def _opener(path: str, attrs: str, which: str) -> Any:
    def begin(module: Any, *_: Any) -> None:
        log = markers.active()
        if log is not None:
            _calls().append((id(module), which, log, log.begin_json("module", path, attrs)))
    return begin


def _closer(which: str) -> Any:
    def end(module: Any, *_: Any) -> None:
        stack = _calls()
        key = id(module)
        if not any(k == key and w == which for k, w, _, _ in stack):
            return
        while stack:              # close calls that raised inside this one, then this one
            k, w, log, token = stack.pop()
            log.end(token)
            if k == key and w == which:
                break
    return end


def modules(model: Any, prefix: str = "model", backward: bool = False, max_depth: int | None = None) -> ModuleHooks:
    """Mark every call of `model`'s modules (see the module docstring); `max_depth` leaves out modules
    nested deeper than that below `model` (``model.layers.3.mlp`` is depth 3): each hooked call costs
    microseconds, which a decode step of many small modules feels."""
    if not hasattr(model, "named_modules") or not hasattr(model, "register_forward_pre_hook"):
        raise TypeError(f"collect.modules needs a torch.nn.Module, got {type(model).__name__}")
    handles: list[Any] = []
    for name, module in model.named_modules():
        if max_depth is not None and name and name.count(".") + 1 > max_depth:
            continue
        path = f"{prefix}.{name}" if name else prefix
        cls = type(module).__name__
        forward = json.dumps({"class": cls}, sort_keys=True)
        handles.append(module.register_forward_pre_hook(_opener(path, forward, "forward")))
        handles.append(module.register_forward_hook(_closer("forward")))
        if backward and hasattr(module, "register_full_backward_pre_hook"):
            attrs = json.dumps({"class": cls, "pass": "backward"}, sort_keys=True)
            handles.append(module.register_full_backward_pre_hook(_opener(path, attrs, "backward")))
            handles.append(module.register_full_backward_hook(_closer("backward")))
    return ModuleHooks(handles)
