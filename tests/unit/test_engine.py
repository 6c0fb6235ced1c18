"""analyze.engine: the program behind the live blocks, named from their frames — the verdict's advice is
given in its words, so a wrong engine means advice for knobs the user does not have."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from snapanalyze import attribute, load
from snapanalyze.analyze.engine import PYTORCH, detect_engine, engine_from_tables

SCENARIOS = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"
SITE = "/usr/lib/python3.12/site-packages/"


def tables(stacks: dict[int, list[tuple[str, str]]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Frame and stack tables from {stack_id: [(file, function), …] innermost first}."""
    frames: dict[tuple[str, str], int] = {}
    rows = []
    for sid, stack in stacks.items():
        for depth, frame in enumerate(stack):
            fid = frames.setdefault(frame, len(frames))
            rows.append({"stack_id": sid, "depth": depth, "frame_id": fid})
    frame_table = pd.DataFrame({"frame_id": list(frames.values()),
                                "filename": [f for f, _ in frames], "line": [7] * len(frames),
                                "name": [n for _, n in frames]})
    return frame_table, pd.DataFrame(rows, columns=["stack_id", "depth", "frame_id"])


def blocks(stack_ids: list[int], categories: list[str] | None = None) -> pd.DataFrame:
    return pd.DataFrame({"stack_id": stack_ids, "size": [1 << 20] * len(stack_ids),
                         "category": categories or ["other"] * len(stack_ids)})


def test_an_engine_frame_names_the_engine_with_its_evidence_and_share() -> None:
    frames, stacks = tables({
        0: [(SITE + "vllm/v1/worker/gpu_model_runner.py", "execute_model"), (SITE + "vllm/v1/engine/core.py", "run")],
        1: [(SITE + "torch/nn/modules/linear.py", "forward"), (SITE + "vllm/v1/engine/core.py", "run")],
        2: [("/app/serve.py", "main")],
    })
    engine = engine_from_tables(frames, stacks, blocks([0, 0, 1, 2, -1]))
    assert (engine.name, engine.label) == ("vllm", "vLLM")
    assert (engine.blocks, engine.framed) == (3, 4) and engine.share == pytest.approx(0.75)
    # The frame that the most blocks share (the engine's entry point here), path shortened, with its line.
    assert engine.evidence_text() == "vllm/v1/engine/core.py:7:run"


def test_a_serving_engine_wins_over_the_model_code_it_runs() -> None:
    frames, stacks = tables({
        0: [(SITE + "transformers/models/llama/modeling_llama.py", "forward"),
            (SITE + "sglang/srt/model_executor/model_runner.py", "forward")],
        1: [(SITE + "transformers/models/llama/modeling_llama.py", "forward")],
    })
    engine = engine_from_tables(frames, stacks, blocks([0, 1]))
    assert engine.name == "sglang" and engine.blocks == 1


def test_transformers_alone_is_transformers() -> None:
    frames, stacks = tables({0: [(SITE + "transformers/generation/utils.py", "generate"), ("/app/run.py", "main")]})
    assert engine_from_tables(frames, stacks, blocks([0])).name == "transformers"


def test_training_is_recognised_by_its_frames_or_by_its_state() -> None:
    frames, stacks = tables({
        0: [(SITE + "torch/optim/adamw.py", "_init_group"), ("/app/train.py", "main")],
        1: [(SITE + "torch/_tensor.py", "__getitem__"), ("/app/train.py", "main")],
    })
    engine = engine_from_tables(frames, stacks, blocks([0, 1]))
    assert engine.name == "training" and engine.evidence_text() == "torch/optim/adamw.py:7:_init_group"
    # A function filter: torch/_tensor.py only counts in `backward`, not in any tensor method.
    assert engine_from_tables(frames, stacks, blocks([1])).name == "pytorch"
    # No frames at all, but gradients live: a training program all the same, and the evidence says why.
    engine = engine_from_tables(frames, stacks, blocks([-1, -1], ["gradients", "weights"]))
    assert engine.name == "training" and engine.evidence_text() == "live gradients" and engine.framed == 0


def test_windows_paths_match_too() -> None:
    frames, stacks = tables({0: [("C:\\venv\\Lib\\site-packages\\vllm\\worker\\worker.py", "load_model")]})
    assert engine_from_tables(frames, stacks, blocks([0])).name == "vllm"


def test_nothing_recognised_is_plain_pytorch() -> None:
    frames, stacks = tables({0: [("/app/model.py", "forward")]})
    engine = engine_from_tables(frames, stacks, blocks([0, 0, -1]))
    assert (engine.name, engine.label, engine.evidence) == (PYTORCH.name, PYTORCH.label, None)
    assert engine.framed == 2 and engine.blocks == 0
    empty = engine_from_tables(frames.iloc[:0], stacks.iloc[:0], blocks([]))
    assert empty.name == "pytorch" and empty.framed == 0


@pytest.mark.parametrize(("scenario", "name"), [
    ("prompt_logprobs_logits", "vllm"), ("oom_live_exhaustion", "sglang"),
    ("hf_eager_attention_threshold", "transformers"), ("concurrent_requests", "transformers"),
])
def test_the_fixtures_engines_come_from_their_live_blocks(scenario: str, name: str) -> None:
    snap = load(SCENARIOS / f"{scenario}.pickle")
    engine = detect_engine(snap, attribute(snap).blocks)
    assert engine.name == name and engine.blocks > 0 and engine.evidence
    assert str(engine.evidence_text()).startswith(name + "/")
