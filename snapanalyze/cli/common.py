"""Options and output helpers shared by the commands."""

from __future__ import annotations

import json
from typing import Any

import click

from ..errors import UsageError
from ..units import parse_bytes

FORMATS = click.Choice(["table", "json"])
WARNINGS_KEY = "snapanalyze.warnings"     # ctx.meta: the InputWarnings of this command, in order


class _Size(click.ParamType):
    """A size as people write it (70GiB, 512 MiB, 1.5GB, 4096) → bytes; a bad one is a one-line UsageError."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            return parse_bytes(value)
        except UsageError as exc:
            raise UsageError(f"{param.opts[0] if param is not None else 'size'}: {exc}") from None


SIZE = _Size()


def input_argument(func: Any) -> Any:
    """FILE (a snapshot file or a run directory) plus --rank/--tag to choose inside a run directory."""
    func = click.option("--tag", default=None, help="Snapshot tag in a run directory (default: final).")(func)
    func = click.option("--rank", type=int, default=None, help="Rank in a run directory.")(func)
    return click.argument("file", type=click.Path(dir_okay=True, path_type=str))(func)


def source_option(func: Any) -> Any:
    """--source DIR (repeatable): the program's own source, so frames resolve to their classes and lines."""
    return click.option("--source", "source", multiple=True, type=click.Path(file_okay=False, path_type=str),
                        help="The program's source checkout (repeatable): frames resolve to Class.method and the "
                             "code at their line, which rules can key on.")(func)


def rules_for(rules_file: str | None, source: tuple[str, ...] = ()) -> Any:
    """The rule set of --rules, bound to the --source roots (a UsageError names a missing one)."""
    from ..analyze.rules import load_rules
    from ..load.source import SourceIndex
    return load_rules(rules_file, source=SourceIndex.of(list(source)))


def emit_json(doc: Any) -> None:
    """Print `doc` as JSON; a dict gets `warnings`: what the inputs' validation found (empty when none)."""
    if isinstance(doc, dict):
        ctx = click.get_current_context(silent=True)
        doc = {**doc, "warnings": list(ctx.meta.get(WARNINGS_KEY, [])) if ctx is not None else []}
    click.echo(json.dumps(doc, indent=2, default=str))
