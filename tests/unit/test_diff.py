"""diff: phase spans and windows, self-diffs are empty, a planted fix shows exactly the planted change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, SnapshotBuilder, frames_for, write_pickle

from snapanalyze import load
from snapanalyze.analyze.diff import diff, stack_identity, stack_key
from snapanalyze.analyze.diff_result import diff_result
from snapanalyze.analyze.phases import WindowPeak, phase_spans, window_bounds, window_peak
from snapanalyze.errors import UsageError
from snapanalyze.replay import replay

FIX = ROOT / "fixtures" / "sweeps" / "logits_float_fix"
REAL_1024 = ROOT / "fixtures" / "real" / "cs336-medium-ctx1024-inference-t2.11.pickle"
HF_EAGER = ROOT / "fixtures" / "scenarios" / "hf_eager_attention_threshold.pickle"
MiB = 1 << 20


def _annotate(raw: dict[str, Any], spans: list[tuple[str, str, int]]) -> dict[str, Any]:
    raw["external_annotations"] = [{"name": n, "stage": st, "device": 0, "time_us": t} for n, st, t in spans]
    return raw


def _small(tmp_path: Path, name: str, extra: int = 0, line_shift: int = 0, phases: bool = True,
           bigger: int = 0) -> Path:
    """Blocks under /app/model.py frames (lines shifted by `line_shift`): embed 1 MiB, attn 2 MiB + `bigger`,
    and `extra` bytes under "leak"; all freed again; one record_function span "step" around it all."""
    b = SnapshotBuilder(frames=False)
    b.segment(0x1000_0000, [(8 * MiB, 8 * MiB, "inactive")])
    blocks = [(0x1000_0000, MiB, "embed"), (0x1010_0000, 2 * MiB + bigger, "attn")]
    blocks += [(0x1040_0000, extra, "leak")] if extra else []
    for i, (addr, size, fn) in enumerate(blocks):
        b.alloc(addr, size, frames=frames_for(fn, 10 + i + line_shift))
    for addr, size, _ in blocks:
        b.free(addr, size)
    raw = b.build()
    t = raw["device_traces"][0]
    if phases:
        _annotate(raw, [("step", "START", t[0]["time_us"] - 1), ("step", "END", t[-1]["time_us"] + 1)])
    return write_pickle(tmp_path / f"{name}.pickle", raw)


def test_phase_spans_pair_names_and_keep_open_ends(builder: SnapshotBuilder) -> None:
    builder.alloc(0x1000, 512)
    raw = _annotate(builder.build(), [
        ("late", "END", 5), ("A", "START", 10), ("B", "START", 11), ("B", "END", 12), ("A", "END", 13),
        ("A", "START", 20), ("A", "END", 21), ("open", "START", 30)])
    from snapanalyze.load.columns import to_snapshot
    spans = phase_spans(to_snapshot(raw, "mem", "pickle"))
    assert list(spans["phase"]) == ["late", "A#1", "B", "A#2", "open"]
    rows = {r.phase: r for r in spans.itertuples()}
    assert (rows["A#1"].start_us, rows["A#1"].end_us) == (10, 13)
    assert (rows["B"].start_us, rows["B"].end_us) == (11, 12)
    assert rows["late"].start_us is None or str(rows["late"].start_us) == "<NA>"
    assert str(rows["open"].end_us) == "<NA>"
    assert rows["A#2"].occurrence == 2


def test_window_peak_against_the_active_bytes_before_the_window(builder: SnapshotBuilder) -> None:
    builder.segment(0x2000_0000, [(4 * MiB, 4 * MiB, "inactive")])
    builder.alloc(0x2000_0000, MiB)            # 0
    builder.alloc(0x2010_0000, 2 * MiB)        # 1
    builder.free(0x2010_0000, 2 * MiB)         # 2, 3
    builder.free(0x2000_0000, MiB)             # 4, 5
    from snapanalyze.load.columns import to_snapshot
    dt = replay(to_snapshot(builder.build(), "mem", "pickle"))[0]
    whole = window_peak(dt, 0, len(dt) - 1)
    assert whole == WindowPeak(first_index=0, event_index=1, time_us=dt.time_at(1), active_bytes=3 * MiB,
                               baseline_active_bytes=0, reserved_bytes=4 * MiB)
    assert whole.transient_bytes == 3 * MiB
    later = window_peak(dt, 3, 5)              # after the 2 MiB block went: nothing rises above 1 MiB
    assert (later.event_index, later.baseline_active_bytes, later.transient_bytes) == (2, 3 * MiB, 0)
    t = dt.time_us
    assert window_bounds(dt, int(t[1]), int(t[3])) == (1, 3)
    assert window_bounds(dt, None, None) == (0, len(dt) - 1)
    first, last = window_bounds(dt, int(t[-1]) + 10, None)
    assert first > last


@pytest.mark.parametrize("path", [REAL_1024, HF_EAGER], ids=lambda p: p.name)
def test_a_snapshot_diffed_with_itself_is_empty(path: Path) -> None:
    result = diff(load(path), load(path))
    cats, stacks = result.changes()
    assert result.identical and len(cats) == 0 and len(stacks) == 0
    assert (result.peaks.filter(like="delta_").to_numpy() == 0).all()
    assert set(result.stacks["status"]) == {"same"}
    assert result.categories["bytes_a"].sum() == result.peaks.iloc[0]["active_bytes_a"]


def test_phases_are_aligned_by_name() -> None:
    result = diff(load(HF_EAGER), load(HF_EAGER))
    assert list(result.peaks["phase"].fillna("(global)")) == ["(global)", "request:short-sdpa", "request:long-eager"]
    long_ = result.peaks[result.peaks["phase"] == "request:long-eager"].iloc[0]
    assert long_["event_index_a"] == result.peaks.iloc[0]["event_index_a"]   # the global peak is in it


def test_the_planted_fix_is_exactly_the_change() -> None:
    expected = json.loads((FIX / "expected.json").read_text())
    planted = expected["planted"]
    result = diff(load(FIX / "before.pickle"), load(FIX / "after.pickle"))
    cats, stacks = result.changes()
    assert len(stacks) == 1
    s = stacks.iloc[0]
    assert (s["status"], s["delta_bytes"], s["bytes_a"], s["category_a"]) == \
        ("vanished", -planted["bytes"], planted["bytes"], planted["category"])
    assert s["site"].endswith(f"score.py:{planted['line_in_a']}:{planted['site_function']}")
    assert s["transient_bytes_a"] == planted["bytes"]
    assert dict(zip(cats["category"], cats["delta_bytes"])) == expected["category_deltas"]
    for row in result.peaks.itertuples():       # global and the "score" phase
        assert row.delta_active_bytes == expected["peak_delta_bytes"]
        assert row.delta_baseline_bytes == 0
    assert list(result.peaks["phase"].fillna("(global)")) == ["(global)", "score"]
    assert not result.identical


def test_the_typed_result_carries_the_planted_change_and_survives_a_pickle() -> None:
    """`diff` renders one frozen result of plain values (what a worker sends back): the changed rows only
    unless everything is asked for, every stack counted by status, its JSON strict."""
    import pickle

    expected = json.loads((FIX / "expected.json").read_text())
    d = diff(load(FIX / "before.pickle"), load(FIX / "after.pickle"))
    r = diff_result(d)
    assert pickle.loads(pickle.dumps(r)) == r
    assert [(s.status, s.delta_bytes) for s in r.stacks] == [("vanished", -expected["planted"]["bytes"])]
    assert {c.category: c.delta_bytes for c in r.categories} == expected["category_deltas"]
    assert [p.delta.active_bytes for p in r.peaks] == [expected["peak_delta_bytes"]] * 2
    assert r.counts.vanished == 1 and sum(vars(r.counts).values()) == len(d.stacks)
    assert len(diff_result(d, everything=True).stacks) == len(d.stacks) > len(r.stacks)
    doc = json.loads(json.dumps(r.to_json(), allow_nan=False))
    assert doc["stacks"][0]["frames"] == list(r.stacks[0].labels()[1]) == list(d.changes()[1]["frames"][0])
    assert doc["stacks"][0]["frames"] == [f.label() for f in r.stacks[0].frames] and doc["counts"]["vanished"] == 1
    assert doc["peaks"][0]["delta"]["active_bytes"] == expected["peak_delta_bytes"]


def test_stacks_whose_lines_moved_are_the_same_stack() -> None:
    a, b = load(FIX / "before.pickle"), load(FIX / "after.pickle")
    result = diff(a, b)
    softmax = result.stacks[result.stacks["site"].str.contains("score.py:65:score")]
    # log_softmax's fp32 conversion and its output: line 66 in A, 65 in B, the same stacks
    assert len(softmax) == 2 and set(softmax["status"]) == {"same"}
    assert len(a.events) and len(b.events)  # interns every stack
    frames_a, frames_b = (set(map(tuple, x.frames_table()[["filename", "line", "name"]].to_numpy().tolist()))
                          for x in (a, b))
    assert ("/srv/eval/score.py", 67, "score") in frames_a and ("/srv/eval/score.py", 67, "score") not in frames_b


def test_new_vanished_grew_and_lines_ignored(tmp_path: Path) -> None:
    base = load(_small(tmp_path, "a"))
    moved = load(_small(tmp_path, "b", line_shift=7))
    assert diff(base, moved).identical
    leaked = diff(base, load(_small(tmp_path, "c", extra=3 * MiB)))
    _, stacks = leaked.changes()
    assert list(stacks["status"]) == ["new"] and stacks.iloc[0]["bytes_b"] == 3 * MiB
    assert stacks.iloc[0]["frames"][0] == "/app/model.py:leak" or stacks.iloc[0]["frames"][0].endswith("model.py:leak")
    grown = diff(base, load(_small(tmp_path, "d", bigger=MiB)))
    _, stacks = grown.changes()
    assert list(stacks["status"]) == ["grew"] and stacks.iloc[0]["delta_bytes"] == MiB
    assert list(diff(load(_small(tmp_path, "e", bigger=MiB)), base).changes()[1]["status"]) == ["shrank"]


def test_stack_identity_ignores_lines_only() -> None:
    snap = load(FIX / "before.pickle")
    assert len(snap.events)  # interns every stack
    ident = stack_identity(snap, 0)
    assert ident and all(len(p) == 2 for p in ident)
    assert stack_key(ident) == stack_key(tuple(ident)) and len(stack_key(ident)) == 12
    assert stack_key(ident) != stack_key(ident[1:])


def test_compare_at_a_phase_and_refuse_a_missing_one(tmp_path: Path) -> None:
    a = load(HF_EAGER)
    short = diff(a, a, phase="request:short-sdpa")
    assert short.instant == "peak of phase request:short-sdpa"
    glob_ = diff(a, a)
    assert short.a.instants[0].event_index != glob_.a.instants[0].event_index
    with pytest.raises(UsageError, match="no phase 'nope'"):
        diff(a, a, phase="nope")


def test_different_phases_are_noted_and_not_aligned(tmp_path: Path) -> None:
    with_phase = load(_small(tmp_path, "a"))
    without = load(_small(tmp_path, "b", phases=False))
    result = diff(with_phase, without)
    assert list(result.peaks["scope"]) == ["global"]
    assert any("phases differ" in n and "step" in n for n in result.notes)


def test_devices_must_be_shared() -> None:
    a = load(REAL_1024)
    with pytest.raises(UsageError, match="device 3 is not in both"):
        diff(a, a, device=3)


def test_categories_carry_each_side_s_inferred_bytes() -> None:
    run = ROOT / "fixtures" / "runs" / "tp2_vision_encoder"
    d = diff(load(run / "rank=0" / "snapshot-final.pickle"), load(run / "rank=1" / "snapshot-final.pickle"))
    cats = d.categories.set_index("category")
    assert cats.loc["mlp", "inferred_bytes_a"] == 296 << 20 and cats.loc["mlp", "inferred_bytes_b"] == 0
    assert cats.loc["vision_encoder", ["inferred_bytes_a", "inferred_bytes_b"]].tolist() == [0, 0]
    blocks = d.a.blocks
    assert cats["inferred_bytes_a"].sum() == blocks.loc[blocks["inferred"].astype(bool), "size"].sum()
