"""`snapanalyze mcp`: the analyses as tools for agents, over the Model Context Protocol (stdio).

Contract: `snapanalyze mcp --root DIR [--root DIR …]` serves, with the official Python SDK (the `mcp` extra,
imported only here), the tools summary, peaks, attribute, explain_oom, phases, ranks, diff, check and whatif. Each
answers with the JSON document its command prints with `--format json` — the same numbers, owners and
warnings — because each call runs that command in a child process: a hostile or huge input costs that
process, bounded by `--timeout` and the loader's memory limits, never the server. Every path an agent names
must resolve (symbolic links followed) inside a root given at start, else the call fails naming the roots. A
document longer than `--max-chars` is not sent: the call fails with its size and how to narrow the question
(a device, a rank, a phase, fewer sites). A command's own error (a damaged file, an unknown phase) comes back
as the call's error, in the command's one line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import click

from .. import confine
from ..report.text import visible
from . import main

NARROW = ("narrow the question: name one device (device=), one rank of a run (rank=), a phase (phase=), or "
          "fewer sites (top=)")


MAX_ARGUMENT = 4096             # characters of one argument (a path, a phase, a setting)
CHILD_MEMORY = 4 << 30          # --max-memory of each command the server runs


class Confined:
    """The directories an agent may read, and the checks every tool call makes."""

    def __init__(self, roots: tuple[str, ...], max_chars: int, timeout: float, jobs: int = 2) -> None:
        self.roots = tuple(Path(r).resolve(strict=True) for r in roots)
        self.max_chars, self.timeout = max_chars, timeout
        self.slots = threading.BoundedSemaphore(jobs)      # commands running at once, whatever the agent sends

    def path(self, given: str) -> str:
        """`given`, resolved, if it lies inside a root; else ToolError naming the roots."""
        from mcp.server.mcpserver.exceptions import ToolError

        _argument(given)
        try:
            resolved = Path(given).expanduser().resolve(strict=True)
        except (OSError, RuntimeError, ValueError):
            raise ToolError(f"{_shown(given)}: no such file or directory") from None
        if not any(resolved == root or resolved.is_relative_to(root) for root in self.roots):
            raise ToolError(f"{given}: outside the directories this server reads "
                            f"({', '.join(str(r) for r in self.roots)})")
        return str(resolved)

    def run(self, *args: Any, passing: tuple[int, ...] = (0,)) -> dict[str, Any]:
        """`snapanalyze ARGS --format json` in a child process: its document, or ToolError with its error line."""
        from mcp.server.mcpserver.exceptions import ToolError

        given = [str(a) for a in args if a is not None]
        for a in given:
            _argument(a)
        argv = [sys.executable, "-m", "snapanalyze", "--max-memory", f"{CHILD_MEMORY}B", *given, "--format", "json"]
        # Every file the command opens is checked against the roots by its descriptor (`snapanalyze.confine`): a
        # run directory's files that link out of a root, or a path swapped for a link after `path()`, are refused.
        env = {**os.environ, confine.ENV: os.pathsep.join(str(r) for r in self.roots)}
        with self.slots:
            child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                     text=True, env=env, start_new_session=True)
            try:
                stdout, stderr = child.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                _kill(child)
                raise ToolError(f"{args[0]} took longer than {self.timeout:g} s; {NARROW}") from None
            except BaseException:
                _kill(child)
                raise
        if child.returncode not in passing:
            lines = stderr.strip().splitlines()
            line = lines[-1] if lines else f"{args[0]} failed (exit {child.returncode})"
            raise ToolError(line if len(line) <= min(self.max_chars, 2000) else
                            line[:min(self.max_chars, 2000)] + f"… ({len(line):,} characters)")
        done = subprocess.CompletedProcess(argv, child.returncode, stdout, stderr)
        if len(done.stdout) > self.max_chars:
            raise ToolError(f"the {args[0]} document is {len(done.stdout):,} characters, over this server's cap of "
                            f"{self.max_chars:,}; {NARROW}")
        document: dict[str, Any] = _inert(json.loads(done.stdout))
        return document


def _inert(value: Any) -> Any:
    """`value` (a JSON document) with every string's control, format, line and paragraph separator characters
    written as visible escapes (`report.text.visible`): an agent reads the answer as text, and a file name or a
    frame holding tag characters or a bidi override would otherwise reach it as hidden instructions."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, list):
        return [_inert(v) for v in value]
    if isinstance(value, dict):
        return {visible(k) if isinstance(k, str) else k: _inert(v) for k, v in value.items()}
    return value


def _kill(child: subprocess.Popen[str]) -> None:
    """The command and every process it started (its own session): none outlives the call."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


def _shown(text: str) -> str:
    return repr(text[:80] + ("…" if len(text) > 80 else ""))


def _argument(text: str) -> None:
    """ToolError for an argument no command takes: a NUL byte, or longer than MAX_ARGUMENT."""
    from mcp.server.mcpserver.exceptions import ToolError
    if "\x00" in text:
        raise ToolError(f"{_shown(text)}: an argument holds a NUL byte")
    if len(text) > MAX_ARGUMENT:
        raise ToolError(f"an argument of {len(text):,} characters, over {MAX_ARGUMENT:,}: {_shown(text)}")


def _option(name: str, value: Any) -> tuple[Any, ...]:
    return (name, value) if value is not None else ()


def build_server(roots: tuple[str, ...], max_chars: int = 60_000, timeout: float = 300.0) -> Any:
    """The MCPServer with every tool, reading only under `roots`."""
    from mcp.server.mcpserver import MCPServer

    box = Confined(roots, max_chars, timeout)
    server = MCPServer("snapanalyze", instructions=(
        "Explain GPU memory peaks of PyTorch programs from allocator snapshots (torch.cuda.memory._snapshot "
        "pickles, or run directories of ranks). Numbers are exact bytes from the allocator's trace; a category "
        "flagged inferred was decided by sizes or names, not proven by a frame. Start with summary or peaks, "
        "then attribute the peak; explain_oom says why an allocation failed. Paths must lie under: "
        + ", ".join(str(r) for r in box.roots)))

    def analysed(source: list[str] | None, rules: str | None) -> tuple[Any, ...]:
        """--source DIR … and --rules FILE, each a path under the roots: what changes an attribution's answer."""
        return (*(x for d in source or [] for x in ("--source", box.path(d))),
                *(("--rules", box.path(rules)) if rules is not None else ()))

    @server.tool()
    def summary(path: str, rank: int | None = None, tag: str | None = None) -> dict[str, Any]:
        """What a snapshot (or each rank of a run directory) holds: format, torch version, devices, events."""
        return box.run("summary", box.path(path), *_option("--rank", rank), *_option("--tag", tag))

    @server.tool()
    def peaks(path: str, top: int = 5, device: int | None = None, rank: int | None = None,
              tag: str | None = None) -> dict[str, Any]:
        """The baseline and the highest peaks of active bytes per device, with when they happened."""
        return box.run("peaks", box.path(path), "--top", top, *_option("--device", device),
                       *_option("--rank", rank), *_option("--tag", tag))

    @server.tool()
    def attribute(path: str, at: str = "peak", phase: str | None = None, device: int | None = None,
                  top: int = 3, rank: int | None = None, tag: str | None = None, source: list[str] | None = None,
                  rules: str | None = None, explain: bool = False) -> dict[str, Any]:
        """Every live byte at an instant (at: peak, peak:N, event:I, time:T; or the peak of a phase) by
        category, with the allocation sites that hold the most; categories sum exactly to the active bytes.
        Returns {source, estimate, ooms (the file's failed allocations: see explain_oom), devices: [{instant,
        active_bytes, reserved_bytes, categories: [{category, bytes, share, inferred_bytes, top_frames}],
        kept_across_step (forward-pass tensors a training loop kept across optimizer steps)}], notes, rules}.
        source: folders of the program's checkout (under the roots), which resolve its frames to Class.method
        and tell an MLP's Linear from an attention one; rules: a TOML file of your own rules; explain: the rule
        that decided each byte."""
        instant = ("--phase", phase) if phase is not None else ("--at", at)
        return box.run("attribute", box.path(path), *instant, "--top", top, *_option("--device", device),
                       *_option("--rank", rank), *_option("--tag", tag), *analysed(source, rules),
                       *(("--explain",) if explain else ()))

    @server.tool()
    def explain_oom(path: str, rank: int | None = None, tag: str | None = None, source: list[str] | None = None,
                    rules: str | None = None) -> dict[str, Any]:
        """Why each allocation failed (fragmentation, live exhaustion, pressure from outside the allocator),
        the allocation that failed and the code that asked for it, forward-pass tensors a training loop kept
        across optimizer steps (kept_across_step), and what would have helped; without a failure, how far the
        peak stayed from the device's capacity. source, rules: as for attribute."""
        return box.run("explain-oom", box.path(path), *_option("--rank", rank), *_option("--tag", tag),
                       *analysed(source, rules))

    @server.tool()
    def phases(path: str, device: int | None = None, rank: int | None = None,
               tag: str | None = None, source: list[str] | None = None, rules: str | None = None) -> dict[str, Any]:
        """Per phase or request span: active bytes before, at the peak and after, and the transient (peak over
        the phase's start), with the categories allocated inside it. source, rules: as for attribute."""
        return box.run("phases", box.path(path), *_option("--device", device), *_option("--rank", rank),
                       *_option("--tag", tag), *analysed(source, rules))

    @server.tool()
    def ranks(path: str, tag: str | None = None, source: list[str] | None = None,
              rules: str | None = None) -> dict[str, Any]:
        """Every rank of a run directory (path) at its peak, the median rank, and the outliers with the
        categories that make their difference. source, rules: as for attribute."""
        return box.run("ranks", box.path(path), *_option("--tag", tag), *analysed(source, rules))

    @server.tool()
    def diff(a: str, b: str, phase: str | None = None, device: int | None = None, source: list[str] | None = None,
             rules: str | None = None) -> dict[str, Any]:
        """B against A: peaks aligned, bytes per category and the stacks that grew, shrank, appeared or vanished.
        source, rules: as for attribute."""
        return box.run("diff", box.path(a), box.path(b), *_option("--phase", phase), *_option("--device", device),
                       *analysed(source, rules))

    @server.tool()
    def check(path: str, budget: str | None = None, max_transient: str | None = None, phase: str | None = None,
              maxima: list[str] | None = None) -> dict[str, Any]:
        """Measure against limits (sizes with units: 70GiB): a peak budget, a transient maximum (over the
        window start, or a phase's start with phase=), per-category maxima (maxima: ["logits=4GiB"]);
        `passed` says whether all held."""
        limits = [x for m in maxima or [] for x in ("--max", m)]
        return box.run("check", box.path(path), *_option("--budget", budget),
                       *_option("--max-transient", max_transient), *_option("--phase", phase), *limits,
                       passing=(0, 1))

    @server.tool()
    def whatif(path: str, settings: list[str] | None = None, capacity: str | None = None,
               device: int | None = None, rank: int | None = None, tag: str | None = None) -> dict[str, Any]:
        """Replay the trace through a simulator of PyTorch's caching allocator: how far it reproduces the
        recorded segment events and block addresses (first_divergence null: all), and, with settings
        (["expandable_segments:True", "max_split_size_mb:512"], as PYTORCH_ALLOC_CONF writes them), the
        reserved peak and whether each OOM's request would have been served (capacity with units: 80GiB)."""
        changes = [x for s in settings or [] for x in ("--set", s)]
        return box.run("whatif", box.path(path), *changes, *_option("--capacity", capacity),
                       *_option("--device", device), *_option("--rank", rank), *_option("--tag", tag))

    return server


@main.command(name="mcp")
@click.option("--root", "roots", multiple=True, required=True,
              type=click.Path(exists=True, file_okay=False, path_type=str),
              help="A directory the agent may read snapshots and runs under (repeatable); nothing else is read.")
@click.option("--max-chars", default=60_000, show_default=True, type=click.IntRange(1000),
              help="The largest document sent back; a larger one asks the agent to narrow its question.")
@click.option("--timeout", default=300.0, show_default=True, type=click.FloatRange(1),
              help="Seconds one tool call may take.")
def mcp_command(roots: tuple[str, ...], max_chars: int, timeout: float) -> None:
    """Serve the analyses to agents over MCP on stdio (pip install 'snapanalyze[mcp]')."""
    try:
        server = build_server(roots, max_chars, timeout)
    except ImportError:
        from ..errors import UsageError
        raise UsageError("snapanalyze mcp needs the MCP SDK: pip install 'snapanalyze[mcp]'") from None
    server.run("stdio")
