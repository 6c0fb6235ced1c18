"""Module spans decide what frames cannot: an allocation made inside `model.layers.0.mlp.down_proj` is MLP,
inside `self_attn` attention, inside `lm_head` logits; a norm or residual in a decoder layer is nobody's
named module. Spans from real hooks (CPU torch) over a tiny Llama-shaped model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import BASE, SnapshotBuilder, write_pickle
from tinylm import TinyLM, torch

from snapanalyze import attribute, load
from snapanalyze.analyze.modules import ModuleIndex
from snapanalyze.collect import markers, modules
from snapanalyze.collect.markers import MarkerLog
from snapanalyze.collect.testing import FakeClock
from snapanalyze.load.samples import _markers_frame
from snapanalyze.session import load_rules

T0 = 1_770_000_000_000_000
MiB = 1 << 20


@pytest.fixture(scope="module")
def spans() -> pd.DataFrame:
    """The module markers of one forward, 100 µs per clock reading, as `load.samples` reads them."""
    log = MarkerLog(rank=0, clock_us=FakeClock(start_us=T0, step_us=100))
    markers.set_active(log)
    try:
        model = TinyLM()
        with modules(model):
            model(torch.randint(0, 128, (2, 8)))
    finally:
        markers.set_active(None)
    return _markers_frame(log.table(), 0, 0)


def _inside(spans: pd.DataFrame, name: str) -> int:
    """A time inside the span `name` and inside none of its children (just after it opened)."""
    row = spans[spans["name"] == name].iloc[0]
    return int(row["start_time_us"]) + 1


WHERE = {"model.layers.0.self_attn.q_proj": "attention", "model.layers.1.self_attn": "attention",
         "model.layers.0.mlp.down_proj": "mlp", "model.layers.1.mlp.act_fn": "mlp", "model.lm_head": "logits",
         "model.layers.0.post_attention_layernorm": None, "model.layers.1": None, "model.embed_tokens": None}


def test_the_innermost_span_names_the_module(spans: pd.DataFrame) -> None:
    index = ModuleIndex.of(spans)
    times = np.array([_inside(spans, name) for name in WHERE])
    got = [d.category if d else None for d in index.decide(times, load_rules())]
    assert got == list(WHERE.values())
    mlp = index.decide(np.array([_inside(spans, "model.layers.0.mlp.down_proj")]), load_rules())[0]
    assert mlp is not None and "model.layers.0.mlp.down_proj (Linear)" in mlp.reason
    assert index.classes[list(index.paths).index("model.layers.0.mlp.down_proj")] == \
        "TinyLM.Block.MLP.Linear"


def test_spans_of_two_threads_at_once_decide_nothing(spans: pd.DataFrame) -> None:
    other = spans.copy()
    other["thread_id"] = other["thread_id"] + 1
    both = pd.concat([spans, other], ignore_index=True)
    index = ModuleIndex.of(both)
    assert index.decide(np.array([_inside(spans, "model.lm_head")]), load_rules()) == [None]


def test_attribution_labels_frameless_allocations_by_their_module(tmp_path, spans: pd.DataFrame) -> None:  # type: ignore[no-untyped-def]
    names = sorted(WHERE, key=lambda name: _inside(spans, name))    # a trace runs forward in time
    b = SnapshotBuilder(frames=False)
    b.segment(BASE, [(MiB, MiB, "active_allocated") for _ in names] + [(MiB, 0, "inactive")])
    for k, name in enumerate(names):
        b.alloc(BASE + k * MiB, MiB, time_us=_inside(spans, name))
    snap = load(write_pickle(tmp_path / "modules.pickle", b.build()))
    blocks = attribute(snap, at=f"event:{len(names) - 1}", markers=spans).blocks.sort_values("address")
    assert blocks["category"].tolist() == [WHERE[name] or "other" for name in names]
    named = blocks[blocks["category"] != "other"]
    assert (named["rule"] == "signal.module_span").all() and named["inferred"].all()
    without = attribute(snap, at=f"event:{len(names) - 1}").blocks
    assert set(without["category"]) == {"other"}
    (tmp_path / "off.toml").write_text('disable = ["stage.module_spans"]\n')      # the stage switched off
    off = attribute(snap, at=f"event:{len(names) - 1}", markers=spans, rules=load_rules(tmp_path / "off.toml"))
    assert set(off.blocks["category"]) == {"other"}
