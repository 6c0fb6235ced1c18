"""`snapanalyze mcp` over stdio, talked to with the MCP SDK's own client: every tool answers with the JSON
document its command prints, paths outside the roots given at start are refused, a document over the cap asks
the agent to narrow its question, and a command's error comes back as the call's error."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner

from snapanalyze.cli import main

pytest.importorskip("mcp", reason="mcp is a dev dependency: pip install -e '.[dev]'")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SCENARIO = FIXTURES / "scenarios" / "oom_fragmentation.pickle"
RUN = FIXTURES / "runs" / "tp2_vision_encoder"
TOOLS = {"summary", "peaks", "attribute", "explain_oom", "phases", "ranks", "diff", "check", "whatif"}


def _session(calls: list[tuple[str, dict[str, Any]]], *options: str) -> tuple[set[str], list[Any]]:
    """Start `snapanalyze mcp --root fixtures OPTIONS` as a subprocess, list its tools and make `calls`."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    async def talk() -> tuple[set[str], list[Any]]:
        server = StdioServerParameters(command=sys.executable,
                                       args=["-m", "snapanalyze", "mcp", "--root", str(FIXTURES), *options])
        async with Client(server) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            return tools, [await client.call_tool(name, args) for name, args in calls]
    return anyio.run(talk)


def _text(result: Any) -> str:
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def _cli_json(*args: str) -> dict[str, Any]:
    done = CliRunner().invoke(main, [*args, "--format", "json"])
    assert done.exit_code in (0, 1), done.output
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def test_every_tool_answers_with_its_commands_document(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.pickle"
    outside.write_bytes(SCENARIO.read_bytes())
    tools, (summary, attribute, oom, ranks, check, whatif, escaped, missing, damaged) = _session([
        ("summary", {"path": str(SCENARIO)}),
        ("attribute", {"path": str(SCENARIO), "top": 2}),
        ("explain_oom", {"path": str(SCENARIO)}),
        ("ranks", {"path": str(RUN)}),
        ("check", {"path": str(SCENARIO), "budget": "10GiB"}),
        ("whatif", {"path": str(SCENARIO), "settings": ["expandable_segments:True"]}),
        ("summary", {"path": str(outside)}),
        ("summary", {"path": str(FIXTURES / "no-such.pickle")}),
        ("summary", {"path": str(FIXTURES / "README.md")}),
    ])
    assert tools == TOOLS
    for result, args in ((summary, ["summary", str(SCENARIO)]), (attribute, ["attribute", str(SCENARIO), "--top", "2"]),
                         (oom, ["explain-oom", str(SCENARIO)]), (ranks, ["ranks", str(RUN)]),
                         (check, ["check", str(SCENARIO), "--budget", "10GiB"]),
                         (whatif, ["whatif", str(SCENARIO), "--set", "expandable_segments:True"])):
        assert not result.is_error, _text(result)
        assert json.loads(_text(result)) == _cli_json(*args), args
    assert json.loads(_text(check))["passed"] is False                          # a limit exceeded is an answer
    failed = json.loads(_text(oom))["snapshots"][0]["ooms"][0]["failed_allocation"]
    assert failed["owner"].endswith("vocab_parallel_embedding.py:120:process_weights_after_loading")
    assert escaped.is_error and "outside the directories this server reads" in _text(escaped)
    assert missing.is_error and "no such file or directory" in _text(missing)
    assert damaged.is_error and "README.md" in _text(damaged)                    # the command's own one line


def test_a_document_over_the_cap_asks_to_narrow_the_question() -> None:
    _, (big,) = _session([("attribute", {"path": str(RUN)})], "--max-chars", "2000")
    assert big.is_error
    assert "characters, over this server's cap of 2,000; narrow the question: name one device" in _text(big)
