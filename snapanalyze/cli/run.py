"""Commands over a run directory's ranks and events: ranks, explain-oom."""

from __future__ import annotations

from . import main  # noqa: F401
