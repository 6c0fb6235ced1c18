"""Plots: figures carry exact peaks, bounded point counts, escaped text, and icicles whose boxes add up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest
from conftest import SnapshotBuilder, write_pickle

from snapanalyze import attribute, find_peaks, load, plots, replay
from snapanalyze.analyze.outside import join_samples
from snapanalyze.analyze.over_time import UNATTRIBUTED, InstantAttributions, categories_over_time, category_curves
from snapanalyze.analyze.phases import PHASE_COLUMNS, phase_table
from snapanalyze.analyze.segment_map import segment_map
from snapanalyze.load.samples import read_run
from snapanalyze.plots import (
    MAX_BANDS,
    MAX_SHOWN_BANDS,
    GiB,
    categories_figure,
    compare_figure,
    cpp_symbol,
    envelope_indices,
    frame_label,
    icicle_figure,
    outside_figure,
    ranks_figure,
    segment_map_figure,
    time_axis,
    timeline_figure,
)
from snapanalyze.session import compare_ranks

SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"
RUNS = SCENARIOS.parent / "runs"
MiB = 1 << 20
BASE = 0x7F00_0000_0000


def long_trace(tmp_path: Path, n_pairs: int = 6000, spike_at: int = 4321) -> Path:
    """n_pairs alloc/free pairs of 1 MiB, with one 512 MiB allocation held across a single pair."""
    b = SnapshotBuilder(frames=False)
    for i in range(n_pairs):
        if i == spike_at:
            b.alloc(BASE + (1 << 32), 512 * MiB)
        b.alloc(BASE, MiB)
        b.free(BASE, MiB)
        if i == spike_at:
            b.free(BASE + (1 << 32), 512 * MiB)
    return write_pickle(tmp_path / "long.pickle", b.build(n_devices=1))


# -- envelope -----------------------------------------------------------------------------------------------

def test_envelope_keeps_short_series_whole() -> None:
    assert envelope_indices(np.arange(10), 5).tolist() == list(range(10))


def test_envelope_keeps_every_spike_and_dip_exactly() -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(100, 200, size=100_003)
    values[12_345] = 10_000
    values[99_999] = -5
    idx = envelope_indices(values, 500)
    assert len(idx) <= 2 * 500 + 2
    assert {12_345, 99_999, 0, 100_002} <= set(idx.tolist())
    assert np.all(np.diff(idx) > 0)
    # each bucket's extremes survive: the envelope's max over any bucket equals the data's
    width = -(-len(values) // 500)
    for k in (0, 123, -(-len(values) // width) - 1):
        lo, hi = k * width, min(len(values), (k + 1) * width)
        kept = idx[(idx >= lo) & (idx < hi)]
        assert values[kept].max() == values[lo:hi].max() and values[kept].min() == values[lo:hi].min()


# -- timeline -----------------------------------------------------------------------------------------------

def test_timeline_figure_is_bounded_and_keeps_the_peak_exact(tmp_path: Path) -> None:
    snap = load(long_trace(tmp_path))
    timeline = replay(snap)
    peaks = find_peaks(timeline, top=3)
    fig = timeline_figure(timeline, 0, peaks, max_points=400)
    curves = {t.name: t for t in fig.data}
    assert set(curves) == {"active (exact)", "reserved (exact)", "allocated (estimate)", "peaks"}
    active = curves["active (exact)"]
    assert len(active.y) <= 400 + 2 + len(peaks)       # envelope, the baseline point, the peaks
    assert len(timeline[0]) > 10 * len(active.y)
    top = int(peaks["active_bytes"].iloc[0])
    assert top == 513 * MiB
    assert np.max(active.y) == top / GiB                  # the spike is drawn at its exact height
    assert list(curves["peaks"].y)[0] == top / GiB
    assert int(peaks["event_index"].iloc[0]) in set(np.asarray(active.customdata).tolist())
    assert fig.layout.xaxis.title.text == "time into the window (s)"


def test_timeline_without_timestamps_uses_the_event_index(tmp_path: Path) -> None:
    b = SnapshotBuilder(times=False)
    b.alloc(BASE, MiB)
    b.free(BASE, MiB)
    timeline = replay(load(write_pickle(tmp_path / "nt.pickle", b.build(n_devices=1))))
    assert time_axis(timeline[0]).title == "event index"
    fig = timeline_figure(timeline, 0)
    assert list(fig.data[-1].x) == [-1.0, 0.0, 1.0, 2.0]


def test_oom_entries_are_marked_where_they_happened() -> None:
    snap = load(SCENARIOS / "oom_fragmentation.pickle")
    timeline = replay(snap)
    fig = timeline_figure(timeline, 0, find_peaks(timeline), snap.ooms)
    oom = next(t for t in fig.data if t.name == "OOM")
    assert list(oom.y) == [timeline[0].active_at(66) / GiB]
    assert "1.96 GiB request failed" in oom.hovertext[0]


def test_figures_do_not_depend_on_plotlys_default_template(monkeypatch: pytest.MonkeyPatch) -> None:
    snap = load(SCENARIOS / "oom_fragmentation.pickle")
    timeline = replay(snap)
    first = timeline_figure(timeline, 0).to_json()
    monkeypatch.setattr(pio.templates, "default", "ggplot2")
    assert timeline_figure(timeline, 0).to_json() == first


def test_nvml_used_is_a_line_of_the_samples_around_the_window() -> None:
    run = RUNS / "slow_nvml_spike"
    snap = load(run)
    timeline = replay(snap)
    nvml = read_run(run).nvml_of(0)
    fig = timeline_figure(timeline, 0, nvml=nvml)
    line = next(t for t in fig.data if t.name == "NVML used (sampled)")
    dt = timeline[0]
    inside = nvml[(nvml["time_us"] >= dt.time_us[0]) & (nvml["time_us"] <= dt.time_us[-1])]
    assert len(line.x) == len(inside) + 2                 # and one sample on each side of the 10 ms window
    span_ms = (int(dt.time_us[-1]) - int(dt.time_us[0])) / 1000
    assert min(line.x) < 0 and max(line.x) > span_ms and tuple(fig.layout.xaxis.range) == (0.0, span_ms)
    assert "before the window" in line.hovertext[0]
    assert timeline_figure(timeline, 0, nvml=nvml.iloc[0:0]).to_json() == timeline_figure(timeline, 0).to_json()


def test_nvml_line_is_bounded(tmp_path: Path) -> None:
    snap = load(long_trace(tmp_path))
    timeline = replay(snap)
    dt = timeline[0]
    t = np.linspace(int(dt.time_us[0]), int(dt.time_us[-1]), 50_000).astype(np.int64)
    nvml = pd.DataFrame({"device": 0, "time_us": t, "used_bytes": (np.arange(len(t)) % 97) * MiB})
    nvml.loc[31_337, "used_bytes"] = 9 * GiB
    line = next(tr for tr in timeline_figure(timeline, 0, nvml=nvml, max_points=400).data if tr.name.startswith("NVML"))
    assert len(line.x) <= 402 and max(line.y) == 9.0


@pytest.mark.slow
def test_phases_are_bands_behind_the_curves_and_bounded() -> None:
    run = RUNS / "tp2_vision_encoder"
    snap = load(run, rank=1)
    timeline = replay(snap)
    phases = phase_table(snap, timeline, read_run(run).markers_of(1), categories=False)
    fig = timeline_figure(timeline, 0, phases=phases)
    shapes = fig.layout.shapes
    assert [s.name for s in shapes] == ["phase: load_model", "phase: initialize_kv_cache", "phase: prefill",
                                        "phase: decode", "phase: prefill"]
    assert all(s.layer == "below" and s.yref == "paper" for s in shapes)
    assert [s.showlegend for s in shapes] == [True, True, True, True, False]       # one legend entry per name
    assert shapes[2].fillcolor == shapes[4].fillcolor != shapes[3].fillcolor
    many = pd.DataFrame([{**dict.fromkeys(PHASE_COLUMNS), "device": 0, "phase": f"<i>p{i}</i>", "occurrence": 1,
                          "label": f"<i>p{i}</i>", "kind": "annotation",
                          "start_us": int(timeline[0].time_us[0]) + 1000 * i,
                          "end_us": int(timeline[0].time_us[0]) + 1000 * i + 10 * (i % 7 + 1), "start_index": i,
                          "end_index": i, "transient_bytes": i % 50} for i in range(500)])
    peak = int(find_peaks(timeline)["event_index"].iloc[0])
    fig = timeline_figure(timeline, 0, find_peaks(timeline), phases=many)
    shapes = fig.layout.shapes
    assert len(shapes) == MAX_BANDS
    shown = [s for s in shapes if s.visible is None or s.visible is True]
    hidden = [s for s in shapes if s.visible == "legendonly"]
    assert len(shown) == MAX_SHOWN_BANDS and len(hidden) == MAX_BANDS - MAX_SHOWN_BANDS
    assert any(s.name == f"phase: &lt;i&gt;p{peak}&lt;/i&gt;" for s in shown)      # the span around the peak
    assert sum(bool(s.showlegend) for s in hidden) == 1                               # one entry, on demand
    assert {s.legendgroup for s in hidden} == {"more phases"}
    assert sum(bool(s.showlegend) for s in shapes) <= MAX_SHOWN_BANDS + 1
    texts = [a.text for a in fig.layout.annotations if a.text]
    assert f"{500 - MAX_BANDS} shorter phases not drawn" in texts
    assert len(texts) <= MAX_SHOWN_BANDS + 1 + 3                  # band labels, the note, the peak labels
    assert not any("<i>" in t for t in texts) and any("&lt;i&gt;" in t for t in texts)


def test_every_timeline_curve_is_a_step_with_no_ramp_between_events(tmp_path: Path) -> None:
    """Between two events memory is constant: the line holds each value until the next drawn event, and the
    envelope keeps every bucket's extremes exactly."""
    snap = load(long_trace(tmp_path))
    timeline = replay(snap)
    fig = timeline_figure(timeline, 0, max_points=400)
    dt = timeline[0]
    for trace in fig.data:
        assert trace.line.shape == "hv"
        idx = np.asarray(trace.customdata)
        values = {"active (exact)": dt.active, "reserved (exact)": dt.reserved,
                  "allocated (estimate)": dt.allocated_est}[trace.name]
        drawn = np.asarray(trace.y)[1:] * GiB
        assert np.array_equal(drawn, values[idx[1:]].astype(np.float64))        # every point an exact value
    active = next(t for t in fig.data if t.name == "active (exact)")
    assert max(active.y) * GiB == dt.active.max()


def test_ranks_figure_stacks_each_ranks_categories() -> None:
    comparison = compare_ranks(RUNS / "tp2_vision_encoder")
    fig = ranks_figure(comparison.table, comparison.categories, order=["kv_cache", "weights"])
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name for t in bars][:2] == ["kv_cache", "weights"]
    assert list(bars[0].y) == ["rank 0", "rank 1 (outlier)"]
    total = sum(np.asarray(t.x) for t in bars)
    assert np.allclose(total * GiB, comparison.table["active_bytes"].to_numpy(dtype=float))
    used = next(t for t in fig.data if t.name == "NVML used")
    assert "estimated" in used.hovertext[0] and "estimated" not in used.hovertext[1]


def test_outside_figure_draws_each_series() -> None:
    run = RUNS / "oom_other_process"
    snap = load(run)
    timeline = replay(snap)
    joined = join_samples(timeline[0], read_run(run).nvml_of(0))
    fig = outside_figure({"rank 0": joined}, int(timeline[0].time_us[0]))
    assert [t.name for t in fig.data] == ["rank 0: outside the allocator", "rank 0: other processes"]
    assert max(fig.data[1].y) == pytest.approx(7.12, abs=0.01)


# -- categories and comparisons -----------------------------------------------------------------------------

def step_at(xs: np.ndarray, ys: np.ndarray, x: float) -> float:
    """The value a step ("hv") line shows at x: that of its last point at or before x."""
    return float(ys[np.searchsorted(xs, x, side="right") - 1])


def _curves(snap, timeline, samples: int, buckets: int = 500) -> tuple[pd.DataFrame, pd.DataFrame]:  # type: ignore[no-untyped-def]
    cache = InstantAttributions(snap, timeline)
    series = categories_over_time(snap, timeline, samples=samples, cache=cache)
    return series, category_curves(cache, 0, series["event_index"].unique(), buckets)


def test_categories_figure_stacks_every_event_up_to_the_exact_curve_and_each_instants_table() -> None:
    snap = load(SCENARIOS / "prompt_logprobs_logits.pickle")
    timeline = replay(snap)
    series, curves = _curves(snap, timeline, samples=6)
    fig = categories_figure(curves, timeline, 0, order=["kv_cache", "weights"], marks=[(598, "peak 1")])
    stacked = [t for t in fig.data if t.stackgroup == "categories"]
    names = [t.name for t in stacked]
    assert names[:2] == ["kv_cache", "weights"]
    assert set(series["category"]) <= {n.split(" (")[0] for n in names}
    assert all(t.line.shape == "hv" for t in fig.data)              # memory is flat between two events
    total = sum(np.asarray(t.y) for t in stacked)
    drawn = np.asarray(stacked[0].customdata)
    dt = timeline[0]
    assert np.allclose(total, [dt.active_at(int(i)) / GiB for i in drawn])    # the stack's top is exact everywhere
    assert drawn[0] == -1 and drawn[-1] == len(dt) - 1                          # from the window's start to its end
    for index, part in series.groupby("event_index"):                          # and equals each instant's table
        k = int(np.flatnonzero(drawn == index)[0])
        for trace in stacked:
            want = part.loc[part["category"] == trace.name, "bytes"].sum()
            assert trace.y[k] * GiB == pytest.approx(want)
    (exact,) = [t for t in fig.data if t.name == "active (exact)"]
    assert np.allclose(np.asarray(exact.y), total)
    assert [a.text for a in fig.layout.annotations] == ["peak 1"]


def test_compare_figure_shows_both_instants_per_category() -> None:
    snap = load(SCENARIOS / "prompt_logprobs_logits.pickle")
    timeline = replay(snap)
    a = attribute(snap, at="peak:2", timeline=timeline)
    b = attribute(snap, at="peak", timeline=timeline)
    fig = compare_figure(a, b, 0, labels=("before", "peak"))
    assert [t.name for t in fig.data] == ["before", "peak"]
    logits = list(fig.data[1].y).index("logits")
    assert fig.data[1].x[logits] == pytest.approx(10_260_736_520 / GiB)
    assert fig.data[0].x[list(fig.data[0].y).index("logits")] == 0


# -- icicle -------------------------------------------------------------------------------------------------

def _tree(fig: go.Figure) -> dict[str, tuple[str, str, int]]:
    ic = fig.data[0]
    return {i: (p, lab, int(v)) for i, p, lab, v in zip(ic.ids, ic.parents, ic.labels, ic.values)}


def test_icicle_boxes_add_up_and_follow_categories() -> None:
    snap = load(SCENARIOS / "prompt_logprobs_logits.pickle")
    result = attribute(snap)
    tree = _tree(icicle_figure(result, 0))
    root = [i for i, (p, _, _) in tree.items() if p == ""]
    assert len(root) == 1 and tree[root[0]][2] == result.instants[0].active_bytes
    cats = {lab.strip("[]"): v for i, (p, lab, v) in tree.items() if p == root[0]}
    assert cats == dict(zip(result.summary["category"], result.summary["bytes"].astype(int)))
    for node, (_, _, value) in tree.items():
        children = [v for p, _, v in tree.values() if p == node]
        assert sum(children) <= value


def test_icicle_hides_plumbing_and_escapes_frame_names(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    frames = [{"filename": "/app/ops.py", "line": 3, "name": "<b>bold</b>"},
              {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 1,
               "name": "_call_impl"},
              {"filename": "/app/main.py", "line": 9, "name": "main"}]
    b.alloc(BASE, 4 * MiB, frames=frames)
    snap = load(write_pickle(tmp_path / "p.pickle", b.build(n_devices=1)))
    fig = icicle_figure(attribute(snap), 0)
    labels = " ".join(fig.data[0].labels) + " ".join(fig.data[0].customdata)
    assert "_call_impl" not in labels
    assert "&lt;b&gt;bold&lt;/b&gt;" in labels and "<b>bold</b>" not in labels
    assert "main (/app/main.py:9)" in labels


def test_icicle_stays_bounded_with_many_stacks(tmp_path: Path) -> None:
    b = SnapshotBuilder()
    for i in range(600):
        frames = [{"filename": f"/app/layer{i}.py", "line": i, "name": f"op{i}"},
                  {"filename": "/app/main.py", "line": 1, "name": "main"}]
        b.alloc(BASE + i * 2 * MiB, MiB + i * 512, frames=frames)
    snap = load(write_pickle(tmp_path / "many.pickle", b.build(n_devices=1)))
    result = attribute(snap)
    fig = icicle_figure(result, 0, max_nodes=50)
    tree = _tree(fig)
    assert len(tree) <= 50 + 5
    folded = [v for _, lab, v in tree.values() if lab.endswith("smaller)")]
    assert folded and sum(folded) > 0
    root = next(i for i, (p, _, _) in tree.items() if p == "")
    assert tree[root][2] == int(result.blocks["size"].sum())


def test_frame_labels() -> None:
    assert frame_label(("/x/site-packages/vllm/a.py", 3, "f")) == "f (vllm/a.py:3)"
    assert frame_label(("??", 0, "at::native::mm(at::Tensor const&, at::Tensor const&)")) == "at::native::mm"
    assert cpp_symbol("at::cuda::(anonymous namespace)::getHandle()") == "at::cuda::(anonymous namespace)::getHandle"
    assert cpp_symbol("plain_symbol") == "plain_symbol"


def test_icicle_boxes_name_python_frames_and_stay_legible(tmp_path: Path) -> None:
    """With C++ and Python frames in a stack (stacks="all"), boxes name the Python frames; C++ symbols show only
    for a stack that has nothing else. Labels too small to read are hidden, not shrunk."""
    b = SnapshotBuilder()
    mixed = [{"filename": "??", "line": 0, "name": "at::native::zeros_symint(c10::ArrayRef<c10::SymInt>)"},
             {"filename": "/app/model.py", "line": 12, "name": "forward"},
             {"filename": "/usr/lib/libtorch_cpu.so", "line": 0, "name": "torch::autograd::THPVariable_zeros"},
             {"filename": "/app/main.py", "line": 3, "name": "main"}]
    native = [{"filename": "??", "line": 0, "name": "mylib::fused_attention_forward(at::Tensor const&)"}]
    b.alloc(BASE, 4 * MiB, frames=mixed)
    b.alloc(BASE + 8 * MiB, 2 * MiB, frames=native)
    snap = load(write_pickle(tmp_path / "cpp.pickle", b.build(n_devices=1)))
    fig = icicle_figure(attribute(snap), 0)
    labels = list(fig.data[0].labels)
    assert not any("zeros_symint" in lab or "THPVariable" in lab for lab in labels)
    assert any(lab.startswith("forward (model.py:12)") for lab in labels)
    assert "mylib::fused_attention_forward" in labels                            # nothing else in that stack
    assert fig.layout.uniformtext.minsize >= 10 and fig.layout.uniformtext.mode == "hide"


def test_segment_map_figure_marks_the_largest_free_block_and_the_failed_request() -> None:
    snap = load(SCENARIOS / "oom_fragmentation.pickle")
    timeline = replay(snap)
    oom = snap.ooms.iloc[0]
    smap = segment_map(snap, timeline, 0, int(oom["index"]), int(oom["size"]), int(oom["stream"]))
    fig = segment_map_figure(smap, max_segments=12)
    by_name = {t.name.split(" · ")[0]: t for t in fig.data}
    assert {"active (live block)", "free (cached, reusable)", "largest usable free block", "failed request"} \
        <= set(by_name)
    request = by_name["failed request"]
    assert request.x[0] * GiB == pytest.approx(int(oom["size"])) and request.base[0] == 0
    largest = by_name["largest usable free block"]
    assert largest.x[0] * GiB == pytest.approx(smap.largest_free.size)
    assert largest.x[0] < request.x[0]                            # fragmentation, visible
    rows = {y for t in fig.data for y in t.y} - set(request.y)
    assert len(rows) == 12
    free_drawn = sum(np.asarray(by_name["free (cached, reusable)"].x)) * GiB
    assert free_drawn == pytest.approx(smap.free_bytes)          # every free byte is in the shown segments
    notes = [a.text for a in fig.layout.annotations]
    assert any(f"{len(smap.segments) - 12} more segments not drawn" in n for n in notes)


def test_a_long_periodic_workload_keeps_its_colours_across_every_swing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """17,500 cycles of 4 GiB up and down (35,000 events) over 512 MiB held throughout, with a handful of
    attributed instants: the held bytes keep their colour from the window's start to its last event (they were
    slivers under the instants before), every swing reaches its exact height, and the swings no instant saw
    are drawn, counted, as not attributed."""
    from conftest import BASE, SnapshotBuilder, write_pickle
    b = SnapshotBuilder()
    b.segment(BASE, [(512 * MiB, 512 * MiB, "active_allocated"), (4 * GiB, 0, "inactive")])
    for _ in range(17_500):
        b.alloc(BASE + 512 * MiB, 4 * GiB)
        b.free(BASE + 512 * MiB, 4 * GiB)
    snap = load(write_pickle(tmp_path / "periodic.pickle", b.build()))
    timeline = replay(snap)
    dt = timeline[0]
    series, curves = _curves(snap, timeline, samples=4)
    fig = categories_figure(curves, timeline, 0)
    stacked = {t.name.split(" (")[0]: t for t in fig.data if t.stackgroup == "categories"}
    held = [t for name, t in stacked.items() if name != UNATTRIBUTED and min(t.y) * GiB == 512 * MiB]
    assert len(held) == 1                                  # the 512 MiB block: one category, every drawn point
    xs = np.asarray(held[0].x)
    assert xs[0] == 0 and xs[-1] == plots.time_axis(dt).x(dt, np.array([len(dt) - 1]))[0]
    total = sum(np.asarray(t.y) for t in stacked.values())
    assert np.allclose(total * GiB, [dt.active_at(int(i)) for i in np.asarray(held[0].customdata)])
    assert (np.isclose(total * GiB, 512 * MiB + 4 * GiB)).sum() >= 400       # the swings, at their height
    assert max(stacked[UNATTRIBUTED].y) * GiB == 4 * GiB                      # those no instant saw, counted
    assert len(fig.data[0].x) < 5000                                          # and the figure stays small
