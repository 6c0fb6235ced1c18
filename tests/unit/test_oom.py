"""Why an allocation failed: the numbers at each oom entry against the generators' answers, the three verdicts,
the advice they lead to, estimates when the oom is not the last word, and the statement when nothing failed."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from conftest import BASE, SnapshotBuilder

from snapanalyze import load, replay
from snapanalyze.analyze.oom import OOM_COLUMNS, OomExplanation, explain_oom, rejected_requests
from snapanalyze.load.columns import to_snapshot
from snapanalyze.load.samples import read_run
from snapanalyze.report import oom_text
from snapanalyze.report.run_documents import no_oom_record, oom_document
from snapanalyze.report.run_terminal import _failed_lines, render_oom
from snapanalyze.session import explain_path
from snapanalyze.sites import site_text

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "fixtures" / "scenarios"
RUNS = ROOT / "fixtures" / "runs"
MiB = 1 << 20
GiB = 1 << 30



def _worded(e: OomExplanation, i: int = 0) -> pd.Series:
    """Row i of the explanation's numbers with its verdict in words (`report.oom_text`), as a reader sees it."""
    verdict = e.verdicts[i]
    words = pd.Series({"why": oom_text.why(verdict), "advice": oom_text.advice(verdict)}, dtype=object)
    return pd.concat([e.ooms.iloc[i], words])

def scenario(name: str) -> tuple[object, dict]:
    return load(SCENARIOS / f"{name}.pickle"), json.loads((SCENARIOS / f"{name}.expected.json").read_text())


def check_numbers(row: pd.Series, exp: dict) -> None:
    assert row["index"] == exp["event_index"]
    assert row["request_bytes"] == exp["size"]
    assert row["device_free_bytes"] == exp["device_free"]
    assert row["active_bytes"] == exp["active_bytes"]
    assert row["allocated_bytes"] == exp["allocated_bytes"]
    assert row["reserved_bytes"] == exp["reserved_bytes"]
    assert row["reserved_free_bytes"] == exp["reserved_free_bytes"]
    assert row["largest_free_block_any_bytes"] == exp["largest_free_block"]
    assert row["verdict"] == exp["verdict"]


def test_fragmentation() -> None:
    snap, exp = scenario("oom_fragmentation")
    result = explain_oom(snap, capacity=40 * GiB)
    assert list(result.ooms.columns) == OOM_COLUMNS and len(result.ooms) == 1 and result.no_oom == ()
    row = _worded(result)
    check_numbers(row, exp["oom"])
    assert row["exact"] and row["state_source"].startswith("end state")
    assert row["largest_free_block_bytes"] == 260 * MiB < row["request_bytes"]
    assert row["request_bytes"] <= row["reserved_free_bytes"] + row["device_free_bytes"]
    # 40 GiB − reserved − device free: the generator's note says 754,974,720 B outside the allocator
    assert row["outside_bytes"] == 754_974_720 and row["capacity_source"] == "given"
    assert row["why"].startswith("allocation failure from fragmentation: the 1.96 GiB request")
    assert "largest usable: 260.00 MiB" in row["why"] and "2.91 GiB would have covered it" in row["why"]
    advice = row["advice"]
    assert advice[0].startswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert advice[1].startswith("max_split_size_mb:256") and row["split_segments"] == 8
    assert result.categories[["category", "bytes"]].values.tolist() == [["weights", exp["oom"]["active_bytes"]]]


def test_live_exhaustion() -> None:
    snap, exp = scenario("oom_live_exhaustion")
    result = explain_oom(snap)
    row = _worded(result)
    check_numbers(row, exp["oom"])
    assert row["largest_free_block_bytes"] == 0          # the only free block is small-pool slack
    assert row["shortfall_bytes"] == 33_554_432 - 1_430_528 - 13_631_488
    assert row["capacity_bytes"] is pd.NA and row["outside_bytes"] is pd.NA
    assert row["capacity_source"].startswith("unknown")
    assert row["why"].startswith("live memory exhaustion: the device could not give the 32.00 MiB request")
    assert row["advice"][0].startswith("a smaller KV cache") and "kv_cache holds 8.47 GiB" in row["advice"][0]
    assert row["advice"][-1] == "free at least 17.64 MiB of live memory before this allocation"
    cats = dict(zip(result.categories["category"], result.categories["bytes"]))
    assert cats == exp["categories"]         # the failure is right after the peak: the same blocks are live
    assert dict(zip(result.categories["category"], result.categories["window_bytes"])) == \
        {"weights": 0, "kv_cache": exp["categories"]["kv_cache"]}


def test_pressure_from_another_process() -> None:
    exp = json.loads((RUNS / "oom_other_process.expected.json").read_text())
    items, problems = explain_path(RUNS / "oom_other_process")
    assert problems == [] and [(i.rank, i.tag) for i in items] == [(0, "oom-1")]
    row = _worded(items[0].explanation)
    want = exp["ranks"]["0"]["oom"]
    check_numbers(row, want)
    others = exp["ranks"]["0"]["nvml"]["other_processes_bytes"]
    assert row["other_processes_bytes"] == others and row["own_outside_bytes"] == 420 * MiB
    assert row["capacity_bytes"] == 24_152_899_584 and row["capacity_source"] == "NVML total"
    assert row["outside_bytes"] == row["capacity_bytes"] - row["reserved_bytes"] - row["device_free_bytes"] \
        == others + 420 * MiB
    assert row["shortfall_bytes"] > 0 and others >= row["shortfall_bytes"]
    assert row["why"].startswith("pressure from outside the allocator")
    assert "other processes held 7.12 GiB on the device at the failure" in row["why"]
    assert row["advice"][0].startswith("give this process the device to itself")


def test_idle_nvml_alone_never_decides() -> None:
    """Samples from long before the failure show another process; none near the failure: no outside verdict."""
    exp = json.loads((RUNS / "oom_other_process.expected.json").read_text())
    snap = load(RUNS / "oom_other_process")
    nvml = read_run(RUNS / "oom_other_process").nvml_of(0)
    early = nvml[nvml["time_us"] < exp["oom_time_us"] - 2_000_000].copy()
    early["other_processes_used_bytes"] = pd.array([8 * GiB] * len(early), dtype="Int64")
    early["used_bytes"] += 8 * GiB
    row = _worded(explain_oom(snap, nvml=early))
    assert row["verdict"] == "live_exhaustion" and row["other_processes_bytes"] is pd.NA
    # with the samples near the failure, but nobody else on the device, it is live exhaustion as well
    alone = nvml.assign(other_processes_used_bytes=pd.array([0] * len(nvml), dtype="Int64"))
    alone["used_bytes"] = alone["process_used_bytes"].astype("int64")
    row = _worded(explain_oom(snap, nvml=alone))
    assert row["verdict"] == "live_exhaustion" and row["other_processes_bytes"] == 0
    assert row["outside_growth_bytes"] == 0


def _oom_then_more(builder: SnapshotBuilder, with_later_free: bool) -> object:
    """A 20 MiB segment: 8 MiB live, a 6 MiB hole, 6 MiB live; a 10 MiB request fails. With `with_later_free`
    the last block is freed after the failure, so the end state shows one merged 12 MiB free block."""
    live, hole, tail = 8 * MiB, 6 * MiB, 6 * MiB
    if with_later_free:
        a, _ = builder.segment(BASE, [(live, live, "active_allocated"), (hole + tail, 0, "inactive")])
    else:
        a, _, _ = builder.segment(BASE, [(live, live, "active_allocated"), (hole, 0, "inactive"),
                                         (tail, tail, "active_allocated")])
    h, c = BASE + live, BASE + live + hole
    builder.event("segment_alloc", BASE, live + hole + tail)
    builder.alloc(a, live)
    builder.alloc(h, hole)
    builder.alloc(c, tail)
    builder.free(h, hole)
    builder.event("oom", None, 10 * MiB, device_free=2 * MiB)
    if with_later_free:
        builder.free(c, tail)
    return to_snapshot(builder.build(), "synthetic.pickle", "pickle")


def test_exact_when_last_and_estimated_otherwise(builder: SnapshotBuilder) -> None:
    exact = _worded(explain_oom(_oom_then_more(builder, False)))
    assert exact["exact"] and exact["largest_free_block_bytes"] == 6 * MiB
    assert exact["reserved_free_bytes"] == 6 * MiB and exact["verdict"] == "live_exhaustion"
    later = _oom_then_more(SnapshotBuilder(), True)
    assert replay(later).check_invariants() == []
    est = explain_oom(later)
    row = _worded(est)
    assert not row["exact"] and row["state_source"].startswith("estimated")
    # the replay lays the live blocks of the failure into the segment: the same 6 MiB hole, not the later 12 MiB
    assert row["largest_free_block_bytes"] == 6 * MiB and row["reserved_free_bytes"] == 6 * MiB
    assert est.notes and est.notes[0].startswith("estimated")


def test_fragmentation_in_small_steps(builder: SnapshotBuilder) -> None:
    """Two 6 MiB holes in one segment, 10 MiB requested, 1 MiB free on the device: fragmentation."""
    a, h1, b, h2 = builder.segment(BASE, [(4 * MiB, 4 * MiB, "active_allocated"), (6 * MiB, 6 * MiB, "inactive"),
                                          (4 * MiB, 4 * MiB, "active_allocated"), (6 * MiB, 6 * MiB, "inactive")])
    builder.event("oom", None, 10 * MiB, device_free=1 * MiB)
    row = _worded(explain_oom(to_snapshot(builder.build(), "f.pickle", "pickle")))
    assert row["verdict"] == "fragmentation" and row["reserved_free_bytes"] == 12 * MiB
    assert "more than the request by itself" in row["why"]


def test_a_free_block_that_fits_is_unexplained(builder: SnapshotBuilder) -> None:
    builder.segment(BASE, [(4 * MiB, 4 * MiB, "active_allocated"), (16 * MiB, 16 * MiB, "inactive")])
    builder.event("oom", None, 10 * MiB, device_free=0)
    row = _worded(explain_oom(to_snapshot(builder.build(), "u.pickle", "pickle")))
    assert row["verdict"] == "unexplained" and row["largest_free_block_bytes"] == 16 * MiB
    # on another stream the same block could not serve it: fragmentation, not a contradiction
    b2 = SnapshotBuilder()
    b2.segment(BASE, [(4 * MiB, 4 * MiB, "active_allocated"), (16 * MiB, 16 * MiB, "inactive")], stream=7)
    b2.event("oom", None, 10 * MiB, device_free=0)
    row = _worded(explain_oom(to_snapshot(b2.build(), "s.pickle", "pickle")))
    assert row["verdict"] == "fragmentation" and row["largest_free_block_bytes"] == 0
    assert row["largest_free_block_any_bytes"] == 16 * MiB


def test_no_oom_with_a_rejected_request() -> None:
    exp = json.loads((RUNS / "admission_rejected.expected.json").read_text())["ranks"]["0"]
    items, problems = explain_path(RUNS / "admission_rejected")
    e = items[0].explanation
    assert len(e.ooms) == 0 and problems == []
    n = no_oom_record(e.no_oom[0])
    assert n["capacity_bytes"] == exp["capacity_bytes"] and n["capacity_source"] == "NVML total"
    assert n["nvml_used_bytes"] == exp["nvml"]["nvml_used_bytes"]
    assert n["headroom_bytes"] == exp["capacity_bytes"] - exp["nvml"]["nvml_used_bytes"]
    assert n["peak_index"] == exp["peak"]["event_index"]
    assert n["message"].startswith("no allocation failure was recorded; the rejected request req-3 (prompt of 40,000 "
                                   "tokens exceeds max_model_len 32,768) was refused by an admission limit")
    assert "the peak stayed 12.48 GiB below capacity (44.99 GiB" in n["message"]
    assert [r["name"] for r in n["rejected_requests"]] == ["req-3"]


def test_no_oom_and_no_capacity() -> None:
    snap = load(SCENARIOS / "kv_weights_baseline.pickle")
    n = no_oom_record(explain_oom(snap).no_oom[0])
    assert n["headroom_bytes"] is None and n["nvml_used_bytes"] is None
    assert n["message"].startswith("no allocation failure was recorded; any rejected request was refused")
    assert "capacity is unknown" in n["message"]
    n = no_oom_record(explain_oom(snap, capacity=80 * GiB).no_oom[0])
    assert n["headroom_bytes"] == 80 * GiB - replay(snap)[0].reserved_at(n["peak_index"])
    assert "allocator reserved only" in n["message"]


def test_rejected_requests_conventions() -> None:
    m = pd.DataFrame([
        {"kind": "request", "name": "a", "start_time_us": 1, "attrs": {"rejected": True}},
        {"kind": "request", "name": "b", "start_time_us": 2, "attrs": {"status": "Aborted", "error": "too long"}},
        {"kind": "request", "name": "c", "start_time_us": 3, "attrs": {"status": "finished"}},
        {"kind": "phase", "name": "d", "start_time_us": 4, "attrs": {"rejected": True}},
    ])
    assert rejected_requests(m).to_dict("records") == [{"name": "a", "time_us": 1, "reason": ""},
                                                       {"name": "b", "time_us": 2, "reason": "too long"}]


def test_a_pickle_inside_a_run_reads_its_rank_samples() -> None:
    items, problems = explain_path(RUNS / "oom_other_process" / "rank=0" / "snapshot-oom-1.pickle")
    assert items[0].rank == 0 and problems == []
    assert items[0].explanation.ooms.iloc[0]["verdict"] == "outside_pressure"


# -- advice in the words of the program (report/advice.toml per engine) -----------------------------------

VLLM_KNOBS = ("--gpu-memory-utilization", "--max-num-batched-tokens", "--max-num-seqs", "--enforce-eager")
SGLANG_KNOBS = ("--mem-fraction-static", "--chunked-prefill-size", "--max-running-requests", "--cuda-graph-max-bs")


def test_advice_names_the_knobs_of_the_engine_that_ran() -> None:
    verdict = explain_oom(scenario("oom_live_exhaustion")[0]).verdicts[0]
    sglang = oom_text.advice(verdict, "sglang")
    assert sglang[0].startswith("a smaller KV cache pool: a lower --mem-fraction-static")
    assert "kv_cache holds 8.47 GiB" in sglang[0]
    plain = oom_text.advice(verdict)                        # no engine known: plain PyTorch, no engine's knob
    assert not any(k in " ".join(plain) for k in VLLM_KNOBS + SGLANG_KNOBS)
    items, _ = explain_path(RUNS / "oom_other_process")
    other = items[0].explanation.verdicts[0]
    assert "--gpu-memory-utilization" in oom_text.advice(other, "vllm")[0]
    assert "--mem-fraction-static" in oom_text.advice(other, "sglang")[0]
    assert oom_text.advice(other)[0].startswith("give this process the device to itself")
    assert "gpu" not in oom_text.advice(other)[0]


def test_each_engine_table_speaks_only_its_own_knobs() -> None:
    table = oom_text._advice_table()
    texts = {name: " ".join([str(v) for v in t.values() if isinstance(v, str)] + list(t.get("categories", {}).values()))
             for name, t in table.items() if isinstance(t, dict)}
    assert set(texts) == {"pytorch", "vllm", "sglang", "transformers", "training"}
    assert not any(k in texts[name] for name in ("pytorch", "sglang", "transformers", "training") for k in VLLM_KNOBS)
    assert not any(k in texts[name] for name in ("pytorch", "vllm", "transformers", "training") for k in SGLANG_KNOBS)


def test_category_advice_falls_back_from_the_engine_to_plain_pytorch() -> None:
    table = oom_text._advice_table()
    assert oom_text.category_advice("communication", "vllm") == table["pytorch"]["categories"]["communication"]
    assert oom_text.category_advice("attention", "training").startswith("activation checkpointing")
    assert oom_text.category_advice("mlp", "vllm") == table["vllm"]["chunk"]
    assert oom_text.category_advice("attention") == table["pytorch"]["chunk"]
    assert oom_text.category_advice("no_such_category", "sglang") == table["sglang"]["chunk"]


def test_peak_advice_adds_the_training_state_levers_when_it_is_live() -> None:
    advice = oom_text.peak_advice("attention", "training", live=["weights", "optimizer_state", "attention"])
    assert len(advice) == 2 and advice[0].startswith("for attention, activation checkpointing")
    assert advice[1].startswith("for optimizer_state, less optimizer state per device: shard it")
    assert oom_text.peak_advice("attention", "training", live=["attention"]) == advice[:1]
    assert oom_text.peak_advice(None, "vllm", live=["optimizer_state"]) == []


def test_the_failed_allocation_is_named_with_its_code_request_and_stack() -> None:
    """The oom entry's own frames say who asked: a vLLM weight repack in the fragmentation fixture, a prefill
    GEMM of request req-2 in the run whose neighbour took the memory."""
    e = explain_oom(load(SCENARIOS / "oom_fragmentation.pickle"))
    failed = e.verdicts[0].failed
    assert failed is not None and failed.size == e.verdicts[0].request_bytes and failed.stack is not None
    assert site_text(failed.stack.owner).endswith("vocab_parallel_embedding.py:120:process_weights_after_loading")
    assert failed.stack.category == "weights" and failed.stack.frames[0] == failed.stack.owner
    items, _ = explain_path(RUNS / "oom_other_process")
    doc = oom_document(items, [], "run")
    record = doc["snapshots"][0]["ooms"][0]["failed_allocation"]
    assert record["size_bytes"] == 512 * MiB and record["request"] == "req=req-2" and record["span"] == "phase:prefill"
    assert record["owner"].endswith("layers/utils.py:105:default_unquantized_gemm") and len(record["frames"]) == 12
    shown = render_oom(items, [], "run").splitlines()
    verdict = next(i for i, line in enumerate(shown) if line.startswith("OOM on device"))
    assert shown[verdict + 1].startswith("  failed: 512.00 MiB asked for by vllm/model_executor/layers/utils.py:105")
    assert "    request req=req-2; in span phase:prefill" in shown


def test_an_oom_entry_without_frames_says_so() -> None:
    b = SnapshotBuilder(frames=False)
    b.segment(BASE, [(MiB, MiB, "active_allocated"), (MiB, 0, "inactive")])
    b.alloc(BASE, MiB)
    b.event("oom", None, 64 * MiB, device_free=0)
    e = explain_oom(to_snapshot(b.build(), "noframes.pickle", "pickle"))
    assert e.verdicts[0].failed is not None and e.verdicts[0].failed.stack is None
    assert _failed_lines(e.verdicts[0].failed) == [
        "  failed: 64.00 MiB (the oom entry records no frames)"]


def test_a_state_without_a_trace_says_what_it_cannot_show_and_what_it_proves() -> None:
    """A snapshot dumped at an OOM without a trace: no failure can be seen, and the admission-limit wording
    (a serving engine's) never appears; the state's free blocks against its live blocks are stated."""
    e = explain_oom(load(ROOT / "fixtures" / "real" / "docubox-state-only.pickle"))
    assert not e.no_oom and len(e.state_only) == 1
    s = e.state_only[0]
    assert s.reserved_bytes == s.allocated_bytes + s.reserved_free_bytes and s.free_blocks == 11
    assert 0 < s.larger_live_blocks < s.live_blocks
    said = oom_text.state_only_message(s)
    assert "no trace, so an allocation failure cannot be seen" in said and "admission" not in said
    assert "1 live block of 105 is larger than that" in said


def test_admission_limits_are_named_only_where_requests_can_be_refused() -> None:
    training = explain_oom(load(ROOT / "fixtures" / "real" / "cs336-forward-fp32-t2.6.pickle"))
    serving = explain_oom(load(SCENARIOS / "kv_weights_baseline.pickle"))
    assert [n.admission for n in training.no_oom] == [False] and [n.admission for n in serving.no_oom] == [True]
    assert "admission" not in oom_text.no_oom_message(training.no_oom[0])
    assert oom_text.no_oom_message(training.no_oom[0]).startswith("no allocation failure was recorded in the trace")
    assert "refused by an admission limit" in oom_text.no_oom_message(serving.no_oom[0])


def test_an_empty_file_says_it_holds_nothing_to_explain(tmp_path: Path) -> None:
    from conftest import write_pickle

    from snapanalyze import attribute
    empty = load(write_pickle(tmp_path / "empty.pickle", {"segments": [], "device_traces": []}))
    assert any("holds no allocator state and no trace" in n for n in explain_oom(empty).notes)
    assert any("no live bytes to attribute" in n for n in attribute(empty).notes)


def test_live_exhaustion_advice_ranks_what_grew_by_bytes_against_the_shortfall() -> None:
    from snapanalyze.analyze.oom import Advice, _advice_for_categories
    cats = pd.DataFrame({"category": ["weights", "mlp", "logits", "attention", "other"],
                         "bytes": [40 * GiB, 3 * GiB, 6 * GiB, 1 * GiB, 5 * MiB],
                         "window_bytes": [0, 3 * GiB, 6 * GiB, 1 * GiB, 5 * MiB]})
    picked = _advice_for_categories(cats, shortfall=2 * GiB)
    assert [a.values["category"] for a in picked] == ["logits", "mlp", "attention"]   # most bytes first, at most 3
    worded = [oom_text._one(a, "training") for a in picked]
    assert worded[0].startswith("a chunked loss over the vocabulary")
    assert worded[0].endswith("logits holds 6.00 GiB allocated in the trace window and live at the failure, enough "
                              "by itself to cover the 2.00 GiB that was missing")
    assert worded[2].endswith("attention holds 1.00 GiB allocated in the trace window and live at the failure, 50% "
                              "of the 2.00 GiB that was missing")
    assert "activation checkpointing" in worded[1]                  # training: the chunk advice for activations
    assert oom_text._one(Advice("category", {"category": "mlp", "bytes": GiB, "in_window": False}), "pytorch") \
        .endswith("mlp holds 1.00 GiB live at the failure")
