"""The CPU capture against a real GPU snapshot: the cs336 transformer of `fixtures/real` (its own model code, from the
program's source folder) run through `collect.cpu` at the shapes its GPU run recorded (the 'medium' model, 24 layers
of d 1024, batch 4 × ctx 128, five warm-up forwards, then one recorded forward under inference_mode) gives the stacks
and the peak the real file holds: the same files, functions and nesting in every allocating stack (torch's own line
numbers aside: the run used torch 2.11), each allocated as often and with the same sizes, and the same live tensors at
the same global peak, byte for byte. Needs the program's imports (einops, einx, jaxtyping: the zoo extra)."""

from __future__ import annotations

import collections
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
for name in ("einops", "einx", "jaxtyping"):
    pytest.importorskip(name)

import snapanalyze as sa  # noqa: E402
from snapanalyze.analyze.peaks import global_peak_index  # noqa: E402
from snapanalyze.collect import cpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STEM = "cs336-medium-ctx128-inference-t2.11"
SOURCE = ROOT / "fixtures" / "real" / "source" / STEM / "assignment2-systems" / "cs336-basics"
MODEL_FILES = ("cs336_basics/",)
LIBRARIES = ("torch/", "einops/", "einx/")

pytestmark = pytest.mark.slow


def _signature(entry: dict[str, Any]) -> tuple[tuple[str, int, str], ...]:
    """The allocating stack's Python frames inside the model code: the model's files with their lines, the
    libraries' by package-relative file and function (their lines differ between torch versions), cut where the
    program's driver begins."""
    out = []
    for f in entry.get("frames", []):
        filename = f["filename"].replace("\\", "/")
        if not filename.endswith(".py"):
            continue
        model = next((filename.split(m, 1)[1] for m in MODEL_FILES if m in filename), None)
        if model is not None:
            out.append((model, f["line"], f["name"]))
            continue
        library = next((lib + filename.split("/" + lib, 1)[1] for lib in LIBRARIES if "/" + lib in filename), None)
        if library is None:
            break                                               # the driver: nsys_profile.py in the real run
        out.append((library, 0, f["name"]))
    return tuple(out)


@pytest.fixture(scope="module")
def captured() -> dict[str, Any]:
    sys.path.insert(0, str(SOURCE))
    try:
        from cs336_basics.model import BasicsTransformerLM
    finally:
        sys.path.remove(str(SOURCE))
    torch.manual_seed(0)
    with cpu.capture() as cap:
        model = BasicsTransformerLM(vocab_size=10000, context_length=128, d_model=1024, num_layers=24, num_heads=16,
                                    d_ff=4096, rope_theta=10000.0)
        warmup = torch.randint(0, 10000, (5, 4, 128), dtype=torch.long, device="cuda")
        execution = torch.randint(0, 10000, (1, 4, 128), dtype=torch.long, device="cuda")
        model.eval()
        with torch.inference_mode():
            for i in range(5):
                model(warmup[i])
            cap.record_memory_history(max_entries=1000000, stacks="all")
            model(execution[0])
        return cap.snapshot("2.11")


def _peak(snapshot_path: Path) -> tuple[int, int, collections.Counter[int]]:
    snap = sa.load(snapshot_path)
    dt = sa.replay(snap)[0]
    index = global_peak_index(dt)
    return index, dt.active_at(index), collections.Counter(dt.live_at(index)["size"].tolist())


def test_the_capture_records_the_stacks_the_gpu_run_recorded(captured: dict[str, Any]) -> None:
    from support import read_builtins
    real = read_builtins(ROOT / "fixtures" / "real" / f"{STEM}.pickle")
    ours = collections.Counter((_signature(e), e["size"]) for e in captured["device_traces"][0]
                               if e["action"] == "alloc")
    theirs = collections.Counter((_signature(e), e["size"]) for e in real["device_traces"][0]
                                 if e["action"] == "alloc")
    assert len(theirs) > 20 and all(len(s) >= 4 for s, _ in theirs)
    assert ours == theirs                 # every allocating site, with its sizes and how often each was allocated


def test_the_capture_holds_the_real_runs_tensors_at_its_peak(captured: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "captured.pickle"
    path.write_bytes(pickle.dumps(captured))
    ours_index, ours_active, ours_sizes = _peak(path)
    real_index, real_active, real_sizes = _peak(ROOT / "fixtures" / "real" / f"{STEM}.pickle")
    assert ours_sizes == real_sizes
    assert ours_active == real_active == 1_736_962_048 and ours_index == real_index == 292
