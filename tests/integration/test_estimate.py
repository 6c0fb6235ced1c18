"""`snapanalyze estimate` as users run it: a program's memory with fake tensors, equal to the same program's CPU
capture with real ones; refusals that name the line; an out-of-memory past --capacity; a sweep for `capacity`; and
every command reading the estimate and saying it is one."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from snapanalyze.collect import cpu, estimate  # noqa: E402

PROGRAM = textwrap.dedent("""
    import argparse
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    for step in range(2):
        x = torch.randn(args.batch, 128, 256, device=device)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    positions = torch.arange(128, device=x.device)      # a device tensor says it is on cuda
    print("peak", torch.cuda.max_memory_allocated())
""")


def _step(batch: int = 4) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    model.to("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    for _ in range(2):
        x = torch.randn(batch, 128, 256, device="cuda")
        loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def _entries(snapshot: dict[str, Any]) -> list[tuple[str, int, int]]:
    return [(e["action"], e["addr"], e["size"]) for e in snapshot["device_traces"][0]]


def test_an_estimate_is_the_capture_of_the_same_program_run_for_real() -> None:
    with cpu.capture(default_device=False, cuda_identity=True) as cap:
        cap.record_memory_history(stacks="python")
        _step()
        real = cap.snapshot()
    made = estimate.run(_step)
    assert _entries(made.snapshot) == _entries(real)          # the same blocks, sizes and addresses, in order
    assert [(s["address"], s["total_size"]) for s in made.snapshot["segments"]] == \
        [(s["address"], s["total_size"]) for s in real["segments"]]
    assert made.peak_allocated == cap.peak_allocated > 0
    assert made.snapshot[estimate.ESTIMATE_KEY]["fake_tensors"] is True


def test_what_fake_tensors_cannot_follow_names_the_line(tmp_path: Path) -> None:
    def branch_on_data() -> None:
        x = torch.randn(4, 4, device="cuda")
        if x.sum() > 0:                                      # needs a value
            x = x * 2
    with pytest.raises(estimate.EstimateRefused, match=r"test_estimate\.py:\d+ \(if x\.sum\(\) > 0:.*reads a value"):
        estimate.run(branch_on_data)

    def data_dependent_shape() -> None:
        x = torch.randn(4, 4, device="cuda")
        x.nonzero()
    with pytest.raises(estimate.EstimateRefused, match=r"x\.nonzero\(\).*depends on the tensor's values"):
        estimate.run(data_dependent_shape)


def test_an_estimate_past_the_capacity_is_an_out_of_memory() -> None:
    made = estimate.run(_step, 64, capacity=24 << 20)
    assert made.oom and made.fits is False
    assert "test_estimate.py" in made.oom_at
    assert any(e["action"] == "oom" for e in made.snapshot["device_traces"][0])
    assert estimate.run(_step, 1, capacity=1 << 30).fits is True


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "snapanalyze", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("estimate")
    (folder / "train.py").write_text(PROGRAM)
    out = _cli("estimate", "-o", str(folder / "est.pickle"), "--shape", "batch=8", "--capacity", "1GiB", "--",
               "python", str(folder / "train.py"), "--batch", "{batch}")
    assert out.returncode == 0, out.stderr
    assert "an estimate (fake tensors on this CPU, no GPU)" in out.stdout and "fits" in out.stdout
    assert "what holds the peak:" in out.stdout and "foreach" not in out.stdout     # the program chose foreach
    assert "peak" in out.stderr                                # the program's own prints go to stderr
    return folder / "est.pickle"


def test_every_command_reads_an_estimate_and_says_so(made: Path, tmp_path: Path) -> None:
    shown = _cli("attribute", str(made))
    assert shown.returncode == 0 and "an estimate" in shown.stdout.splitlines()[0]
    doc = json.loads(_cli("attribute", str(made), "--format", "json").stdout)
    assert doc["estimate"] is True and any("an estimate, not a measurement" in w for w in doc["warnings"])
    assert "batch=8" in doc["warnings"][0]
    for args in (["peaks", str(made)], ["summary", str(made)], ["phases", str(made)],
                 ["whatif", str(made), "--set", "expandable_segments:True"], ["diff", str(made), str(made)],
                 ["check", str(made), "--budget", "80GiB"]):
        out = _cli(*args)
        assert out.returncode == 0, (args, out.stderr)
        assert "an estimate, not a measurement" in out.stderr, args
    report = tmp_path / "report.html"
    out = _cli("report", str(made), "-o", str(report))
    assert out.returncode == 0, out.stderr
    assert "an estimate, not a measurement" in report.read_text()


def test_an_estimate_is_never_overwritten_without_force(made: Path) -> None:
    before = made.read_bytes()
    out = _cli("estimate", "-o", str(made), "--", "python", str(made.parent / "train.py"))
    assert out.returncode != 0 and "exists (--force replaces it)" in out.stderr
    assert made.read_bytes() == before


def test_a_program_that_does_not_run_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("import torch\nx = torch.ones(3, device='cuda')\nprint(x.item())\n")
    out = _cli("estimate", "-o", str(tmp_path / "e.pickle"), "--", "python", str(tmp_path / "bad.py"))
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert f"{tmp_path / 'bad.py'}:3 (print(x.item()))" in out.stderr
    assert not (tmp_path / "e.pickle").exists()


def test_a_shape_sweep_gives_the_capacity_contract(made: Path, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    out = _cli("estimate", "-o", str(sweep), "--shape", "batch=1,2,4,8", "--capacity", "64MiB", "--",
               "python", str(made.parent / "train.py"), "--batch", "{batch}")
    assert out.returncode == 0, out.stderr
    files = sorted(sweep.glob("*.pickle"))
    assert [f.name for f in files] == ["batch=1.pickle", "batch=2.pickle", "batch=4.pickle", "batch=8.pickle"]
    assert "largest that fits: batch=" in out.stdout
    peaks = [pickle.loads(f.read_bytes())[estimate.ESTIMATE_KEY]["peak_allocated"] for f in files]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]
    fit = _cli("capacity", *map(str, files), "--format", "json")
    assert fit.returncode == 0, fit.stderr
    assert json.loads(fit.stdout)


def test_the_readme_example_says_what_fits(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    out = _cli("estimate", "--capacity", "24GiB", "-o", str(tmp_path / "est.pickle"), "--", "python",
               str(root / "examples" / "train_gpt.py"), "--batch", "4", "--tokens", "4096", "--checkpoint")
    assert out.returncode == 0, out.stderr
    assert "of 24.00 GiB: fits" in out.stdout and "flash" in out.stdout
    out = _cli("estimate", "--capacity", "24GiB", "-o", str(tmp_path / "big.pickle"), "--", "python",
               str(root / "examples" / "train_gpt.py"), "--batch", "8", "--tokens", "4096", "--checkpoint")
    assert out.returncode == 1 and "does NOT fit in 24.00 GiB (out of memory at " in out.stdout
    assert _cli("explain-oom", str(tmp_path / "big.pickle")).returncode == 0
