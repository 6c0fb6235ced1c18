"""CLI over runs: `ranks`, `explain-oom`, `phases` and `attribute --phase` — tables, JSON numbers, and exit codes:
0 with a warning for a missing rank or NVML file, 2 with one line for input that cannot be analysed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from snapanalyze.cli import main

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "fixtures" / "runs"
SCENARIOS = ROOT / "fixtures" / "scenarios"
TP2 = RUNS / "tp2_vision_encoder"


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """A $COLUMNS of the shell running the tests would fit the text to it: these tests read it unfitted."""
    monkeypatch.delenv("COLUMNS", raising=False)


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def expected(name: str) -> dict:
    return json.loads((RUNS / f"{name}.expected.json").read_text())


@pytest.fixture()
def tp2(tmp_path: Path) -> Path:
    return Path(shutil.copytree(TP2, tmp_path / "run"))


def test_ranks_table() -> None:
    result = run("ranks", TP2)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == str(TP2)
    header = lines[1]
    for column in ("rank", "peak time", "active", "reserved", "NVML used", "outside alloc.", "top category"):
        assert column in header
    assert lines[3].split()[0] == "0" and "(est.)" in lines[3] and "OUTLIER" not in lines[3]
    assert lines[4].split()[0] == "1" and lines[4].rstrip().endswith("OUTLIER") and "(est.)" not in lines[4]
    assert "rank 1 (device 0) peaks 3.53 GiB above the median rank" in result.stdout
    assert "vision_encoder   4.07 GiB          0 B    +4.07 GiB" in result.stdout
    assert "the peak held 4 µs" in result.stdout and "warning" not in result.stdout


def test_ranks_json() -> None:
    result = run("ranks", TP2, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    exp = expected("tp2_vision_encoder")
    assert doc["median_rank"] == 0 and doc["problems"] == []
    for r in doc["ranks"]:
        e = exp["ranks"][str(r["rank"])]
        assert r["peak"] == {**e["peak"], "duration_us": e["duration_us"]}
        assert r["nvml_used_bytes"] == e["nvml"]["nvml_used_bytes"] and r["outside_bytes"] == e["nvml"]["outside_bytes"]
        assert {c["category"]: c["bytes"] for c in r["categories"]} == e["categories"]
    assert [r["outlier"] for r in doc["ranks"]] == [False, True]
    (o,) = doc["outliers"]
    assert o["rank"] == 1 and o["categories"][0]["category"] == "vision_encoder"
    assert o["categories"][0]["difference_bytes"] == exp["ranks"]["1"]["categories"]["vision_encoder"]


def test_ranks_with_a_missing_rank_is_reported_not_fatal(tp2: Path) -> None:
    (tp2 / "rank=1" / "snapshot-final.pickle").unlink()
    result = run("ranks", tp2)
    assert result.exit_code == 0, result.output
    assert f"warning: rank 1: no snapshot in {tp2 / 'rank=1'}" in result.stdout
    doc = json.loads(run("ranks", tp2, "--format", "json").stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0] and doc["problems"] == [f"rank 1: no snapshot in {tp2 / 'rank=1'}"]


def test_ranks_with_a_missing_nvml_file_is_reported_not_fatal(tp2: Path) -> None:
    (tp2 / "rank=0" / "nvml-part-00001.parquet").unlink()
    result = run("ranks", tp2)
    assert result.exit_code == 0, result.output
    assert "warning: rank 0: no nvml-part-*.parquet" in result.stdout
    row0 = result.stdout.splitlines()[3]
    assert row0.split()[0] == "0" and "–" in row0
    doc = json.loads(run("ranks", tp2, "--format", "json").stdout)
    assert doc["ranks"][0]["nvml_used_bytes"] is None and doc["ranks"][1]["nvml_used_bytes"] is not None


def test_ranks_without_any_snapshot_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "rank=0").mkdir()
    result = run("ranks", tmp_path)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"snapanalyze: error: {tmp_path}: no rank has a snapshot to compare")
    assert len(result.stderr.strip().splitlines()) == 1


def test_explain_oom_fragmentation() -> None:
    path = SCENARIOS / "oom_fragmentation.pickle"
    result = run("explain-oom", path, "--capacity", "40GiB")
    assert result.exit_code == 0, result.output
    assert "verdict FRAGMENTATION" in result.stdout
    assert "expandable_segments:True" in result.stdout and "max_split_size_mb:256" in result.stdout
    assert "outside the allocator      720.00 MiB  capacity − reserved − device free at the failure" in result.stdout
    doc = json.loads(run("explain-oom", path, "--capacity", "42949672960B", "--format", "json").stdout)
    (o,) = doc["snapshots"][0]["ooms"]
    exp = json.loads((SCENARIOS / "oom_fragmentation.expected.json").read_text())["oom"]
    assert (o["request_bytes"], o["device_free_bytes"], o["reserved_free_bytes"], o["largest_free_block_bytes"]) == \
        (exp["size"], exp["device_free"], exp["reserved_free_bytes"], exp["largest_free_block"])
    assert o["outside_bytes"] == 754_974_720 and o["verdict"] == "fragmentation"
    assert o["categories"] == [{"category": "weights", "bytes": exp["active_bytes"], "share": 1.0, "blocks": 138,
                                "window_bytes": 2_264_924_160}]


def test_explain_oom_live_exhaustion_and_unknown_capacity() -> None:
    result = run("explain-oom", SCENARIOS / "oom_live_exhaustion.pickle")
    assert result.exit_code == 0, result.output
    assert "verdict LIVE EXHAUSTION" in result.stdout and "a smaller KV cache" in result.stdout
    assert "unknown: no NVML samples or meta.json (give the run directory, or --capacity)" in result.stdout


def test_explain_oom_on_runs() -> None:
    result = run("explain-oom", RUNS / "oom_other_process")
    assert result.exit_code == 0, result.output
    assert "rank 0: " in result.stdout and "snapshot-oom-1.pickle" in result.stdout
    assert "verdict OUTSIDE PRESSURE" in result.stdout and "other processes (NVML)     7.12 GiB" in result.stdout
    result = run("explain-oom", RUNS / "admission_rejected")
    assert result.exit_code == 0, result.output
    assert "no allocation failure was recorded; the rejected request req-3" in result.stdout
    doc = json.loads(run("explain-oom", TP2, "--format", "json").stdout)
    assert [s["rank"] for s in doc["snapshots"]] == [0, 1] and all(s["ooms"] == [] for s in doc["snapshots"])
    assert all(s["no_oom"][0]["message"].startswith("no allocation failure was recorded") for s in doc["snapshots"])


def test_explain_oom_with_a_missing_nvml_file_or_rank(tp2: Path) -> None:
    (tp2 / "rank=1" / "nvml-part-00001.parquet").unlink()
    result = run("explain-oom", tp2)
    assert result.exit_code == 0, result.output
    assert "warning: rank 1: no nvml-part-*.parquet" in result.stdout
    assert "allocator reserved only" in result.stdout             # rank 1's peak without NVML
    result = run("explain-oom", tp2, "--rank", "3")
    assert result.exit_code == 2 and "no snapshot to explain" in result.stderr


def test_explain_oom_bad_input() -> None:
    result = run("explain-oom", SCENARIOS / "oom_fragmentation.pickle", "--capacity", "forty")
    assert result.exit_code == 2                       # a usage error, as click reports one: names the option
    assert "Invalid value for '--capacity': not a size: 'forty'" in result.stderr and "Traceback" not in result.output
    result = run("explain-oom", SCENARIOS / "oom_fragmentation.pickle", "--capacity", "40")
    assert result.exit_code == 2 and "'40' has no unit: write 40GiB" in result.stderr
    result = run("explain-oom", ROOT / "README.md")
    assert result.exit_code == 2 and result.stderr.startswith("snapanalyze: error: ")


def test_phases_command() -> None:
    result = run("phases", TP2, "--rank", "1")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("0  prefill#1"))
    assert "vision_encoder 4.07 GiB" in row
    doc = json.loads(run("phases", TP2, "--rank", "0", "--format", "json", "--no-categories").stdout)
    exp = expected("tp2_vision_encoder")["ranks"]["0"]["phases"]
    mine = [(p["phase"], p["peak_bytes"], p["before_bytes"]) for p in doc["phases"] if p["source"] == "markers"]
    assert sorted(mine) == sorted((p["phase"], p["peak_bytes"], p["before_bytes"]) for p in exp)
    assert all(p["top_categories"] == [] for p in doc["phases"])


def test_attribute_phase() -> None:
    result = run("attribute", TP2, "--rank", "0", "--phase", "prefill#2", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    (d,) = doc["devices"]
    assert d["instant"] == "peak of phase prefill#2" and d["peak"]["event_index"] == 502
    plain = json.loads(run("attribute", TP2, "--rank", "0", "--at", "event:502", "--format", "json").stdout)
    assert d["categories"] == plain["devices"][0]["categories"] and d["peak"] == plain["devices"][0]["peak"]
    table = run("attribute", TP2, "--rank", "1", "--phase", "prefill")
    assert table.exit_code == 0 and "at the peak of phase prefill#1 (event 437" in table.stdout
    assert "vision_encoder" in table.stdout


def test_attribute_phase_errors() -> None:
    result = run("attribute", TP2, "--rank", "0", "--phase", "prefill", "--at", "peak:2")
    assert result.exit_code == 2 and "--phase and --at" in result.stderr
    result = run("attribute", TP2, "--rank", "0", "--phase", "warmup")
    assert result.exit_code == 2 and "no phase 'warmup' inside the trace window (phases: decode" in result.stderr


def test_sizes_as_people_write_them() -> None:
    a = json.loads(run("explain-oom", SCENARIOS / "oom_fragmentation.pickle", "--capacity", "40GiB",
                       "--format", "json").stdout)
    b = json.loads(run("explain-oom", SCENARIOS / "oom_fragmentation.pickle", "--capacity", f"{40 << 30}B",
                       "--format", "json").stdout)
    assert a == b and a["snapshots"][0]["ooms"][0]["capacity_bytes"] == 40 << 30


def test_attribute_names_requests_from_run_markers_when_torch_recorded_none(tmp_path: Path) -> None:
    """A run whose torch could not set allocator metadata: `attribute RUN` reads the rank's request markers,
    and request A's bytes still live while B peaks come out as concurrent_request (inferred, by time)."""
    import pyarrow.parquet as pq
    from conftest import BASE, SnapshotBuilder, write_pickle

    from snapanalyze import schema as schemas

    mib = 1 << 20
    b = SnapshotBuilder()
    b.segment(BASE, [(10 * mib, 10 * mib, "active_allocated"), (40 * mib, 40 * mib, "active_allocated")])
    b.alloc(BASE, 10 * mib)
    b.alloc(BASE + 10 * mib, 40 * mib)
    raw = b.build()
    t = [e["time_us"] for e in raw["device_traces"][0]]
    rank_dir = tmp_path / "run" / "rank=0"
    rank_dir.mkdir(parents=True)
    write_pickle(rank_dir / "snapshot-final.pickle", raw)
    pq.write_table(schemas.table(schemas.MARKERS_SCHEMA, {
        "kind": ["request", "request"], "name": ["A", "B"], "start_time_us": [t[0] - 5, t[1] - 5],
        "end_time_us": [t[0] + 5, t[1] + 5], "attrs": ["{}", "{}"], "rank": [0, 0], "thread_id": [11, 11],
        "depth": [0, 0]}), rank_dir / "markers.parquet")
    result = run("attribute", tmp_path / "run", "--format", "json", "--explain")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    cats = {c["category"]: c for c in doc["devices"][0]["categories"]}
    assert cats["concurrent_request"]["bytes"] == 10 * mib
    assert doc["devices"][0]["request"] == "req=B"


def test_phases_flag_the_inferred_bytes_of_their_top_categories() -> None:
    doc = json.loads(run("phases", TP2, "--rank", "0", "--format", "json").stdout)
    prefill = next(p for p in doc["phases"] if p["label"] == "prefill#1")
    assert prefill["top_categories"] == ["mlp", "other"]
    assert prefill["top_category_inferred_bytes"] == [296 << 20, 0]   # gate/up outputs told by size and order
    assert all(len(p["top_category_inferred_bytes"]) == len(p["top_categories"]) for p in doc["phases"])
    lines = run("phases", TP2, "--rank", "0").stdout.splitlines()
    assert any("mlp 444.00 MiB (296.00 MiB inferred); other 112.00 MiB" in line for line in lines)
    assert any(line.startswith("inferred = bytes decided by sizes") for line in lines)


def test_phases_kind_and_largest() -> None:
    doc = json.loads(run("phases", TP2, "--rank", "1", "--kind", "request", "--largest", "1",
                         "--format", "json").stdout)
    assert [(p["kind"], p["phase"]) for p in doc["phases"]] == [("request", "req-1")]
    assert doc["phases"][0]["top_categories"][0] == "vision_encoder"
    bad = run("phases", TP2, "--kind", "thread")
    assert bad.exit_code == 2 and "Invalid value for '--kind'" in bad.stderr


# -- every command on every rank of a run ---------------------------------------------------------------------

def _in_repo(*args: object, columns: int | None = None) -> Result:
    """The command as a user types it from the repository root (relative paths: lines do not depend on
    where the checkout lies); COLUMNS set as a terminal of that width sets it."""
    env = {"COLUMNS": str(columns) if columns is not None else None}
    cwd = Path.cwd()
    try:
        import os
        os.chdir(ROOT)
        return CliRunner().invoke(main, [str(a) for a in args], env=env)
    finally:
        os.chdir(cwd)


REL_TP2 = "fixtures/runs/tp2_vision_encoder"
RUN_COMMANDS = {
    "summary": ["summary", REL_TP2],
    "peaks": ["peaks", REL_TP2],
    "attribute": ["attribute", REL_TP2, "--explain"],
    "phases": ["phases", REL_TP2],
    "check": ["check", REL_TP2, "--budget", "56GiB", "--max", "kv_cache=40GiB"],
    "diff": ["diff", REL_TP2, "fixtures/runs/tp2_vision_encoder/rank=0"],
}


@pytest.mark.parametrize("columns", [80, 200, None], ids=["80", "200", "piped"])
@pytest.mark.parametrize("command", sorted(RUN_COMMANDS))
def test_every_command_covers_every_rank_and_fits_the_terminal(command: str, columns: int | None) -> None:
    result = _in_repo(*RUN_COMMANDS[command], columns=columns)
    assert result.exit_code == (1 if command == "check" else 0), result.output
    out = result.stdout
    lines = out.splitlines()
    if command == "check":                             # one line per limit and rank, naming the rank
        assert "FAIL  peak active 59.41 GiB > budget 56.00 GiB by 3.41 GiB (rank 1, device 0)" in lines
        flat = " ".join(out.split())                   # at 80 columns the longest line wraps
        assert "ok peak active 55.89 GiB ≤ budget 56.00 GiB, 115.59 MiB to spare (rank 0, device 0)" in flat
        assert lines[-1] == "FAILED: 3 of 4 limits exceeded (ranks 0, 1)"
    else:                                              # one section per rank, in rank order
        assert out.index("== rank 0 (tag final) ==") < out.index("== rank 1 (tag final) ==")
    if columns is None:                                # piped: lines as long as their content, never wrapped
        assert max(map(len, lines)) > 80 or command == "check"
    else:
        over = [line for line in lines if len(line) > columns and len(line.split()) > 1]
        assert not over, over
    if columns == 80 and command == "peaks":           # a cell too long wraps within its column, numbers stay whole
        row = next(i for i, line in enumerate(lines) if line.lstrip().startswith("1    430"))
        assert "55.89 GiB" in lines[row] and lines[row + 1].strip() == "12:53:23.495334"
    piped = _in_repo(*RUN_COMMANDS[command]).stdout
    if columns is not None and max(map(len, piped.splitlines())) <= columns:
        assert out == piped                            # wide enough: the same text as piped


@pytest.mark.parametrize("command", ["summary", "peaks", "attribute", "phases"])
def test_a_runs_json_lists_each_rank_as_its_rank_alone_would(command: str) -> None:
    extra = ["--no-categories"] if command == "phases" else []
    doc = json.loads(run(command, TP2, "--format", "json", *extra).stdout)
    assert doc["run"] == str(TP2) and doc["problems"] == [] and doc["warnings"] == []
    assert [(r["rank"], r["tag"]) for r in doc["ranks"]] == [(0, "final"), (1, "final")]
    for entry in doc["ranks"]:
        alone = json.loads(run(command, TP2, "--rank", entry["rank"], "--format", "json", *extra).stdout)
        assert "ranks" not in alone                    # --rank keeps the one-snapshot document
        alone.pop("warnings")
        assert {k: v for k, v in entry.items() if k not in ("rank", "tag")} == alone
    if command == "peaks":
        exp = expected("tp2_vision_encoder")["ranks"]
        assert [r["devices"][0]["peak"]["active_bytes"] for r in doc["ranks"]] == \
            [exp["0"]["peak"]["active_bytes"], exp["1"]["peak"]["active_bytes"]]


def test_a_rank_without_a_snapshot_is_a_warning_and_the_others_are_analysed(tp2: Path) -> None:
    (tp2 / "rank=1" / "snapshot-final.pickle").unlink()
    (tp2 / "rank=2").mkdir()
    shutil.copy(TP2 / "rank=1" / "snapshot-final.pickle", tp2 / "rank=2" / "snapshot-final.pickle")
    result = run("peaks", tp2)
    assert result.exit_code == 0, result.output
    assert "== rank 0 (tag final) ==" in result.stdout and "== rank 2 (tag final) ==" in result.stdout
    assert result.stdout.rstrip().endswith(f"warning: rank 1: no snapshot in {tp2 / 'rank=1'}")
    doc = json.loads(run("peaks", tp2, "--format", "json").stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 2]
    assert doc["problems"] == [f"rank 1: no snapshot in {tp2 / 'rank=1'}"]
    (tp2 / "rank=0" / "snapshot-final.pickle").unlink()
    (tp2 / "rank=2" / "snapshot-final.pickle").unlink()
    bad = run("summary", tp2)
    assert bad.exit_code == 2 and "no rank has a snapshot to analyse" in bad.stderr


def test_attribute_csv_of_a_run_has_a_rank_column_and_one_header() -> None:
    text = run("attribute", TP2, "--format", "csv").stdout
    lines = text.splitlines()
    assert lines[0].startswith("rank,") and sum(line == lines[0] for line in lines) == 1
    ranks = [line.split(",")[0] for line in lines[1:]]
    assert set(ranks) == {"0", "1"} and ranks == sorted(ranks)
    alone = run("attribute", TP2, "--rank", "1", "--format", "csv").stdout.splitlines()
    assert not alone[0].startswith("rank,") and len(alone) - 1 == ranks.count("1")


def test_phase_names_are_one_syntax_across_commands() -> None:
    """Each name `phases` prints is what `attribute --phase` and `diff --phase` accept, and it picks that span."""
    doc = json.loads(run("phases", TP2, "--rank", "0", "--format", "json", "--no-categories").stdout)
    labels = [p["label"] for p in doc["phases"]]
    assert "prefill#1" in labels and "prefill#2" in labels and "load_model" in labels and "prefill" not in labels
    table = run("phases", TP2, "--rank", "0").stdout
    for p in doc["phases"]:
        assert f"  {p['label']}  " in table
        if p["peak_index"] < p["start_index"]:         # nothing rose inside it: no instant of its own
            continue
        att = json.loads(run("attribute", TP2, "--rank", "0", "--phase", p["label"], "--format", "json").stdout)
        assert att["devices"][0]["peak"]["event_index"] == p["peak_index"], p["label"]
        assert att["devices"][0]["instant"] == f"peak of phase {p['label']}"
    spaced = json.loads(run("attribute", TP2, "--rank", "0", "--phase", "prefill #2", "--format", "json").stdout)
    assert spaced["devices"][0]["peak"]["event_index"] == 502           # the older spelling still works
    d = json.loads(run("diff", TP2, TP2, "--rank", "0", "--phase", "prefill#2", "--format", "json").stdout)
    assert [(p["scope"], p["phase"]) for p in d["peaks"]] == [("phase", "prefill#2")]   # only the phase asked for
    assert d["peaks"][0]["a"]["event_index"] == 502 and d["instant"] == "peak of phase prefill#2"
    everything = json.loads(run("diff", TP2, TP2, "--rank", "0", "--format", "json").stdout)
    assert [p["phase"] for p in everything["peaks"]][:3] == [None, "load_model", "initialize_kv_cache"]
    assert {"prefill#1", "prefill#2", "req-1"} <= {p["phase"] for p in everything["peaks"]}


def test_explain_oom_names_the_program_and_advises_in_its_knobs() -> None:
    doc = json.loads(run("explain-oom", SCENARIOS / "oom_live_exhaustion.pickle", "--format", "json").stdout)
    (snapshot,) = doc["snapshots"]
    assert snapshot["engine"]["name"] == "sglang" and "sglang/" in snapshot["engine"]["evidence"]
    advice = " ".join(a for o in snapshot["ooms"] for a in o["advice"])
    assert "--mem-fraction-static" in advice and "gpu_memory_utilization" not in advice
    table = run("explain-oom", SCENARIOS / "oom_fragmentation.pickle").stdout
    assert "program: vLLM (recognised by vllm/" in table
    assert "(s)" not in table and "in 8 free blocks" in table
