"""Options and output helpers shared by the commands."""

from __future__ import annotations

import json
from typing import Any

import click

FORMATS = click.Choice(["table", "json"])


def input_argument(func: Any) -> Any:
    """FILE (a snapshot file or a run directory) plus --rank/--tag to choose inside a run directory."""
    func = click.option("--tag", default=None, help="Snapshot tag in a run directory (default: final).")(func)
    func = click.option("--rank", type=int, default=None, help="Rank in a run directory.")(func)
    return click.argument("file", type=click.Path(dir_okay=True, path_type=str))(func)


def emit_json(doc: Any) -> None:
    click.echo(json.dumps(doc, indent=2, default=str))
