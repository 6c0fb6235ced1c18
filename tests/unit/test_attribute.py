"""Attribution: categories sum exactly to the instant's active bytes, decisions follow the precedence,
and the real corpus files come out the way a person reading their stacks would label them."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import BASE, REAL_FILES, SnapshotBuilder, write_pickle

from snapanalyze import UsageError, attribute, find_peaks, load, replay, top_sites
from snapanalyze.analyze.attribute import BLOCK_COLUMNS, STAGES
from snapanalyze.analyze.attribute.frames import FRAME_STAGES
from snapanalyze.analyze.attribute.shapes import shape_logits, shape_scores, vocab_hints
from snapanalyze.analyze.rules import STAGES as NAMED_STAGES
from snapanalyze.session import load_rules

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "real"
SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"
MiB = 1 << 20


@pytest.mark.parametrize("path", sorted(REAL.glob("*.pickle")), ids=lambda p: p.name)
def test_categories_sum_exactly_to_active_bytes_at_every_peak(path):
    snap = load(path)
    timeline = replay(snap)
    for device in timeline.devices:
        for at in ("peak", "event:-1", f"event:{len(timeline[device]) - 1}"):
            result = attribute(snap, at=at, timeline=timeline, device=device)
            instant = result.instants[device]
            assert int(result.blocks["size"].sum()) == instant.active_bytes
            assert int(result.summary["bytes"].sum()) == instant.active_bytes
            assert result.summary["share"].sum() == pytest.approx(1.0 if instant.active_bytes else 0.0)


@pytest.mark.parametrize("ctx", [512, 1024])
def test_cs336_eager_score_tensors_are_attention_related(ctx):
    snap = load(REAL / f"cs336-medium-ctx{ctx}-inference-t2.11.pickle")
    blocks = attribute(snap).blocks
    # B·H·L·L fp32 score tensors: batch 4 × 16 heads × L² × 4 bytes
    scores = blocks[blocks["size"] == 4 * 16 * ctx * ctx * 4]
    assert len(scores) >= 2
    assert set(scores["category"]) <= {"fallback_kernel", "attention"}
    assert "fallback_kernel" in set(scores["category"])
    flagged = scores[scores["category"] == "fallback_kernel"]
    assert flagged["inferred"].all() and (flagged["rule"] == "shape.attention_scores").all()
    assert flagged["frame"].str.contains("scaled_dot_product_attention|softmax").all()


def test_short_context_scores_are_not_guessed_as_fallback():
    snap = load(REAL / "cs336-medium-ctx128-inference-t2.11.pickle")
    blocks = attribute(snap).blocks
    assert "shape.attention_scores" not in set(blocks["rule"])


def test_vllm_pools_holding_kv_and_weights_are_not_called_graph_capture():
    """verl runs vLLM with MemPool-backed sleep mode: frames prove KV cache and weights in pools (0,1)/(0,2)."""
    result = attribute(load(REAL / "verl-vllm-graph-pools-state-only.pickle"))
    by = result.summary.set_index("category")["bytes"]
    assert by["kv_cache"] > 20 * 2**30
    kv = result.blocks[result.blocks["category"] == "kv_cache"]
    assert set(kv["pool"]) <= {"0,1", "0,2", "0,0"} and (kv["pool"] != "0,0").any()
    assert kv[kv["pool"] != "0,0"]["tags"].str.contains("private_pool").all()
    assert "workspace" in by.index  # cuBLAS workspace from at::cuda::getNewWorkspace()


def test_persistent_blocks_without_frames_are_weights_inferred_with_the_fix():
    """Inference: what is live before the window, never freed and without a stack, and whose sizes repeat as a
    model's layers do, is the model's state (flagged inferred, the reason says why and how to record it); the
    cuBLAS-sized one is the workspace."""
    result = attribute(load(REAL / "cs336-medium-ctx1024-inference-t2.11.pickle"))
    before = result.blocks[result.blocks["origin"] == "before window, live throughout"]
    assert int(before["size"].sum()) == result.instants[0].baseline_active_bytes
    assert before["inferred"].all() and set(before["category"]) == {"weights", "workspace"}
    weights = before[before["category"] == "weights"]
    assert (weights["rule"] == "state.layers").all()
    assert weights.iloc[0]["reason"].count("repeat as a model's layers do") == 1
    assert "_record_memory_history before the model is built" in weights.iloc[0]["reason"]
    assert before.loc[before["category"] == "workspace", "size"].tolist() == [8519680]


def test_blocks_freed_by_the_optimizer_are_its_state_and_others_are_named_unknown():
    replaced = attribute(load(REAL / "cs336-step-annotations-t2.10.pickle"))
    freed = replaced.blocks[replaced.blocks["rule"] == "state.freed_by_optimizer"]
    assert len(freed) > 100 and (freed["category"] == "optimizer_state").all() and freed["inferred"].all()
    assert freed["reason"].str.contains("optimizer.py").mean() > 0.9
    unknown = attribute(load(REAL / "cs336-step-user-metadata-t2.11.pickle")).blocks
    unknown = unknown[unknown["rule"] == "unknown.before_window"]
    assert len(unknown) == 1 and unknown.iloc[0]["category"] == "other"
    assert "freed at" in unknown.iloc[0]["reason"] and "benchmarking_script.py" in unknown.iloc[0]["reason"]
    assert "_record_memory_history" in unknown.iloc[0]["reason"]


def test_instants_peak_n_event_and_time():
    snap = load(REAL / "cs336-medium-ctx1024-training-t2.11.pickle")
    timeline = replay(snap)
    peaks = find_peaks(timeline, top=3)
    second = attribute(snap, at="peak:2", timeline=timeline).instants[0]
    assert second.event_index == int(peaks.iloc[1]["event_index"])
    assert second.active_bytes == int(peaks.iloc[1]["active_bytes"])
    t = int(timeline[0].time_us[100])
    at_time = attribute(snap, at=f"time:{t}", timeline=timeline).instants[0]
    assert at_time.event_index >= 100 and int(timeline[0].time_us[at_time.event_index]) == t
    with pytest.raises(UsageError, match="expected peak"):
        attribute(snap, at="noon", timeline=timeline)
    with pytest.raises(UsageError, match="events 0"):
        attribute(snap, at="event:99999999", timeline=timeline)


def test_top_sites_by_frame_and_stack():
    result = attribute(load(REAL / "cs336-medium-ctx1024-training-t2.11.pickle"))
    by_frame = top_sites(result, by="frame", top=5)
    assert list(by_frame.columns) == ["device", "site", "category", "bytes", "blocks", "share"]
    assert by_frame["bytes"].is_monotonic_decreasing
    assert len(by_frame) == 5
    by_stack = top_sites(result, by="stack", category="fallback_kernel")
    assert set(by_stack["category"]) == {"fallback_kernel"}
    assert by_stack["bytes"].sum() == result.summary.set_index("category").loc["fallback_kernel", "bytes"]


def test_a_vocabulary_counts_only_where_a_norm_weight_proves_its_hidden_size():
    llama2 = 32000 * 4096 * 2                    # also 64000 × 2048, 128000 × 1024 and 256000 × 512 × 2 bytes
    # (32000 × 2048 × 4 B is the same product, with a norm of the same bytes: the same vocabulary)
    assert vocab_hints(np.array([llama2, 4096 * 2, 4096 * 4096 * 2])) == {(32000, 4096), (32000, 2048)}
    assert vocab_hints(np.array([llama2, 4096 * 4096 * 2])) == frozenset()      # no norm weight: unproven
    # A 2.7B model with a 10,000-token vocabulary: its largest weight is an MLP's (10240 × 2560 × 4 B), which
    # fits 102,400 × 512 × 2 B by coincidence; its norm weights (2560 × 4 B) do not back that up.
    assert vocab_hints(np.array([10240 * 2560 * 4, 10000 * 2560 * 4, 2560 * 4])) == frozenset()
    assert vocab_hints(np.array([], dtype=np.int64)) == frozenset()


def test_logits_by_size_need_the_hidden_states_of_as_many_tokens():
    """TinyLlama (vocab 32000, hidden 2048, MLP 5632) over 1000 tokens: its logits, 1000 × 32000 × 4 B, come
    with 1000 tokens' hidden states; an MLP activation of 1000 × 5632 × 4 B is 176 × 32000 × 4 B, but nothing
    made 176 tokens' hidden states."""
    hints = vocab_hints(np.array([32000 * 2048 * 2, 2048 * 2]))
    made = {1000 * 2048 * 2, 1000 * 5632 * 4, 1000 * 32000 * 4}
    assert shape_logits(1000 * 32000 * 4, hints, lambda: made) == (1000, 32000, 4)
    assert shape_logits(1000 * 5632 * 4, hints, lambda: made) is None


def test_shape_heuristics():
    size = 8000 * 128256 * 4                            # also 4008 × 256000 × 4 and 32064 × 32000 × 4
    made = {8000 * 4096 * 2}                            # 8000 tokens' hidden states
    assert shape_logits(size, frozenset(), lambda: made) is None     # no live vocabulary weight: no guess
    hints = vocab_hints(np.array([128256 * 4096 * 2, 4096 * 2]))  # Llama-3-8B's embedding and a norm weight
    assert hints == {(128256, 4096), (128256, 2048)}     # 4096 × 2 B or 2048 × 4 B: the same vocabulary
    assert shape_logits(size, hints, lambda: made) == (8000, 128256, 4)
    assert shape_logits(2**30, frozenset({(32768, 4096)}), lambda: {2**30}) is None   # powers of two: ambiguous
    assert shape_logits(1000, hints, lambda: made) is None
    k, L, b = shape_scores(4 * 16 * 1024 * 1024 * 4)
    assert k * L * L * b == 4 * 16 * 1024 * 1024 * 4 and 8 <= k <= 4096 and L >= 512
    assert shape_scores(3 * 5 * 7 * 11) is None


@pytest.mark.skipif(not SCENARIOS.exists(), reason="scenario fixtures not generated")
@pytest.mark.parametrize("expected_path", sorted(SCENARIOS.glob("*.expected.json")), ids=lambda p: p.stem)
def test_scenario_categories_match_expected_answer(expected_path):
    expected = json.loads(expected_path.read_text())
    snap = load(expected_path.with_name(expected_path.name.replace(".expected.json", ".pickle")))
    result = attribute(snap, device=expected["device"])
    instant = result.instants[expected["device"]]
    assert instant.event_index == expected["peak"]["event_index"]
    assert instant.active_bytes == expected["peak"]["active_bytes"]
    got = result.summary.set_index("category")["bytes"].to_dict()
    assert got == expected["categories"]
    for category, tags in expected.get("tags", {}).items():
        rows = result.blocks[result.blocks["category"] == category]
        for tag in tags:
            assert rows["tags"].str.split(",").map(lambda t, tag=tag: tag in t).any(), (category, tag)


def test_malformed_frames_are_shown_not_fatal(tmp_path):
    import pickle

    entries = [{"action": "alloc", "addr": 1, "size": 10, "stream": 0, "frames": "abc"},
               {"action": "alloc", "addr": 2, "size": 30, "stream": 0,
                "frames": [7, {"filename": "x.py", "line": "q", "name": "f"}]}]
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [entries]}))
    result = attribute(load(path))
    assert int(result.blocks["size"].sum()) == 40
    assert set(result.blocks["frame"]) == {"", "x.py:0:f"}


def test_repeated_attributions_share_decisions_and_let_the_snapshot_go(tmp_path):
    """The stack decisions are kept per snapshot and rule set (phases and reports attribute many instants),
    without keeping the snapshot alive once the caller drops it."""
    import gc
    import weakref

    from snapanalyze.analyze.attribute.frames import Decider

    snap = load(SCENARIOS / "concurrent_requests.pickle")
    rules = load_rules()
    first = attribute(snap, at="peak", rules=rules)
    decider = Decider.for_snapshot(snap, rules)
    again = attribute(snap, at="event:700", rules=rules)
    assert Decider.for_snapshot(snap, rules) is decider and len(decider.cache) > 1
    assert first.blocks["category"].notna().all() and again.blocks["category"].notna().all()
    assert load_rules() is rules                                         # the shipped set is parsed once
    (tmp_path / "mine.toml").write_text("")
    assert Decider.for_snapshot(snap, load_rules(tmp_path / "mine.toml")) is not decider   # another set
    gone = weakref.ref(snap)
    del snap, first, again, decider
    gc.collect()
    assert gone() is None


# -- agreement with the hand labels of the real corpus ------------------------------------------------------

LABELS = REAL / "labels"
SOURCES = REAL / "source"
TRUTH = json.loads((LABELS / "truth.json").read_text())
_SAME = {"activations_other": "other", "unknown": "other"}   # the labels' names for what we call other


@functools.cache
def _agreement(stem: str, with_source: bool = True) -> dict[int, float]:
    """Per device: the share of the instant's active bytes whose category equals the hand label (as
    ../shared/tools/label_agreement.py grades it), with the program's source folder as --source."""
    source = SOURCES / stem if with_source and (SOURCES / stem).is_dir() else None
    blocks = attribute(load(REAL / f"{stem}.pickle", source=source)).blocks
    got = dict(zip(zip(blocks["device"].tolist(), blocks["address"].tolist()), blocks["category"]))
    labels = pd.read_csv(LABELS / f"blocks-{stem}.csv")
    out = {}
    for device, truth in TRUTH[stem].items():
        mine = labels[labels["device"] == int(device)]
        same = [got.get((int(device), int(a))) == _SAME.get(lab, lab)
                for a, lab in zip(mine["address"], mine["label"])]
        out[int(device)] = float(mine.loc[same, "size"].sum()) / truth["peak_active_bytes"]
    return out


@pytest.mark.parametrize("stem", sorted(TRUTH))
def test_each_real_file_agrees_with_its_hand_labels(stem):
    """The labels decide each live block from the program's own source; the rules never read them."""
    for device, share in _agreement(stem).items():
        assert share >= 0.70, f"{stem} device {device}: {share:.3f} of the bytes agree"


def test_the_median_file_agrees_on_nine_tenths_of_its_bytes():
    shares = [s for stem in TRUTH for s in _agreement(stem).values()]
    assert float(np.median(shares)) >= 0.90 and len(shares) == 14


def test_without_the_source_user_code_is_decided_by_what_it_calls_and_flagged_inferred():
    """Without --source a function's name proves nothing (SiLU can sit in any block), but what the code calls
    does: the hand-written SwiGLU calls its `silu` between hand-written Linear layers in every stack through
    it, so its intermediates are mlp from the call tree, flagged inferred, the reason naming those calls; with
    the source its class decides, unflagged."""
    stem = "cs336-step-user-metadata-t2.11"
    assert 0.90 < _agreement(stem, with_source=False)[0] and 0.95 < _agreement(stem)[0]
    blocks = attribute(load(REAL / f"{stem}.pickle")).blocks
    tree = blocks[blocks["rule"].str.startswith("calltree.")]
    assert tree["inferred"].all() and tree["reason"].str.contains("inferred from the call tree").all()
    silu = blocks[blocks["reason"].str.contains(r"^made in model\.py:\d+:silu, ")]    # made in the helper
    assert len(silu) and set(silu["category"]) == {"mlp"}
    with_source = attribute(load(REAL / f"{stem}.pickle", source=SOURCES / stem)).blocks
    assert not with_source.loc[with_source["category"] == "mlp", "inferred"].any()


RESNET = '''\
import torch.nn.functional as F
from torch import nn


class ResBlock(nn.Module):
    def forward(self, x):
        h = F.silu(self.conv(x))
        return x + h


class FeedForward(nn.Module):
    def forward(self, x):
        return self.down(F.silu(self.up(x)))


class Block(nn.Module):
    def forward(self, x):
        x = x + self.attn(self.norm(x))
        return x
'''


def _frames(*frames: tuple[str, int, str]) -> list[dict]:
    return [{"filename": f, "line": line, "name": n} for f, line, n in frames]


def test_names_are_scoped_by_the_owning_module(tmp_path):
    """F.silu is MLP inside a FeedForward but not inside a ResBlock; a residual add in Block.forward is the
    block's own, though the statement calls self.attn; without the source the activation proves nothing."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "net.py").write_text(RESNET)
    silu = ("/usr/lib/python3.12/site-packages/torch/nn/functional.py", 2380, "silu")
    user = "/home/me/project/net.py"
    b = SnapshotBuilder()
    b.segment(BASE, [(MiB, MiB, "active_allocated")] * 3 + [(MiB, 0, "inactive")])
    b.alloc(BASE, MiB, frames=_frames(silu, (user, 7, "forward")))                 # ResBlock.forward
    b.alloc(BASE + MiB, MiB, frames=_frames(silu, (user, 13, "forward")))          # FeedForward.forward
    b.alloc(BASE + 2 * MiB, MiB, frames=_frames((user, 18, "forward")))            # Block.forward: x + …
    snap = load(write_pickle(tmp_path / "scoped.pickle", b.build()), source=tmp_path / "src")
    got = attribute(snap, at="event:2").blocks.sort_values("address")
    assert got["category"].tolist() == ["other", "mlp", "other"]
    assert got["frame"].tolist()[1].endswith(":FeedForward.forward") or got["frame"].tolist()[1].endswith(":silu")
    assert "inside ResBlock.forward, which owns it" in got["reason"].tolist()[0]
    blind = attribute(load(tmp_path / "scoped.pickle"), at="event:2").blocks
    assert set(blind["category"]) == {"other"}


# A backward pass's allocations, as torch records them with stacks="all" (innermost first): no Python frame;
# the autograd engine's thread, started by libc (whose frames past the thread entry symbolizers misname).
_NATIVE = ("??", 0)
_ALLOCATING = [(*_NATIVE, "torch::unwind::unwind()"),
               ("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::"
                "malloc(signed char, unsigned long, CUstream_st*)"),
               (*_NATIVE, "at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)")]
_BMM_BACKWARD = [("RegisterCUDA.cpp", 0, "at::(anonymous namespace)::wrapper_CUDA_bmm(at::Tensor const&, "
                  "at::Tensor const&)"),
                 (*_NATIVE, "at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)"),
                 (*_NATIVE, "torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor, "
                  "std::allocator<at::Tensor> >&&)"),
                 ("", 0, "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
                 (*_NATIVE, "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> "
                  "const&)"),
                 ("thread48.o", 0, "execute_native_thread_routine"),
                 (*_NATIVE, "pthread_condattr_setpshared"), (*_NATIVE, "__xmknodat")]


def test_a_backward_pass_leaves_gradients_and_a_cublas_workspace_named_by_their_frames(tmp_path):
    """After a backward, what its engine allocated and kept is a .grad (inferred from the lifetime) — but not
    the workspace the backward thread's cuBLAS handle cached, which its frames prove. A gradient's site is
    the autograd node that made it, never the libc frames past the thread's entry point."""
    workspace = _frames(*_ALLOCATING, (*_NATIVE, "at::cuda::getNewWorkspace()"),
                        (*_NATIVE, "at::cuda::getCurrentCUDABlasHandle()"), *_BMM_BACKWARD)
    grad = _frames(*_ALLOCATING, *_BMM_BACKWARD)
    b = SnapshotBuilder()
    b.segment(BASE, [(32 * MiB, 32 * MiB, "active_allocated"), (4 * MiB, 4 * MiB, "active_allocated"),
                     (MiB, MiB, "active_allocated"), (27 * MiB, 0, "inactive")])
    b.alloc(BASE, 32 * MiB, frames=workspace)
    b.alloc(BASE + 32 * MiB, 4 * MiB, frames=grad)
    b.alloc(BASE + 36 * MiB, MiB, frames=_frames(("/app/train.py", 20, "main")))    # the next forward
    got = attribute(load(write_pickle(tmp_path / "backward.pickle", b.build()))).blocks.sort_values("address")
    assert got["category"].tolist() == ["workspace", "gradients", "other"]
    assert got["rule"].tolist()[:2] == ["torch.workspace.cublas", "lifetime.survived_backward"]
    assert got["inferred"].tolist()[:2] == [False, True]
    assert got["frame"].tolist()[:2] == ["at::cuda::getNewWorkspace", "torch::autograd::generated::BmmBackward0::apply"]


TRANSFORMERS_LLAMA = '''\
import math
import torch
from torch import nn


class LlamaMLP(nn.Module):
    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaAttention(nn.Module):
    def forward(self, hidden_states):
        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3)) / math.sqrt(self.head_dim)
        return self.o_proj(attn_weights)


class LlamaForCausalLM(nn.Module):
    def forward(self, input_ids):
        hidden_states = self.model(input_ids)[0]
        logits = self.lm_head(hidden_states)
        logits = logits.float()
        return logits
'''


def test_a_transformers_model_file_is_decided_by_its_source_where_it_is_read(tmp_path):
    """By name, `modeling_llama.py:forward` could be attention, MLP or the head; its source says which: the
    class its line is in, an inline q·kᵀ (an older transformers' eager attention), the lm_head call. Without
    the source it stays unknown (other), never guessed from the function name."""
    root = tmp_path / "env" / "site-packages" / "transformers" / "models" / "llama"
    root.mkdir(parents=True)
    (root / "modeling_llama.py").write_text(TRANSFORMERS_LLAMA)
    model = str(root / "modeling_llama.py").replace(str(tmp_path / "env"), "/venv/lib/python3.11")
    linear = ("/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", 125, "forward")
    outer = ("/app/generate.py", 8, "main")
    lines = {"mlp": (linear, (model, 8, "forward")), "q": (linear, (model, 13, "forward")),
             "scores": ((model, 15, "forward"),), "head": (linear, (model, 22, "forward")),
             "float": ((model, 23, "forward"),)}
    b = SnapshotBuilder()
    b.segment(BASE, [(2 * MiB, 2 * MiB, "active_allocated")] * len(lines))
    for k, frames in enumerate(lines.values()):
        b.alloc(BASE + 2 * k * MiB, 2 * MiB, frames=_frames(*frames, outer))
    snap = load(write_pickle(tmp_path / "llama.pickle", b.build()), source=tmp_path / "env")
    got = attribute(snap).blocks.sort_values("address")
    assert got["category"].tolist() == ["mlp", "attention", "fallback_kernel", "logits", "logits"]
    assert got["rule"].tolist() == ["transformers.mlp.class", "transformers.attention.class",
                                    "transformers.fallback_kernel.inline_eager_scores", "transformers.logits.call",
                                    "transformers.logits.assign"]
    assert got["frame"].tolist()[0].endswith("modeling_llama.py:8:LlamaMLP.forward")
    assert set(attribute(load(tmp_path / "llama.pickle")).blocks["category"]) == {"other"}


def test_a_checkout_that_differs_from_the_code_that_ran_is_named_and_its_lines_are_not_used(tmp_path):
    """The frame's line 4 lies outside `forward` in this checkout (the code changed since the run): its
    statement there, a `logits = …` line, is not the one that ran, so nothing from that file decides (not even
    the class its `forward` is found in), and a note names the frame and what to pass."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "head.py").write_text("class Head:\n    def build(self):\n        pass\n"
                                               "    logits = compute()\n\n    def forward(self, x):\n"
                                               "        return x\n")
    b = SnapshotBuilder()
    b.segment(BASE, [(MiB, MiB, "active_allocated")])
    b.alloc(BASE, MiB, frames=_frames(("/home/me/run/head.py", 4, "forward"), ("/home/me/run/main.py", 3, "main")))
    result = attribute(load(write_pickle(tmp_path / "drift.pickle", b.build()), source=tmp_path / "src"))
    assert result.blocks["category"].tolist() == ["other"]
    assert result.blocks["frame"].tolist() == ["me/run/head.py:4:forward"]
    assert any(n.startswith("1 frame the trace records in head.py lies outside its function in the copy found "
                            "(head.py:4:forward)")
               and n.endswith("pass the checkout of the code that ran with --source")
               for n in result.notes)


def test_the_pool_id_of_alloc_entries_proves_a_released_graph_pool(tmp_path):
    """torch ≥ 2.12 writes the pool on every entry: blocks of a private pool released before the snapshot
    are still graph_capture; without the field the end state cannot say so, and the frames decide."""
    import pickle

    path = SCENARIOS / "torch214_graph_pools_host.pickle"
    expected = json.loads(path.with_name("torch214_graph_pools_host.expected.json").read_text())
    with_pools = attribute(load(path)).summary.set_index("category")["bytes"].to_dict()
    assert with_pools["graph_capture"] == expected["categories"]["graph_capture"]
    raw = pickle.loads(path.read_bytes())
    for entry in raw["device_traces"][0]:
        entry.pop("pool_id")
    stripped = tmp_path / "no-pool-id.pickle"
    stripped.write_bytes(pickle.dumps(raw))
    without = attribute(load(stripped)).summary.set_index("category")["bytes"].to_dict()
    assert "graph_capture" not in without


def test_an_annotation_naming_a_category_decides_it():
    result = attribute(load(SCENARIOS / "torch214_graph_pools_host.pickle"))
    annotated = result.blocks[result.blocks["annotation"] != ""]
    assert annotated["annotation"].tolist() == ["kv_cache"]
    assert annotated["category"].tolist() == ["kv_cache"] and annotated["rule"].tolist() == ["signal.annotation"]
    assert not annotated["inferred"].any()


def test_an_annotation_that_names_no_category_is_kept_not_obeyed():
    from snapanalyze.analyze.annotations import annotated_category

    assert annotated_category("category=logits", {"logits"}) == "logits"
    assert annotated_category("KV_Cache", {"kv_cache"}) == "kv_cache"
    assert annotated_category("prefix cache for tenant 7", {"kv_cache"}) is None
    assert annotated_category("not_a_category", {"kv_cache"}) is None


@pytest.mark.parametrize("path", [SCENARIOS / "concurrent_requests.pickle", SCENARIOS / "cuda_graph_pool.pickle",
                                  SCENARIOS / "kv_weights_baseline.pickle",
                                  SCENARIOS / "torch214_graph_pools_host.pickle",
                                  REAL / "cs336-medium-ctx512-inference-t2.11.pickle",
                                  REAL / "flexgen-opt1.3b-t2.0.pickle"], ids=lambda p: p.stem)
def test_many_copies_of_the_blocks_get_the_labels_of_one(path):
    """Labels are decided once per distinct input and broadcast: forty copies of every block of a window
    (so thousands of blocks share each stack, pool, request and size) get, copy by copy and column by
    column, the labels the window's blocks get on their own. The copies keep every context signal (the
    main request, the vocabulary, weight and copy counts in proportion, gate/up neighbours), and these files
    show no training, so neither do the copies."""
    from snapanalyze.analyze.attribute import label_lifetimes

    snap = load(path)
    lifetimes = replay(snap)[0].lifetimes
    one = label_lifetimes(snap, 0, lifetimes)
    many = label_lifetimes(snap, 0, pd.concat([lifetimes] * 40, ignore_index=True))
    assert len(many) == 40 * len(one)
    counted = r"\d+ such copies, \d+ weights"          # an autocast copy's reason counts the copies
    for labels in (one, many):
        labels["reason"] = labels["reason"].str.replace(counted, "N such copies, M weights", regex=True)
    pd.testing.assert_frame_equal(many[BLOCK_COLUMNS], pd.concat([one] * 40, ignore_index=True)[BLOCK_COLUMNS],
                                  check_exact=True)             # decision codes differ with the counted reasons
    assert len(set(one["rule"])) >= 3                    # the file decides by several rules and signals


def test_blocks_sharing_stacks_are_labelled_as_each_is_alone(tmp_path):
    """Thousands of blocks over a few stacks, three pools, three requests and many sizes, some freed: each
    sampled block gets, among all of them, the label it gets when it is labelled alone with only the blocks
    that set the context (the request holding the most bytes, the MLP outputs a gate/up block sits next to)."""
    from snapanalyze.analyze.attribute import label_lifetimes
    from snapanalyze.analyze.state import CUBLAS_DEFAULT_WORKSPACE

    def user(function: str, line: int) -> list[dict]:
        return _frames(("/app/model.py", line, function), ("/app/serve.py", 10, "main"))

    stacks = [user("forward", 3), user("allocate_kv_cache", 14), user("self_attn", 20), user("step", 25)]
    scores = 8 * 256 * 256 * 4 * 16                      # batch·heads 128 × 256² × 4 bytes: attention scores
    sizes = [512, 4096, 3 * MiB, 4 * MiB, CUBLAS_DEFAULT_WORKSPACE, scores, scores + 512, 24 * MiB]
    rng = np.random.default_rng(7)
    b = SnapshotBuilder()
    main, mlp = b.segment(BASE, [(64 << 30, 64 << 30, "active_allocated")] + [(2 * MiB, 2 * MiB,
                                                                              "active_allocated")] * 90)[:2]
    bulk = []                                            # (address, size, stack, request, freed)
    for k, pool in enumerate(((0, 0), (0, 1), (0, 2))):
        chosen = rng.integers(0, len(sizes), 1500).tolist()
        freed = (rng.random(1500) < 0.2).tolist()
        addrs = b.segment(BASE + (k + 1) * (1 << 40), [(sizes[c], 0 if f else sizes[c], "inactive" if f else
                                                        "active_allocated") for c, f in zip(chosen, freed)],
                          pool=pool)
        bulk += [(a, sizes[c], int(rng.integers(0, len(stacks))), ["", "req-A", "req-B", "req-C"][int(rng.integers(
            0, 4))], f) for a, c, f in zip(addrs, chosen, freed)]
    b.alloc(main, 64 << 30, frames=stacks[0], user_metadata="req-A")
    outputs = iter(range(90))
    for n, (addr, size, s, request, _) in enumerate(bulk):
        if n % 50 == 25:                                 # an MLP output (2 MiB) among the bulk
            b.alloc(mlp + next(outputs) * 2 * MiB, 2 * MiB, frames=user("mlp", 30))
        b.alloc(addr, size, frames=stacks[s], user_metadata=request)
    for addr, size, _, request, freed in bulk:
        if freed:
            b.free(addr, size, user_metadata=request)
    snap = load(write_pickle(tmp_path / "shared-stacks.pickle", b.build()))
    lifetimes = replay(snap)[0].lifetimes
    together = label_lifetimes(snap, 0, lifetimes)
    assert len(together) == 1 + 90 + len(bulk) and together["stack_id"].nunique() == len(stacks) + 1
    assert {"other", "kv_cache", "attention", "graph_capture", "workspace", "fallback_kernel", "mlp",
            "concurrent_request"} <= set(together["category"])
    assert {"shape.gate_up_of_mlp", "shape.cublas_workspace", "signal.user_metadata"} <= set(together["rule"])
    shown = together.groupby("stack_id")["frame"].unique()          # each stack shows its own innermost frame
    assert shown.map(len).eq(1).all() and shown.map(tuple).is_unique
    context = np.flatnonzero(lifetimes["size"].isin([64 << 30, 2 * MiB]).to_numpy()).tolist()
    assert len(context) == 91
    sample = [i for i in rng.choice(len(lifetimes), 60, replace=False).tolist() if i not in context]
    gate_up = np.flatnonzero((together["rule"] == "shape.gate_up_of_mlp").to_numpy())[:5].tolist()
    for i in sample + gate_up:
        alone = label_lifetimes(snap, 0, lifetimes.iloc[context + [i]])
        pd.testing.assert_frame_equal(together.iloc[[i]].reset_index(drop=True),
                                      alone.iloc[[-1]].reset_index(drop=True), check_exact=True)


def test_each_block_names_the_record_function_span_its_allocation_ran_in(tmp_path):
    b = SnapshotBuilder()                                           # allocations at t0 + 1, 2, 3 ms
    b.segment(BASE, [(MiB, MiB, "active_allocated")] * 3)
    for k in range(3):                                              # before any span, in "prefill", in both
        b.alloc(BASE + k * MiB, MiB)
    snap = b.build()
    snap["external_annotations"] = [
        {"name": "prefill", "stage": "START", "device": 0, "time_us": b.t0 + 1500},
        {"name": "attention", "stage": "START", "device": 0, "time_us": b.t0 + 2500},
        {"name": "attention", "stage": "END", "device": 0, "time_us": b.t0 + 3010},
        {"name": "prefill", "stage": "END", "device": 0, "time_us": b.t0 + 3020}]
    got = attribute(load(write_pickle(tmp_path / "spans.pickle", snap))).blocks.sort_values("address")
    assert got["span"].tolist() == ["", "prefill", "attention"]


def _without(tmp_path: Path, stage: str):  # type: ignore[no-untyped-def]
    (tmp_path / "off.toml").write_text(f'disable = ["{stage}"]\n')
    return load_rules(tmp_path / "off.toml")


def test_the_stages_are_declared_once_in_the_order_they_run() -> None:
    assert [*FRAME_STAGES, *(name for name, _ in STAGES)] == list(NAMED_STAGES)


_FRAME_RULES = tuple(r.name for r in load_rules().rules)


# Each stage, a file on which it decides, and the rules only that stage gives: with the stage disabled in a
# rules file, none of them decides and every byte is still attributed (to what the other stages say).
@pytest.mark.parametrize("stage,path,given", [
    ("stage.rules", SCENARIOS / "kv_weights_baseline.pickle", _FRAME_RULES),
    ("stage.calltree", REAL / "cs336-forward-fp32-t2.6.pickle", ("calltree.", "backward.")),
    ("stage.before_window", REAL / "cs336-step-annotations-t2.10.pickle", ("state.", "unknown.before_window")),
    ("stage.signals", SCENARIOS / "concurrent_requests.pickle", ("signal.user_metadata", "lifetime.", "shape.")),
    ("stage.signals", SCENARIOS / "cuda_graph_pool.pickle", ("signal.private_pool",)),
    ("stage.annotations", SCENARIOS / "torch214_graph_pools_host.pickle", ("signal.annotation",)),
], ids=lambda v: v.name if isinstance(v, Path) else v if isinstance(v, str) else "")
def test_a_rules_file_switches_off_a_whole_stage(tmp_path: Path, stage: str, path: Path, given: tuple[str, ...]
                                                 ) -> None:
    snap = load(path)
    on = attribute(snap).blocks
    off = attribute(snap, rules=_without(tmp_path, stage)).blocks
    assert on["rule"].str.startswith(given).any()            # the stage decides here
    assert not off["rule"].str.startswith(given).any()
    assert off["size"].sum() == on["size"].sum() and len(off) == len(on)


def test_without_the_source_stage_a_file_reads_as_if_no_source_were_given(tmp_path: Path) -> None:
    stem = "cs336-medium-ctx128-inference-t2.11"
    with_source = attribute(load(REAL / f"{stem}.pickle", source=SOURCES / stem),
                            rules=_without(tmp_path, "stage.source"))
    plain = attribute(load(REAL / f"{stem}.pickle"))
    assert with_source.blocks[BLOCK_COLUMNS].equals(plain.blocks[BLOCK_COLUMNS])
    assert not attribute(load(REAL / f"{stem}.pickle", source=SOURCES / stem)).blocks[BLOCK_COLUMNS].equals(
        plain.blocks[BLOCK_COLUMNS])


def test_an_event_index_is_an_instant_as_event_i_is() -> None:
    """The analyses pass the event they chose as an int (not "event:{i}" text parsed again)."""
    snap = load(SCENARIOS / "concurrent_requests.pickle")
    by_text, by_index = attribute(snap, at="event:40"), attribute(snap, at=40)
    assert by_index.instants == by_text.instants and by_index.blocks.equals(by_text.blocks)
    with pytest.raises(UsageError, match="event 100000: device 0 has events"):
        attribute(snap, at=100_000)


def test_the_ids_beside_the_text_make_the_text_and_mean_the_same_at_every_instant() -> None:
    """`frame_id`, `owner_id` and `decision` are what `frame`, `owner` and the decided columns are made from,
    and a decision's code means the same decision in every attribution of one snapshot (one table per
    snapshot and rule set), however many instants were labelled in between."""
    from snapanalyze.sites import site_text, words_text
    snap = load(REAL / "cs336-step-annotations-t2.10.pickle")
    timeline = replay(snap)
    first = attribute(snap, at=200, timeline=timeline)
    for index in range(0, len(timeline[0]), 97):                       # many labellings in between
        attribute(snap, at=index, timeline=timeline)
    first.decider.labelled.clear()                                      # labelled afresh, not served kept
    again = attribute(snap, at=200, timeline=timeline)
    for result in (first, again):
        b = result.blocks
        assert [site_text(result.site(f)) for f in b["frame_id"]] == b["frame"].tolist()
        assert [site_text(result.site(f)) for f in b["owner_id"]] == b["owner"].tolist()
        decided = [result.decision(c) for c in b["decision"]]
        assert [d.category for d in decided] == b["category"].tolist()
        assert [words_text(d.reason) for d in decided] == b["reason"].tolist()
        assert [d.inferred for d in decided] == b["inferred"].tolist()
    assert first.blocks.equals(again.blocks)


def test_a_time_outside_the_trace_window_is_an_error_naming_the_window() -> None:
    snap = load(SCENARIOS / "concurrent_requests.pickle")
    with pytest.raises(UsageError, match=r"outside device 0's trace window \(2026-01-12 06:40:35\.004377 UTC … "):
        attribute(snap, at="time:+100s")
    with pytest.raises(UsageError, match="outside device 0's trace window"):
        attribute(snap, at="time:2020-01-01T00:00:00Z")
    assert attribute(snap, at="time:+0us").instants[0].event_index == 0


def test_top_n_shows_n_sites_per_category() -> None:
    from click.testing import CliRunner

    from snapanalyze.cli import main
    path = str(SCENARIOS / "concurrent_requests.pickle")
    doc = json.loads(CliRunner().invoke(main, ["attribute", path, "--top", "5", "--format", "json"]).stdout)
    other = next(c for c in doc["devices"][0]["categories"] if c["category"] == "other")
    assert len(other["top_frames"]) == 5 and other["top_frame_bytes"] == sorted(other["top_frame_bytes"], reverse=True)
    table = CliRunner().invoke(main, ["attribute", path, "--top", "5"]).stdout
    assert table.count("(12.00 MiB)") == 3 and "(768.00 KiB); (no frames) (48.00 KiB)" in table
    default = json.loads(CliRunner().invoke(main, ["attribute", path, "--format", "json"]).stdout)
    assert max(len(c["top_frames"]) for c in default["devices"][0]["categories"]) == 3


def test_the_attribute_result_is_what_the_terminal_and_the_json_show() -> None:
    """`attribution_result` is the command's one frozen, picklable result: its categories sum exactly to the
    instant's active bytes, its JSON is `to_json()` (strict JSON) and the terminal renders the object itself."""
    import pickle

    from snapanalyze.analyze.attribute.compact import attribution_result
    from snapanalyze.report.terminal import render_attribution
    from snapanalyze.units import fmt_bytes

    snapshot = load(REAL_FILES[0])
    result = attribution_result(attribute(snapshot), explain=True, top=2)
    assert pickle.loads(pickle.dumps(result)) == result
    (device,) = result.devices
    assert sum(c.bytes for c in device.categories) == device.active_bytes
    assert all(len(c.top_frames) <= 2 for c in device.categories)
    assert device.explain is not None and sum(e.bytes for e in device.explain) == device.active_bytes
    doc = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert doc["devices"][0]["transient_bytes"] == device.active_bytes - device.baseline_active_bytes
    assert [c["category"] for c in doc["devices"][0]["categories"]] == [c.category for c in device.categories]
    text = render_attribution(result, top=2, explain=True)
    assert fmt_bytes(device.categories[0].bytes) in text and "why (rule → frame, largest first):" in text


def test_a_backward_on_the_device_thread_leaves_gradients_and_temporaries_of_its_activations(tmp_path):
    """With stacks="python" a backward's allocations carry no frames (CUDA runs them on the autograd device thread,
    which has no Python): what one of them keeps past the backward with a parameter's size is a .grad; what it
    frees before the program allocates again, with exactly the size of a live logits block, is the gradient of
    those logits. Recorded by the CPU capture from real torch code."""
    torch = pytest.importorskip("torch")
    import itertools
    import pickle

    from snapanalyze.collect import cpu

    ticks = itertools.count(1_780_000_000_000_000)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 4000))
    with cpu.capture(clock=lambda: next(ticks)) as cap:
        model.to("cuda")
        cap.record_memory_history(stacks="python")
        with cap.host():
            x, y = torch.randn(128, 256), torch.randint(0, 4000, (128,))
        x, y = x.to("cuda"), y.to("cuda")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        after = torch.zeros(16)                          # the program allocates again: the backward is over
        snapshot = cap.snapshot()
        in_backward = next(i for i, e in enumerate(snapshot["device_traces"][0])
                           if e["action"] == "alloc" and not e["frames"] and e["size"] == 128 * 4000 * 4)
        truth = {int(r["address"]): r for r in cap.rows(len(snapshot["device_traces"][0]) - 1)}
        dlogits = [f.address for f in cap.facts(in_backward) if f.context.phase == "backward"
                   and f.context.node in ("NllLossBackward0", "LogSoftmaxBackward0")]
    path = tmp_path / "train.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    snap = load(path)
    end = attribute(snap, at=f"event:{len(snapshot['device_traces'][0]) - 1}").blocks
    grads = end[end["address"].isin([a for a, r in truth.items() if r["lifecycle"] == "gradients"])]
    assert len(grads) == 4 and set(grads["category"]) == {"gradients"}
    assert set(grads["rule"]) == {"lifetime.survived_backward"} and grads["inferred"].all()
    during = attribute(snap, at=f"event:{in_backward}").blocks.set_index("address")
    assert dlogits and (during.loc[dlogits, "category"] == "logits").all()
    assert (during.loc[dlogits, "rule"] == "shape.backward_pairing").all()
    del after


def test_logits_of_any_vocabulary_are_told_by_the_vocabulary_matrix_and_the_tokens_lookup():
    """T·V·b where a weight is V·H·b and an embedding lookup made T·H·b: the three sizes fix T, V and H together
    (a vocabulary of the model's own, in no list); a size that fits only one of them is not logits."""
    from snapanalyze.analyze.attribute.shapes import lookup_logits
    tokens, vocab, hidden = 1024, 12_000, 256
    weights, lookups = {vocab * hidden * 4}, {tokens * hidden * 4}
    assert lookup_logits(tokens * vocab * 4, weights, lookups) == (tokens, vocab, 4)
    assert lookup_logits(tokens * vocab * 2, weights, lookups) == (tokens, vocab, 2)        # bf16 logits
    assert lookup_logits(tokens * 4 * hidden * 4 * 3, weights, lookups) is None             # an MLP's, bigger
    assert lookup_logits(tokens * vocab * 4, weights, {tokens * hidden * 4 + 512}) is None  # no such lookup
