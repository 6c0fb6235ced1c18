"""Module spans from real forward (and backward) hooks on CPU torch: paths, classes, nesting, removal,
no-ops outside a recording, and `record(..., modules=model)`."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from tinylm import TinyLM, torch

from snapanalyze.collect import markers, modules, record
from snapanalyze.collect.markers import MarkerLog
from snapanalyze.collect.testing import FakeClock, fake_backends
from snapanalyze.load.samples import read_markers


@pytest.fixture
def log() -> Iterator[MarkerLog]:
    log = MarkerLog(rank=0, clock_us=FakeClock(step_us=10))
    markers.set_active(log)
    yield log
    markers.set_active(None)


def test_every_module_call_is_a_closed_span_with_its_path_and_class(log: MarkerLog) -> None:
    model = TinyLM()
    with modules(model):
        model(torch.randint(0, 128, (2, 8)))
    spans = log.markers()
    assert all(m.kind == "module" and m.end_time_us is not None for m in spans)
    by_name = {m.name: m for m in spans}
    assert len(spans) == len(list(model.named_modules())) - 1       # the ModuleList itself is never called
    q = by_name["model.layers.1.self_attn.q_proj"]
    attn, layer = by_name["model.layers.1.self_attn"], by_name["model.layers.1"]
    assert json.loads(q.attrs) == {"class": "Linear"} and json.loads(attn.attrs) == {"class": "Attention"}
    assert layer.start_time_us < attn.start_time_us < q.start_time_us < q.end_time_us < attn.end_time_us
    assert (by_name["model"].depth, layer.depth, attn.depth, q.depth) == (0, 1, 2, 3)


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")     # the embedding's inputs are ids
def test_backward_spans_are_opt_in_and_say_so(log: MarkerLog) -> None:
    model = TinyLM()
    with modules(model, backward=True):
        model(torch.randint(0, 128, (2, 8))).sum().backward()
    backward = [m for m in log.markers() if json.loads(m.attrs).get("pass") == "backward"]
    assert {"model.lm_head", "model.layers.0.mlp.down_proj"} <= {m.name for m in backward}
    assert all(m.end_time_us is not None for m in backward)


def test_max_depth_leaves_out_the_leaves(log: MarkerLog) -> None:
    model = TinyLM()
    with modules(model, max_depth=3):
        model(torch.randint(0, 128, (2, 8)))
    names = {m.name for m in log.markers()}
    assert "model.layers.0.mlp" in names and "model.layers.0.mlp.down_proj" not in names


def test_hooks_are_removed_and_are_no_ops_outside_a_recording(log: MarkerLog) -> None:
    model = TinyLM()
    hooks = modules(model)
    hooks.remove()
    model(torch.randint(0, 128, (2, 8)))
    assert log.markers() == []
    markers.set_active(None)
    with modules(model):
        model(torch.randint(0, 128, (2, 8)))       # no recording: nothing to write, nothing fails
    with pytest.raises(TypeError, match="torch.nn.Module"):
        modules(object())


def test_calls_that_raised_are_closed_by_the_enclosing_one(log: MarkerLog) -> None:
    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = TinyLM()
            self.inner.layers[0].mlp.forward = self._boom     # type: ignore[method-assign]

        def _boom(self, x):  # type: ignore[no-untyped-def]
            raise ValueError("boom")

        def forward(self, ids):  # type: ignore[no-untyped-def]
            try:
                return self.inner(ids)
            except ValueError:
                return None

    outer = Outer()
    with modules(outer):
        outer(torch.randint(0, 128, (2, 8)))
    spans = {m.name: m for m in log.markers()}
    assert {"model.inner", "model.inner.layers.0", "model.inner.layers.0.mlp"} <= set(spans)
    assert all(m.end_time_us is not None for m in spans.values())     # the raised ones closed with "model"
    assert spans["model.inner.layers.0.mlp"].end_time_us <= spans["model"].end_time_us


def test_record_registers_the_hooks_for_the_recording_and_removes_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = TinyLM()
    with record(tmp_path / "run", modules=model, _backends=fake_backends()):
        model(torch.randint(0, 128, (2, 8)))
    assert all(not m._forward_pre_hooks for m in model.modules())
    found = read_markers(tmp_path / "run" / "rank=0", 0)
    mods = found[found["kind"] == "module"]
    assert "model.layers.0.mlp.gate_proj" in set(mods["name"])
    assert set(mods["attrs"].map(lambda a: a["class"])) >= {"Linear", "MLP", "Attention", "TinyLM"}
