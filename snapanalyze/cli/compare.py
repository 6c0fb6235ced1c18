"""Commands that compare snapshots or runs: diff, capacity, check."""

from __future__ import annotations

from . import main  # noqa: F401
