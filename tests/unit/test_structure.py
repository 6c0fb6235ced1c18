"""What the call tree's structure says, and what it does not: attention is scores from projections, a softmax and a
weighted sum (or a kernel that is all of it), not "a softmax runs beneath"; a trunk that calls sublayers of other
roles is none of them; a deep stack of layers does not work for its caller; a line's only call, read from the
source, shows the C++ op that made its allocation; nn.Transformer's layers are a model's own structure.

Stacks are written innermost frame first, as torch records them; the library structure each follows is named at it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from conftest import BASE, SnapshotBuilder, write_pickle

from snapanalyze import attribute, load

MiB = 1 << 20
SP = "/opt/conda/lib/python3.11/site-packages/"
Frame = tuple[str, int, str]


def py(path: str, line: int, function: str) -> Frame:
    return (path if path.startswith("/") else SP + path, line, function)


CALL = [py("torch/nn/modules/module.py", 1794, "_call_impl"), py("torch/nn/modules/module.py", 1783,
                                                                  "_wrapped_call_impl")]
LINEAR = [py("torch/nn/modules/linear.py", 134, "forward"), *CALL]
NORM = [py("torch/nn/functional.py", 2993, "layer_norm"), py("torch/nn/modules/normalization.py", 228, "forward"),
        *CALL]
CONV = [py("torch/nn/modules/conv.py", 548, "forward"), *CALL]
BN = [py("torch/nn/functional.py", 2822, "batch_norm"), py("torch/nn/modules/batchnorm.py", 193, "forward"), *CALL]
SOFTMAX = [py("torch/nn/functional.py", 2140, "softmax")]
CE = [py("torch/nn/functional.py", 3494, "cross_entropy")]


def blocks(tmp_path: Path, stacks: dict[str, list[Frame]], size: int = 4 * MiB, source: Path | None = None,
           name: str = "structure") -> pd.DataFrame:
    """Each named stack allocates one live block; the blocks' rows by name."""
    b = SnapshotBuilder()
    b.segment(BASE, [(size, size, "active_allocated")] * len(stacks))
    for k, frames in enumerate(stacks.values()):
        b.alloc(BASE + k * size, size, frames=[{"filename": f, "line": line, "name": n} for f, line, n in frames])
    snap = load(write_pickle(tmp_path / f"{name}.pickle", b.build()), source=source)
    got = attribute(snap).blocks.sort_values("address")
    return got.assign(name=list(stacks)).set_index("name")


# transformers 5.x generate(): GenerationMixin._sample calls the model, then `probs = softmax(next_token_scores)`
# and multinomial: a softmax over the vocabulary beside the whole model, no projection of its own.
GEN = "transformers/generation/utils.py"
LLAMA = "transformers/models/llama/modeling_llama.py"


def test_a_samplers_softmax_is_no_attention_but_a_softmax_beside_projections_is(tmp_path: Path) -> None:
    sample = [py(GEN, 3195, "_sample"), py(GEN, 2500, "generate"), py("/home/u/serve.py", 30, "main")]
    model = [*CALL, py(LLAMA, 470, "forward"), *CALL, *sample[:1], *sample[1:]]
    attn = [py("/home/u/model.py", 40, "forward"), *CALL, py("/home/u/model.py", 80, "forward"), *CALL,
            py("/home/u/train.py", 12, "main")]
    got = blocks(tmp_path, {
        "probs": [*SOFTMAX, *sample],
        "hidden": [*NORM, *model],
        "q": [*LINEAR, *attn],
        "weights": [*SOFTMAX, *attn],
    })
    assert got.loc["probs", "category"] != "attention" and got.loc["hidden", "category"] != "attention"
    assert got.loc["q", "category"] == got.loc["weights", "category"] == "attention"
    assert got.loc["q", "rule"] == "calltree.attention_scores" and "softmax" in got.loc["q", "reason"]


def test_a_block_calling_nn_multiheadattention_beside_its_mlp_is_a_trunk_not_attention(tmp_path: Path) -> None:
    """A hand-written ViT block (torch 2.14): `h = self.norm1(x); x = x + self.attn(h, h, h)[0]` runs
    nn.MultiheadAttention — torch's own module, no model code of its own — then `x + self.mlp(self.norm2(x))`
    calls the user's MLP: the block's own allocations (its norms, residual adds) are neither attention nor MLP."""
    vit = "/home/u/vit.py"
    block = [py(vit, 64, "forward"), *CALL, py(vit, 90, "forward"), *CALL, py("/home/u/train.py", 20, "main")]
    mha = [py("torch/nn/functional.py", 7104, "multi_head_attention_forward"),
           py("torch/nn/modules/activation.py", 1495, "forward"), *CALL]
    mlp = [py(vit, 40, "forward"), *CALL, py(vit, 66, "forward"), *block[1:]]
    got = blocks(tmp_path, {
        "norm1": [*NORM, *block],
        "attn_out": [*mha, py(vit, 65, "forward"), *block[1:]],
        "fc1": [*LINEAR, *mlp],
        "gelu": [py("torch/nn/functional.py", 1900, "gelu"), *mlp],
    })
    assert got.loc["norm1", "category"] == "other"
    assert got.loc["attn_out", "category"] == "attention"              # torch's functional MHA rule
    assert got.loc["fc1", "category"] == got.loc["gelu", "category"] == "mlp"


def test_a_whole_resnet_does_not_work_for_the_line_that_scores_its_classes(tmp_path: Path) -> None:
    """timm 1.0.31 resnet: main → ResNet.forward → forward_features → BasicBlock.forward (convs, BatchNorm) and
    forward_head (the fc); main then takes `logits.softmax(-1)`. A deep stack of layers is no building block of
    main: its convolutions are no attention of main's softmax."""
    res = "timm/models/resnet.py"
    main = [py("/home/u/eval.py", 22, "main")]
    net = [*CALL, py(res, 809, "forward"), *CALL, *main]
    feats = [py(res, 777, "forward_features"), *net]
    got = blocks(tmp_path, {
        "stem": [*CONV, *feats],
        "bn": [*BN, py(res, 146, "forward"), *CALL, *feats],
        "conv": [*CONV, py(res, 145, "forward"), *CALL, *feats],
        "fc": [*LINEAR, py(res, 804, "forward_head"), *net],
        "probs": [*SOFTMAX, *main],
        "loss": [*CE, *main],
    })
    assert set(got.loc[["stem", "bn", "conv", "fc"], "category"]) == {"other"}
    assert got.loc["probs", "category"] != "attention"


# torch 2.14 torch/nn/modules/transformer.py: TransformerEncoderLayer.forward (norm_first) runs
# `x = x + self._sa_block(self.norm1(x), ...)` (947) and `x = x + self._ff_block(self.norm2(x))` (950); _sa_block
# calls self.self_attn (nn.MultiheadAttention) and dropout1, _ff_block linear1 → activation → dropout → linear2 →
# dropout2.
TF = "torch/nn/modules/transformer.py"


def test_nn_transformer_layers_are_model_structure_not_their_callers_role(tmp_path: Path) -> None:
    user = [py("/home/u/lm.py", 30, "forward"), *CALL, py("/home/u/train.py", 40, "main")]
    layer = [py(TF, 947, "forward"), *CALL, py(TF, 542, "forward"), *CALL, *user]
    ff = [py(TF, 981, "_ff_block"), py(TF, 950, "forward"), *layer[1:]]
    got = blocks(tmp_path, {
        "attn": [py("torch/nn/functional.py", 7104, "multi_head_attention_forward"),
                 py("torch/nn/modules/activation.py", 1495, "forward"), *CALL, py(TF, 968, "_sa_block"), *layer],
        "drop1": [py("torch/nn/functional.py", 1497, "dropout"), py("torch/nn/modules/dropout.py", 73, "forward"),
                  *CALL, py(TF, 971, "_sa_block"), *layer],
        "ff1": [*LINEAR, *ff],
        "ff_drop": [py("torch/nn/functional.py", 1497, "dropout"), py("torch/nn/modules/dropout.py", 73, "forward"),
                    *CALL, *ff],
        "norm1": [*NORM, *layer],
        "residual": layer,
        "lm_head": [*LINEAR, py("/home/u/lm.py", 32, "forward"), *user[1:]],
    })
    assert got.loc["attn", "category"] == got.loc["drop1", "category"] == "attention"
    assert got.loc["ff1", "category"] == got.loc["ff_drop", "category"] == "mlp"
    assert got.loc["ff1", "rule"] == "torch.mlp.transformer_layer"
    assert got.loc["norm1", "category"] == got.loc["residual", "category"] == "other"
    assert got.loc["lm_head", "category"] != "attention"


def test_the_only_call_on_a_line_shows_the_c_op_that_made_its_allocation(tmp_path: Path) -> None:
    """F.scaled_dot_product_attention is a C builtin: with stacks="python" its allocation's innermost frame is the
    user's line. The source names the call there, which shows the attention; without it, nothing does."""
    root = tmp_path / "src"
    (root / "u").mkdir(parents=True)
    lines = ["import torch.nn.functional as F", "", "", "class Mixer:", "    def forward(self, x):",
             "        q, k, v = self.qkv(x).chunk(3, dim=-1)",
             "        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)", "        return self.out(y)"]
    (root / "u" / "mixer.py").write_text("\n".join(lines) + "\n")
    here = [py("/home/u/u/mixer.py", 7, "forward"), *CALL, py("/home/u/u/train.py", 9, "main")]
    stacks = {"qkv": [*LINEAR, py("/home/u/u/mixer.py", 6, "forward"), *here[1:]], "y": here}
    without = blocks(tmp_path, stacks, name="plain")
    assert set(without["category"]) == {"other"}
    with_source = blocks(tmp_path, stacks, source=root, name="read")
    assert set(with_source["category"]) == {"attention"}
    assert with_source.loc["qkv", "rule"] == "calltree.attention"           # the projection: by the call tree
    assert "scaled_dot_product_attention" in with_source.loc["qkv", "reason"]



def test_a_sublayer_reached_from_the_forward_and_from_a_checkpoints_recomputation_speaks_by_its_role(
        tmp_path: Path) -> None:
    """torch.utils.checkpoint_sequential (use_reentrant=True, torch 2.14 checkpoint.py): a block's forward runs
    from the model's forward (checkpoint.py:771 under checkpoint_sequential) and again from CheckpointFunction's
    backward (checkpoint.py:318) on the autograd thread, whose stacks hold no caller above it. Its MLP, called from
    one line of it, is one node with two callers; recorded first from the recomputation, it must still have its
    role before the forward's block asks it (the block is then a trunk, and the loss's log-softmax in main owns
    none of the block's norms)."""
    net = "/home/u/resmlp.py"
    mlp = [py(net, 25, "forward"), *CALL, py(net, 35, "forward"), *CALL]
    recompute = [py("torch/utils/checkpoint.py", 771, "forward"), py("torch/utils/checkpoint.py", 318, "backward"),
                 py("torch/autograd/function.py", 366, "apply")]
    forward = [py("torch/utils/checkpoint.py", 771, "forward"), py("torch/utils/checkpoint.py", 790,
                                                                   "checkpoint_sequential"),
               py(net, 49, "forward"), *CALL, py("/home/u/train.py", 65, "main")]
    gelu = [py("torch/nn/functional.py", 1900, "gelu"), py("torch/nn/modules/activation.py", 816, "forward"), *CALL]
    got = blocks(tmp_path, {
        "re_fc": [*LINEAR, *mlp, *recompute],
        "re_gelu": [*gelu, *mlp, *recompute],
        "re_norm": [*NORM, py(net, 35, "forward"), *CALL, *recompute],
        "fc": [*LINEAR, *mlp, *forward],
        "gelu": [*gelu, *mlp, *forward],
        "norm": [*NORM, py(net, 35, "forward"), *CALL, *forward],
        "stem": [*LINEAR, py(net, 48, "forward"), *CALL, py("/home/u/train.py", 65, "main")],
        "loss": [*CE, py("/home/u/train.py", 65, "main")],
    })
    assert set(got.loc[["fc", "gelu"], "category"]) == {"mlp"}
    assert got.loc["norm", "category"] == "other"
    assert got.loc["loss", "category"] == "logits"


def test_sublayers_run_inline_from_lines_of_their_own_speak_per_line(tmp_path: Path) -> None:
    """torchvision 0.29 vision_transformer.py EncoderBlock.forward: `x = self.ln_1(input)` (113),
    `x, _ = self.self_attention(x, x, x, need_weights=False)` (114: nn.MultiheadAttention), `x = x + input` (116),
    `y = self.ln_2(x)` (118), `y = self.mlp(y)` (119: MLPBlock, an nn.Sequential of Linear, GELU, Dropout, Linear,
    Dropout — torch's own modules, no model code of its own), `return x + y` (120). One function holds both
    sublayers: each line speaks for what its own calls made (the MLP's by the order the trace shows: a projection,
    the activation, a projection again); its norms and residual adds are neither's."""
    vit = "torchvision/models/vision_transformer.py"
    enc = [*CALL, py(vit, 157, "forward"), *CALL, py(vit, 298, "forward"), *CALL, py("/home/u/eval.py", 20, "main")]
    seq = [py("torch/nn/modules/container.py", 250, "forward"), *CALL]
    mha = [py("torch/nn/functional.py", 7104, "multi_head_attention_forward"),
           py("torch/nn/modules/activation.py", 1495, "forward"), *CALL]
    got = blocks(tmp_path, {
        "ln_1": [*NORM, py(vit, 113, "forward"), *enc],
        "attn": [*mha, py(vit, 114, "forward"), *enc],
        "residual": [py(vit, 116, "forward"), *enc],
        "ln_2": [*NORM, py(vit, 118, "forward"), *enc],
        "fc1": [*LINEAR, *seq, py(vit, 119, "forward"), *enc],
        "gelu": [py("torch/nn/functional.py", 1900, "gelu"), py("torch/nn/modules/activation.py", 816, "forward"),
                 *CALL, *seq, py(vit, 119, "forward"), *enc],
        "fc2": [*LINEAR, *seq, py(vit, 119, "forward"), *enc],            # the same stack as fc1's, after GELU
        "out": [py(vit, 120, "forward"), *enc],
    })
    assert got.loc["attn", "category"] == "attention"
    assert set(got.loc[["fc1", "gelu", "fc2"], "category"]) == {"mlp"}
    assert "on that line" in got.loc["fc1", "reason"] and got.loc["fc1", "inferred"]
    assert set(got.loc[["ln_1", "residual", "ln_2", "out"], "category"]) == {"other"}
