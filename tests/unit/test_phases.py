"""Phases: collector markers, record_function annotations and user_metadata spans mapped onto the trace, their
before / peak / after and top categories as the construction made them, and the instant `--phase` attributes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import SnapshotBuilder

from snapanalyze import attribute, load, replay
from snapanalyze.analyze.phases import PHASE_COLUMNS, attribute_phase, find_phase, phase_instant, phase_table, spans
from snapanalyze.errors import UsageError
from snapanalyze.load.columns import to_snapshot
from snapanalyze.load.samples import empty_markers, read_run

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "fixtures" / "runs"
CASES = [(name, rank) for name in ("tp2_vision_encoder", "slow_nvml_spike", "admission_rejected", "oom_other_process")
         for rank in ((0, 1) if name == "tp2_vision_encoder" else (0,))]
KEYS = ["start_index", "end_index", "before_bytes", "peak_bytes", "peak_index", "after_bytes", "transient_bytes",
        "retained_bytes", "clipped", "open"]


def expected(name: str) -> dict:
    return json.loads((RUNS / f"{name}.expected.json").read_text())


def rank_inputs(name: str, rank: int):
    snap = load(RUNS / name, rank=rank)
    return snap, replay(snap), read_run(RUNS / name).markers_of(rank)


@pytest.mark.parametrize("name,rank", CASES, ids=[f"{n}-rank{r}" for n, r in CASES])
def test_marker_phases_match_the_construction(name: str, rank: int) -> None:
    snap, timeline, markers = rank_inputs(name, rank)
    table = phase_table(snap, timeline, markers)
    assert list(table.columns) == PHASE_COLUMNS
    mine = table[table["source"] == "markers"]
    want = expected(name)["ranks"][str(rank)]["phases"]
    assert len(mine) == len(want)
    for exp in want:
        kind = "request" if exp["kind"] == "request" else "phase"
        row = mine[(mine["phase"] == exp["phase"]) & (mine["occurrence"] == exp["occurrence"])
                   & (mine["kind"] == kind)]
        assert len(row) == 1, exp
        row = row.iloc[0]
        assert {k: (bool(row[k]) if k in ("clipped", "open") else int(row[k])) for k in KEYS} == \
            {k: exp[k] for k in KEYS}, exp["phase"]
        cats = list(exp["categories"].items())[:3]
        assert list(zip(row["top_categories"], row["top_category_bytes"])) == cats, exp["phase"]


def test_vision_prefill_is_what_sets_rank_1_apart() -> None:
    rows = {}
    for rank in (0, 1):
        snap, timeline, markers = rank_inputs("tp2_vision_encoder", rank)
        t = phase_table(snap, timeline, markers)
        rows[rank] = t[(t["phase"] == "prefill") & (t["occurrence"] == 1)].iloc[0]
    assert rows[1]["top_categories"][0] == "vision_encoder" and rows[0]["top_categories"][0] == "mlp"
    assert rows[1]["transient_bytes"] - rows[0]["transient_bytes"] == 4_369_416_192 - 583_008_256
    assert rows[0]["before_bytes"] == rows[1]["before_bytes"]         # same weights and KV on both ranks


def test_spans_drop_duplicates_of_the_markers() -> None:
    snap, _, markers = rank_inputs("tp2_vision_encoder", 0)
    both = spans(snap, markers)
    assert set(both["source"]) == {"markers"}                       # phase:X annotations and req=X metadata deduped
    alone = spans(snap)
    assert set(alone["source"]) == {"annotations", "user_metadata"}
    assert list(alone[alone["kind"] == "annotation"]["phase"]) == ["load_model", "initialize_kv_cache", "prefill",
                                                                   "decode", "prefill"]
    assert list(alone[alone["kind"] == "metadata"]["phase"]) == ["req=req-1", "req=req-2"]


def test_annotations_alone_give_the_same_phase_numbers() -> None:
    snap, timeline, markers = rank_inputs("tp2_vision_encoder", 1)
    from_markers = phase_table(snap, timeline, markers, categories=False)
    from_annotations = phase_table(snap, timeline, None, categories=False)
    a = from_markers[from_markers["kind"] == "phase"].reset_index(drop=True)
    b = from_annotations[from_annotations["kind"] == "annotation"].reset_index(drop=True)
    assert a[["phase", "occurrence"] + KEYS].equals(b[["phase", "occurrence"] + KEYS])


def test_user_metadata_spans() -> None:
    snap, timeline, _ = rank_inputs("tp2_vision_encoder", 1)
    t = phase_table(snap, timeline, None)
    req1 = t[t["phase"] == "req=req-1"].iloc[0]
    meta = snap.trace(0).user_metadata_names
    codes = snap.trace(0).user_metadata
    idx = [i for i, c in enumerate(codes) if meta[c] == "req=req-1"]
    assert (req1["start_index"], req1["end_index"]) == (idx[0], idx[-1])
    assert req1["peak_bytes"] == 63_794_746_372 and req1["top_categories"][0] == "vision_encoder"


def test_record_function_annotations_of_a_scenario() -> None:
    snap = load(ROOT / "fixtures" / "scenarios" / "hf_eager_attention_threshold.pickle")
    t = phase_table(snap)
    assert list(t["phase"]) == ["request:short-sdpa", "request:long-eager"]
    long = t.iloc[1]
    exp = json.loads((ROOT / "fixtures" / "scenarios" / "hf_eager_attention_threshold.expected.json").read_text())
    assert long["peak_bytes"] == exp["peak"]["active_bytes"] and long["peak_index"] == exp["peak"]["event_index"]
    assert long["top_categories"][0] == "fallback_kernel"
    assert bool(t.iloc[0]["clipped"])                  # the ring buffer opens inside the first pass


def test_phase_without_events_and_open_phase() -> None:
    snap, timeline, markers = rank_inputs("tp2_vision_encoder", 0)
    t = phase_table(snap, timeline, markers)
    req0 = t[t["phase"] == "req-0"].iloc[0]
    assert req0["end_index"] < req0["start_index"] and req0["transient_bytes"] == 0 and req0["top_categories"] == []
    snap, timeline, markers = rank_inputs("oom_other_process", 0)
    t = phase_table(snap, timeline, markers, categories=False)
    step2 = t[(t["phase"] == "prefill") & (t["occurrence"] == 2)].iloc[0]
    assert bool(step2["open"]) and step2["end_index"] == len(timeline[0]) - 1 and step2["end_us"] is pd.NA


def test_phase_instant_picks_the_highest_occurrence_or_the_one_asked_for() -> None:
    snap, timeline, markers = rank_inputs("tp2_vision_encoder", 0)
    exp = expected("tp2_vision_encoder")["ranks"]["0"]["phases"]
    prefills = [p for p in exp if p["phase"] == "prefill"]
    device, index, row = phase_instant(snap, "prefill", timeline, markers)
    assert (device, index) == (0, max(prefills, key=lambda p: p["peak_bytes"])["peak_index"]) and index == 430
    _, index2, row2 = phase_instant(snap, "prefill#2", timeline, markers)
    assert index2 == prefills[1]["peak_index"] == 502 and row2["occurrence"] == 2
    result = attribute_phase(snap, "prefill#2", timeline, markers)
    plain = attribute(snap, at=f"event:{index2}", timeline=timeline, device=0)
    assert result.summary.equals(plain.summary)
    assert result.instants[0].label == "peak of phase prefill#2" and result.instants[0].event_index == 502
    with pytest.raises(UsageError, match=r"no phase 'prefil' inside the trace window \(phases: decode, "):
        phase_instant(snap, "prefil", timeline, markers)
    with pytest.raises(UsageError, match="no phase 'prefill#3'"):
        phase_instant(snap, "prefill#3", timeline, markers)


def test_no_spans_at_all() -> None:
    snap = load(ROOT / "fixtures" / "scenarios" / "oom_fragmentation.pickle")
    assert len(phase_table(snap, markers=empty_markers())) == 0
    with pytest.raises(UsageError, match="no markers, record_function annotations or user_metadata"):
        phase_instant(snap, "prefill")


def test_a_marker_spanning_two_devices_needs_a_device() -> None:
    b = SnapshotBuilder()
    for device in (0, 1):
        b.alloc(0x7F0000000000 + device * 2**30, 1 << 20, device=device)
        b.free(0x7F0000000000 + device * 2**30, 1 << 20, device=device)
    snap = to_snapshot(b.build(), "two.pickle", "pickle")
    markers = pd.DataFrame([{"rank": 0, "session": 0, "kind": "phase", "name": "prefill", "start_time_us": b.t0,
                             "end_time_us": b.t0 + 10**6, "attrs": {}, "thread_id": 1, "depth": 0}])
    markers["end_time_us"] = markers["end_time_us"].astype("Int64")
    with pytest.raises(UsageError, match=r"spans devices \[0, 1\]; choose one with --device"):
        phase_instant(snap, "prefill", markers=markers)
    device, index, _ = phase_instant(snap, "prefill", markers=markers, device=1)
    assert device == 1 and snap.trace(1).action[index] == 0      # the alloc: 1 MiB live


def test_kinds_and_largest_narrow_the_table_and_keep_its_numbers() -> None:
    snap, timeline, markers = rank_inputs("tp2_vision_encoder", 1)
    full = phase_table(snap, timeline, markers)
    requests = phase_table(snap, timeline, markers, kinds=["request"])
    assert set(requests["kind"]) == {"request"} and len(requests) == int((full["kind"] == "request").sum())
    top = phase_table(snap, timeline, markers, kinds=["request", "phase"], largest=2)
    pool = full[full["kind"].isin(["request", "phase"])]
    assert sorted(top["transient_bytes"], reverse=True) == sorted(pool["transient_bytes"], reverse=True)[:2]
    same = pool.set_index(["phase", "occurrence", "kind"])
    for row in top.itertuples(index=False):                     # the same numbers and categories as in full
        want = same.loc[(row.phase, row.occurrence, row.kind)]
        assert (row.peak_bytes, row.top_categories, row.top_category_bytes) == \
            (want["peak_bytes"], want["top_categories"], want["top_category_bytes"])


def test_attribute_largest_keeps_every_span_and_attributes_the_largest() -> None:
    snap, timeline, markers = rank_inputs("tp2_vision_encoder", 1)
    full = phase_table(snap, timeline, markers)
    some = phase_table(snap, timeline, markers, attribute_largest=2)
    assert len(some) == len(full)
    attributed = some[some["top_categories"].map(len) > 0]
    biggest = full.sort_values(["transient_bytes", "start_index"], ascending=[False, True]).head(2)
    assert sorted(attributed["transient_bytes"]) == sorted(biggest["transient_bytes"])
    assert attributed["top_categories"].tolist() == \
        full.loc[attributed.index, "top_categories"].tolist()


def test_labels_name_each_span_once_and_find_phase_reads_them_back() -> None:
    snap, timeline, markers = rank_inputs("tp2_vision_encoder", 0)
    t = phase_table(snap, timeline, markers, categories=False)
    prefills = t[(t["phase"] == "prefill") & (t["kind"] == "phase")]
    assert list(prefills["label"]) == ["prefill#1", "prefill#2"]                 # repeated: NAME#K
    assert list(t[t["phase"] == "load_model"]["label"]) == ["load_model"]        # once: the bare name
    assert list(find_phase(t, "prefill")["label"]) == ["prefill#1", "prefill#2"]  # a bare name: every occurrence
    for name in ("prefill#2", "prefill #2", "prefill# 2"):
        assert list(find_phase(t, name)["label"]) == ["prefill#2"], name
    with pytest.raises(UsageError, match=r"no phase 'prefill#9'.*\(phases: decode, initialize_kv_cache"):
        find_phase(t, "prefill#9", "x")


def test_a_name_with_a_hash_is_its_own_label_and_numbering_is_per_device() -> None:
    b = SnapshotBuilder()
    for _ in range(2):
        for device in (0, 1):
            b.alloc(0x7F0000000000 + device * 2**30, 1 << 20, device=device)
            b.free(0x7F0000000000 + device * 2**30, 1 << 20, device=device)
    raw = b.build()
    raw["external_annotations"] = [
        {"name": "layer#3", "stage": stage, "device": device, "time_us": e["time_us"] + (-1 if stage == "START" else 1)}
        for device in (0, 1) for e, stage in zip(
            [raw["device_traces"][device][k] for k in (0, 2, 3, 5)], ["START", "END", "START", "END"])]
    t = spans(to_snapshot(raw, "hash.pickle", "pickle"))
    assert sorted(zip(t["device"], t["label"])) == [(0, "layer#3#1"), (0, "layer#3#2"), (1, "layer#3#1"),
                                                    (1, "layer#3#2")]       # counted per device
    assert len(find_phase(t, "layer#3")) == 4                  # the name itself, not occurrence 3 of "layer"
    assert set(find_phase(t, "layer#3#2")["device"]) == {0, 1}


def test_the_phases_result_is_the_table_the_terminal_and_the_json_show() -> None:
    """`phases_of` turns the notebook's `phase_table` into one frozen, picklable `Phases`: its rows are the
    table's, in order, as plain values (strict JSON, attrs kept), and the terminal renders the object."""
    import pickle

    from snapanalyze.analyze.phase_result import phases_of
    from snapanalyze.report.run_terminal import render_phases
    from snapanalyze.units import fmt_bytes

    run = ROOT / "fixtures" / "sweeps" / "phase_markers" / "run"
    data = read_run(run)
    snapshot = load(run, rank=0)
    table = phase_table(snapshot, replay(snapshot), data.markers_of(0))
    result = phases_of(table, str(snapshot.source))
    assert pickle.loads(pickle.dumps(result)) == result
    assert [p.label for p in result.phases] == table["label"].tolist()
    assert [p.transient_bytes for p in result.phases] == table["transient_bytes"].tolist()
    assert any(p.attrs for p in result.phases)                  # the markers' shape attributes survive
    doc = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert list(doc["phases"][0]) == PHASE_COLUMNS
    assert doc["phases"][0]["attrs"] == dict(result.phases[0].attrs)
    text = render_phases(result)
    assert result.phases[0].label in text and fmt_bytes(result.phases[0].peak_bytes) in text
