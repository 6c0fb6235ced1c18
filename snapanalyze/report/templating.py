"""The jinja2 environment every HTML fragment of snapanalyze is rendered with.

Contract: `environment()` returns one shared Environment over `report/templates/` with autoescaping on for
every template (so any text from a snapshot — frame names, file paths, metadata — is escaped), undefined
names raising, and the display filters: `bytes` (binary units), `int` (thousands separators), `share` (a
percentage), `duration` (µs in the unit that reads best) and `count` (`n|count("event")`: "1 event",
"2 events"), formatted as the terminal shows them. Every value a template prints keeps a number and its unit
on one line (the space between them becomes a no-break space), so a narrow window never splits "1.50 GiB".
`render(name, **values)` renders one template to Markup.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import jinja2
from markupsafe import Markup

from ..units import fmt_bytes, fmt_count, fmt_duration_us, fmt_share

_NUMBER_UNIT = re.compile(r"(?<=\d) (?=(?:B|KiB|MiB|GiB|TiB|PiB|µs|ms|s)\b)")


def _keep_units(value: Any) -> Any:
    """What a template prints, with no line break between a number and its unit (Markup, rendered already,
    is left as it is)."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return _NUMBER_UNIT.sub("\u00a0", value)
    return value


def _int(value: Any) -> str:
    return f"{int(value):,}"


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("snapanalyze.report", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, finalize=_keep_units)
    env.filters.update({"bytes": fmt_bytes, "int": _int, "share": fmt_share, "duration": fmt_duration_us,
                        "count": fmt_count})
    return env


def render(name: str, **values: Any) -> Markup:
    """Template `name` (relative to report/templates) rendered with `values`, as safe Markup."""
    return Markup(environment().get_template(name).render(**values))
