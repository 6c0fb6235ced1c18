"""Run directories: find the snapshots of each rank and pick the one an analysis asks for.

Contract: `scan(path)` lists the snapshots under a run directory as `RunEntry`s (rank, tag, converted tables
dir or None, pickle or None; ranks and tags sorted) plus `problems`: one line per name it skipped and why (a
tag `layout.check_tag` refuses, a snapshot that is not a regular file, a ``tag=`` directory without its
``snapshot.json``) and per directory holding leftovers of an interrupted write (which `atomic` removes on
the next write there). Two sources are read, by `layout`'s names: our layout (``rank=N/snapshot-<tag>.pickle``
and ``rank=N/tag=<tag>/`` tables), and the names engines dump under (`layout.ENGINE_NAMINGS`: SGLang's
``<time>-TP-<rank>-memory.pickle`` files in the directory, torchtitan's ``iteration_<N>[_exit]/rank<R>_…``
folders in it or the directory being one), whose rank and tag come from the names. A damaged layout raises
BadInputError naming it: two ``rank=`` directories for one rank, a rank past `layout.MAX_WORLD_SIZE` (in a
directory or an engine's file name), two snapshot files claiming one rank and tag. `entries(path)` is
`scan(path).entries`. One policy chooses a rank's snapshot everywhere (`pick`): the tag asked for; else, with
`prefer_oom`, its OOM snapshots; else ``final``; else its only one — several others are ambiguous.
`resolve(path, rank, tag)` applies it to each rank asked for (every rank when `rank` is None) and returns the
one snapshot to load — converted Parquet tables when present (fast), else the pickle — and raises UsageError
listing the choices when the selection is ambiguous or empty. `path` may be the run directory, one `rank=N`
directory, or one `tag=T` tables directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import layout
from ..atomic import is_leftover
from ..errors import BadInputError, UsageError

NO_SNAPSHOTS = ("a directory without snapshots: expected rank=N/snapshot-<tag>.pickle or rank=N/tag=<tag>/ tables "
                "(see `snapanalyze convert`), an engine's dump (SGLang <time>-TP-<rank>-memory.pickle, torchtitan "
                "iteration_<N>/rank<R>_memory_snapshot.pickle), or pickles whose names give their rank "
                "(rank0_oom.pickle, snapshot_rank1.pickle)")


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


@dataclass(frozen=True)
class Listing:
    """What `scan` found: the snapshots, and the names it skipped or left alone (see the module docstring)."""

    entries: list[RunEntry]
    problems: list[str]


@dataclass
class _Found:
    root: Path
    parts: dict[tuple[int, str], dict[str, Path]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def add(self, rank: int, tag: str, kind: str, path: Path) -> None:
        if rank >= layout.MAX_WORLD_SIZE:
            raise BadInputError(path, f"the name says rank {rank}, past the largest rank this reader accepts "
                                f"({layout.MAX_WORLD_SIZE - 1:,}): a damaged or foreign file name")
        slot = self.parts.setdefault((rank, tag), {})
        if kind in slot:
            raise BadInputError(self.root, f"{self._shown(slot[kind])} and {self._shown(path)} both claim rank "
                                f"{rank} tag {tag}: keep one of the two")
        slot[kind] = path

    def skip(self, path: Path, why: str) -> None:
        self.problems.append(f"{self._shown(path)}: skipped ({why})")

    def leftovers(self, directory: Path, names: list[str]) -> None:
        if names:
            shown = ", ".join(names[:3]) + (f", … ({len(names)} in all)" if len(names) > 3 else "")
            self.problems.append(f"{self._shown(directory)}: leftovers of an interrupted write ({shown}): ignored; "
                                 "the next write into that directory removes them once stale")

    def _shown(self, path: Path) -> str:
        try:
            return str(path.relative_to(self.root)) if path != self.root else str(path)
        except ValueError:
            return str(path)

    def listing(self) -> Listing:
        entries = [RunEntry(rank, tag, parts.get("tables"), parts.get("pickle"))
                   for (rank, tag), parts in sorted(self.parts.items())]
        return Listing(entries, self.problems)


def _rank_dir(rank: int, directory: Path, found: _Found) -> None:
    """Our layout: ``snapshot-<tag>.pickle`` files and ``tag=<tag>/`` tables of one rank directory."""
    leftovers = []
    for child in layout.children(directory):
        if is_leftover(child):
            leftovers.append(child.name)
            continue
        tag, kind = layout.parse_tag_dir(child), "tables"
        if tag is None:
            tag, kind = layout.parse_snapshot_file(child), "pickle"
        if tag is None:
            continue
        if not layout.is_valid_tag(tag):
            found.skip(child, f"its tag {tag[:40]!r} is not one snapanalyze writes: 1-128 letters, digits, "
                       "'.', '_' or '-'")
        elif kind == "tables" and not child.is_dir():
            found.skip(child, "not a directory")
        elif kind == "tables" and not layout.is_tables_dir(child):
            found.skip(child, f"incomplete tables: no {layout.TABLES_META} (convert again)")
        elif kind == "pickle" and not child.is_file():
            found.skip(child, "not a regular file")
        else:
            found.add(rank, tag, kind, child)
    found.leftovers(directory, leftovers)


def _engine_files(root: Path, found: _Found) -> None:
    """Snapshots engines named (`layout.ENGINE_NAMINGS`): files in `root` and in its engine folders."""
    candidates = []
    for child in layout.children(root):
        if child.is_dir() and layout.engine_folder(child):
            candidates += layout.children(child)
        else:
            candidates.append(child)
    for path in candidates:
        named = layout.engine_snapshot(path)
        if named is None:
            if path.parent == root and path.name.endswith(layout.SNAPSHOT_SUFFIX) \
                    and not path.name.startswith(layout.SNAPSHOT_PREFIX):
                found.skip(path, "its name gives no rank: analyse the file itself, or name one file per rank "
                                 "rank<N>_….pickle")
            continue
        if not path.is_file():
            found.skip(path, "not a regular file")
            continue
        found.add(named.rank, named.tag, "pickle", path)


def scan(path: str | Path) -> Listing:
    """Every snapshot under a run directory (or one rank directory), and the problems met (module docstring)."""
    root = Path(path)
    if not root.is_dir():
        raise BadInputError(root, "not a run directory")
    problem = layout.rank_name_problem(root)
    if problem:
        raise BadInputError(root, problem)
    found = _Found(root)
    own = layout.parse_rank_dir(root)
    if own is not None:
        _rank_dir(own, root, found)
        return found.listing()
    for rank, child in layout.rank_dirs(root).items():
        _rank_dir(rank, child, found)
    _engine_files(root, found)
    return found.listing()


def entries(path: str | Path) -> list[RunEntry]:
    """Every snapshot under a run directory (or one rank directory), ranks and tags sorted."""
    return scan(path).entries


def ranks(path: str | Path) -> list[int]:
    return sorted({e.rank for e in entries(path)})


def resolve(path: str | Path, rank: int | None = None, tag: str | None = None) -> Path:
    """The tables directory or pickle to load for (rank, tag) under `path` (see module docstring)."""
    root = Path(path)
    if layout.is_tables_dir(root):
        return root
    listing = scan(root)
    if not listing.entries:
        skipped = f" ({'; '.join(listing.problems)})" if listing.problems else ""
        raise BadInputError(root, NO_SNAPSHOTS + skipped)
    wanted = sorted({e.rank for e in listing.entries}) if rank is None else [rank]
    picks = [pick([e for e in listing.entries if e.rank == r], tag) for r in wanted]
    found = [e for p in picks if p is not None for e in p]
    choices = ", ".join(f"rank {e.rank} tag {e.tag}" for e in listing.entries)
    if len(found) > 1 or None in picks:
        raise UsageError(f"{root}: holds several snapshots ({choices}); choose one with --rank and --tag")
    if not found:
        raise UsageError(f"{root}: no snapshot for rank {rank} tag {tag} (has: {choices})")
    return found[0].path


def pick(mine: list[RunEntry], tag: str | None = None, prefer_oom: bool = False) -> list[RunEntry] | None:
    """The snapshots of one rank (`mine`) an analysis reads: those tagged `tag` when it is given; else, with
    `prefer_oom`, every OOM snapshot (`layout.is_oom_tag`) when there is one; else ``final``; else its only
    snapshot. [] when it has none (or none tagged `tag`); None when several others leave the choice open."""
    if tag is not None:
        return [e for e in mine if e.tag == tag]
    if prefer_oom and any(layout.is_oom_tag(e.tag) for e in mine):
        return [e for e in mine if layout.is_oom_tag(e.tag)]
    if any(e.tag == layout.FINAL_TAG for e in mine):
        return [e for e in mine if e.tag == layout.FINAL_TAG]
    return mine if len(mine) <= 1 else None
