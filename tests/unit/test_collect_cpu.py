"""The collector's CPU capture (`snapanalyze.collect.cpu`): it emulates a CUDA device for real PyTorch code and
writes the snapshot CUDA's recorder would have, with the truth of every block. Each test runs a few lines of
real torch under the capture and reads the snapshot back through snapanalyze's own loader."""

from __future__ import annotations

import inspect
import itertools
import pickle
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import snapanalyze as sa  # noqa: E402
from snapanalyze.analyze.peaks import global_peak_index  # noqa: E402
from snapanalyze.analyze.summary import torch_version_bounds  # noqa: E402
from snapanalyze.analyze.trace_replay import replay_device  # noqa: E402
from snapanalyze.collect import cpu  # noqa: E402
from snapanalyze.collect.cpu.snapshot import VERSIONS  # noqa: E402

HERE = Path(__file__).resolve()


def _capture(**kw: Any) -> Any:
    ticks = itertools.count(1_780_000_000_000_000)
    return cpu.capture(clock=lambda: next(ticks), **kw)


def _load(tmp_path: Path, snapshot: dict[str, Any], name: str = "s.pickle") -> Any:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snapshot))
    return sa.load(path)


def _allocs(snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in snapshot["device_traces"][0] if e["action"] == "alloc"]


def _python(entry: dict[str, Any]) -> list[tuple[str, int, str]]:
    return [(f["filename"], f["line"], f["name"]) for f in entry["frames"] if f["filename"].endswith(".py")]


def test_tensors_made_inside_live_on_the_device_and_host_tensors_are_copied_by_to_cuda() -> None:
    before = torch.ones(1000)                                # made before the capture: the host's
    with _capture() as cap:
        cap.record_memory_history()
        on_device = torch.zeros(250)                         # 1,000 B on the device
        with cap.host():
            host = torch.ones(500)                           # the host's
        moved = host.to("cuda")                              # a copy: 2,000 B on the device
        again = moved.to("cuda")                             # already there: the same tensor
        cast = moved.to(torch.float16)                       # on the device, another dtype: 1,000 B
        back = moved.cpu()                                   # a copy on the host
        factory = torch.empty(64, device="cuda")             # device="cuda" means the device
        also = before.cuda()                                 # .cuda() of a host tensor: a copy
        held = [cap.is_device(t) for t in (on_device, host, moved, cast, back, factory, also, before)]
        snapshot = cap.snapshot()
    assert again is moved and back.data_ptr() != moved.data_ptr()
    assert held == [True, False, True, True, False, True, True, False]
    assert [e["size"] for e in _allocs(snapshot)] == [1000, 2000, 1000, 256, 4000]


def test_the_recorded_stack_is_the_programs_own_frames_as_cuda_records_them() -> None:
    def make() -> Any:
        return torch.ones(300)                               # the allocating line

    def softmax_of(x: Any) -> Any:
        return F.softmax(x, dim=-1)                          # torch's Python function with a __torch_function__ path

    with _capture() as cap:
        cap.record_memory_history()
        x = make()
        make_line = inspect.getsourcelines(make)[1] + 1
        call_line = inspect.currentframe().f_lineno - 2  # type: ignore[union-attr]
        y = softmax_of(x)
        snapshot = cap.snapshot()
    first, second = _allocs(snapshot)
    frames = _python(first)
    assert frames[0] == (str(HERE), make_line, "make")
    assert frames[1] == (str(HERE), call_line, inspect.currentframe().f_code.co_name)  # type: ignore[union-attr]
    assert not any("snapanalyze/collect" in f for f, _, _ in frames)           # none of the capture's own frames
    assert not any(f.endswith(("overrides.py", "_python_dispatch.py", "_compile.py", "eval_frame.py"))
                   for f, _, _ in frames)
    names = [(Path(f).name, n) for f, _, n in _python(second)]
    assert names[:2] == [("functional.py", "softmax"), ("test_collect_cpu.py", "softmax_of")]   # softmax once
    del y


def test_a_backward_allocates_on_the_autograd_device_thread() -> None:
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            return grad * 2                                  # Python on the device thread

    model = nn.Linear(32, 32)
    with cap_context(stacks="python") as (cap, snap):
        model.to("cuda")
        x = torch.randn(4, 32, requires_grad=True)
        Double.apply(model(x)).sum().backward()
    backward = [e for e in _allocs(snap()) if not e["frames"]]
    assert backward, "the C++ nodes' allocations carry no Python frame"
    custom = [e for e in _allocs(snap()) if e["frames"] and _python(e)[0][2] == "backward"]
    assert custom and all(not any(n == "<module>" or n.startswith("test_") for _, _, n in _python(e))
                          for e in custom)               # cut at the engine: the caller's frames are not there


class cap_context:
    """A capture recording from the start; `snap()` is its snapshot after the block ran."""

    def __init__(self, **record: Any) -> None:
        self.record = record
        self.cap: Any = None
        self.snapshot: dict[str, Any] | None = None

    def __enter__(self) -> tuple[Any, Any]:
        self.cap = _capture().__enter__()
        self.cap.record_memory_history(**self.record)
        return self.cap, lambda: self.snapshot

    def __exit__(self, *exc: Any) -> None:
        self.snapshot = self.cap.snapshot()
        self.cap.__exit__(*exc)


def test_stacks_all_names_the_op_the_autograd_node_and_the_cublas_workspace() -> None:
    model = nn.Linear(16, 16)
    with cap_context(stacks="all") as (cap, snap):
        model.cuda()
        model(torch.randn(8, 16)).sum().backward()
    entries = _allocs(snap())
    names = [[f["name"] for f in e["frames"]] for e in entries]
    assert any(any("generated::AddmmBackward0::apply" in n for n in ns) for ns in names)
    assert any(any("at::cuda::getNewWorkspace" in n for n in ns) for ns in names)
    workspaces = [e for e in entries if e["size"] == cpu.tracker.CUBLAS_WORKSPACE]
    assert len(workspaces) == 2                               # the program's thread and the autograd device thread
    forward = next(ns for ns in names if any("at::_ops::addmm::call" in n for n in ns)
                   and not any("autograd::generated" in n for n in ns))
    assert forward[-1] != "_start" and "_start" in forward   # the outermost Python frame comes after _start


def test_blocks_made_before_recording_started_have_no_alloc_entry_and_no_frames(tmp_path: Path) -> None:
    with _capture() as cap:
        weights = torch.randn(4096)                           # 16 KiB, before the window
        cap.record_memory_history()
        out = weights * 2
        snapshot = cap.snapshot()
    assert [e["size"] for e in _allocs(snapshot)] == [16384]
    blocks = [b for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert sorted((b["requested_size"], bool(b["frames"])) for b in blocks) == [(16384, False), (16384, True)]
    snap = _load(tmp_path, snapshot)
    timeline = sa.replay(snap)
    assert timeline[0].baseline_active == 16384
    del out


@pytest.mark.parametrize("version", VERSIONS)
def test_each_layout_loads_replays_exactly_and_dates_itself(tmp_path: Path, version: str) -> None:
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    with _capture() as cap:
        model.to("cuda")
        opt = torch.optim.AdamW(model.parameters())
        cap.record_memory_history()
        for _ in range(2):
            with torch.autograd.profiler.record_function("train_step"):
                model(torch.randn(32, 64)).square().mean().backward()
                opt.step()
                opt.zero_grad()
        cap.empty_cache()
        snapshot = cap.snapshot(version)
    snap = _load(tmp_path, snapshot)
    assert not snap.warnings
    lo, hi, _ = torch_version_bounds(snap)
    want = tuple(int(x) for x in version.split("."))
    assert lo <= want and (hi is None or want <= hi)
    timeline = sa.replay(snap)                                # the loader proves the replay against the end state
    check = replay_device(snap, timeline, 0)
    assert check.agrees and check.segment_events > 0      # the allocator model reproduces every segment event
    entry = snapshot["device_traces"][0][0]
    assert ("time_us" in entry) == (version != "2.1")
    assert ("pool_id" in entry) == (version == "2.13")
    if version != "2.1":
        names = {(a["name"], a["stage"]) for a in snapshot["external_annotations"]}
        assert {("train_step", "START"), ("train_step", "END"), ("Optimizer.step#AdamW.step", "START")} <= names
    if version in ("2.6", "2.11", "2.13"):
        frames = [f for e in snapshot["device_traces"][0] for f in e["frames"]]
        assert len({id(f) for f in frames}) < len(frames)     # one dict per distinct frame, shared


def test_the_truth_names_parameters_grads_optimizer_state_inputs_and_workspace(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 128))
    with _capture() as cap:
        with cap.host():
            batch = torch.randn(16, 128)
        cap.record_memory_history()
        model.to("cuda")
        opt = torch.optim.Adam(model.parameters())
        x = batch.to("cuda")
        model(x).square().mean().backward()
        opt.step()
        snapshot = cap.snapshot()
        index = len(snapshot["device_traces"][0]) - 1
        rows = cap.rows(index)
    by = {}
    for r in rows:
        by[r["lifecycle"]] = by.get(r["lifecycle"], 0) + int(r["size"])
    params = sum(p.numel() * 4 for p in model.parameters())
    assert by["weights"] == params and by["gradients"] == params and by["optimizer_state"] >= 2 * params
    assert by["inputs"] == 16 * 128 * 4 and by["workspace"] == 2 * cpu.tracker.CUBLAS_WORKSPACE
    snap = _load(tmp_path, snapshot)
    assert sum(int(r["size"]) for r in rows) == sa.replay(snap)[0].active_at(index)


def test_autograd_nodes_carry_the_module_whose_forward_made_them() -> None:
    class Head(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(64, 1000)

        def forward(self, x: Any) -> Any:
            return torch.log_softmax(self.proj(x), dim=-1)

    model = nn.Sequential(nn.Linear(64, 64), Head())
    with _capture() as cap:
        model.to("cuda")
        cap.record_memory_history()
        loss = model(torch.randn(8, 64)).sum()
        loss.backward()
        index = len(cap.snapshot()["device_traces"][0]) - 1
        facts = cap.facts(index)
        ever = [f for f in cap.facts(-1)]
    del ever
    backward = [f for f in facts if f.context.phase == "backward"]
    assert backward
    grads = [f for f in backward if "grad" in f.roles]
    assert {f.module for f in grads} >= {"0", "1.proj"}         # the .grad of each Linear, by the forward module


def test_an_allocation_past_the_capacity_is_an_oom_entry_and_the_programs_exception(tmp_path: Path) -> None:
    with _capture(capacity=64 << 20) as cap:
        cap.record_memory_history()
        keep = torch.empty(40 << 20, dtype=torch.uint8)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(40 << 20, dtype=torch.uint8)
        snapshot = cap.snapshot()
    oom = [e for e in snapshot["device_traces"][0] if e["action"] == "oom"]
    assert len(oom) == 1 and oom[0]["size"] == 40 << 20 and "addr" not in oom[0]
    snap = _load(tmp_path, snapshot)
    assert len(snap.ooms) == 1
    del keep


def test_the_same_program_writes_the_same_snapshot() -> None:
    def run() -> bytes:
        torch.manual_seed(0)
        with _capture() as cap:
            cap.record_memory_history()
            m = nn.Linear(32, 32).cuda()
            m(torch.randn(4, 32)).sum().backward()
            return pickle.dumps(cap.snapshot())
    assert run() == run()


def test_the_global_peak_holds_the_blocks_the_truth_lists(tmp_path: Path) -> None:
    with _capture() as cap:
        cap.record_memory_history()
        a = torch.empty(1 << 20)
        b = torch.empty(2 << 20)
        del b
        c = torch.empty(1 << 18)
        snapshot = cap.snapshot()
        snap = _load(tmp_path, snapshot)
        dt = sa.replay(snap)[0]
        index = global_peak_index(dt)
        rows = cap.rows(index)
    assert sorted(int(r["size"]) for r in rows) == [4 << 20, 8 << 20]
    del a, c


def test_attention_dropout_runs_in_a_fused_kernel_as_on_cuda_unless_math_is_forced() -> None:
    """CUDA's flash and memory-efficient kernels take attention dropout; the CPU's fused kernel does not and falls
    back to the math path, which materialises the scores. The capture runs the call as CUDA would."""
    def ops(forced: bool) -> list[str]:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with _capture() as cap:
            q = torch.randn(2, 4, 128, 32, requires_grad=True)
            cap.record_memory_history()
            if forced:
                with sdpa_kernel(SDPBackend.MATH):
                    F.scaled_dot_product_attention(q, q, q, dropout_p=0.1, is_causal=True)
            else:
                F.scaled_dot_product_attention(q, q, q, dropout_p=0.1, is_causal=True)
            return [cap.contexts[b.context].op.split(".")[1] for b in cap.blocks[1:]]
    assert set(ops(False)) == {"_scaled_dot_product_flash_attention_for_cpu"}
    assert "_safe_softmax" in ops(True)


def test_multihead_attention_dropout_runs_fused_too_but_its_explicit_weights_path_stays() -> None:
    """nn.MultiheadAttention calls SDPA inside its functional form, out of the mode's sight: without attention
    weights its dropout goes to the fused kernel as on CUDA; asking for the weights takes the explicit path, which
    materialises (and drops out) the scores on CUDA as well."""
    def ops(need_weights: bool) -> set[str]:
        with _capture() as cap:
            mha = torch.nn.MultiheadAttention(64, 4, dropout=0.1, batch_first=True)
            x = torch.randn(2, 128, 64, requires_grad=True)
            cap.record_memory_history()
            mha(x, x, x, need_weights=need_weights)
            return {cap.contexts[b.context].op.split(".")[1] for b in cap.blocks if cap.contexts[b.context].op}
    assert "_scaled_dot_product_flash_attention_for_cpu" in ops(False) and "_softmax" not in ops(False)
    assert {"_softmax", "bmm"} <= ops(True)


def test_dropout_keeps_a_one_byte_mask_as_cudas_fused_kernel_does() -> None:
    """On CUDA at::dropout runs native_dropout, whose mask for the backward is bool; the CPU's own path keeps a
    float mask. The capture runs the CUDA way: the output and a mask of one byte per element."""
    with _capture() as cap:
        x = torch.randn(64, 256, requires_grad=True)
        cap.record_memory_history()
        y = F.dropout(x.cuda(), p=0.1, training=True)
        sizes = sorted(b.size for b in cap.blocks if cap.contexts[b.context].op.startswith("aten.native_dropout"))
        assert sizes == [64 * 256, 64 * 256 * 4]           # the bool mask, the float32 output
        y.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape
        assert F.dropout(x, p=0.1, training=False) is x or torch.equal(F.dropout(x, p=0.1, training=False), x)
