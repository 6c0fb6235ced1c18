"""Forward-pass tensors kept across training steps (a retained graph, outputs held for logging) are found from
the trace alone, on the frame structure of two real training programs (cs336 on torch 2.11 and 2.10: their
own forward stacks and torch.optim's step wrapper), named in the OOM advice with exact bytes, and never claimed
for a loop that frees them, for tensors that legitimately wait across another optimizer's step, or at any
instant of the real traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import BASE, REAL_DIR, SnapshotBuilder, read_fixture_raw

from snapanalyze import attribute, load
from snapanalyze.analyze.kept import kept_across_step
from snapanalyze.analyze.oom import explain_oom
from snapanalyze.load.columns import to_snapshot
from snapanalyze.replay import replay
from snapanalyze.report import oom_text
from snapanalyze.report.run_documents import oom_document
from snapanalyze.session import load_rules
from snapanalyze.sites import site_text

MiB = 1 << 20
TRAINING = ["cs336-medium-ctx1024-training-t2.11.pickle", "cs336-step-annotations-t2.10.pickle"]
PER_FORWARD = load_rules().per_forward


def _real_stacks(name: str) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """The program's own forward allocation stacks (under a module call) and its optimizer step's stack."""
    trace = read_fixture_raw(REAL_DIR / name)["device_traces"][0]

    def in_step(e: dict[str, Any]) -> bool:
        return any(f["filename"].endswith("torch/optim/optimizer.py") and f["name"] == "wrapper"
                   for f in e.get("frames", []))

    first = next(i for i, e in enumerate(trace) if in_step(e))
    forward = [e["frames"] for e in trace[:first] if e["action"] == "alloc"
               and any(f["name"] == "_call_impl" for f in e["frames"])]
    return forward[:60], next(e["frames"] for e in trace if in_step(e) and e["action"] == "alloc")


class Loop:
    """A training loop on one segment, allocation by allocation, with the real program's stacks; the end state
    is laid out from what is live when it ends."""

    size = 2 * MiB

    def __init__(self, capacity_blocks: int) -> None:
        self.b, self.next, self.live = SnapshotBuilder(), BASE, {}
        self.total = capacity_blocks * self.size
        self.b.event("segment_alloc", BASE, self.total)

    def alloc(self, frames: list[dict[str, Any]]) -> int:
        a, self.next = self.next, self.next + self.size
        self.live[a] = True
        self.b.event("alloc", a, self.size, frames=frames)
        return a

    def free(self, a: int, frames: list[dict[str, Any]] | None = None) -> None:
        self.live[a] = False
        self.b.event("free_requested", a, self.size, frames=frames or [])
        self.b.event("free_completed", a, self.size, frames=frames or [])

    def step(self, frames: list[dict[str, Any]]) -> None:
        self.free(self.alloc(frames), frames)

    def fail(self, frames: list[dict[str, Any]], oom: bool = True) -> Any:
        """An OOM asking for the whole segment (or, without `oom`, an allocation), then the end state: live
        blocks, free runs merged (as the allocator merges them)."""
        if oom:
            self.b.event("oom", None, self.total, device_free=MiB, frames=frames)
        else:
            self.alloc(frames)
        blocks: list[tuple[int, int, str]] = []
        for on in self.live.values():
            if not on and blocks and blocks[-1][2] == "inactive":
                blocks[-1] = (blocks[-1][0] + self.size, 0, "inactive")
            else:
                blocks.append((self.size, self.size if on else 0, "active_allocated" if on else "inactive"))
        rest = self.total - (self.next - BASE)
        if rest:
            blocks.append((rest, 0, "inactive"))
        self.b.segment(BASE, blocks)
        self.raw = self.b.build()
        return to_snapshot(self.raw, "loop.pickle", "pickle")


def leaky_loop(name: str, leak: bool, steps: int = 3, rerun: int = 10,
               oom: bool = True) -> tuple[Any, list[int], set[int]]:
    """`steps` iterations (forward, backward freeing the forward's tensors unless `leak`, optimizer step), then
    `rerun` allocations of the next forward and an OOM. Returns the snapshot, the addresses kept across a step
    and those whose code ran again after the last step."""
    forward, step = _real_stacks(name)
    loop = Loop((steps + 1) * (len(forward) + 1))
    kept: list[int] = []
    made_by: dict[int, tuple[Any, ...]] = {}
    for _ in range(steps):
        made = [loop.alloc(frames) for frames in forward]
        made_by.update({a: _key(frames) for a, frames in zip(made, forward)})
        for a in made:
            if leak:
                kept.append(a)
            else:
                loop.free(a)
        loop.step(step)
    again = {_key(frames) for frames in forward[:rerun]}
    for frames in forward[:rerun]:
        loop.alloc(frames)
    return loop.fail(forward[rerun], oom), kept, {a for a in kept if made_by[a] in again}


def _key(frames: list[dict[str, Any]]) -> tuple[Any, ...]:
    return tuple((f["filename"], f["line"], f["name"]) for f in frames)


@pytest.mark.parametrize("name", TRAINING)
def test_forward_tensors_kept_across_steps_are_found_with_exact_bytes(name: str) -> None:
    snapshot, kept, reran = leaky_loop(name, leak=True)
    assert replay(snapshot).check_invariants() == []                   # the loop's end state is its trace's
    explanation = explain_oom(snapshot)
    assert explanation.verdicts[0].verdict == "live_exhaustion"
    index = int(explanation.ooms["index"].iloc[0])
    blocks = attribute(snapshot, at=index).blocks
    forward_made = blocks[blocks["category"].isin([*PER_FORWARD, "other"])]
    expected = forward_made[forward_made["address"].isin(reran)]
    assert int(expected["size"].sum()) >= len(reran) * Loop.size // 2     # most of the kept code is forward-made
    found = explanation.verdicts[0].kept
    assert found is not None
    assert found.bytes == int(expected["size"].sum()) and found.blocks == len(expected)
    assert found.steps == 3                                # made in the first step, outlived all three
    assert {c for c, _ in found.categories} <= {*PER_FORWARD, "other"}
    assert sum(n for _, n in found.categories) == found.bytes
    # the step began where the program's optimizer wrapper first allocated in the last iteration
    trace = snapshot.trace(0)
    assert found.step_index < index and trace.size[found.step_index] == Loop.size
    worded = oom_text.advice(explanation.verdicts[0], explanation.engine.name)
    kept_words = [w for w in worded if w.startswith("keep no forward-pass tensors across training steps")]
    assert worded[0] == kept_words[0]                      # a leak leads: fixed before anything is tuned
    assert len(kept_words) == 1 and f"before the training step at event {found.step_index:,}" in kept_words[0]
    assert "the oldest outlived 3 steps" in kept_words[0] and "retain_graph=True" in kept_words[0]
    # the optimizer keeps no state here (nothing of it is live), yet its step in the trace names the program
    assert explanation.engine.name == "training" and "optimizer.py" in str(explanation.engine.evidence)
    item = type("Item", (), {"explanation": explanation, "rank": 0, "tag": "final", "path": "loop.pickle"})
    doc = json.loads(json.dumps(oom_document([item], [], "loop.pickle")))
    assert doc["snapshots"][0]["ooms"][0]["kept_across_step"]["bytes"] == found.bytes


@pytest.mark.parametrize("name", TRAINING)
def test_a_loop_that_frees_its_forward_keeps_nothing(name: str) -> None:
    snapshot, _, _ = leaky_loop(name, leak=False)
    explanation = explain_oom(snapshot)
    assert explanation.verdicts[0].verdict == "live_exhaustion" and explanation.verdicts[0].kept is None
    assert not any(w.startswith("keep no forward-pass") for w in oom_text.advice(explanation.verdicts[0]))


def test_tensors_waiting_across_another_optimizers_step_are_not_kept() -> None:
    """A GAN step: the generator's forward runs, the discriminator steps, and the generator's tensors wait for
    its own backward. Its code has not run again, so nothing is claimed."""
    forward, step = _real_stacks(TRAINING[0])
    generator, discriminator = forward[:30], forward[30:]
    loop = Loop(200)
    fake = [loop.alloc(frames) for frames in generator]                # netG(noise), saved for G's backward
    for a in [loop.alloc(frames) for frames in discriminator]:          # netD(fake.detach()); D backward
        loop.free(a)
    loop.step(step)                                                     # optimizerD.step()
    for frames in discriminator[:5]:                                    # netD(fake) for G's loss, then OOM
        loop.alloc(frames)
    snapshot = loop.fail(discriminator[5])
    assert fake and explain_oom(snapshot).verdicts[0].kept is None


@pytest.mark.parametrize("name", TRAINING + ["cs336-step-user-metadata-t2.11.pickle"])
def test_no_instant_of_a_real_training_trace_claims_kept_tensors(name: str) -> None:
    snapshot = load(REAL_DIR / name)
    timeline = replay(snapshot)
    n = len(timeline[0])
    for index in range(0, n, n // 20):
        assert kept_across_step(attribute(snapshot, at=index, timeline=timeline), 0, index, PER_FORWARD) is None, index


def test_a_category_of_ones_own_may_be_per_forward(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[categories]]\nname = "my_cache"\nper_forward = true\n')
    assert load_rules(rules).categories["my_cache"].per_forward
    rules.write_text('[[categories]]\nname = "my_cache"\nper_forward = "yes"\n')
    from snapanalyze.errors import RulesError
    with pytest.raises(RulesError, match="per_forward must be true or false"):
        load_rules(rules)


def test_the_report_says_it_at_the_peak_and_at_the_failure_with_paths_redacted() -> None:
    """Without an OOM the verdict's "To lower the peak" leads with the kept tensors; with one, the OOM section's
    advice names them; with --redact-paths the site's path is redacted there too."""
    from snapanalyze.report.html import build_report

    snapshot, _, _ = leaky_loop(TRAINING[0], leak=True, oom=False)
    page = build_report(snapshot, samples=4)
    lower = page[page.index("To lower the peak"):]
    assert "keep no forward-pass tensors across training steps" in lower[:3000]
    assert "are still live at the peak" in lower[:3000] and "cs336_basics/model.py" in lower[:3000]
    redacted = build_report(leaky_loop(TRAINING[0], leak=True)[0], samples=4, redact_paths=True)
    words = redacted[redacted.index("keep no forward-pass tensors"):][:1500]
    assert "are still live at the failure" in words and "cs336-basics/" not in words and "model.py" in words


def test_attribute_names_them_at_the_peak_in_the_terminal_and_json(tmp_path: Path) -> None:
    """`snapanalyze attribute` at the peak of a loop that keeps its forward tensors: the typed result carries
    them, the JSON as `kept_across_step`, the terminal in the OOM advice's words; a loop that frees them says
    nothing of the kind."""
    import pickle

    from click.testing import CliRunner

    from snapanalyze.cli import main

    def attribute_cli(leak: bool) -> tuple[dict[str, Any], str]:
        forward, step = _real_stacks(TRAINING[1])
        loop = Loop(4 * (len(forward) + 1))
        for _ in range(3):
            made = [loop.alloc(frames) for frames in forward]
            for a in made if not leak else ():
                loop.free(a)
            loop.step(step)
        for frames in forward[:10]:
            loop.alloc(frames)
        loop.fail(forward[10], oom=False)
        path = tmp_path / f"loop-{leak}.pickle"
        path.write_bytes(pickle.dumps(loop.raw))
        doc = json.loads(CliRunner().invoke(main, ["attribute", str(path), "--format", "json"]).stdout)
        return doc, CliRunner().invoke(main, ["attribute", str(path)]).stdout

    doc, text = attribute_cli(leak=True)
    kept = doc["devices"][0]["kept_across_step"]
    assert kept is not None and kept["steps"] == 3 and kept["bytes"] > 0
    assert "keep no forward-pass tensors across training steps" in text and "still live at the global peak" in text
    doc, text = attribute_cli(leak=False)
    assert doc["devices"][0]["kept_across_step"] is None and "keep no forward-pass" not in text


def _cpu_training(leak: bool, steps: int = 3, keep_outputs: bool = False) -> Any:
    """A real training loop (tiny Llama-shaped model, torch.optim.AdamW, CPU torch) recorded by `CpuTrace`:
    `steps` iterations and the next forward. With `leak`, `backward(retain_graph=True)` and the loss kept
    keep every iteration's saved activations; without, `loss.item()` is all that is kept; `keep_outputs`
    stores each iteration's logits (detached) for logging."""
    torch = pytest.importorskip("torch")
    from cpu_trace import CpuTrace
    from tinylm import TinyLM

    torch.manual_seed(0)
    model = TinyLM(vocab=128, d=64, layers=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    history: list[Any] = []
    recorder = CpuTrace()
    with recorder:
        for step in range(steps + 1):
            ids = torch.randint(0, 128, (4, 64))
            logits = model(ids)
            if step == steps:
                break
            loss = torch.nn.functional.cross_entropy(logits.view(-1, 128), ids.view(-1))
            loss.backward(retain_graph=leak)
            history.append(loss if leak else loss.item())
            if keep_outputs:
                history.append(logits.detach())
            optimizer.step()
            optimizer.zero_grad()
        raw = recorder.snapshot()
    return to_snapshot(raw, "cpu-training.pickle", "pickle")


def test_a_real_training_loop_that_retains_its_graph_and_one_that_does_not() -> None:
    """The frames of a real torch 2.13 loop (AdamW's step through Optimizer's `wrapper`, modules through
    `_call_impl`, autograd on the calling thread): retaining the graph is found at the peak, with the three
    steps its oldest activations outlived and only forward-pass categories; the same loop with `.item()` claims
    nothing at any 20th instant."""
    leaky = _cpu_training(leak=True)
    assert replay(leaky).check_invariants() == []
    result = attribute(leaky)
    (instant,) = result.instants.values()
    found = kept_across_step(result, 0, instant.event_index, PER_FORWARD)
    assert found is not None and found.steps == 3
    assert {c for c, _ in found.categories} <= {*PER_FORWARD, "other"}
    b = result.blocks
    retained = b[(b["alloc_index"] >= 0) & (b["alloc_index"] < found.step_index)
                 & (b["category"] != "optimizer_state")]       # what the kept graphs hold (grads were set to None)
    # all but what the loss computation made (it has not run again in the last, unfinished iteration)
    assert 0.9 * int(retained["size"].sum()) <= found.bytes <= int(retained["size"].sum())
    clean = _cpu_training(leak=False)
    timeline = replay(clean)
    n = len(timeline[0])
    for index in range(0, n, 20):
        assert kept_across_step(attribute(clean, at=index, timeline=timeline), 0, index, PER_FORWARD) is None, index


def test_outputs_kept_for_logging_in_a_real_loop() -> None:
    """Each iteration's logits stored (detached) for logging: the earlier iterations' logits whose lm_head has
    run again are found, whole blocks of the logits' size (4 × 64 × 128 float32)."""
    snapshot = _cpu_training(leak=False, keep_outputs=True)
    result = attribute(snapshot)
    (instant,) = result.instants.values()
    found = kept_across_step(result, 0, instant.event_index, PER_FORWARD)
    assert found is not None and found.blocks >= 2 and found.bytes == found.blocks * 4 * 64 * 128 * 4
    assert site_text(found.site).endswith("tinylm.py:54:forward")            # TinyLM.forward's lm_head line


def test_the_notebook_shows_them_as_the_terminal_does() -> None:
    """An Attribution in Jupyter renders the command's typed result: the kept tensors' line included."""
    from snapanalyze.report.notebook import attribution_html

    snapshot, _, _ = leaky_loop(TRAINING[0], leak=True, oom=False)
    page = attribution_html(attribute(snapshot)).replace("\u00a0", " ")
    assert "<b>Kept across training steps:</b> keep no forward-pass tensors across training steps" in page
    clean, _, _ = leaky_loop(TRAINING[0], leak=False, oom=False)
    assert "Kept across training steps" not in attribution_html(attribute(clean))
