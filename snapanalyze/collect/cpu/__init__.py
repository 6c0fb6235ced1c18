"""The collector's CPU capture: a real PyTorch program run on the CPU, recorded as a CUDA snapshot with its truth.

Usage (``pip install 'snapanalyze[collect]'``; no GPU needed)::

    from snapanalyze.collect import cpu

    with cpu.capture() as cap:                    # tensors made here live on the emulated CUDA device
        model = build_model().to("cuda")           # or build it on the host first: `with cap.host(): …`
        cap.record_memory_history(stacks="python")
        loss = model(batch.to("cuda")).sum()
        loss.backward()
        snapshot = cap.snapshot(torch_version="2.13")    # the dict torch.cuda.memory._snapshot() returns
        truth = cap.rows(index)                           # what each block live after trace entry `index` is

`capture` (`tracker.CpuCapture`) runs the program under a TorchDispatchMode that sees every storage the
device would hold and a TorchFunctionMode that emulates the device's placement, with module, optimizer and
record_function hooks; the caching-allocator model places the blocks; `frames` makes the stacks CUDA's recorder
would keep (a backward's on the autograd device thread); `snapshot` lays the result out as a torch version
writes it; `truth` says what every block is. Imports torch only when a capture starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .tracker import CpuCapture

__all__ = ["capture", "CpuCapture"]


def capture(**options: Any) -> CpuCapture:
    """A `CpuCapture` (a context manager) with these options: `settings` (PYTORCH_ALLOC_CONF text),
    `capacity` (bytes the device may reserve, None: unbounded), `cublas_workspace` (bytes, None: none),
    `default_device` (False: a tensor made without ``device=`` is the host's, as in a program without
    ``torch.set_default_device``), `cuda_identity` (True: the program sees its device tensors' ``.device`` as
    ``cuda:0`` and ``.is_cuda`` True, so ``torch.arange(n, device=x.device)`` is the device's too)."""
    from .tracker import CpuCapture
    return CpuCapture(**options)


def __getattr__(name: str) -> Any:
    if name == "CpuCapture":
        from .tracker import CpuCapture
        return CpuCapture
    raise AttributeError(name)
