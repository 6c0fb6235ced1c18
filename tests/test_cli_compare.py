"""CLI: `diff`, `capacity` and `check` — tables, JSON documents and exit codes (1 only for an exceeded limit)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner, Result
from conftest import ROOT

from snapanalyze.cli import main

REAL = [ROOT / "fixtures" / "real" / f"cs336-medium-ctx{n}-inference-t2.11.pickle" for n in (128, 256, 512, 1024)]
SWEEPS = ROOT / "fixtures" / "sweeps"
FIX = SWEEPS / "logits_float_fix"


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_diff_of_a_file_with_itself_says_so() -> None:
    result = run("diff", REAL[-1], REAL[-1])
    assert result.exit_code == 0, result.output
    assert "no difference" in result.stdout
    doc = json.loads(run("diff", REAL[-1], REAL[-1], "--format", "json").stdout)
    assert doc["identical"] is True and doc["categories"] == [] and doc["stacks"] == []
    assert doc["peaks"][0]["delta"] == {"active_bytes": 0, "baseline_bytes": 0, "transient_bytes": 0,
                                        "reserved_bytes": 0}
    everything = json.loads(run("diff", REAL[-1], REAL[-1], "--format", "json", "--all").stdout)
    assert everything["stacks"] and {s["status"] for s in everything["stacks"]} == {"same"}


def test_diff_shows_the_planted_fix() -> None:
    expected = json.loads((FIX / "expected.json").read_text())
    doc = json.loads(run("diff", FIX / "before.pickle", FIX / "after.pickle", "--format", "json").stdout)
    assert doc["identical"] is False
    assert [(s["status"], s["delta_bytes"]) for s in doc["stacks"]] == [("vanished", -expected["planted"]["bytes"])]
    assert doc["counts"]["vanished"] == 1 and doc["counts"]["new"] == 0
    assert [(c["category"], c["delta_bytes"]) for c in doc["categories"]] == list(expected["category_deltas"].items())
    assert [p["phase"] for p in doc["peaks"]] == [None, "score"]
    table = run("diff", FIX / "before.pickle", FIX / "after.pickle").stdout
    assert "vanished" in table and "score.py:64:score" in table and "1 vanished" in table


def test_diff_at_a_missing_phase_is_exit_2() -> None:
    result = run("diff", FIX / "before.pickle", FIX / "after.pickle", "--phase", "nope")
    assert result.exit_code == 2 and "no phase 'nope'" in result.stderr


def test_capacity_from_file_names_on_the_real_sweep() -> None:
    result = run("capacity", *REAL, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["driver"] == "tokens" and [p["shape"] for p in doc["points"]] == [{"tokens": n} for n in
                                                                                   (128, 256, 512, 1024)]
    fits = {f["target"]: f for f in doc["fits"]}
    assert fits["attention_related"]["model"] == "quadratic" and fits["total"]["model"] == "quadratic"
    # the one jump: only the ctx512 run used autocast, whose bf16 copy of the lm_head weight appears
    assert [(j["category"], j["how"]) for j in doc["jumps"]] == [("weights", "appears")] and doc["contract"] is None
    text = run("capacity", *REAL).stdout
    assert "attention_related*" in text and "quadratic" in text and "weights appears" in text


def test_capacity_contract_and_jump_in_the_table() -> None:
    files = sorted((SWEEPS / "attention_threshold").glob("*.pickle"))
    result = run("capacity", *files, "--budget", "80GiB", "--concurrency", "1", "--concurrency", "4")
    assert result.exit_code == 0, result.output
    assert "tokens 4096 → 5120: fallback_kernel appears" in result.stdout
    assert "hold back" in result.stdout and "concurrency" in result.stdout
    doc = json.loads(run("capacity", *files, "--budget", "80GiB", "--format", "json").stdout)
    assert doc["contract"]["budget_bytes"] == 80 << 30
    assert [lim["concurrency"] for lim in doc["contract"]["limits"]][:2] == [1, 2]
    assert doc["jumps"][0]["category"] == "fallback_kernel"


def test_capacity_from_a_manifest_without_inputs() -> None:
    doc = json.loads(run("capacity", "--shape-from", SWEEPS / "chunked_prefill" / "manifest.csv",
                         "--transient-budget", "300MiB", "--margin", "0", "--format", "json").stdout)
    assert doc["driver"] == "chunk" and len(doc["points"]) == 8
    assert doc["points"][0]["shape"]["engine"] == "vllm-v1"
    assert doc["contract"]["transient_budget_bytes"] == 300 << 20
    assert 4096 < doc["contract"]["limits"][0]["max_x"] < 8192


def test_capacity_from_markers_of_a_copied_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(SWEEPS / "phase_markers" / "run", run_dir)
    doc = json.loads(run("capacity", run_dir, "--shape-from", "markers", "--format", "json").stdout)
    assert [p["phase"] for p in doc["points"]] == ["prefill#1", "prefill#2", "prefill#3", "prefill#4"]
    assert [p["shape"]["tokens"] for p in doc["points"]] == [1024, 2048, 4096, 8192]


def test_capacity_errors_are_exit_2() -> None:
    result = run("capacity", ROOT / "fixtures" / "scenarios" / "moe_long_prefill.pickle", REAL[0])
    assert result.exit_code == 2 and "no shape in the file name" in result.stderr
    result = run("capacity", *REAL, "--margin", "0.1")
    assert result.exit_code == 2 and "give --budget" in result.stderr
    result = run("capacity", *REAL, "--budget", "lots")
    assert result.exit_code == 2 and "not a size" in result.stderr


def test_check_passes_and_fails_with_exit_codes() -> None:
    ok = run("check", REAL[-1], "--budget", "70GiB", "--max", "fallback_kernel=1GiB", "--format", "json")
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc["passed"] is True and doc["failures"] == [] and len(doc["checks"]) == 2
    over = run("check", REAL[-1], "--budget", "2.5GiB", "--max-transient", "512MiB", "--format", "json")
    assert over.exit_code == 1
    doc = json.loads(over.stdout)                       # the document is still printed for CI
    assert doc["passed"] is False and len(doc["failures"]) == 2
    assert over.stderr.startswith("snapanalyze: error:") and "exceed the budget" in over.stderr
    table = run("check", REAL[-1], "--budget", "2GB")
    assert table.exit_code == 1 and "OVER" in table.stdout and "FAILED" in table.stdout


def test_check_usage_errors_are_exit_2() -> None:
    assert run("check", REAL[-1]).exit_code == 2
    bad = run("check", REAL[-1], "--max", "nosuch=1GiB")
    assert bad.exit_code == 2 and "unknown category" in bad.stderr
    assert run("check", REAL[-1], "--budget", "1.5.5GB").exit_code == 2
