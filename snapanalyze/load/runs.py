"""Run directories: find the snapshots of each rank and pick the one an analysis asks for.

Contract: `entries(path)` lists the snapshots under a run directory (the names are `layout`'s) as
(rank, tag, converted tables dir or None, pickle or None), ranks and tags sorted. `resolve(path, rank, tag)`
returns the one snapshot to load — converted Parquet tables when present (fast), else the pickle — and
raises UsageError listing the choices when the selection is ambiguous or empty. `path` may be the run
directory, one `rank=N` directory, or one `tag=T` tables directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import layout
from ..errors import BadInputError, UsageError


@dataclass(frozen=True)
class RunEntry:
    rank: int
    tag: str
    tables: Path | None
    pickle: Path | None

    @property
    def path(self) -> Path:
        found = self.tables or self.pickle
        assert found is not None
        return found


def _rank_entries(rank: int, directory: Path) -> list[RunEntry]:
    found: dict[str, dict[str, Path]] = {}
    for child in sorted(directory.iterdir()):
        tag = layout.parse_tag_dir(child)
        pickled = layout.parse_snapshot_file(child)
        if tag is not None and child.is_dir() and layout.is_tables_dir(child):
            found.setdefault(tag, {})["tables"] = child
        elif pickled is not None and child.is_file():
            found.setdefault(pickled, {})["pickle"] = child
    return [RunEntry(rank, tag, parts.get("tables"), parts.get("pickle")) for tag, parts in sorted(found.items())]


def entries(path: str | Path) -> list[RunEntry]:
    """Every snapshot under a run directory (or one rank directory), ranks and tags sorted."""
    root = Path(path)
    if not root.is_dir():
        raise BadInputError(root, "not a run directory")
    own = layout.parse_rank_dir(root)
    if own is not None:
        return _rank_entries(own, root)
    ranks = sorted((rank, child) for child in root.iterdir()
                   if child.is_dir() and (rank := layout.parse_rank_dir(child)) is not None)
    return [e for rank, child in ranks for e in _rank_entries(rank, child)]


def ranks(path: str | Path) -> list[int]:
    return sorted({e.rank for e in entries(path)})


def resolve(path: str | Path, rank: int | None = None, tag: str | None = None) -> Path:
    """The tables directory or pickle to load for (rank, tag) under `path` (see module docstring)."""
    root = Path(path)
    if layout.is_tables_dir(root):
        return root
    found = entries(root)
    if not found:
        raise BadInputError(root, "a directory without snapshots: expected rank=N/snapshot-<tag>.pickle or "
                            "rank=N/tag=<tag>/ tables (see `snapanalyze convert`)")
    if rank is not None:
        found = [e for e in found if e.rank == rank]
    if tag is not None:
        found = [e for e in found if e.tag == tag]
    elif len({e.tag for e in found}) > 1 and any(e.tag == layout.FINAL_TAG for e in found):
        found = [e for e in found if e.tag == layout.FINAL_TAG]
    choices = ", ".join(f"rank {e.rank} tag {e.tag}" for e in entries(root))
    if not found:
        raise UsageError(f"{root}: no snapshot for rank {rank} tag {tag} (has: {choices})")
    if len(found) > 1:
        raise UsageError(f"{root}: holds several snapshots ({choices}); choose one with --rank and --tag")
    return found[0].path
