"""Loading: any snapshot file or run directory → a validated columnar Snapshot.

Contract: `load(path, rank=None, tag=None, limits=None, frames=True, source=None)` is the single entry
point. A file is read safely (`safe_pickle`, within `limits`) and columnarised (`columns`); a directory is
a run (`runs`): the chosen rank's converted Parquet tables (`parquet`) are read when present, else its
pickle. Either way the result is checked once (`validate`): what the analysis can live with becomes the
snapshot's `warnings`, each also issued as an InputWarning. With `source` (`source.SourceIndex`, or the
program's checkout as paths) the kept frames are resolved to their source, which the snapshot carries
(`Snapshot.sources`): the analyses read it and open no file. Problems raise BadInputError (the file and
what is wrong with it) or UsageError (an ambiguous choice in a run).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

from ..errors import InputWarning
from ..model import Snapshot
from .runs import resolve
from .safe_pickle import Limits
from .source import SourceIndex
from .validate import validate

SourceRoots = SourceIndex | str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None


def load(path: str | Path, rank: int | None = None, tag: str | None = None,
         limits: Limits | None = None, frames: bool | str = True, source: SourceRoots = None) -> Snapshot:
    """Load a snapshot: pickle (plain or gzip), torch.save zip, JSON, or one snapshot of a run directory.
    Which of a file's stacks are kept: `frames=True` ("all") every event's and block's, "allocations" only
    those an analysis of live bytes reads (allocations, OOMs, the frees of blocks from before the trace, the
    blocks holding bytes: about a third of the events, so a third of the interning), `False` ("none") none,
    for analyses that never look at stacks, like peaks. The raw objects are freed as the columns are built.
    `source` (directories of the program's checkout, or a `SourceIndex`) resolves the kept frames to their
    source, which the snapshot then carries (`Snapshot.sources`, what the rules read)."""
    snapshot = validate(_read(path, rank, tag, limits, frames))
    index = SourceIndex.of(source)
    if index is not None:
        interner = snapshot.interner          # read once (a converted run reads it on first use)
        snapshot = dataclasses.replace(snapshot, interner_source=interner, sources=index.frames(interner.frames))
    for text in snapshot.warnings:
        warnings.warn(f"{snapshot.source}: {text}", InputWarning, stacklevel=2)
    return snapshot


def _read(path: str | Path, rank: int | None, tag: str | None, limits: Limits | None, frames: bool | str) -> Snapshot:
    if os.path.isdir(path):      # never raises: a name too long is then read as a file, which says so
        chosen = resolve(path, rank, tag)
        if chosen.is_dir():
            from .parquet import read_tables  # pyarrow only for a converted run
            return read_tables(chosen)
        path = chosen
    from .columns import to_snapshot  # the pickle path (and pandas, for its annotations) only when needed
    from .safe_pickle import read_raw

    raw = read_raw(path, limits)
    return to_snapshot(raw.data, str(path), raw.container, raw.stream_bytes, consume=True, frames=frames)


__all__ = ["load", "Limits", "SourceIndex", "SourceRoots"]
