"""Notebook display for the core types, without the core depending on the layer that renders it.

Contract: a class that inherits `HtmlDisplay` gets `_repr_html_`, which Jupyter calls: it renders through
the function registered for the class's name (`register`). The renderers live in `report.notebook`, which
registers them when imported; the package's `__init__` names it with `provide` (the one place that knows
both sides), and it is imported on the first display. With no renderer `_repr_html_` returns None and
Jupyter falls back to the repr. Nothing here imports another snapanalyze module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

_renderers: dict[str, Callable[[Any], str]] = {}
_providers: list[str] = []


def register(class_name: str, render: Callable[[Any], str]) -> None:
    """Render objects of the class named `class_name` with `render` (object → HTML fragment)."""
    _renderers[class_name] = render


def provide(module: str) -> None:
    """Import `module` (which calls `register`) the first time an object without a renderer is displayed."""
    if module not in _providers:
        _providers.append(module)


class HtmlDisplay:
    """Mixin: Jupyter shows the object as the HTML its registered renderer makes."""

    def _repr_html_(self) -> str | None:
        name = type(self).__name__
        while name not in _renderers and _providers:
            importlib.import_module(_providers.pop(0))
        render = _renderers.get(name)
        return render(self) if render is not None else None
