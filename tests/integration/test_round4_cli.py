"""Answers true on real files (issue 50): the commands as a user runs them, from where a user runs them."""

from __future__ import annotations

import json
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


LOG_LINES = [
    "(EngineCore_0 pid=41807) DEBUG 09-03 16:28:25 [gpu_worker.py:244] Memory profiling takes 3.10 seconds. Total non "
    "KV cache memory: 16.45GiB; torch peak memory increase: 2.44GiB; non-torch forward increase memory: 0.41GiB; "
    "weights memory: 13.60GiB.",
    "(EngineCore_0 pid=41807) INFO 09-03 16:28:25 [gpu_worker.py:245] Available KV cache memory: 46.88 GiB"]


def _budget(tmp_path: Path, lines: list[str]) -> dict[str, object]:
    log = tmp_path / "vllm.log"
    log.write_text("\n".join(lines) + "\n")
    done = subprocess.run([sys.executable, "-m", "snapanalyze", "budget",
                           str(ROOT / "fixtures" / "sweeps" / "vllm_budget" / "run-01.pickle"), "--shape-from", "none",
                           "--engine-log", str(log), "--total", "80GiB", "--format", "json"],
                          capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    doc: dict[str, object] = json.loads(done.stdout)
    return doc


def test_budget_derives_the_utilisation_a_log_does_not_print(tmp_path: Path) -> None:
    """A vLLM log without gpu_memory_utilization: the run used 0.8, which its figures imply (16.45 GiB non-KV +
    46.88 GiB KV of 80 GiB); the 0.9 default was assumed, and advice given from it."""
    text = json.dumps(_budget(tmp_path, LOG_LINES))
    assert '"source": "derived"' in text and "0.792" in text and "its own figures imply it" in text
    assert "default gpu_memory_utilization 0.9" not in text


def test_budget_flags_a_stated_utilisation_its_figures_contradict(tmp_path: Path) -> None:
    stated = ["INFO 09-03 16:28:10 [utils.py:328] non-default args: {'model': 'm', 'gpu_memory_utilization': 0.95}"]
    text = json.dumps(_budget(tmp_path, stated + LOG_LINES))
    assert "utilization_contradicted" in text


def _legacy_state_only(tmp_path: Path) -> Path:
    """The shipped state-only file with a 1-entry legacy trace, as `summary` calls 'state only'."""
    import pickle
    sys.path.insert(0, str(ROOT / "fixtures"))
    try:
        from support import read_builtins
    finally:
        sys.path.remove(str(ROOT / "fixtures"))
    snap = read_builtins(ROOT / "fixtures" / "real" / "docubox-state-only.pickle")
    seg = snap["segments"][0]
    snap["device_traces"] = [[{"action": "alloc", "addr": seg["address"], "size": seg["blocks"][0]["size"],
                               "stream": 0, "frames": []}]]
    path = tmp_path / "state.pickle"
    path.write_bytes(pickle.dumps(snap))
    return path


def test_a_state_only_file_gets_no_verdict_about_a_peak_that_never_happened(tmp_path: Path) -> None:
    path = _legacy_state_only(tmp_path)
    done = subprocess.run([sys.executable, "-m", "snapanalyze", "attribute", str(path)], capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "the allocator's state (the file holds no trace" in done.stdout
    assert "global peak" not in done.stdout and "transient" not in done.stdout
    doc = json.loads(subprocess.run([sys.executable, "-m", "snapanalyze", "attribute", str(path), "--format", "json"],
                                    capture_output=True, text=True).stdout)
    assert doc["devices"][0]["instant"] == "allocator state"
    peaks = subprocess.run([sys.executable, "-m", "snapanalyze", "peaks", str(path)], capture_output=True, text=True,
                           env={**os.environ, "COLUMNS": "200"}).stdout
    assert "the allocator's state and a 1-entry legacy trace: no peak can be found in it" in peaks
    assert "transient" not in peaks.split("active =")[0]
    doc = json.loads(subprocess.run([sys.executable, "-m", "snapanalyze", "peaks", str(path), "--format", "json"],
                                    capture_output=True, text=True).stdout)
    assert doc["devices"][0]["state_only"] is True
    report = tmp_path / "report.html"
    done = subprocess.run([sys.executable, "-m", "snapanalyze", "report", str(path), "-o", str(report)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    import html
    text = html.unescape(report.read_text())
    assert "holds the allocator's state but no trace" in text
    assert "made the difference" not in text and "To lower the peak" not in text
    assert "fig-timeline" not in text                  # no one-point timeline on a hairline axis
    assert "fig-categories" not in text                # nor a one-event chart of categories (seen in Chromium)
    assert "Device 0, the allocator's state" in text and "peak 1" not in text   # not a peak: the state
    assert "so an allocation failure cannot be seen in it" in text


def test_advice_fits_the_numbers_it_is_given_for() -> None:
    """Advice is ranked by the bytes it could save at the peak, says them, and is left out below 5 % of it (sharding
    was advised for 15 KiB of optimizer state in a 9.95 GiB peak)."""
    from snapanalyze.report.oom_text import peak_advice
    gib = 1 << 30
    # the training engine advises on optimizer state whenever it is live: here 15 KiB of a 9.95 GiB peak
    advice = peak_advice("logits", "training", {"logits": 4 * gib, "optimizer_state": 15 * 1024, "weights": 5 * gib},
                         int(9.95 * gib))
    assert advice[0].startswith("for logits (4.00 GiB, 40.2% of the peak)")
    assert len(advice) == 1 and not any("optimizer_state" in a for a in advice)
    big = peak_advice(None, "training", {"optimizer_state": 3 * gib, "mlp": 5 * gib}, 10 * gib)
    assert len(big) == 1 and big[0].startswith("for optimizer_state (3.00 GiB, 30.0% of the peak)")


def test_diff_matches_a_site_whose_callers_moved(tmp_path: Path) -> None:
    """The program's script changed (every stack now passes through a new run() in its own file): a site was
    called both new and vanished ('5 new, 5 vanished'); it is matched by what the user sees, and the match says
    it needed fuzziness."""
    import pickle
    sys.path.insert(0, str(ROOT / "fixtures"))
    try:
        from support import read_builtins
    finally:
        sys.path.remove(str(ROOT / "fixtures"))
    before = ROOT / "fixtures" / "sweeps" / "logits_float_fix" / "before.pickle"
    snap = read_builtins(before)
    extra = {"filename": "/home/me/srv/eval/run.py", "line": 10, "name": "run"}
    seen: set[int] = set()
    for frames in [e.get("frames") for t in snap["device_traces"] for e in t] + \
            [b.get("frames") for seg in snap["segments"] for b in seg["blocks"]]:
        if frames and id(frames) not in seen:
            seen.add(id(frames))
            frames.append(extra)
    moved = tmp_path / "moved.pickle"
    moved.write_bytes(pickle.dumps(snap))
    doc = json.loads(subprocess.run([sys.executable, "-m", "snapanalyze", "diff", str(before), str(moved), "--format",
                                     "json", "--all"], capture_output=True, text=True).stdout)
    statuses = {s["status"] for s in doc["stacks"]}
    assert "new" not in statuses and "vanished" not in statuses
    assert any(s["matched"] == "site" for s in doc["stacks"])
    assert any("matched by their site alone" in n and "fuzzy" in n for n in doc["notes"])


def test_a_negative_kv_figure_is_named_not_budgeted(tmp_path: Path) -> None:
    """vLLM logs a negative 'Available KV cache memory' when nothing is left for the pool: a failed budget, never
    negative bytes (issue 49, item 8)."""
    lines = [LOG_LINES[0], "(EngineCore_0 pid=41807) INFO 09-03 16:28:25 [gpu_worker.py:245] Available KV cache "
             "memory: -4.50 GiB"]
    doc = _budget(tmp_path, lines)
    text = json.dumps(doc)
    assert "kv_negative" in text
    assert "-4831838208" not in text and "-4.5" not in text.replace("-4.50 GiB", "")


def test_a_peak_past_the_capacity_without_a_failure_is_a_contradiction_not_a_negative_headroom(
        tmp_path: Path) -> None:
    """The OOM run with its failure entry taken out: its peak (NVML used) is 86 MiB past the device's capacity
    although nothing failed. explain-oom said 'the peak stayed -86.00 MiB below capacity' (headroom_bytes −90,177,536);
    the figures contradict each other, and the answer says so instead."""
    import pickle
    import shutil
    run = tmp_path / "run"
    shutil.copytree(ROOT / "fixtures" / "runs" / "oom_other_process", run)
    path = run / "rank=0" / "snapshot-oom-1.pickle"
    raw = pickle.loads(path.read_bytes())
    raw["device_traces"][0] = [e for e in raw["device_traces"][0] if e.get("action") != "oom"]
    path.write_bytes(pickle.dumps(raw))
    done = subprocess.run([sys.executable, "-m", "snapanalyze", "explain-oom", str(run), "--format", "json"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (no_oom,) = json.loads(done.stdout)["snapshots"][0]["no_oom"]
    assert no_oom["headroom_bytes"] is None and no_oom["contradiction_bytes"] == 90_177_536
    text = subprocess.run([sys.executable, "-m", "snapanalyze", "explain-oom", str(run)], capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "200"}).stdout
    assert "exceeds the capacity" in text and "contradict each other" in text and "below capacity" not in text
