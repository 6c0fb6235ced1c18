"""Command line: argv → library calls → text or JSON on stdout, exit codes. Nothing else lives here.

Contract: `main` is the click group; each module of this package registers the thin commands of one
area (load, analyse, render), and is imported only when one of its commands runs (COMMANDS names the module
of each), so that `snapanalyze peaks` does not pay for importing what `report` needs. One place
(`_Group.invoke`) maps SnapanalyzeError to a one-line message on stderr and its exit code (2; `check` uses 1
for a budget exceeded); `--debug` shows the traceback instead.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from .. import __version__
from ..errors import SnapanalyzeError

# command → the module of this package that defines it
COMMANDS = {"summary": "analyze", "peaks": "analyze", "attribute": "analyze", "convert": "convert",
            "ranks": "run", "phases": "run", "explain-oom": "run", "diff": "compare", "capacity": "compare",
            "check": "compare", "report": "report"}


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            importlib.import_module(f"{__name__}.{COMMANDS[cmd_name]}")   # its decorators register it
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SnapanalyzeError as exc:
            if (ctx.obj or {}).get("debug"):
                raise
            click.echo(f"snapanalyze: error: {exc}", err=True)
            ctx.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show a traceback on errors.")
@click.version_option(__version__, prog_name="snapanalyze")
@click.pass_context
def main(ctx: click.Context, debug: bool) -> None:
    """Explain GPU memory peaks from PyTorch allocator snapshots."""
    ctx.obj = {"debug": debug}

