"""capacity: shapes from names/manifests/markers, fits, jumps, contracts — on the real sweep and planted ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from conftest import ROOT

from snapanalyze import load
from snapanalyze.analyze.attribute import attribute
from snapanalyze.analyze.capacity import Fit, capacity_contract, fit_bytes, fit_capacity
from snapanalyze.analyze.capacity_result import capacity_result
from snapanalyze.analyze.sweep import CATEGORY_COLUMNS, Sweep, category_levels, label_window, measure_sweep
from snapanalyze.batch_shape import shape_from_filename
from snapanalyze.errors import BadInputError, UsageError
from snapanalyze.load.shapes import read_manifest
from snapanalyze.plots_capacity import capacity_figure
from snapanalyze.replay import replay
from snapanalyze.report.compare_terminal import render_capacity
from snapanalyze.session import capacity, sweep_points

REAL = [ROOT / "fixtures" / "real" / f"cs336-medium-ctx{n}-inference-t2.11.pickle" for n in (128, 256, 512, 1024)]
SWEEPS = ROOT / "fixtures" / "sweeps"
THRESHOLD = sorted((SWEEPS / "attention_threshold").glob("*.pickle"))
MiB = 1 << 20


def _expected(name: str) -> dict:
    return json.loads((SWEEPS / name / "expected.json").read_text())


@pytest.fixture(scope="module")
def real() -> object:
    return capacity([str(p) for p in reversed(REAL)])           # any input order


@pytest.fixture(scope="module")
def threshold() -> object:
    return capacity([str(p) for p in THRESHOLD])


@pytest.fixture(scope="module")
def chunked() -> object:
    return capacity([], shape_from=str(SWEEPS / "chunked_prefill" / "manifest.csv"))


# -- shapes -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, shape", [
    ("cs336-medium-ctx1024-inference-t2.11.pickle", {"tokens": 1024}),
    ("llama-tokens=32768.pickle", {"tokens": 32768}),
    ("run_bs4_ctx2048.pickle", {"tokens": 2048, "batch": 4}),
    ("serve-batch=4-chunk=2048-prompt_tokens=8192.pkl.gz", {"tokens": 8192, "batch": 4, "chunk": 2048}),
    ("vit-images=8.json", {"images": 8}),
    ("long-ctx32k.pickle", {"tokens": 32768}),
    ("seq_len=512.pickle", {"tokens": 512}),
    ("snapshot-final.pickle", {}),
    ("model-t2.11-v3.pickle", {}),
])
def test_shape_from_filename(name: str, shape: dict[str, int]) -> None:
    assert shape_from_filename(name) == shape


def test_a_file_name_with_two_values_for_one_variable_is_refused() -> None:
    with pytest.raises(UsageError, match="tokens several values"):
        shape_from_filename("ctx1024-tokens=2048.pickle")


def test_manifest_resolves_files_and_aliases(tmp_path: Path) -> None:
    (tmp_path / "m.csv").write_text("Snapshot,prompt_tokens,BS,chunk_size,note\na.pickle,8192,2,,first\n"
                                    "sub/b.pickle,4096,1,1024,second\n")
    df = read_manifest(tmp_path / "m.csv")
    assert list(df["file"]) == ["a.pickle", "sub/b.pickle"]
    assert df["path"].iloc[1] == str((tmp_path / "sub" / "b.pickle").resolve())
    assert list(df["tokens"]) == [8192, 4096] and list(df["batch"]) == [2, 1]
    assert pd.isna(df["chunk"].iloc[0]) and df["chunk"].iloc[1] == 1024
    assert list(df["note"]) == ["first", "second"]


@pytest.mark.parametrize("text, problem", [
    ("tokens,batch\n1,2\n", "no file column"),
    ("file,note\na,b\n", "no shape column"),
    ("file,tokens\na,1\na,2\n", "listed twice"),
    ("file,tokens\na,many\n", "must be a number"),
    ("file,tokens\na,1.5\n", "whole number"),
    ("file,tokens\na,1,2\n", "has 3 fields"),
    ("file,tokens\n", "at least one row"),
    ("file,ctx,tokens\na,1,2\n", "same shape variable"),
])
def test_bad_manifests_say_what_is_wrong(tmp_path: Path, text: str, problem: str) -> None:
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises((BadInputError, UsageError), match=problem):
        read_manifest(tmp_path / "m.csv")


def test_sweep_points_refuse_what_they_cannot_place(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no shape in the file name"):
        sweep_points([str(ROOT / "fixtures" / "scenarios" / "moe_long_prefill.pickle")])
    with pytest.raises(UsageError, match="expected filename, markers, none or a manifest"):
        sweep_points([str(REAL[0])], shape_from="names")
    with pytest.raises(UsageError, match="not listed in"):
        sweep_points([str(REAL[0])], shape_from=str(SWEEPS / "chunked_prefill" / "manifest.csv"))
    with pytest.raises(UsageError, match="no phase with a shape"):
        sweep_points([str(REAL[0])], shape_from="markers")
    with pytest.raises(UsageError, match="at least 2 shapes"):
        capacity([str(REAL[0])])


# -- fitting ------------------------------------------------------------------------------------------------

def test_fit_recovers_exact_models() -> None:
    x = np.array([1024.0, 2048, 4096, 8192])
    lin = fit_bytes(x, x * x, 5e6 + 3000 * x)
    assert lin.model == "linear" and lin.intercept == pytest.approx(5e6) and lin.linear == pytest.approx(3000)
    assert lin.quadratic == 0 and lin.max_rel_residual < 1e-9
    quad = fit_bytes(x, x * x, 128.0 * x * x)
    assert quad.model == "quadratic" and quad.quadratic == pytest.approx(128) and quad.linear == 0
    assert fit_bytes(x, x * x, np.full(4, 7e6)).model == "constant"
    assert fit_bytes(x, x * x, np.zeros(4)).model == "constant"
    assert fit_bytes([], [], []).model == "none"


def test_fit_prefers_fewer_coefficients_unless_they_cut_the_error() -> None:
    x = np.array([1.0, 2, 3, 4, 5, 6])
    noisy = 1000 * x * (1 + np.array([0.004, -0.003, 0.002, -0.004, 0.003, -0.002]))
    assert fit_bytes(x, x * x, noisy).model == "linear"              # the quadratic term buys < 2 points
    bent = 1000 * x + 300 * x * x
    f = fit_bytes(x, x * x, bent)
    assert f.model == "quadratic" and f.max_rel_residual < 1e-9
    assert min(f.intercept, f.linear, f.quadratic) >= 0


def test_fit_never_uses_as_many_coefficients_as_points() -> None:
    f = fit_bytes([1.0, 2.0], [1.0, 4.0], [10.0, 50.0])
    assert f.coefficients == 1


def test_a_fit_without_a_model_predicts_no_number() -> None:
    assert np.isnan(Fit("insufficient", *[float("nan")] * 4, 2).predict([1.0, 2.0], [1.0, 4.0])).all()
    assert np.isnan(Fit("none", 0.0, 0.0, 0.0, float("inf"), 0).predict(1.0, 1.0))


def test_category_levels_track_baseline_and_window() -> None:
    lt = pd.DataFrame({"category": ["a", "a", "b", "a"], "size": [100, 10, 5, 20],
                       "alloc_index": [-1, 2, 3, 4], "free_index": [3, 6, -1, 5]})
    levels = category_levels(lt, 2, 6).set_index("target")
    assert levels.loc["a"].to_dict() == {"baseline_bytes": 100, "transient_bytes": 30, "max_bytes": 110}
    assert levels.loc["b"].to_dict() == {"baseline_bytes": 0, "transient_bytes": 5, "max_bytes": 5}
    fam = category_levels(lt, 2, 6, {"a": "ab", "b": "ab"}).set_index("target")
    assert fam.loc["ab", "transient_bytes"] == 35


def test_labelled_lifetimes_agree_with_attribute_at_the_peak() -> None:
    snap = load(REAL[-1])
    timeline = replay(snap)
    result = attribute(snap, timeline=timeline)
    index = result.instants[0].event_index
    lab = label_window(snap, timeline, 0)
    live = lab[(lab["alloc_index"] <= index) & ((lab["free_index"] < 0) | (lab["free_index"] > index))]
    assert live.groupby("category")["size"].sum().to_dict() == result.summary.set_index("category")["bytes"].to_dict()


# -- the real sweep: eager attention in cs336 at 128 … 1024 tokens ------------------------------------------

def test_real_sweep_points_come_from_ctx_in_the_names(real) -> None:  # type: ignore[no-untyped-def]
    shapes = real.sweep.shapes
    assert list(shapes["tokens"]) == [128, 256, 512, 1024]
    assert real.driver == "tokens"
    assert (shapes["transient_bytes"] == shapes["peak_bytes"] - shapes["baseline_bytes"]).all()
    assert shapes["transient_bytes"].is_monotonic_increasing


def test_real_sweep_attention_scores_grow_quadratically(real) -> None:  # type: ignore[no-untyped-def]
    fits = real.fits.set_index("target")
    for target in ("total", "attention_related", "fallback_kernel"):
        assert fits.loc[target, "model"] == "quadratic", target
        assert fits.loc[target, "max_rel_residual"] < 0.2
    fam = fits.loc["attention_related"]
    # 4 live score tensors of B·H·L² fp32 = 4 × 4·16·4 = 1,024 bytes per token² at the peak of L = 1024
    assert 700 < fam["quadratic_bytes"] < 1100
    assert fam["linear_bytes"] == 0
    assert fits.loc["fallback_kernel", "from_x"] == 256          # present from 256 tokens up
    # attention → fallback label is no jump; the one jump is the ctx512 run's autocast (only it ran under
    # autocast): a bf16 copy of the 10000 × 1024 lm_head weight appears
    assert real.jumps[["category", "how", "bytes_after", "from_x", "to_x"]].values.tolist() == [
        ["weights", "appears", 10000 * 1024 * 2, 256.0, 512.0]]
    cats = real.sweep.categories
    fam_rows = cats[cats["target"] == "attention_related"].set_index("label")["transient_bytes"]
    # 8× the length: the scores grow 64×, a q/k/v projection output live at the peak (attention, from the call
    # tree) 8×; together more than 50×
    assert fam_rows.iloc[-1] > 50 * fam_rows.iloc[0]


def test_real_sweep_categories_sum_to_the_peak(real) -> None:  # type: ignore[no-untyped-def]
    cats = real.sweep.categories
    per = cats[cats["kind"] == "category"].groupby("label")["peak_bytes"].sum()
    peaks = real.sweep.shapes.set_index("label")["peak_bytes"]
    assert (per.reindex(peaks.index) == peaks).all()


# -- planted sweeps ----------------------------------------------------------------------------------------

def test_threshold_sweep_finds_the_planted_jump(threshold) -> None:  # type: ignore[no-untyped-def]
    exp = _expected("attention_threshold")
    assert threshold.driver == exp["driver"]
    assert len(threshold.jumps) == 1
    j = threshold.jumps.iloc[0]
    assert (j["from_x"], j["to_x"]) == (exp["jump"]["from_tokens"], exp["jump"]["to_tokens"])
    assert (j["category"], j["how"]) == (exp["jump"]["category"], exp["jump"]["how"])
    assert "total" in j["targets"] and "attention_related" in j["targets"]
    regimes = threshold.regimes["total"]
    assert [r[2].model for r in regimes] == [exp["total_model_below"], exp["total_model_above"]]
    assert regimes[1][0] == exp["jump"]["to_tokens"]


def test_threshold_sweep_matches_the_construction(threshold) -> None:  # type: ignore[no-untyped-def]
    exp = _expected("attention_threshold")["files"]
    shapes = threshold.sweep.shapes.set_index("label")
    cats = threshold.sweep.categories
    for name, e in exp.items():
        assert shapes.loc[name, "peak_bytes"] == e["peak_active_bytes"]
        assert shapes.loc[name, "transient_bytes"] == e["transient_bytes"]
        mine = cats[(cats["label"] == name) & (cats["kind"] == "category")].set_index("target")["transient_bytes"]
        assert mine.get("fallback_kernel", 0) == e["category_transient_high_water"].get("fallback_kernel", 0)


def test_threshold_sweep_from_record_function_names_matches_the_file_names(threshold) -> None:  # type: ignore[no-untyped-def]
    by_span = capacity([str(p) for p in THRESHOLD], shape_from="markers")
    assert list(by_span.sweep.shapes["tokens"]) == list(threshold.sweep.shapes["tokens"])
    assert list(by_span.sweep.shapes["transient_bytes"]) == list(threshold.sweep.shapes["transient_bytes"])
    assert list(by_span.jumps["category"]) == ["fallback_kernel"]


def test_chunked_prefill_follows_the_chunk(chunked) -> None:  # type: ignore[no-untyped-def]
    exp = _expected("chunked_prefill")
    assert chunked.driver == "chunk"
    drivers = chunked.drivers.set_index("driver")
    assert drivers.loc["tokens", "max_rel_residual"] > 0.5 > drivers.loc["chunk", "max_rel_residual"]
    total = chunked.fits.set_index("target").loc["total"]
    assert total["model"] == exp["model"] and total["max_rel_residual"] < 0.01
    by_chunk = chunked.sweep.shapes.groupby("chunk")["transient_bytes"].agg(["min", "max"])
    for chunk, expected in exp["transient_by_chunk"].items():
        assert by_chunk.loc[int(chunk)].tolist() == [expected, expected]   # whatever the prompt
    assert len(chunked.jumps) == 0
    assert any("chunk" in n for n in chunked.notes)


def test_chunk_contract_solves_for_the_chunk_that_fits(chunked) -> None:  # type: ignore[no-untyped-def]
    exp = _expected("chunked_prefill")["transient_by_chunk"]
    contract = capacity_contract(chunked, transient_budget_bytes=exp["4096"], margin=0.0, concurrency=(1,))
    assert contract.driver == "chunk"
    assert 4090 <= contract.limits[0].max_x <= 4096
    contract = capacity_contract(chunked, transient_budget_bytes=exp["4096"] - MiB, margin=0.0, concurrency=(1,))
    assert contract.limits[0].max_x < 4096


def test_markers_sweep_takes_shapes_from_phase_attrs() -> None:
    exp = _expected("phase_markers")
    cap = capacity([str(SWEEPS / "phase_markers" / "run")], shape_from="markers")
    shapes = cap.sweep.shapes
    assert list(shapes["phase"]) == [p["phase"] for p in exp["phases"]]          # decode phases have no shape
    assert list(shapes["tokens"]) == [p["tokens"] for p in exp["phases"]]
    assert list(shapes["transient_bytes"]) == [p["transient_bytes"] for p in exp["phases"]]
    assert list(shapes["baseline_bytes"]) == [p["baseline_active_bytes"] for p in exp["phases"]]
    fits = cap.fits.set_index("target")
    assert fits.loc["total", "model"] == exp["model"]
    top = max((t for t in fits.index if fits.loc[t, "kind"] == "category"),
              key=lambda t: cap.points[t].max())
    assert top == exp["top_category"]
    assert fits.loc["logits", "linear_bytes"] == pytest.approx(exp["logits_bytes_per_token"], rel=1e-3)


# -- contracts ------------------------------------------------------------------------------------------------

def test_contract_trusts_a_regime_below_a_jump_only_up_to_its_last_shape(threshold) -> None:  # type: ignore[no-untyped-def]
    baseline = int(threshold.sweep.shapes["baseline_bytes"].max())
    tight = capacity_contract(threshold, budget_bytes=baseline + (1 << 30), concurrency=(1,))
    assert tight.limits[0].max_x == 4096 and not tight.limits[0].extrapolated
    roomy = capacity_contract(threshold, budget_bytes=80 << 30, concurrency=(1, 2))
    first = roomy.limits[0]
    assert first.max_x > 8192 and first.extrapolated
    fit = threshold.fit("total")
    assert fit.predict(first.max_x, first.max_x ** 2) * (1 + roomy.margin) <= roomy.transient_budget_bytes
    assert roomy.limits[1].max_x < first.max_x and roomy.limits[1].max_total > first.max_total
    assert any("jumps between tokens 4096 and 5120" in n for n in roomy.notes)


def test_contract_reserve_and_observed_points(threshold) -> None:  # type: ignore[no-untyped-def]
    shapes = threshold.sweep.shapes
    budget = int(shapes["peak_bytes"].iloc[-2]) + 1                # the 6144-token peak fits, 8192 does not
    contract = capacity_contract(threshold, budget_bytes=budget)
    assert [o.fits for o in contract.observed] == [True] * 6 + [False]
    r = contract.reserve
    assert r.x == 8192 and r.measured_bytes == int(shapes["transient_bytes"].iloc[-1])
    assert r.reserve_bytes >= r.measured_bytes and not r.fits


def test_contract_when_the_baseline_alone_is_over_budget(threshold) -> None:  # type: ignore[no-untyped-def]
    contract = capacity_contract(threshold, budget_bytes=1 << 30)
    assert contract.limits == () and "already exceeds" in contract.notes[0]
    with pytest.raises(UsageError):
        capacity_contract(threshold)


def test_forced_driver_must_vary(threshold) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError, match="driver 'chunk'"):
        fit_capacity(threshold.sweep, driver="chunk")


def test_measure_one_device_only_when_asked() -> None:
    points = sweep_points([str(p) for p in REAL[:2]])
    with pytest.raises(UsageError, match="no device 1"):
        measure_sweep(points, device=1)


def test_capacity_figure_is_built_not_shown(threshold) -> None:  # type: ignore[no-untyped-def]
    contract = capacity_contract(threshold, budget_bytes=80 << 30)
    fig = capacity_figure(threshold, contract)
    assert isinstance(fig, go.Figure)
    names = [t.name for t in fig.data]
    assert "total transient" in names and "fallback_kernel" in names
    assert any("extrapolated" in n for n in names)
    assert any("jump: fallback_kernel" in (a.text or "") for a in fig.layout.annotations)
    assert fig.to_json() == capacity_figure(threshold, contract).to_json()     # deterministic


def _synthetic(rows: list[dict[str, object]], cats: list[dict[str, object]]) -> Sweep:
    shapes = pd.DataFrame(rows)
    for k in ("tokens", "batch", "chunk", "images"):
        shapes[k] = shapes[k].astype("Int64") if k in shapes else pd.array([pd.NA] * len(shapes), dtype="Int64")
    return Sweep(points=(), shapes=shapes, categories=pd.DataFrame(cats, columns=CATEGORY_COLUMNS))


def test_tokens_times_concurrency_from_a_batch_sweep() -> None:
    rows, cats = [], []
    for L in (1024, 2048, 4096):
        for b in (1, 2, 4):
            y = 1_000_000 + 1000 * b * L + 10 * b * L * L
            label = f"L{L}-b{b}"
            rows.append({"label": label, "tokens": L, "batch": b, "baseline_bytes": 10 << 30,
                         "peak_bytes": (10 << 30) + y, "transient_bytes": y})
            cats.append({"label": label, "target": "mlp", "kind": "category", "baseline_bytes": 0,
                         "peak_bytes": y, "transient_bytes": y, "max_bytes": y})
    cap = fit_capacity(_synthetic(rows, cats))
    f = cap.fit()
    assert cap.driver == "tokens" and f.model == "quadratic" and len(cap.jumps) == 0
    assert (f.intercept, f.linear, f.quadratic) == pytest.approx((1e6, 1000, 10), rel=1e-6)
    budget = (10 << 30) + (512 << 20)
    contract = capacity_contract(cap, budget_bytes=budget, margin=0.0, concurrency=(1, 4, 8))
    limits = {lim.concurrency: lim for lim in contract.limits}
    for c, lim in limits.items():
        x = lim.max_x
        assert f.predict(c * x, c * x * x) <= 512 << 20 < f.predict(c * (x + 1), c * (x + 1) ** 2)
        assert lim.max_total == c * x and not lim.bounded
    assert limits[1].max_x > 4096 and limits[1].extrapolated     # past the largest measured length
    assert limits[4].max_x < 4096 and not limits[4].extrapolated  # measured lengths and concurrency
    assert limits[8].extrapolated                              # concurrency 8 was never measured
    # 4 GiB would let the model go past 2× the measured shapes: the answers stop there, labelled
    roomy = capacity_contract(cap, budget_bytes=(10 << 30) + (4 << 30), margin=0.0, concurrency=(1, 8))
    one, eight = roomy.limits
    assert (one.max_x, one.bounded, one.extrapolated) == (8192, True, True)          # 2 × 4096 per sequence
    assert (eight.max_total, eight.bounded) == (32768, True)                        # 2 × 4 × 4096 in all
    assert any("answers stop at 2× the largest measured shape" in n for n in roomy.notes)


def test_a_category_taking_over_its_family_is_no_jump_but_appearing_alone_is() -> None:
    rows, cats = [], []
    for L in (1024, 2048, 4096, 8192):
        y = 100 * L * L
        rows.append({"label": f"L{L}", "tokens": L, "baseline_bytes": 0, "peak_bytes": y + 64 * L * 1024,
                     "transient_bytes": y + 64 * L * 1024})
        label = "attention" if L < 4096 else "fallback_kernel"
        for target, kind, v in ((label, "category", y), ("attention_related", "family", y),
                                ("mlp", "category", 64 * L * 1024)):
            cats.append({"label": f"L{L}", "target": target, "kind": kind, "baseline_bytes": 0, "peak_bytes": v,
                         "transient_bytes": v, "max_bytes": v})
    assert len(fit_capacity(_synthetic(rows, cats)).jumps) == 0
    # the same fallback appearing from nothing, its family with it, is a jump
    for c in cats:
        if c["target"] in ("attention", "attention_related") and c["label"] in ("L1024", "L2048"):
            c["transient_bytes"] = 0
    for r in rows[:2]:
        r["transient_bytes"] = r["peak_bytes"] = 64 * int(str(r["label"])[1:]) * 1024
    jumps = fit_capacity(_synthetic(rows, cats)).jumps
    assert list(jumps["category"]) == ["fallback_kernel"] and list(jumps["how"]) == ["appears"]
    assert (jumps.iloc[0]["from_x"], jumps.iloc[0]["to_x"]) == (2048, 4096)


# -- never extrapolate silently ------------------------------------------------------------------------------

def _tokens_sweep(transients: dict[int, int], cats: dict[str, dict[int, int]] | None = None) -> Sweep:
    """A synthetic sweep over prompt tokens: total transient per length, optional category transients."""
    rows = [{"label": f"L{L}", "source": f"L{L}.pickle", "phase": None, "device": 0, "tokens": L,
             "peak_event_index": 1, "baseline_bytes": 1 << 30, "peak_bytes": (1 << 30) + y, "transient_bytes": y,
             "reserved_bytes": (1 << 30) + y, "max_reserved_bytes": (1 << 30) + y} for L, y in transients.items()]
    per = cats or {"mlp": transients}
    crows = [{"label": f"L{L}", "target": name, "kind": "category", "baseline_bytes": 0, "peak_bytes": y,
              "transient_bytes": y, "max_bytes": y} for name, ys in per.items() for L, y in ys.items()]
    return _synthetic(rows, crows)


def test_threshold_contract_answers_stop_at_twice_the_measured_shapes(threshold) -> None:  # type: ignore[no-untyped-def]
    contract = capacity_contract(threshold, budget_bytes=80 << 30)
    answered = [lim for lim in contract.limits if lim.max_x is not None]
    assert answered and all(lim.max_x <= 2 * 8192 and lim.max_total <= 2 * 8192 for lim in answered)
    assert all(lim.extrapolated for lim in answered if lim.max_x > 8192 or lim.max_total > 8192)
    bounded = {lim.concurrency: lim.max_x for lim in answered if lim.bounded}
    assert bounded[2] == 8192 and bounded[64] == 256              # 2 × 8192 tokens across the sequences
    assert not answered[0].bounded and 8192 < answered[0].max_x < 16384   # the budget binds first at 1
    text = render_capacity(capacity_result(threshold, contract))
    assert "8,192 (bound: 2× measured)" in text and "15,8" in text and "(extrapolated)" in text
    assert "answers stop at 2× the largest measured shape (tokens 8192" in text


def test_a_two_shape_sweep_is_insufficient_data_even_with_a_zero_residual() -> None:
    cap = fit_capacity(_tokens_sweep({1024: 128 * 1024 ** 2, 2048: 128 * 2048 ** 2}))   # exactly quadratic
    assert fit_bytes([1024.0, 2048], [1024.0 ** 2, 2048 ** 2], [128 * 1024 ** 2, 128 * 2048 ** 2]
                     ).max_rel_residual < 1e-12                    # a one-term fit would claim 0 %
    fits = cap.fits.set_index("target")
    assert set(fits["model"]) == {"insufficient"}
    assert fits[["intercept_bytes", "linear_bytes", "quadratic_bytes", "max_rel_residual"]].isna().all().all()
    contract = capacity_contract(cap, budget_bytes=80 << 30)
    assert len(contract.limits) == 1 and contract.limits[0].insufficient and contract.limits[0].max_x is None
    assert contract.margin == 0.0 and any(n.startswith("insufficient data") for n in contract.notes)
    r = contract.reserve                                           # the measured shape still sizes the reserve
    assert r.predicted_bytes is None and r.measured_bytes == 128 * 2048 ** 2 == r.reserve_bytes and r.fits
    result = capacity_result(cap, contract)
    doc = result.to_json()
    json.dumps(doc, allow_nan=False)                               # no NaN / Infinity in the JSON
    assert doc["fits"][0]["quadratic_bytes"] is None and doc["fits"][0]["model"] == "insufficient"
    text = render_capacity(result)
    assert "insufficient data" in text and "0.0%" not in text.split("jumps")[0].split("fits")[-1]
    assert capacity_contract(cap, transient_budget_bytes=1 << 30, target_x=1536).reserve.reserve_bytes is None


def test_a_negative_transient_is_insufficient_data() -> None:
    cap = fit_capacity(_tokens_sweep({1024: -(1 << 20), 2048: 2 << 20, 4096: 4 << 20}))
    assert cap.fit().model == "insufficient" and np.isnan(cap.fit().predict(1024, 1024 ** 2))


def test_a_jump_at_the_last_shape_leaves_a_regime_too_small_to_fit() -> None:
    lengths = (1024, 2048, 4096, 8192)
    ys = {L: 1000 * L for L in lengths[:3]} | {8192: 1000 * 8192 + (8 << 30)}
    cap = fit_capacity(_tokens_sweep(ys, {"mlp": {L: 1000 * L for L in lengths},
                                          "fallback_kernel": {8192: 8 << 30}}))
    below, above = cap.regimes["total"]
    assert below[2].model == "linear" and above[2].model == "insufficient" and above[0] == 8192
    contract = capacity_contract(cap, budget_bytes=80 << 30, concurrency=(1,))
    lim = contract.limits[0]
    assert lim.max_x == 4096 and not lim.bounded                     # the last shape below the jump, no further
    assert any("fewer than 3 to fit" in n for n in contract.notes)
    assert contract.reserve.measured_bytes == ys[8192]              # measured: no model needed


def test_a_reserve_target_is_bounded_and_labelled() -> None:
    cap = fit_capacity(_tokens_sweep({L: 1000 * L for L in (1024, 2048, 4096)}))
    with pytest.raises(UsageError, match="outside 0 … 2× the largest measured shape"):
        capacity_contract(cap, budget_bytes=80 << 30, target_x=8193)
    far = capacity_contract(cap, budget_bytes=80 << 30, target_x=8192)
    r = far.reserve
    assert r.extrapolated and r.predicted_bytes == 1000 * 8192 and r.measured_bytes is None
    assert any("modelled, not measured (beyond the measured shapes)" in n for n in far.notes)
    near = capacity_contract(cap, budget_bytes=80 << 30)
    assert not near.reserve.extrapolated and near.reserve.measured_bytes == 1000 * 4096


def test_fits_spell_their_units_per_token() -> None:
    cap = fit_capacity(_tokens_sweep({L: 331 * L * L for L in (1024, 2048, 4096)},
                                     {"attention": {L: 331 * L * L for L in (1024, 2048, 4096)},
                                      "kv_cache": {L: 32768 * L for L in (1024, 2048, 4096)}}))
    text = render_capacity(capacity_result(cap))
    assert "331 bytes/token²" in text and "32.00 KiB/token" in text
    assert "/tokens" not in text and " B/" not in text


def test_capacity_figure_draws_measured_fits_solid_and_stops_at_the_bound(threshold) -> None:  # type: ignore[no-untyped-def]
    contract = capacity_contract(threshold, budget_bytes=80 << 30)
    fig = capacity_figure(threshold, contract)
    solid = [t for t in fig.data if t.mode == "lines" and t.line.dash == "solid"]
    dashed = [t for t in fig.data if t.mode == "lines" and t.line.dash == "dash"]
    assert solid and max(float(np.max(t.x)) for t in solid) == 8192      # fits over the measured shapes only
    assert len(dashed) == 1 and "extrapolated" in dashed[0].name
    assert float(np.min(dashed[0].x)) == 8192 and float(np.max(dashed[0].x)) <= 2 * 8192
    assert any("beyond the measured shapes" in (a.text or "") for a in fig.layout.annotations)
    two = fit_capacity(_tokens_sweep({1024: 1 << 20, 2048: 4 << 20}))
    fig = capacity_figure(two)
    assert not [t for t in fig.data if t.mode == "lines"]
    assert any("insufficient data to fit" in (t.name or "") for t in fig.data)


def test_a_transient_that_never_reaches_the_budget_stops_at_the_bound() -> None:
    cap = fit_capacity(_tokens_sweep({L: 64 << 20 for L in (1024, 2048, 4096)},
                                     {"workspace": {L: 64 << 20 for L in (1024, 2048, 4096)}}))
    assert cap.fit().model == "constant"
    [lim] = capacity_contract(cap, budget_bytes=80 << 30, concurrency=(1,)).limits
    assert (lim.max_x, lim.unbounded, lim.bounded, lim.extrapolated) == (8192, True, True, True)
    text = render_capacity(capacity_result(cap, capacity_contract(cap, budget_bytes=80 << 30, concurrency=(1,))))
    assert "8,192 (bound: 2× measured, model never reaches the budget)" in text


def test_the_bound_is_worded_one_way_in_every_output() -> None:
    """A contract's answer capped at 2× the measured shapes reads "bound: 2× measured" in the capacity table, the
    budget's terminal and JSON explanations alike: the wording comes from one place, and no renderer spells it."""
    import dataclasses

    import snapanalyze
    from snapanalyze.analyze.capacity import ContractLimit
    from snapanalyze.report import compare_terminal, text

    assert text.bound_label() == "bound: 2× measured"
    capped = ContractLimit(concurrency=1, max_x=8192, max_total=8192, predicted_bytes=1 << 30, extrapolated=False,
                           unbounded=False, bounded=True)
    assert compare_terminal._limit(capped, "tokens") == "8,192 (bound: 2× measured)"
    assert compare_terminal._limit(dataclasses.replace(capped, max_x=None), "tokens") == \
        "beyond the measured tokens (bound: 2× measured)"
    report = Path(snapanalyze.__file__).parent / "report"
    assert [p.name for p in sorted(report.rglob("*.py")) if p.name != "text.py" and "2×" in p.read_text()] == []
