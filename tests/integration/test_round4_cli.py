"""Answers true on real files (issue 50): the commands as a user runs them, from where a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "fixtures" / "runs" / "tp2_vision_encoder"


def test_workers_import_this_package_from_a_clone_s_parent_folder(tmp_path: Path) -> None:
    """Run from a folder holding a folder named snapanalyze (a clone's parent), the forkserver's workers imported
    that folder and died ("killed for memory?"); they import the package the command runs."""
    (tmp_path / "snapanalyze").mkdir()
    (tmp_path / "snapanalyze" / "__init__.py").write_text("SHADOW = 'the shadowing folder was imported'\n")
    exe = Path(sys.executable).with_name("snapanalyze")
    command = [str(exe)] if exe.exists() else [sys.executable, "-P", "-m", "snapanalyze"]
    done = subprocess.run([*command, "ranks", str(RUN), "--jobs", "2", "--format", "json"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "died" not in done.stderr and "/snapanalyze/__init__.py" not in done.stderr


def test_every_answer_about_a_file_that_ran_out_of_memory_says_so_first() -> None:
    import json
    oom = ROOT / "fixtures" / "scenarios" / "oom_live_exhaustion.pickle"
    for command in ("attribute", "peaks"):
        done = subprocess.run([sys.executable, "-m", "snapanalyze", command, str(oom)], capture_output=True, text=True,
                              env={**os.environ, "COLUMNS": "200"})
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[1] == ("OUT OF MEMORY on device 0 at event 112: a request of 32.00 MiB failed, device free "
                            "13.00 MiB"), command
        assert lines[2] == f"  why: snapanalyze explain-oom {oom}"
        doc = json.loads(subprocess.run([sys.executable, "-m", "snapanalyze", command, str(oom), "--format", "json"],
                                        capture_output=True, text=True).stdout)
        assert doc["ooms"] == [{"device": 0, "index": 112, "request_bytes": 33554432, "device_free_bytes": 13631488}]
    clean = ROOT / "fixtures" / "scenarios" / "cuda_graph_pool.pickle"
    done = subprocess.run([sys.executable, "-m", "snapanalyze", "attribute", str(clean)], capture_output=True,
                          text=True)
    assert "OUT OF MEMORY" not in done.stdout


def test_wording_says_what_it_means() -> None:
    from snapanalyze.units import fmt_share
    assert fmt_share(2 / 4499) == "<0.1%" and fmt_share(0) == "0.0%" and fmt_share(0.25) == "25.0%"
    assert fmt_share(4498 / 4499) == ">99.9%" and fmt_share(1.0) == "100.0%"
    readme = (ROOT / "README.md").read_text()
    assert "a bare repeated name means its occurrence with the highest peak" in readme
    done = subprocess.run([sys.executable, "-m", "snapanalyze", "explain-oom",
                           str(ROOT / "fixtures" / "scenarios" / "cuda_graph_pool.pickle")], capture_output=True,
                          text=True)
    assert "((" not in done.stdout and "))" not in done.stdout
