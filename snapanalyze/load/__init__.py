"""Loading: any snapshot file (or, later, run directory) → a columnar Snapshot.

Contract: `load(path)` is the single entry point; it reads the container safely (`safe_pickle`) and
columnarises it (`columns`), raising BadInputError with the file name and the problem otherwise.
"""

from __future__ import annotations

from pathlib import Path

from ..model import Snapshot
from .columns import to_snapshot
from .safe_pickle import read_raw


def load(path: str | Path) -> Snapshot:
    """Load a snapshot file: pickle (plain or gzip), torch.save zip, or JSON."""
    raw, container = read_raw(path)
    return to_snapshot(raw, str(path), container)


__all__ = ["load"]
