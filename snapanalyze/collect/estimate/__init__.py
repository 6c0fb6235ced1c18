"""Estimate a GPU program's memory on a machine without the GPU: its tensors fake, its allocations real.

Usage::

    from snapanalyze.collect import estimate

    result = estimate.run(train_step, capacity=80 << 30)           # a callable: it builds and runs the model
    result = estimate.run_script(["train.py", "--batch", "8"])      # a program, as `python train.py --batch 8`
    result.snapshot     # torch.cuda.memory._snapshot() as a GPU run would write it, marked as an estimate
    result.peak_reserved, result.fits, result.choices

The program runs under the CPU capture (`collect.cpu`: device placement, the caching-allocator model, stacks as
CUDA records them) with every tensor fake (`FakeTensorMode`: shapes, dtypes and strides; no data, no compute), so
a 7B model's training step at real shapes runs here. `torch.cuda` answers from the capture (`device_api`: memory
statistics, `_record_memory_history` — the program's own window —, `_dump_snapshot`, synchronize); where CUDA's
choice differs from the CPU's in memory the estimate models CUDA's documented rule and says so (`cuda_rules`).
What the emulation cannot follow (a value read from a tensor, a data-dependent shape, a kernel without a fake
implementation) raises `EstimateRefused` naming the program's line (`refusal`); no snapshot is made then. An
out-of-memory past `capacity` is a result: the snapshot ends with its `oom` entry.

The snapshot carries `ESTIMATE_KEY` (`snapanalyze.layout`): how it was made, the shapes, the capacity, the choices
modelled; every command that reads it says "estimate". Imports torch only when run.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import CollectorError
from ...layout import ESTIMATE_KEY
from .refusal import EstimateRefused

__all__ = ["run", "run_script", "Estimate", "EstimateRefused", "ESTIMATE_KEY"]

DEFAULT_TOTAL = 80 << 30           # what mem_get_info reports without --capacity: an 80 GB device


@dataclass(frozen=True)
class Estimate:
    snapshot: dict[str, Any]
    peak_allocated: int                   # max_memory_allocated over the run
    peak_reserved: int                    # max_memory_reserved over the run
    capacity: int | None
    oom: bool                             # the run needed more than `capacity`
    choices: tuple[str, ...] = ()         # what CUDA would choose, as modelled
    oom_at: str = ""                      # the program's line that ran out of memory
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def fits(self) -> bool | None:
        return None if self.capacity is None else not self.oom and self.peak_reserved <= self.capacity


def run(fn: Callable[..., Any], *args: Any, capacity: int | None = None, settings: str = "",
        torch_version: str = "2.13", shapes: Mapping[str, int] | None = None, program: Sequence[str] = (),
        **kwargs: Any) -> Estimate:
    """Run `fn(*args, **kwargs)` with fake tensors on the emulated device (tensors it makes live there; ``.to("cuda")``
    moves host tensors there) and estimate its memory. See the module docstring."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ..cpu import capture
    from . import cuda_rules
    from .cuda_rules import Choices, CudaMode, cuda_defaults
    from .device_api import emulated_cuda

    # As in a GPU program: a tensor made without device= is the host's, and a device tensor says it is on cuda:0.
    cap = capture(settings=settings, capacity=capacity, default_device=False, cuda_identity=True)
    cap.outermost.update({__file__, runpy.__file__, "<frozen runpy>"})
    choices = Choices()
    dumped: list[dict[str, Any]] = []
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    # Module._apply swaps a fake parameter with its moved or cast copy, which torch refuses while the converter's
    # memo holds a weak reference to it; the memo only maps a fresh meta tensor to its fake, which nothing reuses.
    fake.fake_tensor_converter.set_tensor_memo = lambda *_: None  # type: ignore[method-assign]
    oom, oom_at = False, ""
    import torch

    with _quiet_warnings(), _no_initialisation(), cuda_defaults(choices), fake:
        try:
            with cap, emulated_cuda(cap, capacity or DEFAULT_TOTAL, dumped.append, torch_version), \
                    CudaMode(choices):
                assert cap.reader is not None
                cap.reader.own_files.add(cuda_rules.__file__)      # its mode's frames are the estimate's
                cap.record_memory_history(stacks="python")
                try:
                    fn(*args, **kwargs)
                except torch.OutOfMemoryError as exc:
                    from .refusal import program_line
                    oom, oom_at = True, program_line(exc.__traceback__)
                except SystemExit as exc:
                    if exc.code not in (None, 0):
                        raise EstimateRefused(f"the program exited with status {exc.code}") from None
                snapshot = dumped[-1] if dumped else cap.snapshot(torch_version)
        except CollectorError:                # EstimateRefused included: already one line
            raise
        except Exception as exc:
            from .refusal import refusal
            raise refusal(exc) from exc
    oom = oom or any(e.get("action") == "oom" for t in snapshot.get("device_traces", []) for e in t)
    meta = {"made_by": "snapanalyze estimate", "program": list(program), "shapes": dict(shapes or {}),
            "capacity": capacity, "allocator_settings": settings, "torch": str(torch.__version__),
            "choices": choices.lines(), "peak_allocated": cap.peak_allocated, "peak_reserved": cap.peak_reserved,
            "oom": oom, "fake_tensors": True}
    snapshot[ESTIMATE_KEY] = meta
    return Estimate(snapshot, cap.peak_allocated, cap.peak_reserved, capacity, oom, tuple(choices.lines()),
                    oom_at, meta)


def run_script(argv: Sequence[str], **options: Any) -> Estimate:
    """Run a program given as its command line (``train.py ARGS``, ``python train.py ARGS`` or ``python -m
    package.module ARGS``) as `run` runs a callable: as ``__main__``, with ``sys.argv`` and ``sys.path[0]`` set
    as the interpreter sets them."""
    args = list(argv)
    if args and os.path.basename(args[0]).startswith("python"):
        args = args[1:]
    if not args:
        raise CollectorError("estimate: no program given (snapanalyze estimate -- python train.py ARGS)")
    module = None
    if args[0] == "-m":
        if len(args) < 2:
            raise CollectorError("estimate: -m needs a module name")
        module, args = args[1], args[1:]
    elif args[0].startswith("-"):
        raise CollectorError(f"estimate: the interpreter option {args[0]} is not supported; give the script")
    elif not os.path.isfile(args[0]):
        raise CollectorError(f"estimate: {args[0]}: no such program file")

    def main() -> None:
        with _argv(args, None if module else os.path.dirname(os.path.abspath(args[0]))):
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(args[0], run_name="__main__")
    return run(main, program=list(argv), **options)


@contextlib.contextmanager
def _argv(args: list[str], path0: str | None) -> Iterator[None]:
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = list(args)
    if path0 is not None:
        sys.path.insert(0, path0)
    else:
        sys.path.insert(0, os.getcwd())
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


@contextlib.contextmanager
def _no_initialisation() -> Iterator[None]:
    """torch.nn.init's in-place initialisers return their tensor unchanged: they write values, which fake tensors do
    not hold (and trunc_normal_'s rejection sampling reads them back), and allocate nothing that outlives them."""
    import torch.nn.init as init
    names = [n for n in dir(init) if n.endswith("_") and not n.startswith("_") and callable(getattr(init, n))]
    saved = {n: getattr(init, n) for n in names}

    def unchanged(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return tensor
    try:
        for n in names:
            setattr(init, n, unchanged)
        yield
    finally:
        for n, f in saved.items():
            setattr(init, n, f)


@contextlib.contextmanager
def _quiet_warnings() -> Iterator[None]:
    import warnings
    with warnings.catch_warnings():
        # A CPU build warns that CUDA autocast is unavailable (the estimate autocasts on the CPU instead).
        warnings.filterwarnings("ignore", message=".*CUDA is not available.*")
        warnings.filterwarnings("ignore", message=".*User provided device_type of 'cuda'.*")
        yield
