"""The fast exit: nothing kept outside a fast-exiting command's one input; the console entry point's output,
exit codes and errors are those of `main`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from snapanalyze import fastexit
from snapanalyze.cli import main
from snapanalyze.load import load

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "fixtures" / "scenarios" / "cuda_graph_pool.pickle"
REAL = REPO / "fixtures" / "real" / "cs336-medium-ctx1024-training-t2.11.pickle"


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """This process as if it will end through fastexit.exit; what was kept, emptied afterwards."""
    monkeypatch.setattr(fastexit, "_enabled", True)
    kept: list[object] = []
    monkeypatch.setattr(fastexit, "_kept", kept)
    return kept


def _console(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "snapanalyze", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


def test_nothing_is_kept_by_a_process_that_frees_its_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    kept: list[object] = []
    monkeypatch.setattr(fastexit, "_kept", kept)
    with fastexit.single_input():            # the tests' in-process command line: not enabled
        assert fastexit.keep(object()) is False
        load(FIXTURE)
    assert kept == []


def test_only_the_single_input_of_a_fast_exiting_process_is_kept(fast: list[object]) -> None:
    assert fastexit.keep(object()) is False  # outside single_input: a run's ranks, the Python API
    with fastexit.single_input():
        assert fastexit.keep("x") is True
    assert fast == ["x"]
    assert fastexit.keep(object()) is False


def test_a_kept_input_loads_to_the_same_snapshot(fast: list[object]) -> None:
    freed = load(REAL)
    with fastexit.single_input():
        kept = load(REAL)
        assert len(fast) == 1                # the raw objects, left for the exit
        load(REAL, frames=False)             # no frames: its raw objects are freed as the columns are built
        assert len(fast) == 1
    for name in freed.block_columns:
        assert np.array_equal(freed.block_columns[name], kept.block_columns[name])
    for device, trace in freed.traces.items():
        other = kept.traces[device]
        assert np.array_equal(trace.addr, other.addr) and np.array_equal(trace.action, other.action)
        everything = np.arange(len(trace))
        assert [freed.stack(s) for s in freed.event_stack_ids(device, everything)] == \
            [kept.stack(s) for s in kept.event_stack_ids(device, everything)]


def test_the_console_entry_point_prints_everything_main_prints() -> None:
    expected = CliRunner().invoke(main, ["attribute", str(REAL), "--format", "csv"])
    assert expected.exit_code == 0
    done = _console("attribute", str(REAL), "--format", "csv")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout) > 1 << 16        # more than a pipe holds: flushed before the exit
    assert done.stdout == expected.output
    document = _console("peaks", str(FIXTURE), "--format", "json")
    assert document.returncode == 0 and json.loads(document.stdout)["devices"][0]["peaks"]


def test_the_console_entry_point_keeps_main_s_exit_codes(tmp_path: Path) -> None:
    missing = _console("attribute", str(tmp_path / "none.pickle"))
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [f"snapanalyze: error: {tmp_path / 'none.pickle'}: no such file"]
    over = _console("check", str(FIXTURE), "--budget", "1MiB")
    assert over.returncode == 1 and "\nFAIL  peak active" in over.stdout
    usage = _console("attribute")
    assert usage.returncode == 2 and "Missing argument" in usage.stderr
