"""Command line: argv → library calls → text or JSON on stdout, exit codes. Nothing else lives here.

Contract: `main` is the click group; each module of this package registers the thin commands of one area
(load, analyse, render), and is imported only when one of its commands runs (COMMANDS names the module of
each), so that `snapanalyze peaks` does not pay for importing what `report` needs. One place
(`_Group.invoke`) maps SnapanalyzeError — and a MemoryError or RecursionError, which only hostile or
enormous input causes — to a one-line message on stderr and its exit code (2); `--debug` shows the traceback
instead. (`check` prints an exceeded limit as its result on stdout and exits 1: not an error.) It also
prints each InputWarning once, as one `snapanalyze: warning:` line on stderr, and keeps them for
`common.emit_json` to list under `warnings`. `--max-memory` bounds what reading any input may cost
(`load.safe_pickle.Limits`). `run` is the console entry point: `main`, then a fast exit (`fastexit`).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import click

from .. import __version__, fastexit
from ..errors import InputWarning, SnapanalyzeError
from .common import SIZE, WARNINGS_KEY

# command → the module of this package that defines it
COMMANDS = {"summary": "analyze", "peaks": "analyze", "attribute": "analyze", "convert": "convert",
            "ranks": "run", "phases": "run", "explain-oom": "run", "diff": "compare", "capacity": "compare",
            "check": "compare", "report": "report", "mcp": "mcp", "budget": "budget",
            "whatif": "whatif", "estimate": "estimate"}


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            importlib.import_module(f"{__name__}.{COMMANDS[cmd_name]}")   # its decorators register it
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        seen: list[str] = ctx.meta.setdefault(WARNINGS_KEY, [])
        shown = warnings.showwarning

        def show(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
            if not issubclass(category, InputWarning):
                shown(message, category, *args, **kwargs)
            elif str(message) not in seen:
                seen.append(str(message))
                click.echo(f"snapanalyze: warning: {_visible(str(message))}", err=True)

        with warnings.catch_warnings():
            warnings.simplefilter("always", InputWarning)
            warnings.showwarning = show
            try:
                return super().invoke(ctx)
            except (SnapanalyzeError, MemoryError, RecursionError) as exc:
                if (ctx.obj or {}).get("debug"):
                    raise
                click.echo(f"snapanalyze: error: {_message(exc)}", err=True)
                ctx.exit(getattr(exc, "exit_code", 2))


def _visible(text: str) -> str:
    from ..report.text import one_line
    return one_line(text)


def _message(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "ran out of memory (an input larger than this machine can analyse, or one built to exhaust it; " \
               "--max-memory refuses such inputs early)"
    if isinstance(exc, RecursionError):
        return "an input nests deeper than any snapshot does (refused)"
    return _visible(str(exc))            # an error may quote a name from the input


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show a traceback on errors.")
@click.option("--max-memory", type=SIZE, default=None, envvar="SNAPANALYZE_MAX_MEMORY",
              help="Refuse an input whose reading would take more memory than this (e.g. 8GiB); default: a "
                   "few times the file's size.")
@click.version_option(__version__, prog_name="snapanalyze")
@click.pass_context
def main(ctx: click.Context, debug: bool, max_memory: int | None) -> None:
    """Explain GPU memory peaks from PyTorch allocator snapshots."""
    from ..session.inputs import reading_limits
    ctx.obj = {"debug": debug}
    if max_memory is not None:
        ctx.with_resource(reading_limits(max_memory))


def run() -> None:
    """The console script and `python -m snapanalyze`: `main`, then the process ends through `fastexit.exit`
    with main's exit code, without tearing down what the command loaded."""
    try:
        main()
        code: int | str | None = 0
    except SystemExit as exc:
        code = exc.code
    fastexit.exit(code)
