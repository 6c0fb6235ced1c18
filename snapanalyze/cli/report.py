"""`snapanalyze report`: one self-contained HTML postmortem."""

from __future__ import annotations

from . import main  # noqa: F401
