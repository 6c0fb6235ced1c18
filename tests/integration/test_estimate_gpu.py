"""The estimate against a real capture on a GPU (device-gated: runs only where torch sees CUDA). The shipped example
(`examples/train_gpt.py`, scaled to fit any GPU) runs for real with `_record_memory_history`, and its estimate at
the same shapes must give the real peak active and peak reserved bytes within ±5 %."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (device-gated)")

from snapanalyze.collect import estimate  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"
ARGS = ["--batch", "4", "--tokens", "1024", "--layers", "6", "--d-model", "768", "--heads", "12", "--checkpoint"]


def _main() -> None:
    saved = sys.argv
    sys.argv = [str(EXAMPLE), *ARGS]
    try:
        runpy.run_path(str(EXAMPLE), run_name="__main__")
    finally:
        sys.argv = saved


def _real() -> tuple[int, int, dict[str, Any]]:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    _main()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(), snapshot


def test_the_estimate_gives_the_real_gpu_peak() -> None:
    allocated, reserved, _ = _real()
    made = estimate.run(_main)
    assert abs(made.peak_allocated - allocated) <= 0.05 * allocated, (made.peak_allocated, allocated)
    assert abs(made.peak_reserved - reserved) <= 0.05 * reserved, (made.peak_reserved, reserved)
