"""Loading: any snapshot file or run directory → a columnar Snapshot.

Contract: `load(path, rank=None, tag=None)` is the single entry point. A file is read safely
(`safe_pickle`) and columnarised (`columns`); a directory is a run (`runs`): the chosen rank's converted
Parquet tables (`parquet`) are read when present, else its pickle. Problems raise BadInputError (the file
and what is wrong with it) or UsageError (an ambiguous choice in a run).
"""

from __future__ import annotations

from pathlib import Path

from ..model import Snapshot
from .parquet import read_tables
from .runs import resolve


def load(path: str | Path, rank: int | None = None, tag: str | None = None) -> Snapshot:
    """Load a snapshot: pickle (plain or gzip), torch.save zip, JSON, or one snapshot of a run directory."""
    if Path(path).is_dir():
        chosen = resolve(path, rank, tag)
        if chosen.is_dir():
            return read_tables(chosen)
        path = chosen
    from .columns import to_snapshot  # the pickle path (and pandas, for its annotations) only when needed
    from .safe_pickle import read_raw

    raw, container = read_raw(path)
    return to_snapshot(raw, str(path), container)


__all__ = ["load"]
