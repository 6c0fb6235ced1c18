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
from snapanalyze.analyze.capacity import capacity_contract, fit_bytes, fit_capacity
from snapanalyze.analyze.sweep import CATEGORY_COLUMNS, Sweep, category_levels, label_window, measure_sweep
from snapanalyze.errors import BadInputError, UsageError
from snapanalyze.load.shapes import read_manifest, shape_from_filename
from snapanalyze.plots_capacity import capacity_figure
from snapanalyze.replay import replay
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
    with pytest.raises(UsageError, match="expected filename, markers or a manifest"):
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
    assert fam_rows.iloc[-1] > 60 * fam_rows.iloc[0]              # 8× the length, 64× the bytes


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
    budget = (10 << 30) + (4 << 30)
    contract = capacity_contract(cap, budget_bytes=budget, margin=0.0, concurrency=(1, 4, 8))
    limits = {lim.concurrency: lim for lim in contract.limits}
    for c, lim in limits.items():
        x = lim.max_x
        assert f.predict(c * x, c * x * x) <= 4 << 30 < f.predict(c * (x + 1), c * (x + 1) ** 2)
        assert lim.max_total == c * x
    assert not limits[4].extrapolated or limits[4].max_x > 4096
    assert limits[8].extrapolated                              # concurrency 8 was never measured


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
