"""The collector on a real CUDA device (skipped without one): history, markers in the trace, OOM snapshot."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import pytest

from snapanalyze import collect, layout


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")]


def test_real_recording_on_a_gpu(tmp_path: Path) -> None:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NVML may be missing in a container: nvml="optional"
        with collect.record(tmp_path, nvml="optional", nvml_interval_ms=5) as rec:
            with collect.phase("prefill", tokens=128):
                with collect.request("req-1"):
                    x = torch.empty(8 * 1024 * 1024, device="cuda")
            collect.dump("after")
            with pytest.raises(torch.cuda.OutOfMemoryError):
                torch.empty(2**50, dtype=torch.uint8, device="cuda")
            del x
    rdir = rec.rank_dir
    assert rdir is not None
    names = [p.name for p in layout.snapshot_files(rdir)]
    assert {"snapshot-after.pickle", "snapshot-final.pickle", "snapshot-oom-1.pickle"} <= set(names)
    snap = pickle.loads((rdir / "snapshot-after.pickle").read_bytes())
    events = [e for trace in snap["device_traces"] for e in trace]
    allocs = [e for e in events if e["action"] == "alloc" and e["size"] == 32 * 1024 * 1024]
    assert allocs
    if hasattr(torch.cuda.memory, "_set_memory_metadata"):
        assert allocs[-1].get("user_metadata") == "req=req-1"
    oom = pickle.loads((rdir / "snapshot-oom-1.pickle").read_bytes())
    assert any(e["action"] == "oom" for trace in oom["device_traces"] for e in trace)
    meta = json.loads((rdir / "meta.json").read_text())
    assert meta["ooms"][0]["snapshot"] == "snapshot-oom-1.pickle"
    assert meta["devices"][0]["total_memory_bytes"] > 0
    is_enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if is_enabled is not None:
        assert not is_enabled()  # recording was stopped after the final dump
