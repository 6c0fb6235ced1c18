"""budget: an engine's start-up log read into its budget (real lines of vLLM V0, V1 and SGLang), and that
budget checked against the shapes a sweep measured — verdicts and settings computed here from how the
fixtures were built (their expected.json and the log's printed numbers), never from the analysis."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from snapanalyze.cli import main
from snapanalyze.errors import BadInputError
from snapanalyze.load.engine_log import check_patterns, parse_engine_log, read_engine_log
from snapanalyze.units import fmt_bytes

ROOT = Path(__file__).resolve().parents[2]
REAL = json.loads((ROOT / "fixtures" / "engine_logs" / "real_lines.json").read_text())
VLLM = ROOT / "fixtures" / "sweeps" / "vllm_budget"
SGLANG = ROOT / "fixtures" / "sweeps" / "sglang_budget"
GiB, MiB = 1 << 30, 1 << 20


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("item", REAL, ids=lambda i: f"{i['version']}: {i['line'][-60:]}")
def test_real_lines_read_as_their_engine_printed_them(item: dict[str, Any]) -> None:
    config = parse_engine_log([item["line"]], item["where"])
    assert config.engine == item["engine"]
    got = {name: f.value for name, f in config.figures.items()}
    for name, value in item["figures"].items():
        want = value * GiB if name.endswith("_bytes") else value
        assert got.get(name) == pytest.approx(want, rel=1e-9), (name, got)
        figure = config.figures[name]
        assert figure.source == "log" and figure.detail.startswith("line 1: ")
    assert set(got) == set(item["figures"])          # nothing read that the line does not state
    assert config.version == item.get("version_text")


def test_a_logged_figure_knows_its_precision() -> None:
    config = parse_engine_log(["INFO 04-24 16:32:59 [gpu_model_runner.py:1316] Model loading took 14.9889 GiB "
                               "and 3.652170 seconds", "INFO Available KV cache memory: 34.3 GiB"], "log")
    assert config.figures["weights_bytes"].precision == pytest.approx(0.00005 * GiB)
    assert config.figures["kv_cache_bytes"].precision == pytest.approx(0.05 * GiB)       # one decimal printed


def test_tensor_parallel_workers_are_read_once_from_the_lowest_rank() -> None:
    lines = [f"(Worker_TP{r} pid={100 + r}) INFO 08-14 14:07:22 [gpu_model_runner.py:6806] Model loading took "
             f"{w} GiB memory and 12.0 seconds" for r, w in ((1, "9.99"), (0, "8.50"), (2, "9.99"))]
    assert parse_engine_log(lines, "log").figures["weights_bytes"].value == 8.5 * GiB


def test_sglang_graph_phases_add_up_and_the_last_free_memory_stands() -> None:
    lines = ["[2026-07-21 13:35:33 TP0] Capture target decode CUDA graph end. elapsed=4.83 s, mem usage=0.24 GB, "
             "avail mem=7.28 GB.",
             "[2026-07-21 13:35:40 TP0] Capture target prefill CUDA graph end. elapsed=6.10 s, mem usage=0.50 GB, "
             "avail mem=6.78 GB."]
    config = parse_engine_log(lines, "log")
    assert config.figures["cuda_graph_bytes"].value == pytest.approx(0.74 * GiB)
    assert config.figures["free_after_startup_bytes"].value == pytest.approx(6.78 * GiB)


def test_logs_that_state_no_budget_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="no start-up line of vLLM or SGLang stating their memory budget"):
        parse_engine_log(["INFO starting server on :8000", "hello"], "x.log")
    both = ["INFO 04-24 16:32:59 [gpu_model_runner.py:1316] Model loading took 14.9889 GiB and 3.6 seconds",
            "[2025-03-27 21:33:31 TP0] Memory pool end. avail mem=14.61 GB"]
    with pytest.raises(BadInputError, match="lines of both vLLM and SGLang"):
        parse_engine_log(both, "x.log")
    binary = tmp_path / "core.log"
    binary.write_bytes(b"\x7fELF\x00\x00" * 10)
    with pytest.raises(BadInputError, match="not a text log"):
        read_engine_log(binary)
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)
    result = run("budget", str(VLLM / "run-01.pickle"), "--shape-from", "none", "--engine-log", str(fifo))
    assert result.exit_code == 2 and "fifo.log: is a FIFO, not a regular file" in result.stderr


# Format strings read in the engines' source for which no printed line was found to copy.
SOURCE_ONLY = {"CUDA graph memory profiling is disabled", "'max_num_seqs': ", "'gpu_memory_utilization': ",
               "'max_num_batched_tokens': ", "'max_model_len': ", "mem_fraction_static", "tp_size",
               "Load weight begin"}


def test_every_shipped_pattern_reads_a_real_line() -> None:
    """Each line pattern is valid and matches a real printed line, but the few known only from the engines'
    source."""
    patterns = check_patterns()
    assert {p.engine for p in patterns} == {"vllm", "sglang"}
    real = [i["line"] for i in REAL]
    unread = [p.regex.pattern for p in patterns if not any(p.contains in x and p.regex.search(x) for x in real)]
    assert all(any(k in u for k in SOURCE_ONLY) for u in unread), unread


# -- the budget against measured shapes ---------------------------------------------------------------------

def _printed(log: Path, marker: str, after: str) -> float:
    line = next(x for x in log.read_text().splitlines() if marker in x)
    text = line.split(after, 1)[1]
    return float(text.split("GiB")[0].split(" GB")[0].strip())


def _budget(*args: str) -> dict[str, Any]:
    result = run("budget", *args, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_vllm_shapes_against_the_budget_its_log_states() -> None:
    """run-03 is the shape vLLM profiled; run-04's prompt logits exceed the profile and the device; run-05's
    allocated bytes fit the profile while its cached, unsplittable blocks exceed the device."""
    exp = json.loads((VLLM / "expected.json").read_text())
    log = VLLM / "vllm.log"
    activation = _printed(log, "torch peak memory increase", "torch peak memory increase: ") * GiB
    non_torch = _printed(log, "non-torch forward increase", "non-torch forward increase memory: ") * GiB
    capacity = exp["total_bytes"] - non_torch
    doc = _budget("--shape-from", str(VLLM / "manifest.csv"), "--engine-log", str(log), "--total", "80GiB")
    ratio = next(p for p in doc["budget"]["parts"] if p["name"] == "utilization")
    assert doc["budget"]["ratio"] == 0.95 and ratio["bytes"] is None and ratio["source"] == "log"   # a share, not bytes
    shapes = {s["label"]: s for s in doc["shapes"]}
    for name, f in exp["files"].items():
        s = shapes[name]
        forward = f["peak_active_bytes"] - f["baseline_active_bytes"]          # start-up is pre-window
        assert s["activation_bytes"] == forward
        assert s["over_budget_bytes"] == pytest.approx(forward - activation, abs=1)
        assert s["over_device_bytes"] == pytest.approx(f["peak_reserved_bytes"] - capacity, abs=1)
    verdicts = {name: shapes[name]["verdict"] for name in exp["files"]}
    assert verdicts == {"run-01.pickle": "fits", "run-02.pickle": "fits", "run-03.pickle": "fits",
                        "run-04.pickle": "exceeds_device", "run-05.pickle": "exceeds_device"}
    assert shapes["run-03.pickle"]["uncertain"]            # the profiled shape, to the log's 0.01 GiB
    logits = exp["files"]["run-04.pickle"]["categories_at_peak"]["logits"]
    assert shapes["run-04.pickle"]["categories"][0] == {"category": "logits", "bytes": logits}
    assert shapes["run-05.pickle"]["over_budget_bytes"] < 0 < shapes["run-05.pickle"]["over_device_bytes"]
    # the settings: the worst excess comes out of the KV pool
    need = max(f["peak_reserved_bytes"] - capacity for f in exp["files"].values())
    settings = {s["name"]: s for s in doc["settings"]}
    util = math.floor((0.95 - need / exp["total_bytes"]) * 1000) / 1000
    assert settings["gpu_memory_utilization"]["value"] == util
    kv = _printed(log, "Available KV cache memory", "Available KV cache memory: ") * GiB
    tokens = int(next(x for x in log.read_text().splitlines() if "KV cache size" in x).split(": ")[-1].split()[0]
                 .replace(",", ""))
    per_token = kv / tokens
    freed = (0.95 - util) * exp["total_bytes"]
    assert settings["gpu_memory_utilization"]["kv_tokens_after"] == int((int(kv - freed)) // per_token)
    assert settings["kv_cache_memory"]["value"] == pytest.approx(kv - math.ceil(need / MiB) * MiB, abs=1)
    assert not doc["fits"]


def test_sglang_reserve_that_a_16k_chunk_exceeds() -> None:
    exp = json.loads((SGLANG / "expected.json").read_text())
    log = SGLANG / "sglang.log"
    lines = log.read_text().splitlines()
    weights = float(next(x for x in lines if "Load weight end" in x).split("mem usage=")[1].split(" GB")[0]) * GiB
    kv_line = next(x for x in lines if "KV Cache is allocated" in x)
    kv = sum(float(kv_line.split(f"{k} size: ")[1].split(" GB")[0]) for k in ("K", "V")) * GiB
    free = float(next(x for x in lines if "Memory pool end" in x).split("avail mem=")[1].split(" GB")[0]) * GiB
    capacity = weights + kv + free              # what the allocator holds or can still get
    doc = _budget("--shape-from", str(SGLANG / "manifest.csv"), "--engine-log", str(log), "--total", "80GiB")
    ratio = next(p for p in doc["budget"]["parts"] if p["name"] == "mem_fraction_static")
    assert doc["budget"]["ratio"] == 0.98 and ratio["bytes"] is None and ratio["precision_bytes"] == 0
    shapes = {s["label"]: s for s in doc["shapes"]}
    for name, f in exp["files"].items():
        assert shapes[name]["over_device_bytes"] == pytest.approx(f["peak_reserved_bytes"] - capacity, abs=1)
    assert [shapes[f"chunk-{c}.pickle"]["verdict"] for c in (2048, 4096, 8192, 16384)] == [
        "fits", "fits", "fits", "exceeds_device"]
    # chunked_prefill_size: the transient is linear in the chunk (construction); the reserved bytes beyond
    # the transient are at most `offset` over the shapes; the largest chunk whose peak fits the capacity
    files = exp["files"].values()
    pts = sorted((f["shape"]["chunk"], f["transient_bytes"]) for f in files)
    slope = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
    intercept = pts[0][1] - slope * pts[0][0]
    offset = max(f["peak_reserved_bytes"] - f["transient_bytes"] for f in files)
    chunk = math.floor((capacity - offset - intercept) / slope)
    settings = {s["name"]: s for s in doc["settings"]}
    assert settings["chunked_prefill_size"]["value"] == pytest.approx(chunk, abs=1)
    assert 8192 < settings["chunked_prefill_size"]["value"] < 16384
    need = max(f["peak_reserved_bytes"] - capacity for f in files)
    assert settings["mem_fraction_static"]["value"] == math.floor(
        (exp["mem_fraction_static"] - need / exp["total_bytes"]) * 1000) / 1000


def test_the_terminal_names_each_figures_source_and_the_arithmetic() -> None:
    result = run("budget", "--shape-from", str(VLLM / "manifest.csv"), "--engine-log", str(VLLM / "vllm.log"),
                 "--total", "80GiB", "--explain")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "vLLM 0.10.1.1 (v1) memory budget" in out
    assert "device total" in out and "option: --total" in out
    assert "as logged: line 6:" in out                             # the DEBUG profiling line
    assert "run-04.pickle: the forward pass is logits" in out
    assert "gpu_memory_utilization 0.950 → " in out and "rounded down to" in out


def test_options_give_what_the_log_does_not_and_without_an_engine_nothing_is_guessed(tmp_path: Path) -> None:
    inputs = ["--shape-from", str(VLLM / "manifest.csv")]
    doc = _budget(*inputs, "--engine-log", str(VLLM / "vllm.log"))           # V1 INFO: no total
    assert doc["budget"]["capacity"]["source"] == "missing" and "total" in doc["budget"]["missing"]
    assert all(s["over_device_bytes"] is None for s in doc["shapes"])
    assert {s["label"]: s["verdict"] for s in doc["shapes"]}["run-04.pickle"] == "exceeds_budget"
    doc = _budget(*inputs, "--engine", "vllm", "--total", "80GiB", "--weights", "2.3GiB", "--kv-cache", "72GiB")
    activation = doc["budget"]["activation"]
    assert activation["source"] == "derived" and "non-torch memory included" in activation["detail"]
    assert doc["budget"]["ratio_source"]["source"] == "default"       # vLLM's 0.9, said so
    assert not doc["budget"]["capacity_exact"]
    assert "non_torch_unknown" in doc["budget"]["notes"]
    result = run("budget", *inputs, "--total", "80GiB")
    assert result.exit_code == 2 and "without an engine" in result.stderr
    result = run("budget", *inputs, "--engine", "sglang", "--engine-log", str(VLLM / "vllm.log"))
    assert result.exit_code == 2 and "is a vllm log" in result.stderr


def test_check_engine_log_is_a_ci_gate() -> None:
    log = str(VLLM / "vllm.log")
    bad = run("check", str(VLLM / "run-04.pickle"), "--engine-log", log, "--total", "80GiB")
    assert bad.exit_code == 1 and bad.output.startswith("FAIL  run-04.pickle: peak reserved")
    good = run("check", str(VLLM / "run-02.pickle"), "--engine-log", log, "--total", "80GiB")
    assert good.exit_code == 0 and good.output.startswith("ok    run-02.pickle")
    both = run("check", str(VLLM / "run-04.pickle"), "--engine-log", log, "--total", "80GiB", "--budget", "200GiB")
    assert both.exit_code == 1 and "FAIL  run-04.pickle" in both.output and "ok" in both.output
    assert both.output.rstrip().endswith("FAILED: the serving engine's budget (above); 1 other limit held")
    both = run("check", str(VLLM / "run-04.pickle"), "--engine-log", log, "--total", "80GiB", "--budget", "200GiB",
               "--format", "json")
    assert both.exit_code == 1
    merged = json.loads(both.stdout)
    assert merged["passed"] is False and merged["engine_budget"]["fits"] is False
    doc = json.loads(run("check", str(VLLM / "run-04.pickle"), "--engine-log", log, "--total", "80GiB",
                         "--format", "json").stdout)
    assert doc["passed"] is False and doc["budget"]["shapes"][0]["verdict"] == "exceeds_device"


def test_the_report_shows_the_budget_beside_the_measurement(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = run("report", str(VLLM / "run-04.pickle"), "--engine-log", str(VLLM / "vllm.log"), "--capacity",
                 "80GiB", "-o", str(out), "--samples", "2")
    assert result.exit_code == 0, result.output
    page = out.read_text().replace("\u00a0", " ")      # a number and its unit are joined by a no-break space
    section = page[page.index('id="budget"'):page.index('id="rules"')]
    assert "Serving engine budget" in section and "exceeds the device" in section
    assert "gpu_memory_utilization 0.950 → " in section and "logits 7.34 GiB" in section
    assert "1 of 1 measured inputs exceed vLLM&#39;s memory budget; run-04.pickle exceeds the device by 3.37 GiB." \
        in page
    assert "is more than the 80.00 GiB device holds, by 2.96 GiB" in page
    plain = tmp_path / "plain.html"
    assert run("report", str(VLLM / "run-04.pickle"), "-o", str(plain), "--samples", "2").exit_code == 0
    assert 'id="budget"' not in plain.read_text()


def test_the_python_api_and_the_notebook_give_the_same_check() -> None:
    import snapanalyze

    check = snapanalyze.budget([str(VLLM / "run-04.pickle")], VLLM / "vllm.log", shape_from="none",
                               figures={"total_bytes": 80 * GiB})
    assert [s.verdict for s in check.shapes] == ["exceeds_device"]
    html = check._repr_html_()
    assert html is not None and "exceeds the device" in html and "gpu_memory_utilization 0.950 → " in html
    doc = _budget(str(VLLM / "run-04.pickle"), "--shape-from", "none", "--engine-log", str(VLLM / "vllm.log"),
                  "--total", "80GiB")
    assert doc["shapes"][0]["over_device_bytes"] == check.shapes[0].over_device_bytes


def test_every_target_renders_the_one_typed_check() -> None:
    """The terminal, the engine check and the JSON are made from the `BudgetCheck` the API returns, which a
    worker can hand back (it pickles)."""
    import pickle

    from snapanalyze.cli.budget import engine_config_of
    from snapanalyze.cli.common import terminal_width
    from snapanalyze.report.budget_documents import budget_document
    from snapanalyze.report.budget_terminal import render_budget, render_engine_check
    from snapanalyze.session import budget_of

    inputs = [str(p) for p in sorted(VLLM.glob("*.pickle"))]
    config = engine_config_of(str(VLLM / "vllm.log"), None, {"total": 80 * GiB})     # as `--total 80GiB` gives it
    check = budget_of(config, inputs, shape_from=str(VLLM / "manifest.csv"))
    assert pickle.loads(pickle.dumps(check)) == check
    cli = run("budget", *inputs, "--shape-from", str(VLLM / "manifest.csv"), "--engine-log", str(VLLM / "vllm.log"),
              "--total", "80GiB", "--explain")
    assert cli.exit_code == 0, cli.output
    assert cli.output.rstrip("\n") == render_budget(check, explain=True, width=terminal_width())
    doc = json.loads(run("budget", *inputs, "--shape-from", str(VLLM / "manifest.csv"), "--engine-log",
                         str(VLLM / "vllm.log"), "--total", "80GiB", "--format", "json").output)
    assert {k: v for k, v in doc.items() if k != "warnings"} == json.loads(json.dumps(budget_document(check)))
    assert doc["fits"] is False and [s["verdict"] for s in doc["shapes"]] == [s.verdict for s in check.shapes]
    lines = render_engine_check(check).splitlines()
    assert [line.split()[0] for line in lines] == ["ok" if s.verdict == "fits" else "FAIL" for s in check.shapes]


def test_a_vision_shape_recorded_from_engine_start_counts_weights_and_kv_as_steady() -> None:
    """tp2_vision_encoder records from start-up (window baseline 0): the steady state is the weights and the
    KV pool live at the peak, and rank 1's forward pass is its vision encoder's images."""
    run_dir = ROOT / "fixtures" / "runs" / "tp2_vision_encoder"
    exp = json.loads((ROOT / "fixtures" / "runs" / "tp2_vision_encoder.expected.json").read_text())
    doc = _budget(str(run_dir), "--shape-from", "none", "--engine", "vllm", "--total", "80GiB",
                  "--gpu-memory-utilization", "0.9", "--weights", "8.28GiB", "--activation-peak", "1GiB",
                  "--non-torch", "1.5GiB", "--kv-cache", "47GiB")
    shapes = {s["label"]: s for s in doc["shapes"]}
    for rank, e in exp["ranks"].items():
        s = shapes[f"tp2_vision_encoder rank {rank}"]
        cats = e["categories"]
        assert s["steady_bytes"] == cats["weights"] + cats["kv_cache"]
        assert s["activation_bytes"] == e["peak"]["active_bytes"] - cats["weights"] - cats["kv_cache"]
    one = shapes["tp2_vision_encoder rank 1"]
    assert one["categories"][0] == {"category": "vision_encoder", "bytes": exp["ranks"]["1"]["categories"][
        "vision_encoder"]}
    assert one["verdict"] == "exceeds_budget" and shapes["tp2_vision_encoder rank 0"]["verdict"] == "fits"


def test_the_sglang_recipe_reads_what_sglangs_profiler_writes(tmp_path: Path) -> None:
    """The README's SGLang recipe: one `/start_profile {"activities": ["MEM"]}` … `/stop_profile` per shape writes
    `SGLANG_TORCH_PROFILER_DIR/<profile id>/<time>-TP-<rank>-memory.pickle` (SGLang's profiler with the MEM
    activity, as `layout.ENGINE_NAMINGS` cites it); a manifest naming those files with their shapes is all
    `budget` needs. Laid out so, the fixture's shapes read exactly as they do from their own names."""
    prof = tmp_path / "prof"
    rows = ["file,tokens,chunk"]
    for k, chunk in enumerate((2048, 4096, 8192, 16384)):
        started = f"17585513{k:02d}.0762882"                        # the profile id: the start time
        dumped = prof / started / f"17585513{k:02d}.159891-TP-0-memory.pickle"
        dumped.parent.mkdir(parents=True)
        dumped.write_bytes((SGLANG / f"chunk-{chunk}.pickle").read_bytes())
        rows.append(f"{dumped.relative_to(tmp_path)},{chunk},{chunk}")
    (tmp_path / "shapes.csv").write_text("\n".join(rows) + "\n")
    log = str(SGLANG / "sglang.log")
    got = _budget("--shape-from", str(tmp_path / "shapes.csv"), "--engine-log", log, "--total", "80GiB")
    want = _budget("--shape-from", str(SGLANG / "manifest.csv"), "--engine-log", log, "--total", "80GiB")
    assert [s["verdict"] for s in got["shapes"]] == [s["verdict"] for s in want["shapes"]] == [
        "fits", "fits", "fits", "exceeds_device"]
    assert [s["over_device_bytes"] for s in got["shapes"]] == [s["over_device_bytes"] for s in want["shapes"]]
    assert got["settings"] == want["settings"]


def _run_with_nvml(tmp_path: Path, snapshot_file: Path, outside: int, total: int) -> tuple[Path, int, int]:
    """`snapshot_file` as rank 0 of a run whose NVML samples see `outside` bytes beyond the allocator's reserved
    bytes (the peak's reserved from the replay) throughout, one sample inside the peak's hold. Returns the run,
    the peak's reserved bytes and the number of samples."""
    import pyarrow as pa

    from snapanalyze import layout, load, replay
    from snapanalyze import schema as schemas
    from snapanalyze.analyze.peaks import peaks_of

    rank = tmp_path / "run" / "rank=0"
    rank.mkdir(parents=True)
    (rank / "snapshot-final.pickle").write_bytes(snapshot_file.read_bytes())
    timeline = replay(load(snapshot_file))
    (device,) = peaks_of(timeline, top=1).devices
    peak = device.peaks[0]
    assert peak.time_us is not None and peak.duration_us is not None and peak.duration_us > 1
    dt = timeline[int(device.device)]
    times = [int(dt.time_us[0]), peak.time_us + peak.duration_us // 2, int(dt.time_us[-1])]
    reserved = [dt.reserved_at(int(i)) for i in dt.time_us.searchsorted(times, side="right") - 1]
    rows = [{"time_us": t, "device": int(device.device), "used_bytes": r + outside, "free_bytes": total - r - outside,
             "total_bytes": total, "process_used_bytes": r + outside, "other_processes_used_bytes": 0,
             "torch_allocated_bytes": None, "torch_reserved_bytes": r} for t, r in zip(times, reserved)]
    schemas.write_table(pa.Table.from_pylist(rows, schema=schemas.NVML_SCHEMA), rank / layout.nvml_part_name(1),
                        schema=schemas.NVML_SCHEMA)
    return tmp_path / "run", peak.reserved_bytes, len(rows)


def test_memory_outside_the_allocator_from_nvml_against_what_the_budget_leaves_for_it(tmp_path: Path) -> None:
    """A run whose NVML samples see 3 GiB outside the allocator (NCCL buffers at TP > 1, say) where vLLM's log
    budgets 420 MiB of non-torch memory: the shape says by how much the budget missed it, measured inside the
    peak, and the device check uses what NVML saw (reserved + outside against the total), not the budgeted
    capacity: 4.11 GiB of margin by the budget, 1.52 GiB by NVML."""
    total, outside = 80 * GiB, 3 * GiB
    run_dir, reserved, _ = _run_with_nvml(tmp_path, VLLM / "run-02.pickle", outside, total)
    log = str(VLLM / "vllm.log")
    plain = _budget(str(VLLM / "run-02.pickle"), "--shape-from", "none", "--engine-log", log, "--total", "80GiB")
    doc = _budget(str(run_dir), "--shape-from", "none", "--engine-log", log, "--total", "80GiB")
    (shape,), (before,) = doc["shapes"], plain["shapes"]
    budget_outside = total - doc["budget"]["capacity"]["bytes"]          # what the budget leaves outside
    assert before["outside_bytes"] is None and before["outside_over_bytes"] is None
    assert shape["outside_bytes"] == outside and shape["outside_measured"] is True
    assert shape["outside_over_bytes"] == outside - budget_outside > 0
    assert shape["reserved_bytes"] == reserved == before["reserved_bytes"]
    assert shape["over_device_bytes"] == reserved + outside - total < 0 and shape["verdict"] == "fits"
    assert before["over_device_bytes"] == reserved - doc["budget"]["capacity"]["bytes"]
    assert "outside_not_budgeted" in doc["notes"] and "outside_not_budgeted" not in plain["notes"]
    text = run("budget", str(run_dir), "--shape-from", "none", "--engine-log", log, "--total", "80GiB").output
    assert "outside the allocator at each peak (NVML)" in text and "3.00 GiB (measured)" in text
    assert f"+{fmt_bytes(outside - budget_outside)} against the budget" in text
    page = tmp_path / "report.html"
    assert run("report", str(run_dir), "--engine-log", log, "--capacity", "80GiB", "-o", str(page)).exit_code == 0
    html = page.read_text()
    assert "outside the allocator (NVML)" in html
    assert f"3.00\u00a0GiB (+{fmt_bytes(outside - budget_outside)} vs budget)".replace(" GiB", "\u00a0GiB") in html
