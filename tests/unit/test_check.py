"""check: sizes parse, limits are measured against the right numbers, an exceeded limit exits 1."""

from __future__ import annotations

import pytest
from conftest import ROOT

from snapanalyze import attribute_phase, load, phase_table
from snapanalyze.analyze.attribute import attribute
from snapanalyze.analyze.check import BudgetExceeded, check, parse_bytes, parse_limits
from snapanalyze.errors import SnapanalyzeError, UsageError
from snapanalyze.replay import replay

REAL = ROOT / "fixtures" / "real" / "cs336-medium-ctx1024-inference-t2.11.pickle"
SOURCE = ROOT / "fixtures" / "real" / "source" / "cs336-medium-ctx1024-inference-t2.11"
PEAK = 2_877_435_904        # active bytes at its global peak (see test_capacity / attribute)
GiB, MiB = 1 << 30, 1 << 20


@pytest.mark.parametrize("text, value", [
    ("70GiB", 70 * GiB), ("512MiB", 512 * MiB), ("1.5GB", 1_500_000_000), ("4096", 4096), (" 2 GiB ", 2 * GiB),
    ("64k", 65536), ("1_000", 1000), ("0.5TiB", GiB * 512), ("10B", 10), ("3kb", 3000), (".5GiB", GiB // 2),
    ("8gib", 8 * GiB), (123, 123),
])
def test_parse_bytes(text: str | int, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "abc", "-1GB", "5XB", "1.5.5GB", "nan", "GiB", "1e3"])
def test_parse_bytes_refuses_non_sizes(text: str) -> None:
    with pytest.raises(UsageError, match="not a size"):
        parse_bytes(text)


def test_parse_limits() -> None:
    assert parse_limits(["logits=4GiB", " mlp = 512MiB"]) == {"logits": 4 * GiB, "mlp": 512 * MiB}
    for bad in (["logits"], ["=4GiB"], ["a=1", "a=2"]):
        with pytest.raises(UsageError):
            parse_limits(bad)


def test_budget_exceeded_exits_1_unlike_other_errors() -> None:
    assert BudgetExceeded("x").exit_code == 1 and issubclass(BudgetExceeded, SnapanalyzeError)
    assert UsageError("x").exit_code == 2


def test_budget_is_checked_against_the_peak() -> None:
    snap = load(REAL)
    assert replay(snap)[0].active.max() == PEAK
    ok = check(snap, budget=PEAK)
    assert ok.passed and ok.failures() == [] and ok.rows.iloc[0]["headroom_bytes"] == 0
    over = check(snap, budget=PEAK - 1)
    assert not over.passed
    (message,) = over.failures()
    assert "exceed the budget" in message and "by 1 B" in message and str(REAL) in message


def test_the_typed_report_is_what_the_terminal_and_json_show() -> None:
    """`check` renders one frozen report per snapshot (what a worker sends back): plain values, picklable, its
    JSON strict; the terminal's verdict line follows the report."""
    import json
    import pickle

    from snapanalyze.analyze.check_result import check_report
    from snapanalyze.report.compare_terminal import render_check

    over = check_report(check(load(REAL), budget=PEAK - 1))
    assert pickle.loads(pickle.dumps(over)) == over and not over.passed
    (row,) = over.checks
    assert (row.actual_bytes, row.limit_bytes, row.headroom_bytes, row.ok) == (PEAK, PEAK - 1, -1, False)
    doc = json.loads(json.dumps(over.to_json(), allow_nan=False))
    assert doc["checks"][0]["headroom_bytes"] == -1 and doc["failures"] == list(over.failures)
    shown = render_check([(None, over)], over.source).splitlines()
    assert shown[1].startswith("FAIL  peak active") and shown[-1] == "FAILED: 1 of 1 limit exceeded"
    by_rank = render_check([(3, over)], "run", engine_fits=True).splitlines()
    assert by_rank[-1] == "FAILED: 1 of 1 limit exceeded (rank 3)" and "(rank 3, device 0)" in by_rank[1]


def test_reserved_metric_uses_the_highest_reserved_bytes() -> None:
    snap = load(REAL)
    highest = int(replay(snap)[0].reserved.max())
    row = check(snap, budget=highest, metric="reserved").rows.iloc[0]
    assert (row["actual_bytes"], bool(row["ok"]), row["subject"]) == (highest, True, "highest reserved bytes")
    assert not check(snap, budget=highest - 1, metric="reserved").passed


def test_transient_and_category_limits() -> None:
    snap = load(REAL)
    dt = replay(snap)[0]
    transient = PEAK - dt.baseline_active
    result = check(snap, max_transient=transient, max_category={"fallback_kernel": GiB, "logits": 0})
    rows = result.rows.set_index("subject")
    assert result.passed
    assert rows.loc["peak − active bytes at the window start", "actual_bytes"] == transient
    at_peak = attribute(snap).summary.set_index("category")["bytes"]
    assert rows.loc["fallback_kernel", "at_peak_bytes"] == at_peak["fallback_kernel"] == GiB
    assert rows.loc["fallback_kernel", "actual_bytes"] >= rows.loc["fallback_kernel", "at_peak_bytes"]
    assert rows.loc["logits", "actual_bytes"] == 0
    failed = check(snap, max_transient=transient - 1, max_category={"fallback_kernel": GiB - 1})
    assert len(failed.failures()) == 2
    assert any("category fallback_kernel reaches" in f for f in failed.failures())


def test_other_transients_than_at_the_peak_count_for_a_category() -> None:
    # mlp (SwiGLU, known from the program's source) holds 192 MiB at its own high-water mark (three 4 × 1024 ×
    # 4096 fp32 intermediates) but nothing at the global peak (in attention)
    row = check(load(REAL, source=SOURCE), max_category={"mlp": 100 * MiB}).rows.iloc[0]
    assert row["at_peak_bytes"] == 0 and row["actual_bytes"] == 3 * 4 * 1024 * 4096 * 4 and not row["ok"]


def test_check_needs_a_limit_and_known_categories() -> None:
    snap = load(REAL)
    with pytest.raises(UsageError, match="at least one limit"):
        check(snap)
    with pytest.raises(UsageError, match="unknown category logit"):
        check(snap, max_category={"logit": 1})
    with pytest.raises(UsageError, match="metric"):
        check(snap, budget=1, metric="allocated")
    with pytest.raises(UsageError, match="no device 2"):
        check(snap, budget=1, device=2)


def test_max_transient_over_a_phase_is_the_phases_transient() -> None:
    """One meaning per word: `check --phase P --max-transient` measures what `phases` calls P's transient (its
    peak over its start), not the peak over the window start, which counts everything loaded before P."""
    from snapanalyze.load.samples import markers_for
    run = ROOT / "fixtures" / "sweeps" / "phase_markers" / "run"
    snap, markers = load(run), markers_for(run)
    phases = phase_table(snap, markers=markers, categories=False).set_index("label")
    over_phase = check(snap, max_transient=5 << 30, phase="prefill#2", markers=markers).rows.iloc[0]
    assert over_phase["actual_bytes"] == phases.loc["prefill#2", "transient_bytes"] and over_phase["ok"]
    assert over_phase["subject"] == "peak of phase prefill#2 − active bytes at its start"
    over_window = check(snap, max_transient=5 << 30).rows.iloc[0]
    assert over_window["subject"] == "peak − active bytes at the window start" and not over_window["ok"]
    attributed = attribute_phase(snap, "prefill#2", markers=markers).instants[0]
    assert attributed.active_bytes - attributed.baseline_active_bytes == phases.loc["prefill#2", "transient_bytes"]
    assert attributed.baseline == "the start of phase prefill#2"
