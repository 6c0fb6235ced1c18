"""The fast exit: the console entry point's output, exit codes and errors are those of `main`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from snapanalyze.cli import main

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "fixtures" / "scenarios" / "cuda_graph_pool.pickle"
REAL = REPO / "fixtures" / "real" / "cs336-medium-ctx1024-training-t2.11.pickle"


def _console(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "snapanalyze", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


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


@pytest.mark.slow
def test_parquet_reads_of_bytes_end_without_an_abort() -> None:
    """fixtures/sweeps.py --check compares Parquet bytes; read pre-buffered (pq.read_table's default), Arrow's I/O
    thread could free a buffer wrapping them during interpreter shutdown: "terminate called without an active
    exception", exit 134, about once in twenty runs. Fifty fresh interpreters run that comparison and exit cleanly."""
    code = ("import sys; sys.path.insert(0, 'fixtures'); import sweeps, pathlib; "
            "data = pathlib.Path(sys.argv[1]).read_bytes(); "
            "assert all(sweeps._same('m.parquet', data, data) for _ in range(20))")
    markers = next(REPO.glob("fixtures/sweeps/**/markers.parquet"))
    for _ in range(50):
        done = subprocess.run([sys.executable, "-c", code, str(markers)], capture_output=True, text=True, cwd=REPO,
                              timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
