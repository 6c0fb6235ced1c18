"""Programs nobody here has seen: synthetic stacks with the frame structure of the library versions we read
(paths, function names, call nesting), one test per way the rules once failed on real unseen programs.

Each stack is written innermost frame first, as torch records it. The versions each structure was read from
are named at the stack; no test here is keyed on a corpus file.
"""

from __future__ import annotations

import pandas as pd
from conftest import BASE, SnapshotBuilder, write_pickle

from snapanalyze import attribute, load
from snapanalyze.analyze.rules import HEURISTICS
from snapanalyze.session import load_rules

MiB = 1 << 20
SP = "/opt/conda/lib/python3.11/site-packages/"
Frame = tuple[str, int, str]


def py(path: str, line: int, function: str) -> Frame:
    return (path if path.startswith("/") else SP + path, line, function)


def cpp(function: str) -> Frame:
    return ("??", 0, function)


CALL = [py("torch/nn/modules/module.py", 1747, "_call_impl"), py("torch/nn/modules/module.py", 1736,
                                                                  "_wrapped_call_impl")]
LINEAR = [py("torch/nn/modules/linear.py", 125, "forward"), *CALL]


def blocks(tmp_path, stacks: dict[str, list[Frame]], size: int = 4 * MiB, name: str = "unseen") -> pd.DataFrame:
    """Each named stack allocates one live block; the blocks' rows by name."""
    b = SnapshotBuilder()
    b.segment(BASE, [(size, size, "active_allocated")] * len(stacks))
    for k, frames in enumerate(stacks.values()):
        b.alloc(BASE + k * size, size, frames=[{"filename": f, "line": line, "name": n} for f, line, n in frames])
    got = attribute(load(write_pickle(tmp_path / f"{name}.pickle", b.build()))).blocks.sort_values("address")
    return got.assign(name=list(stacks)).set_index("name")


# -- 1. an optimizer step that runs the model ---------------------------------------------------------------
# lightning 2.4.0 automatic optimisation with torch 2.5 Adam: LightningOptimizer.step (core/optimizer.py:154)
# -> Strategy.optimizer_step -> Precision.optimizer_step -> Optimizer.step wrapper (optimizer.py:487, _use_grad)
# -> Adam.step, which calls `closure()` -> Precision._wrap_closure -> Closure.__call__ -> closure ->
# _training_step -> strategy.training_step -> the user's training_step -> the DiT.

L = "lightning/pytorch/"
STEP = [py("torch/optim/optimizer.py", 79, "_use_grad"), py("torch/optim/optimizer.py", 487, "wrapper"),
        py(L + "plugins/precision/precision.py", 123, "optimizer_step"),
        py(L + "strategies/strategy.py", 239, "optimizer_step"), py(L + "core/optimizer.py", 154, "step"),
        py(L + "core/module.py", 1306, "optimizer_step"), py(L + "trainer/call.py", 171, "_call_lightning_module_hook"),
        py(L + "loops/optimization/automatic.py", 270, "_optimizer_step"),
        py(L + "loops/optimization/automatic.py", 192, "run"), py(L + "loops/training_epoch_loop.py", 250, "advance"),
        py("/home/u/dit/train.py", 80, "main")]
CLOSURE = [py("/home/u/dit/lit.py", 40, "training_step"), py(L + "strategies/strategy.py", 390, "training_step"),
           py(L + "trainer/call.py", 319, "_call_strategy_hook"),
           py(L + "loops/optimization/automatic.py", 320, "_training_step"),
           py(L + "loops/optimization/automatic.py", 146, "closure"),
           py("torch/utils/_contextlib.py", 116, "decorate_context"),
           py(L + "loops/optimization/automatic.py", 138, "__call__"),
           py(L + "plugins/precision/precision.py", 108, "_wrap_closure"),
           py("torch/optim/adam.py", 213, "step"), *STEP]
DIT = "/home/u/dit/models.py"
BLOCK = [*CALL, py(DIT, 130, "forward"), *CALL, py(DIT, 210, "forward"), *CALL, *CLOSURE]   # DiTBlock, DiT
ATTN = [py(DIT, 60, "forward"), *BLOCK]                                                     # Attention.forward
TIMM_MLP = "timm/layers/mlp.py"                                                             # timm 1.0.19 Mlp
MLP_CALL = [*CALL, py(DIT, 128, "forward"), *CALL, py(DIT, 210, "forward"), *CALL, *CLOSURE]


def test_an_optimizer_step_owns_only_its_own_update_not_the_model_its_closure_runs(tmp_path):
    got = blocks(tmp_path, {
        "qkv": [*LINEAR, py(DIT, 58, "forward"), *BLOCK],
        "scores": [py(DIT, 60, "forward"), *BLOCK],                              # q @ k.transpose(-2, -1)
        "softmax": [py("torch/nn/functional.py", 2140, "softmax"), py(DIT, 61, "forward"), *BLOCK],
        "fc1": [*LINEAR, py(TIMM_MLP, 44, "forward"), *MLP_CALL],
        "gelu": [py("torch/nn/modules/activation.py", 734, "forward"), *CALL, py(TIMM_MLP, 45, "forward"),
                 *MLP_CALL],
        "fc2": [*LINEAR, py(TIMM_MLP, 49, "forward"), *MLP_CALL],
        "exp_avg": [py("torch/optim/adam.py", 140, "_init_group"), py("torch/optim/adam.py", 233, "step"), *STEP],
        "loss": [py("/home/u/dit/lit.py", 42, "training_step"), *CLOSURE[1:]],
    })
    assert got["category"].to_dict() == {"qkv": "attention", "scores": "attention", "softmax": "attention",
                                         "fc1": "mlp", "gelu": "mlp", "fc2": "mlp", "exp_avg": "optimizer_state",
                                         "loss": "other"}
    attention = got.loc[["qkv", "scores", "softmax"]]
    assert attention["inferred"].all() and attention["rule"].str.startswith("calltree.").all()
    assert set(got.loc[["fc1", "gelu", "fc2"], "rule"]) == {"timm.mlp.layers"}     # timm's own MLP file
    assert not got.loc["exp_avg", "inferred"] and "lightning" not in got.loc["exp_avg", "frame"]
    assert "softmax" in got.loc["scores", "reason"]                            # the evidence is named


def test_a_plain_closure_passed_to_lbfgs_runs_model_code_the_step_does_not_own(tmp_path):
    """torch 2.5 LBFGS.step calls `closure()` (lbfgs.py:330) — the user's closure in the training script,
    which runs the model: no Lightning, the step's frame is the only optimizer frame of the stack."""
    step = [py("torch/optim/lbfgs.py", 330, "step"), py("torch/optim/optimizer.py", 79, "_use_grad"),
            py("torch/optim/optimizer.py", 487, "wrapper"), py("/home/u/fit.py", 50, "main")]
    net = [*CALL, py("/home/u/fit.py", 31, "closure"), *step]
    got = blocks(tmp_path, {
        "hidden": [*LINEAR, py("/home/u/net.py", 12, "forward"), *net],
        "act": [py("torch/nn/functional.py", 1704, "relu"), py("/home/u/net.py", 13, "forward"), *net],
        "direction": [py("torch/optim/lbfgs.py", 360, "step"), *step[1:]],
    }, name="lbfgs")
    assert got.loc["direction", "category"] == "optimizer_state"
    assert got.loc["hidden", "category"] != "optimizer_state" and got.loc["act", "category"] != "optimizer_state"


# -- 2. model libraries without readable source -------------------------------------------------------------
# transformers modeling_qwen2.py, call structure as in 4.44-4.56 (line numbers illustrative, not one release's):
# Qwen2MLP.forward (57: down_proj(act_fn(gate_proj(x)) * up_proj(x)), act_fn
# = nn.SiLU), Qwen2Attention.forward (q_proj 153, apply_rotary_pos_emb 159, attention_interface = integrations/
# sdpa_attention.py sdpa_attention_forward 176, o_proj 189), Qwen2DecoderLayer.forward (self_attn 241, residual
# add 252, post_attention_layernorm 256, mlp 257), Qwen2ForCausalLM.forward -> self.loss_function
# (loss/loss_utils.py ForCausalLMLoss: logits.float(), then fixed_cross_entropy -> F.cross_entropy). A LoRA
# adapter (peft 0.13 tuners/lora/layer.py Linear.forward) wraps q_proj.

QWEN = "/opt/conda/lib/python3.11/site-packages/transformers/models/qwen2/modeling_qwen2.py"
MODEL = [*CALL, py(QWEN, 563, "forward"), *CALL, py(QWEN, 838, "forward"), *CALL,
         py("/home/u/eval/run.py", 20, "main")]
DEC_ATT = [*CALL, py(QWEN, 241, "forward"), *MODEL]
DEC_MLP = [*CALL, py(QWEN, 257, "forward"), *MODEL]
LOSS = [py("transformers/loss/loss_utils.py", 47, "ForCausalLMLoss"), py(QWEN, 866, "forward"), *CALL,
        py("/home/u/eval/run.py", 20, "main")]


def test_transformers_modeling_code_without_its_source_is_decided_by_what_it_calls(tmp_path):
    got = blocks(tmp_path, {
        "gate": [*LINEAR, py(QWEN, 57, "forward"), *DEC_MLP],
        "silu": [py("torch/nn/functional.py", 2380, "silu"), py("torch/nn/modules/activation.py", 432, "forward"),
                 *CALL, py(QWEN, 57, "forward"), *DEC_MLP],
        "gate_x_up": [py(QWEN, 57, "forward"), *DEC_MLP],
        "q_lora": [*LINEAR, py("peft/tuners/lora/layer.py", 557, "forward"), *CALL, py(QWEN, 153, "forward"),
                   *DEC_ATT],
        "q_embed": [py(QWEN, 96, "apply_rotary_pos_emb"), py(QWEN, 159, "forward"), *DEC_ATT],
        "sdpa": [py("transformers/integrations/sdpa_attention.py", 53, "sdpa_attention_forward"),
                 py(QWEN, 176, "forward"), *DEC_ATT],
        "o_proj": [*LINEAR, py(QWEN, 189, "forward"), *DEC_ATT],
        "residual": [py(QWEN, 252, "forward"), *MODEL],
        "rmsnorm": [py(QWEN, 205, "forward"), *CALL, py(QWEN, 256, "forward"), *MODEL],
        "logits_fp32": LOSS,
        "log_softmax": [py("torch/nn/functional.py", 3104, "cross_entropy"),
                        py("transformers/loss/loss_utils.py", 36, "fixed_cross_entropy"), *LOSS],
    }, name="qwen2")
    assert got["category"].to_dict() == {
        "gate": "mlp", "silu": "mlp", "gate_x_up": "mlp", "q_lora": "attention", "q_embed": "attention",
        "sdpa": "attention", "o_proj": "attention", "residual": "other", "rmsnorm": "other",
        "logits_fp32": "logits", "log_softmax": "logits"}
    tree = got.loc[["gate", "silu", "gate_x_up", "q_lora", "q_embed", "o_proj"]]    # the rest: transformers.toml
    assert tree["inferred"].all() and tree["rule"].str.startswith("calltree.").all()
    assert "silu" in got.loc["gate", "reason"] and "sdpa_attention_forward" in got.loc["o_proj", "reason"]


# diffusers 0.35.1: FeedForward lives in models/attention.py (forward: `for module in self.net: hidden_states =
# module(hidden_states)`, 1720) and its GELU in models/activations.py (GELU.forward: self.proj 88, self.gelu 89, a
# method calling F.gelu, a C builtin with no Python frame); BasicTransformerBlock (attention.py) calls self.ff.
DIFF = "diffusers/models/"
FF = [*CALL, py(DIFF + "attention.py", 1720, "forward"), *CALL, py(DIFF + "attention.py", 1255, "forward"), *CALL,
      py(DIFF + "transformers/transformer_2d.py", 450, "forward"), *CALL, py("/home/u/sample.py", 30, "main")]


def test_a_file_named_attention_that_holds_the_mlp_is_decided_by_what_its_code_calls(tmp_path):
    got = blocks(tmp_path, {
        "proj": [*LINEAR, py(DIFF + "activations.py", 88, "forward"), *FF],
        "gelu": [py(DIFF + "activations.py", 83, "gelu"), py(DIFF + "activations.py", 89, "forward"), *FF],
        "ff_out": [*LINEAR, *FF],
    }, name="diffusers")
    assert got["category"].to_dict() == {"proj": "mlp", "gelu": "mlp", "ff_out": "mlp"}
    assert got["inferred"].all() and got.loc["ff_out", "rule"] == "calltree.mlp"
    assert "calls only model code whose role is mlp" in got.loc["ff_out", "reason"]


# -- 5. non-transformer models ------------------------------------------------------------------------------
# A GNN's per-node update MLP (Linear -> ReLU -> Linear in the user's update_nodes) and torch_geometric 2.6.1
# GATConv: forward -> self.lin (nn/dense/linear.py) and the generated edge_updater -> GATConv.edge_update ->
# utils/_softmax.py softmax; the generated propagate -> GATConv.message (alpha.unsqueeze(-1) * x_j).

GNN = "/home/u/gnn/models.py"
PYG = "torch_geometric/"
GEN = "/tmp/torch_geometric.nn.conv.gat_conv_GATConv_propagate_k2j1x9.py"
NODES = [py(GNN, 181, "update_nodes"), py(GNN, 200, "forward"), *CALL, py("/home/u/gnn/train.py", 60, "main")]
GAT = [py(PYG + "nn/conv/gat_conv.py", 360, "forward"), *CALL, py(GNN, 120, "forward"), *CALL,
       py("/home/u/gnn/train.py", 60, "main")]


def test_per_node_mlps_are_named_and_graph_attention_is_message_passing_not_attention(tmp_path):
    """A GAT's edge softmax normalises over each node's edges: message passing, not attention over keys."""
    got = blocks(tmp_path, {
        "hidden": [*LINEAR, *NODES],
        "relu": [py("torch/nn/functional.py", 1704, "relu"), *NODES],
        "out": [*LINEAR, py(GNN, 183, "update_nodes"), *NODES[1:]],
        "alpha": [py(PYG + "utils/_softmax.py", 60, "softmax"), py(PYG + "nn/conv/gat_conv.py", 420, "edge_update"),
                  py(GEN, 95, "edge_updater"), *GAT],
        "message": [py(PYG + "nn/conv/gat_conv.py", 440, "message"), py(GEN, 160, "propagate"), *GAT],
    }, name="gnn")
    assert got["category"].to_dict() == {"hidden": "mlp", "relu": "mlp", "out": "mlp", "alpha": "other",
                                         "message": "other"}
    assert got.loc[["hidden", "relu", "out"], "inferred"].all()


# -- 5b. a block beside its sublayers: DiT's adaLN modulation (facebookresearch/DiT models.py, with timm 1.0's
# Attention and Mlp from timm/models/vision_transformer.py and timm/layers/mlp.py). DiTBlock.forward runs
# self.adaLN_modulation(c) (nn.Sequential(nn.SiLU(), nn.Linear)), then
# `x = x + gate_msa.unsqueeze(1) * self.attn(modulate(self.norm1(x), shift_msa, scale_msa))` and the same with
# self.mlp: an activation between linear layers is not what the block is — the MLP is the sublayer it calls.

DIT_FILE = "/home/u/DiT/models.py"
DIT_BLOCK = [py(DIT_FILE, 150, "forward"), *CALL, py(DIT_FILE, 240, "forward"), *CALL,
             py("/home/u/DiT/train.py", 60, "main")]
SEQ = [py("torch/nn/modules/container.py", 250, "forward"), *CALL]


def test_a_block_whose_own_calls_are_an_adaln_modulation_is_not_the_mlp_it_calls(tmp_path):
    vit = "timm/models/vision_transformer.py"
    got = blocks(tmp_path, {
        "silu": [py("torch/nn/functional.py", 2380, "silu"), py("torch/nn/modules/activation.py", 432, "forward"),
                 *CALL, *SEQ, py(DIT_FILE, 148, "forward"), *DIT_BLOCK[1:]],
        "modulation": [*LINEAR, *SEQ, py(DIT_FILE, 148, "forward"), *DIT_BLOCK[1:]],
        "qkv": [*LINEAR, py(vit, 88, "forward"), *CALL, py(DIT_FILE, 149, "forward"), *DIT_BLOCK[1:]],
        "gated_attention": [py(DIT_FILE, 149, "forward"), *DIT_BLOCK[1:]],
        "fc1": [*LINEAR, py(TIMM_MLP, 44, "forward"), *CALL, py(DIT_FILE, 150, "forward"), *DIT_BLOCK[1:]],
        "gelu": [py("torch/nn/modules/activation.py", 734, "forward"), *CALL, py(TIMM_MLP, 45, "forward"), *CALL,
                 py(DIT_FILE, 150, "forward"), *DIT_BLOCK[1:]],
        "gated_mlp": [py(DIT_FILE, 150, "forward"), *DIT_BLOCK[1:]],
    }, name="dit")
    assert got.loc[["fc1", "gelu"], "category"].tolist() == ["mlp", "mlp"]             # timm's Mlp is the MLP
    assert "mlp" not in got.loc[["silu", "modulation", "gated_attention", "gated_mlp", "qkv"], "category"].tolist()


# -- 6. backward on the autograd thread: C++ frames only (torch 2.5, stacks="all") ---------------------------

ENGINE = [cpp("torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
          cpp("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, "
              "torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::"
              "ReadyQueue> const&)"),
          cpp("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
          cpp("torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, "
              "bool)"),
          ("thread48.o", 0, "execute_native_thread_routine"), cpp("start_thread"), cpp("clone")]
MALLOC = [cpp("torch::unwind::unwind()"),
          ("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"
           "(signed char, unsigned long, CUstream_st*)"),
          cpp("at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)")]


def _node(op: str, node: str) -> list[Frame]:
    return [*MALLOC, cpp(f"at::_ops::{op}::call(at::Tensor const&, at::Tensor const&)"),
            cpp(f"torch::autograd::generated::{node}::apply(std::vector<at::Tensor, std::allocator<at::Tensor> "
                ">&&)"), *ENGINE]


def test_backward_nodes_are_named_by_the_forward_op_they_differentiate(tmp_path):
    got = blocks(tmp_path, {
        "dlogits": _node("_log_softmax_backward_data", "LogSoftmaxBackward0"),
        "dnll": _node("nll_loss_backward", "NllLossBackward0"),
        "dscores": _node("_softmax_backward_data", "SoftmaxBackward0"),
        "dsilu": _node("silu_backward", "SiluBackward0"),
        "dsdpa": _node("_scaled_dot_product_efficient_attention_backward",
                       "ScaledDotProductEfficientAttentionBackward0"),
        "drelu": _node("threshold_backward", "ReluBackward0"),
    }, name="backward")
    assert got["category"].to_dict() == {"dlogits": "logits", "dnll": "logits", "dscores": "attention",
                                         "dsilu": "mlp", "dsdpa": "attention", "drelu": "other"}
    named = got.drop(index=["drelu", "dsdpa"])                # the fused SDPA backward: torch.toml names it
    assert named["inferred"].all() and named["rule"].str.startswith("backward.").all()
    assert got.loc["dscores", "frame"] == "torch::autograd::generated::SoftmaxBackward0::apply"


# -- DataParallel (torch 2.5 nn/parallel): replicas' weights are broadcast on every forward ------------------

def test_data_parallel_replicas_hold_copies_of_the_weights(tmp_path):
    dp = [py("torch/nn/parallel/data_parallel.py", 184, "forward"), *CALL, py("/home/u/train.py", 44, "main")]
    worker = [py("torch/nn/parallel/parallel_apply.py", 96, "_worker"),
              py("/usr/lib/python3.11/threading.py", 1010, "run"),
              py("/usr/lib/python3.11/threading.py", 1073, "_bootstrap_inner"),
              py("/usr/lib/python3.11/threading.py", 1030, "_bootstrap")]
    got = blocks(tmp_path, {
        "replica_weight": [py("torch/nn/parallel/comm.py", 67, "broadcast_coalesced"),
                           py("torch/nn/parallel/_functions.py", 22, "forward"),
                           py("torch/autograd/function.py", 575, "apply"),
                           py("torch/nn/parallel/replicate.py", 80, "_broadcast_coalesced_reshape"),
                           py("torch/nn/parallel/replicate.py", 127, "replicate"),
                           py("torch/nn/parallel/data_parallel.py", 199, "replicate"), *dp],
        "input_shard": [py("torch/nn/parallel/comm.py", 205, "scatter"),
                        py("torch/nn/parallel/_functions.py", 100, "forward"),
                        py("torch/autograd/function.py", 575, "apply"),
                        py("torch/nn/parallel/scatter_gather.py", 31, "scatter_map"),
                        py("torch/nn/parallel/scatter_gather.py", 46, "scatter"),
                        py("torch/nn/parallel/scatter_gather.py", 62, "scatter_kwargs"),
                        py("torch/nn/parallel/data_parallel.py", 182, "scatter"), *dp],
        "replica_act": [*LINEAR, py("/home/u/net.py", 12, "forward"), *CALL, *worker],
    }, name="dp")
    assert got["category"].to_dict() == {"replica_weight": "weights", "input_shard": "inputs",
                                         "replica_act": "other"}


# -- 3. a library checkout of another version ---------------------------------------------------------------
# A modeling_qwen2.py laid out as another release: line 57, the MLP's line in the run, lies inside
# Qwen2Attention.forward here, a function of the frame's name, so that frame alone cannot tell; but the run's
# apply_rotary_pos_emb line (96) and its decoder-layer lines fall outside functions of their names here.

OTHER_RELEASE = "import torch\nfrom torch import nn\n\n\n" + "\n" * 46 + '''class Qwen2Attention(nn.Module):
    def forward(self, hidden_states):
        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)
        attn_weights = torch.matmul(query_states, key_states.transpose(2, 3))
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_output = torch.matmul(attn_weights, value_states)
        return self.o_proj(attn_output)


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)
''' + "\n" * 60 + '''
def apply_rotary_pos_emb(q, k, cos, sin):
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class Qwen2MLP(nn.Module):
    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
'''


def test_a_library_copy_of_another_version_decides_nothing_and_the_note_says_what_to_install(tmp_path):
    root = tmp_path / "env" / "lib" / "python3.11" / "site-packages" / "transformers" / "models" / "qwen2"
    root.mkdir(parents=True)
    (root / "modeling_qwen2.py").write_text(OTHER_RELEASE)
    assert OTHER_RELEASE.splitlines()[56].strip().startswith("attn_weights = nn.functional.softmax")   # line 57
    stacks = {"gate": [*LINEAR, py(QWEN, 57, "forward"), *DEC_MLP],
              "silu": [py("torch/nn/functional.py", 2380, "silu"), py("torch/nn/modules/activation.py", 432,
                                                                      "forward"), *CALL, py(QWEN, 57, "forward"),
                       *DEC_MLP],
              "q_embed": [py(QWEN, 96, "apply_rotary_pos_emb"), py(QWEN, 159, "forward"), *DEC_ATT],
              "q_proj": [*LINEAR, py(QWEN, 153, "forward"), *DEC_ATT]}
    b = SnapshotBuilder()
    b.segment(BASE, [(4 * MiB, 4 * MiB, "active_allocated")] * len(stacks))
    for k, frames in enumerate(stacks.values()):
        b.alloc(BASE + k * 4 * MiB, 4 * MiB, frames=[{"filename": f, "line": n, "name": fn} for f, n, fn in frames])
    result = attribute(load(write_pickle(tmp_path / "drift.pickle", b.build()), source=tmp_path / "env"))
    got = result.blocks.sort_values("address").assign(name=list(stacks)).set_index("name")
    assert got["category"].to_dict() == {"gate": "mlp", "silu": "mlp", "q_embed": "attention", "q_proj": "attention"}
    assert got["inferred"].all() and not got["rule"].str.startswith("transformers.").any()
    assert not got["frame"].str.contains("Qwen2Attention").any()
    note = next(n for n in result.notes if "modeling_qwen2.py" in n)
    assert "transformers/models/qwen2/modeling_qwen2.py" in note and "modeling_qwen2.py:96:apply_rotary_pos_emb" in note
    assert "install the transformers that ran (--env-source reads this environment's), or pass its site-packages " \
           "with --source" in note


# -- 4. `.grad` tensors moved with their module by Module._apply ---------------------------------------------
# torch 2.13 nn/modules/module.py (read here): `_apply` recurses into children, then per parameter
# `param_applied = fn(param)` (line 964) and, with a gradient, `grad_applied = fn(param_grad)` (line 1008) right
# after it, then `fn(buf)` per buffer (line 1034); older releases' `_apply` (found with the search tool, lines
# not read) have the same order (`fn(param.grad)`).

def _moved(tmp_path, layout: list[tuple[str, int, int]], name: str, rules=None) -> pd.DataFrame:
    """`model.cuda()` with the trace on: each (name, _apply line, size) allocates one live block, in order."""
    apply_ = [py("torch/nn/modules/module.py", 915, "_apply"), py("torch/nn/modules/module.py", 1084, "cuda"),
              py("/home/u/train.py", 30, "main")]
    b = SnapshotBuilder()
    b.segment(BASE, [(size, size, "active_allocated") for _, _, size in layout])
    addr = BASE
    for _, line, size in layout:
        frames = [py("torch/nn/modules/module.py", 1084, "<lambda>"), py("torch/nn/modules/module.py", line, "_apply"),
                  *apply_]
        b.alloc(addr, size, frames=[{"filename": f, "line": n, "name": fn} for f, n, fn in frames])
        addr += size
    got = attribute(load(write_pickle(tmp_path / f"{name}.pickle", b.build())), rules=rules).blocks
    return got.sort_values("address").assign(name=[n for n, _, _ in layout]).set_index("name")


def test_grads_moved_with_their_module_are_gradients_not_weights(tmp_path):
    C = 64 * 1024
    got = _moved(tmp_path, [
        ("fc1.weight", 964, 4 * MiB), ("fc1.weight.grad", 1008, 4 * MiB), ("fc1.bias", 964, C),
        ("fc1.bias.grad", 1008, C), ("fc2.weight", 964, 4 * MiB), ("fc2.weight.grad", 1008, 4 * MiB),
        ("bn.weight", 964, C), ("bn.weight.grad", 1008, C), ("bn.bias", 964, C), ("bn.bias.grad", 1008, C),
        ("bn.running_mean", 1034, C), ("bn.running_var", 1034, C), ("bn.num_batches_tracked", 1034, 512)],
        name="apply_grads")
    grads = got.index.str.endswith(".grad")
    assert (got.loc[grads, "category"] == "gradients").all()
    assert (got.loc[~grads, "category"] == "weights").all()        # parameters and buffers (a BatchNorm's too)
    assert got.loc[grads, "inferred"].all() and (got.loc[grads, "rule"] == "order.apply_grad").all()
    assert "module.py:1008:_apply" in got.loc["fc1.weight.grad", "reason"]


def test_every_heuristic_can_be_disabled_by_name(tmp_path):
    user = tmp_path / "rules.toml"
    user.write_text('disable = ["order.apply_grad"]\n')
    got = _moved(tmp_path, [("w", 964, 4 * MiB), ("w.grad", 1008, 4 * MiB), ("b", 964, MiB), ("b.grad", 1008, MiB)],
                 name="apply_off", rules=load_rules(user))
    assert (got["category"] == "weights").all()
    for name in HEURISTICS:                              # each is a name `disable` accepts
        user.write_text(f'disable = ["{name}"]\n')
        assert not load_rules(user).enabled(name)


def test_a_module_moved_without_grads_is_all_weights(tmp_path):
    got = _moved(tmp_path, [("w1", 964, 4 * MiB), ("w2", 964, 4 * MiB), ("rm", 1034, 4 * MiB),
                            ("rv", 1034, 4 * MiB)], name="apply_plain")
    assert (got["category"] == "weights").all()


# -- 4. a retained forward graph from before the window ------------------------------------------------------
# GPT-2-style eager attention (transformers 4.48 models/gpt2/modeling_gpt2.py: eager_attention_forward, called
# from GPT2Attention.forward): the program keeps each step's outputs with their grad_fn, so every step's scores
# stay live. The blocks of earlier steps carry no frames (recording began later); the window shows the same
# site making blocks of that size and freeing none of them.

GPT2 = "transformers/models/gpt2/modeling_gpt2.py"
SCORES = [py("torch/nn/functional.py", 2140, "softmax"), py(GPT2, 66, "eager_attention_forward"),
          py(GPT2, 341, "forward"), *CALL, py(GPT2, 640, "forward"), *CALL, py("/home/u/eval.py", 21, "main")]


def _retained(tmp_path, name: str, freed_too: bool = False, oom: bool = False) -> pd.DataFrame:
    b = SnapshotBuilder()
    b.frames = False                                    # blocks from before the window: no frames
    before = [("w", 4 * MiB)] * 4 + [("old_scores", 8 * MiB)] * 6
    b.segment(BASE, [(size, size, "active_allocated") for _, size in before])
    b.frames = True
    now = BASE + (64 << 20)
    b.segment(now, [(8 * MiB, 8 * MiB, "active_allocated")] * 3 + [(8 * MiB, 8 * MiB, "inactive")])
    frames = [{"filename": f, "line": n, "name": fn} for f, n, fn in SCORES]
    for k in range(3):
        b.alloc(now + k * 8 * MiB, 8 * MiB, frames=frames)
    if freed_too:                                       # the same site also made one the window frees
        b.alloc(now + 3 * 8 * MiB, 8 * MiB, frames=frames)
        b.free(now + 3 * 8 * MiB, 8 * MiB, frames=frames)
    if oom:
        b.event("oom", None, 64 * MiB, device_free=MiB)
    got = attribute(load(write_pickle(tmp_path / f"{name}.pickle", b.build()))).blocks
    got = got[got["origin"] != "trace"].sort_values("address")
    return got.assign(name=[n for n, _ in before]).reset_index(drop=True)


def test_frameless_blocks_the_size_of_activations_the_program_keeps_are_those_activations(tmp_path):
    got = _retained(tmp_path, "retained")
    old = got[got["name"] == "old_scores"]
    # eager attention materialises the scores that a fused kernel avoids (transformers.toml): fallback_kernel
    assert (old["category"] == "fallback_kernel").all() and old["inferred"].all()
    assert (old["rule"] == "state.retained_activation").all()
    assert "modeling_gpt2.py:66:eager_attention_forward" in old["reason"].iloc[0]
    # four blocks of one size, with no frames: nothing says they are a model's weights (issue 46, class 3)
    assert (got.loc[got["name"] == "w", "category"] == "other").all()


def test_frameless_blocks_stay_state_where_the_program_frees_those_activations_or_ran_out(tmp_path):
    for name, kw in (("freed", {"freed_too": True}), ("oom", {"oom": True})):
        got = _retained(tmp_path, name, **kw)
        # two sizes repeating, no frames, no training: unknown, and the reason says how to record who made them
        assert (got["category"] == "other").all() and (got["rule"] == "state.unknown").all(), name
        assert "record_memory_history before the model is built" in got["reason"].iloc[0]


# -- 1b. a program's own Optimizer subclass, without its source ----------------------------------------------
# torch 2.6 and 2.13 optim/optimizer.py: Optimizer.profile_hook_step wraps every subclass's step in `wrapper`,
# which calls it (`out = func(*args, **kwargs)`); the interpreter's C frames lie between the two.

def test_the_step_torch_optims_wrapper_calls_is_the_optimizers_own_update(tmp_path):
    interp = [("/usr/local/src/conda/python-3.12.3/Python/ceval.c", 578, "PyEval_EvalCode")]
    wrapper = [*interp, py("torch/optim/optimizer.py", 493, "wrapper"), py("/home/u/train.py", 118, "run")]
    got = blocks(tmp_path, {
        "exp_avg": [py("/home/u/cs336/adapters.py", 887, "step"), *wrapper],
        "own_loop_step": [py("/home/u/train.py", 40, "step"), py("/home/u/train.py", 118, "run")],
    }, name="subclass_step")
    assert got["category"].to_dict() == {"exp_avg": "optimizer_state", "own_loop_step": "other"}
    assert got.loc["exp_avg", "rule"] == "torch.optimizer_state.subclass_step"


# -- PyG batches (torch_geometric 2.8.1 data/data.py: BaseData.to -> apply(lambda x: x.to(device)) ->
# data/storage.py BaseStorage.apply -> recursive_apply) are the program's inputs.

def test_a_graph_batch_moved_by_data_to_is_inputs(tmp_path):
    got = blocks(tmp_path, {
        "x": [py(PYG + "data/data.py", 377, "<lambda>"), py(PYG + "data/storage.py", 891, "recursive_apply"),
              py(PYG + "data/storage.py", 198, "apply"), py(PYG + "data/data.py", 349, "apply"),
              py(PYG + "data/data.py", 376, "to"), py("/home/u/gnn/train.py", 40, "main")],
    }, name="pyg_batch")
    assert got.loc["x", "category"] == "inputs" and got.loc["x", "rule"] == "pyg.inputs.data_to"
