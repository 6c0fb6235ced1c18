"""`snapanalyze mcp` as a security boundary (issue 49, item 1), driven with the MCP SDK's own client: a run
directory inside the root whose files link out of it is refused (every file a command opens is checked by its
descriptor), and an argument no command takes (a NUL byte, 5,000 characters) gets a one-line error, never an
empty "Error executing tool"."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp", reason="mcp is a dev dependency: pip install -e '.[dev]'")

SCENARIO = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios" / "oom_fragmentation.pickle"


def _calls(root: Path, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    async def talk() -> list[Any]:
        server = StdioServerParameters(command=sys.executable, args=["-m", "snapanalyze", "mcp", "--root", str(root)])
        async with Client(server) as client:
            return [await client.call_tool(name, args) for name, args in calls]
    return anyio.run(talk)


def _text(result: Any) -> str:
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def test_files_that_link_out_of_the_root_are_never_read(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "run" / "rank=0").mkdir(parents=True)
    outside.mkdir()
    shutil.copy(SCENARIO, outside / "secret.pickle")
    shutil.copy(SCENARIO, root / "mine.pickle")
    (root / "run" / "rank=0" / "snapshot-final.pickle").symlink_to(outside / "secret.pickle")
    (root / "link.pickle").symlink_to(outside / "secret.pickle")
    answers = _calls(root, [("peaks", {"path": str(root / "run")}), ("summary", {"path": str(root / "run")}),
                            ("peaks", {"path": str(root / "link.pickle")}),
                            ("peaks", {"path": str(root / "mine.pickle")})])
    for answer in answers[:3]:
        assert answer.is_error and "outside the directories this server reads" in _text(answer), _text(answer)
        assert "secret" not in _text(answer) or "outside" in _text(answer)
    assert not answers[3].is_error, _text(answers[3])


def test_an_argument_no_command_takes_is_a_one_line_error(tmp_path: Path) -> None:
    shutil.copy(SCENARIO, tmp_path / "mine.pickle")
    nul, long = _calls(tmp_path, [("peaks", {"path": str(tmp_path / "mine\x00.pickle")}),
                                  ("attribute", {"path": str(tmp_path / "mine.pickle"), "at": "x" * 5000})])
    assert nul.is_error and "NUL byte" in _text(nul) and "\n" not in _text(nul).strip()
    assert long.is_error and "over 4,096" in _text(long) and len(_text(long)) < 400


def test_attribute_takes_the_source_its_notes_ask_for(tmp_path: Path) -> None:
    """attribute's notes tell the agent to pass the program's source: the tool takes it (issue 50, item 7), and
    with it the frames resolve to Class.method; ranks takes `path` as every other tool does."""
    import json
    root = Path(__file__).resolve().parents[2] / "fixtures"
    real = root / "real" / "cs336-medium-ctx128-inference-t2.11.pickle"
    source = root / "real" / "source" / "cs336-medium-ctx128-inference-t2.11"
    without, with_source, ranks = _calls(root, [
        ("attribute", {"path": str(real)}), ("attribute", {"path": str(real), "source": [str(source)]}),
        ("ranks", {"path": str(root / "runs" / "tp2_vision_encoder")})])
    assert not without.is_error and not with_source.is_error and not ranks.is_error, _text(ranks)
    plain, resolved = json.loads(_text(without)), json.loads(_text(with_source))
    assert any("--source" in note for note in plain["notes"])
    assert not any("--source DIR" in note for note in resolved["notes"])
    assert json.dumps(resolved) != json.dumps(plain)


def test_hidden_characters_in_a_file_name_reach_the_agent_escaped(tmp_path: Path) -> None:
    """Tag characters (U+E0000 block: text an LLM reads and a person does not see) and a bidi override in a file
    name come back as visible escapes in every string of the answer, not as hidden instructions."""
    name = tmp_path / "run\U000e0049\U000e0067\U000e006e\u202eevil.pickle"
    shutil.copy(SCENARIO, name)
    (answer,) = _calls(tmp_path, [("attribute", {"path": str(name)})])
    said = _text(answer)
    assert not answer.is_error, said
    assert "\\U000e0049" in said and "\\u202e" in said
    assert not any(0xE0000 <= ord(c) <= 0xE007F or c == "\u202e" for c in said)
