"""Loading: any snapshot file or run directory → a validated columnar Snapshot.

Contract: `load(path, rank=None, tag=None, limits=None)` is the single entry point. A file is read safely
(`safe_pickle`, within `limits`) and columnarised (`columns`); a directory is a run (`runs`): the chosen
rank's converted Parquet tables (`parquet`) are read when present, else its pickle. Either way the result is
checked once (`validate`): what the analysis can live with becomes the snapshot's `warnings`, each also
issued as an InputWarning. Problems raise BadInputError (the file and what is wrong with it) or UsageError
(an ambiguous choice in a run).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from .. import fastexit
from ..errors import InputWarning
from ..model import Snapshot
from .runs import resolve
from .safe_pickle import Limits
from .validate import validate


def load(path: str | Path, rank: int | None = None, tag: str | None = None,
         limits: Limits | None = None, frames: bool = True) -> Snapshot:
    """Load a snapshot: pickle (plain or gzip), torch.save zip, JSON, or one snapshot of a run directory.
    `frames=False` (for analyses that never look at stacks, like peaks) keeps no frames from a file, whose
    frames lists are then freed as soon as the columns exist."""
    snapshot = validate(_read(path, rank, tag, limits, frames))
    for text in snapshot.warnings:
        warnings.warn(f"{snapshot.source}: {text}", InputWarning, stacklevel=2)
    return snapshot


def _read(path: str | Path, rank: int | None, tag: str | None, limits: Limits | None, frames: bool) -> Snapshot:
    if os.path.isdir(path):      # never raises: a name too long is then read as a file, which says so
        chosen = resolve(path, rank, tag)
        if chosen.is_dir():
            from .parquet import read_tables  # pyarrow only for a converted run
            return read_tables(chosen)
        path = chosen
    from .columns import to_snapshot  # the pickle path (and pandas, for its annotations) only when needed
    from .safe_pickle import read_raw

    raw = read_raw(path, limits)
    # Frames kept pin most of the raw objects' memory whatever else is freed, so when the process will end
    # without freeing them (fastexit), freeing the rest as the columns are built only costs time.
    kept = frames and fastexit.keep(raw)
    return to_snapshot(raw.data, str(path), raw.container, raw.stream_bytes, consume=not kept, frames=frames)


__all__ = ["load", "Limits"]
