"""CLI: `diff`, `capacity` and `check` — tables, JSON documents and exit codes (1 only for an exceeded limit)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from conftest import ROOT

from snapanalyze.cli import main
from snapanalyze.units import fmt_bytes

REAL = [ROOT / "fixtures" / "real" / f"cs336-medium-ctx{n}-inference-t2.11.pickle" for n in (128, 256, 512, 1024)]
SWEEPS = ROOT / "fixtures" / "sweeps"
FIX = SWEEPS / "logits_float_fix"


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A $COLUMNS of the shell running the tests would fit the text to it: these tests read it unfitted."""
    monkeypatch.delenv("COLUMNS", raising=False)


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


def test_diff_flags_each_side_s_inferred_bytes() -> None:
    run_dir = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "tp2_vision_encoder"
    a, b = run_dir / "rank=0", run_dir / "rank=1"
    doc = json.loads(run("diff", a, b, "--format", "json").stdout)
    mlp = next(c for c in doc["categories"] if c["category"] == "mlp")
    assert (mlp["a_inferred_bytes"], mlp["b_inferred_bytes"]) == (296 << 20, 0)
    lines = run("diff", a, b).stdout.splitlines()
    assert any(line.split()[1:2] == ["mlp"] and line.endswith("296.00 MiB / –") for line in lines)
    assert any(line.startswith("inferred = bytes decided by sizes") for line in lines)


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


def test_capacity_labels_extrapolated_and_bounded_answers_and_spells_units() -> None:
    files = sorted((SWEEPS / "attention_threshold").glob("*.pickle"))
    result = run("capacity", *files, "--budget", "80GiB")
    assert result.exit_code == 0, result.output
    rows = {m.group(1): line for line in result.stdout.splitlines() if (m := re.match(r"\s+(\d+)\s{2}", line))}
    assert "(extrapolated)" in rows["1"] and "8,192 (bound: 2× measured)" in rows["2"]
    assert "256 (bound: 2× measured)" in rows["64"]
    assert "note: answers stop at 2× the largest measured shape" in result.stdout
    assert "331 bytes/token²" in result.stdout and "48.00 KiB/token" in result.stdout     # the MLP, its norm apart
    assert "/tokens" not in result.stdout
    doc = json.loads(run("capacity", *files, "--budget", "80GiB", "--format", "json").stdout)
    assert all(lim["max_x"] <= 2 * 8192 for lim in doc["contract"]["limits"] if lim["max_x"] is not None)
    assert [lim["bounded"] for lim in doc["contract"]["limits"]][:2] == [False, True]
    far = run("capacity", *files, "--budget", "80GiB", "--target", "20000")
    assert far.exit_code == 2 and far.stdout == ""
    assert far.stderr.count("\n") == 1 and "2× the largest measured shape (8192)" in far.stderr


def test_capacity_fits_the_terminal_width() -> None:
    files = [str(f) for f in sorted((SWEEPS / "attention_threshold").glob("*.pickle"))]
    for width in (80, 200):
        out = CliRunner().invoke(main, ["capacity", *files, "--budget", "80GiB"], env={"COLUMNS": str(width)})
        assert out.exit_code == 0, out.output
        assert max(len(line) for line in out.stdout.splitlines()) <= width
        narrow = "  total: quadratic, 331 bytes/token² · q; max residual 0.7%" in out.stdout
        assert narrow == (width == 80)                  # the fits table at 200, one line per fit at 80
        assert "8,192 (bound: 2× measured)" in out.stdout


def test_capacity_of_two_shapes_is_insufficient_data() -> None:
    result = run("capacity", REAL[2], REAL[3], "--budget", "24GiB")
    assert result.exit_code == 0, result.output
    fits = [line for line in result.stdout.splitlines() if line.startswith(("total ", "attention "))]
    assert len(fits) == 2 and all("insufficient data" in line and "0.0%" not in line for line in fits)
    assert "insufficient data: no regime of the total transient has 3 or more shapes" in result.stdout
    assert "hold back 1.09 GiB" in result.stdout                      # the measured 1024-token transient
    doc = json.loads(run("capacity", REAL[2], REAL[3], "--budget", "24GiB", "--format", "json").stdout)
    total = next(f for f in doc["fits"] if f["target"] == "total")
    assert total["model"] == "insufficient" and total["max_rel_residual"] is None
    assert doc["contract"]["limits"] == [{"concurrency": 1, "max_x": None, "max_total": None, "predicted_bytes": None,
                                          "extrapolated": False, "unbounded": False, "bounded": False,
                                          "insufficient": True}]


def test_check_passes_and_fails_with_exit_codes() -> None:
    ok = run("check", REAL[-1], "--budget", "70GiB", "--max", "fallback_kernel=1GiB", "--format", "json")
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc["passed"] is True and doc["failures"] == [] and len(doc["checks"]) == 2
    over = run("check", REAL[-1], "--budget", "2.5GiB", "--max-transient", "512MiB", "--format", "json")
    assert over.exit_code == 1
    doc = json.loads(over.stdout)                       # the document is still printed for CI
    assert doc["passed"] is False and len(doc["failures"]) == 2
    assert "exceed the budget" in doc["failures"][0] and over.stderr == ""     # a result, not an error
    table = run("check", REAL[-1], "--budget", "2GB", "--max-transient", "4GiB")
    assert table.exit_code == 1 and table.stderr == ""
    budget, transient = json.loads(run("check", REAL[-1], "--budget", "2GB", "--max-transient", "4GiB",
                                       "--format", "json").stdout)["checks"]
    b = {k: fmt_bytes(abs(v)) for k, v in budget.items() if k.endswith("_bytes")}
    t = {k: fmt_bytes(abs(v)) for k, v in transient.items() if k.endswith("_bytes")}
    assert table.stdout.splitlines() == [          # one line per limit, its verdict first
        str(REAL[-1]),
        f"FAIL  peak active {b['actual_bytes']} > budget {b['limit_bytes']} by {b['headroom_bytes']} (device 0)",
        f"ok    transient (peak − active bytes at the window start) {t['actual_bytes']} ≤ max transient "
        f"{t['limit_bytes']}, {t['headroom_bytes']} to spare (device 0)",
        "FAILED: 1 of 2 limits exceeded"]


def test_check_usage_errors_are_exit_2() -> None:
    assert run("check", REAL[-1]).exit_code == 2
    bad = run("check", REAL[-1], "--max", "nosuch=1GiB")
    assert bad.exit_code == 2 and "unknown category" in bad.stderr
    assert run("check", REAL[-1], "--budget", "1.5.5GB").exit_code == 2


TP2 = ROOT / "fixtures" / "runs" / "tp2_vision_encoder"


def test_check_of_a_run_fails_when_any_rank_exceeds_and_names_it() -> None:
    result = run("check", TP2, "--budget", "56GiB", "--format", "json")
    assert result.exit_code == 1 and result.stderr == ""
    doc = json.loads(result.stdout)
    assert doc["passed"] is False and doc["run"] == str(TP2) and doc["problems"] == []
    assert [(r["rank"], r["passed"]) for r in doc["ranks"]] == [(0, True), (1, False)]
    (failure,) = doc["failures"]
    assert failure.startswith("rank 1: ") and "exceed the budget" in failure
    assert run("check", TP2, "--budget", "60GiB").exit_code == 0
    alone = run("check", TP2, "--rank", "0", "--budget", "56GiB", "--format", "json")
    assert alone.exit_code == 0 and "ranks" not in json.loads(alone.stdout)


def test_a_size_needs_a_unit() -> None:
    bare = run("check", REAL[-1], "--budget", "70")
    assert bare.exit_code == 2 and bare.stdout == ""
    assert "Invalid value for '--budget': '70' has no unit: write 70GiB, 70MiB or 70B (bytes)" in bare.stderr
    assert run("check", REAL[-1], "--max-transient", "1.5").exit_code == 2
    category = run("check", REAL[-1], "--max", "logits=4")
    assert category.exit_code == 2 and "Invalid value for '--max': '4' has no unit" in category.stderr
    assert run("check", REAL[-1], "--budget", "0").exit_code == 1               # 0 needs no unit
    bytes_ = json.loads(run("check", REAL[-1], "--budget", "70B", "--format", "json").stdout)
    assert bytes_["checks"][0]["limit_bytes"] == 70
    assert run("--max-memory", "8", "peaks", REAL[-1]).exit_code == 2


def test_diff_of_two_runs_goes_rank_by_rank_and_a_file_serves_every_rank() -> None:
    doc = json.loads(run("diff", TP2, TP2, "--format", "json").stdout)
    assert doc["a"] == str(TP2) and doc["b"] == str(TP2) and doc["problems"] == []
    assert [(r["rank"], r["identical"]) for r in doc["ranks"]] == [(0, True), (1, True)]
    rank0 = TP2 / "rank=0" / "snapshot-final.pickle"
    against = json.loads(run("diff", TP2, rank0, "--format", "json").stdout)
    assert [(r["rank"], r["identical"], r["b"]) for r in against["ranks"]] == \
        [(0, True, str(rank0)), (1, False, str(rank0))]
    vision = next(c for c in against["ranks"][1]["categories"] if c["category"] == "vision_encoder")
    assert vision["b_bytes"] == 0 and vision["delta_bytes"] == -vision["a_bytes"] < 0
    table = run("diff", TP2, rank0)
    assert table.exit_code == 0 and table.stdout.count("== rank ") == 2 and "vision_encoder" in table.stdout
    one = json.loads(run("diff", TP2, TP2, "--rank", "1", "--format", "json").stdout)
    assert "ranks" not in one and one["identical"] is True
