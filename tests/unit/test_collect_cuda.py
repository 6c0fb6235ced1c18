"""The real torch backend's probes that need no GPU (run against whatever torch is installed)."""

from __future__ import annotations

from typing import Any

import pytest

from snapanalyze.collect import CollectorError
from snapanalyze.collect.cuda import CudaBackend, TorchCudaBackend, _accepts
from snapanalyze.collect.testing import FakeCuda


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch")


def test_fake_is_a_cuda_backend() -> None:
    assert isinstance(FakeCuda(), CudaBackend)


def test_probes_of_the_installed_torch(torch: Any) -> None:
    backend = TorchCudaBackend(torch)
    assert isinstance(backend, CudaBackend)
    assert backend.distributed() is None  # no process group here
    assert backend.versions()["torch"] == torch.__version__
    hooks = backend.trace_hooks()
    assert hooks.annotate is not None
    with hooks.annotate("phase:probe"):
        pass
    assert (hooks.set_metadata is not None) == hasattr(torch.cuda.memory, "_set_memory_metadata")
    assert _accepts(torch.cuda.memory._record_memory_history, "max_entries")


def test_history_is_asked_for_annotations_only_where_torch_accepts_them(torch: Any) -> None:
    calls: list[dict[str, object]] = []

    class Memory:
        @staticmethod
        def _record_memory_history(enabled: str | None = "all", context: str | None = "all", stacks: str = "all",
                                   max_entries: int = 1) -> None:
            calls.append({"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries})

    class Cuda:
        memory = Memory

    class OldTorch:
        cuda = Cuda

    args = TorchCudaBackend(OldTorch).start_history(stacks="python", max_entries=5, annotations=True)
    assert "global_record_annotations" not in args
    assert calls == [{"enabled": "all", "context": "all", "stacks": "python", "max_entries": 5}]


def test_a_refused_history_call_is_a_collector_error() -> None:
    class Memory:
        @staticmethod
        def _record_memory_history(**kw: object) -> None:
            raise RuntimeError("CUDA driver initialization failed")

    class Torch:
        class cuda:  # mimics torch.cuda
            memory = Memory

    with pytest.raises(CollectorError, match="enabling allocator history failed"):
        TorchCudaBackend(Torch).start_history(stacks="python", max_entries=5, annotations=False)


def test_no_oom_observer_on_a_build_without_it(torch: Any) -> None:
    has = hasattr(torch._C, "_cuda_attach_out_of_memory_observer")
    if has:
        pytest.skip("this torch has the observer (attaching it here would be permanent)")
    assert TorchCudaBackend(torch).attach_oom_observer(lambda *a: None) is False
