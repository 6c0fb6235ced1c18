"""Options and output helpers shared by the commands: input and size options, the terminal's width, JSON."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..errors import UsageError
from ..units import parse_bytes

FORMATS = click.Choice(["table", "json"])
F = TypeVar("F", bound=Callable[..., Any])
WARNINGS_KEY = "snapanalyze.warnings"     # ctx.meta: the InputWarnings of this command, in order


_BARE_NUMBER = re.compile(r"^\s*[0-9_.]+\s*$")


class _Size(click.ParamType):
    """A size as people write it (70GiB, 512 MiB, 1.5GB, 4096B, 0) → bytes. A number without a unit other
    than 0 is refused (`--budget 70` means 70 GiB to a person, 70 bytes to a parser): click's usage error."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value)
        try:
            n = parse_bytes(text)
        except UsageError as exc:
            self.fail(str(exc), param, ctx)
        if _BARE_NUMBER.match(text) and n != 0:
            self.fail(f"{text.strip()!r} has no unit: write {text.strip()}GiB, {text.strip()}MiB or "
                      f"{text.strip()}B (bytes)", param, ctx)
        return n


SIZE = _Size()


RULES_HELP = "A TOML file of your own categories and rules, layered over the shipped packs."


def rules_option(help: str = RULES_HELP) -> Callable[[F], F]:
    """--rules FILE: a user's rules (`rules_for` reads it)."""
    return click.option("--rules", "rules_file", type=click.Path(dir_okay=False, path_type=str), default=None,
                        help=help)


def device_option(help: str = "Only this device.") -> Callable[[F], F]:
    return click.option("--device", type=int, default=None, help=help)


def format_option(choices: click.Choice = FORMATS, help: str | None = None) -> Callable[[F], F]:
    """--format (as `fmt`), a table unless asked."""
    return click.option("--format", "fmt", type=choices, default="table", show_default=True, help=help)


def input_argument(func: Any) -> Any:
    """FILE (a snapshot file or a run directory) plus --rank/--tag to choose inside a run directory."""
    func = click.option("--tag", default=None, help="Snapshot tag in a run directory (default: final).")(func)
    func = click.option("--rank", type=int, default=None, help="Rank in a run directory.")(func)
    return click.argument("file", type=click.Path(dir_okay=True, path_type=str))(func)


ENV_SOURCE_KEY = "snapanalyze.env_source"   # ctx.meta: --env-source was given


def source_option(func: Any) -> Any:
    """--source DIR (repeatable): the program's own source, so frames resolve to their classes and lines;
    --env-source: installed packages' frames read from this Python's site-packages too (`source_for`)."""
    def remember(ctx: click.Context, _: click.Parameter, value: bool) -> None:
        ctx.meta[ENV_SOURCE_KEY] = value
    func = click.option("--env-source", is_flag=True, expose_value=False, callback=remember,
                        help="Also read installed packages' frames (transformers, timm, …) from this Python's "
                             "site-packages; a file decides only if every frame the trace records in it fits, so "
                             "install the versions that ran.")(func)
    return click.option("--source", "source", multiple=True, type=click.Path(file_okay=False, path_type=str),
                        help="The program's source checkout (repeatable): frames resolve to Class.method and the "
                             "code at their line, which rules can key on.")(func)


def rules_for(rules_file: str | None) -> Any:
    """The rule set of --rules, read once per process while the file is unchanged, so each rank's work may
    ask for it again."""
    try:
        stamp = os.stat(rules_file).st_mtime_ns if rules_file is not None else None
    except OSError:
        stamp = None                       # load_rules says what is wrong with it
    return _rules(rules_file, stamp)


@functools.lru_cache(maxsize=8)
def _rules(rules_file: str | None, stamp: int | None) -> Any:
    from ..session.inputs import load_rules
    return load_rules(rules_file)


def source_for(source: tuple[str, ...]) -> Any:
    """The `session.source_index` of --source DIR … and --env-source (None for neither; a UsageError
    names a missing directory), which each load resolves its frames with."""
    from ..session.inputs import source_index
    ctx = click.get_current_context(silent=True)
    return source_index(list(source), environment=bool(ctx is not None and ctx.meta.get(ENV_SOURCE_KEY)))


def terminal_width() -> int | None:
    """Columns to fit text output into: $COLUMNS when set, else the terminal's width when stdout is one; None
    (no fitting: lines as long as their content, stable for scripts) when output is piped or captured."""
    columns = os.environ.get("COLUMNS", "")
    if columns.strip().isdigit() and int(columns) > 0:
        return int(columns)
    stream = sys.stdout
    if hasattr(stream, "isatty") and stream.isatty():
        return shutil.get_terminal_size().columns
    return None


def echo_text(text: str, width: int | None) -> None:
    """Print terminal text, its long lines wrapped to `width` (tables arrive fitted already), every character
    a terminal would act on written visibly (`text.visible`: names and metadata come from the snapshot)."""
    from ..report.text import visible, wrap
    click.echo(wrap(visible(text), width))


def emit_json(doc: Any) -> None:
    """Print `doc` as JSON; a dict gets `warnings`: what the inputs' validation found (empty when none)."""
    if isinstance(doc, dict):
        ctx = click.get_current_context(silent=True)
        doc = {**doc, "warnings": list(ctx.meta.get(WARNINGS_KEY, [])) if ctx is not None else []}
    click.echo(json.dumps(doc, indent=2, default=str, allow_nan=False))
