"""Command line: argv → library calls → text or JSON on stdout, exit codes. Nothing else lives here.

Contract: `main` is the click group; each module of this package registers the thin commands of one
area (load, analyse, render). One place (`_Group.invoke`) maps SnapanalyzeError to a one-line message on
stderr and its exit code (2; `check` uses 1 for a budget exceeded); `--debug` shows the traceback instead.
"""

from __future__ import annotations

from typing import Any

import click

from .. import __version__
from ..errors import SnapanalyzeError


class _Group(click.Group):
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


from . import analyze, compare, convert, report, run  # noqa: E402,F401  (register the commands)
