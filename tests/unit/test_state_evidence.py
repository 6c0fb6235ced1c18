"""What the trace window says of the blocks from before it (no frames): real torch programs run under the CPU
capture, each attributed at its peak and compared with what the capture knows each block is.

- LBFGS keeps replacing history of a size no parameter has: the older history is optimizer state;
- Module._apply frees a model moved off the device at a run's end: those blocks are its parameters;
- a backward that makes each parameter's gradient shows the parameters' sizes;
- the backward's own cuBLAS workspace is no gradient;
- a block that runs in the forward and again in a checkpoint's recomputation keeps its sublayer's role.
"""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import snapanalyze as sa  # noqa: E402
from snapanalyze.analyze.peaks import global_peak_index  # noqa: E402
from snapanalyze.collect import cpu  # noqa: E402
from snapanalyze.collect.cpu.truth import lifecycle_label  # noqa: E402


def _run(tmp_path: Path, program: Any, name: str) -> pd.DataFrame:
    """Capture `program(cap)`, attribute the snapshot at its peak; each block's category, rule and lifecycle
    beside what the capture knows it is (`truth`: weights, gradients, optimizer_state, inputs, …)."""
    ticks = itertools.count(1_780_000_000_000_000)
    with cpu.capture(clock=lambda: next(ticks)) as cap:
        held = program(cap)
        snapshot = cap.snapshot("2.13")
        path = tmp_path / f"{name}.pickle"
        path.write_bytes(pickle.dumps(snapshot))
        snap = sa.load(path)
        index = global_peak_index(sa.replay(snap)[0])
        rows = {int(r["address"]): r for r in cap.rows(index, lifecycle_label)}
    del held
    blocks = sa.attribute(snap, device=0).blocks
    of = lambda key: blocks["address"].map(lambda a: str(rows[int(a)][key]) if int(a) in rows else "?")  # noqa: E731
    return blocks.assign(truth=of("label"), op=of("op"), cls=of("class"), node=of("node"))


def _share(blocks: pd.DataFrame, truth: str, category: str) -> float:
    mine = blocks[blocks["truth"] == truth]
    return float(mine.loc[mine["category"] == category, "size"].sum() / mine["size"].sum())


def test_lbfgs_history_from_before_the_window_is_optimizer_state(tmp_path: Path) -> None:
    def program(cap: Any) -> Any:
        model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 1))
        model = model.cuda()
        x, y = torch.randn(512, 32, device="cuda"), torch.randn(512, 1, device="cuda")
        opt = torch.optim.LBFGS(model.parameters(), max_iter=4, history_size=6)

        def closure() -> Any:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            return loss
        for step in range(3):
            if step == 2:
                cap.record_memory_history()
            opt.step(closure)
        return model, opt
    got = _run(tmp_path, program, "lbfgs")
    got = got[got["size"] > 512]           # scalars (LBFGS's ys, the final Linear's bias) share sizes by chance
    history = got[(got["truth"] == "optimizer_state") & (got["alloc_index"] < 0)]
    # kept from before (more of the state the step keeps replacing), or freed inside the window by the step
    assert "state.replaced_optimizer_state" in set(history["rule"])
    assert set(history["rule"]) <= {"state.replaced_optimizer_state", "state.freed_by_optimizer"}
    assert _share(got, "weights", "optimizer_state") == 0.0
    assert _share(got, "weights", "weights") == 1.0            # the gradients' sizes show the parameters
    assert set(got.loc[got["truth"] == "weights", "rule"]) == {"state.copies_per_gradient"}


def test_a_model_moved_off_the_device_by_module_apply_frees_its_parameters(tmp_path: Path) -> None:
    def program(cap: Any) -> Any:
        model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 64)).cuda()
        cap.record_memory_history()
        with torch.no_grad():                                 # no graph keeps a weight alive past the move
            out = model(torch.randn(256, 64, device="cuda"))
        model.cpu()                                           # a trainer's teardown: the weights leave the device
        return model, out
    got = _run(tmp_path, program, "teardown")
    weights = got[got["truth"] == "weights"]
    assert len(weights) and set(weights["category"]) == {"weights"}
    assert set(weights["rule"]) == {"state.freed_by_module_move"}
    assert weights["inferred"].all()


def test_the_backward_threads_cublas_workspace_is_no_gradient(tmp_path: Path) -> None:
    def program(cap: Any) -> Any:
        cap.record_memory_history()
        model = nn.Sequential(nn.Linear(128, 128), nn.Tanh(), nn.Linear(128, 1)).cuda()
        model(torch.randn(64, 128, device="cuda")).sum().backward()
        return model
    got = _run(tmp_path, program, "workspace")
    workspace = got[got["truth"] == "workspace"]
    assert len(workspace) == 2                                # the main thread's and the device thread's
    assert set(workspace["category"]) == {"workspace"}


def test_a_checkpointed_block_keeps_its_mlps_role_in_the_forward_and_the_recomputation(tmp_path: Path) -> None:
    """torch.utils.checkpoint (use_reentrant=True) runs a block's forward under no_grad and again in the backward:
    the block's frame is reached from two stacks (its callers differ above it), its MLP sublayer from one line of
    it. The block is a trunk (a norm and a residual beside an MLP) in both."""
    class FF(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128)

        def forward(self, x: Any) -> Any:
            return self.fc2(self.act(self.fc1(x)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.ff = nn.LayerNorm(128), FF()

        def forward(self, x: Any) -> Any:
            return x + self.ff(self.norm(x))

    def program(cap: Any) -> Any:
        from torch.utils.checkpoint import checkpoint_sequential
        blocks = nn.Sequential(*[Block() for _ in range(4)]).cuda()
        head = nn.Linear(128, 10).cuda()
        cap.record_memory_history()
        x = torch.randn(512, 128, device="cuda", requires_grad=True)
        loss = F.cross_entropy(head(checkpoint_sequential(blocks, 2, x, use_reentrant=True)),
                               torch.randint(0, 10, (512,), device="cuda"))
        loss.backward()
        return blocks, head
    got = _run(tmp_path, program, "checkpoint")
    logits = got[got["category"] == "logits"]
    assert logits["op"].str.contains("softmax|nll").all()       # the loss's own blocks only, not the blocks'
    trunk = got[got["cls"].str.endswith(".Block") | got["cls"].str.endswith("LayerNorm")]
    assert len(trunk) and set(trunk["category"]) == {"other"}
    assert "mlp" in set(got.loc[got["cls"].str.contains("FF|GELU|Linear"), "category"])
