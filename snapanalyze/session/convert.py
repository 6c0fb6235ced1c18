"""Plan a conversion of snapshot pickles into a run directory: which file goes to which rank and tag.

Contract: `convert_plan(inputs, output, rank, tag, force)` returns [(source pickle, target tables dir)]
without touching anything, every target inside the run directory written to. A run directory given as input
converts in place (each rank's `snapshot-<tag>.pickle` → the `tag=<tag>/` beside it; an engine's dump, see
`layout.ENGINE_NAMINGS`, → `DIR/rank=N/tag=<tag>/` inside the directory given), or into `output`; files need
`output`. A file's rank comes from `--rank`, else a `rank=N` parent directory, else an engine's file name,
else 0; its tag from `--tag` (which must pass `layout.check_tag`), else `snapshot-<tag>.pickle`, else an
engine's name, else the file name — a tag from a name is made valid (`layout.sanitize_tag`). UsageError for:
a bad --tag or --rank, an output that is not a directory, two inputs mapping to one target, an existing
target without `force`, and with `force` a target that is not converted tables (`parquet.check_replaceable`).
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import layout
from ..atomic import describe
from ..errors import UsageError
from ..load.parquet import check_replaceable
from ..load.runs import RunEntry, entries


def _stem(name: str) -> str:
    for suffix in (".gz", ".pickle", ".pkl", ".json", ".pt", ".zip"):
        name = name.removesuffix(suffix)
    return name


def _file_rank(item: Path, rank: int | None) -> int:
    if rank is not None:
        return rank
    parent = layout.parse_rank_dir(item.parent)
    if parent is not None:
        return parent
    named = layout.engine_snapshot(item)
    if named is None:
        return 0
    if named.rank >= layout.MAX_WORLD_SIZE:
        raise UsageError(f"{item}: the name says rank {named.rank}, past {layout.MAX_WORLD_SIZE - 1:,}: give --rank")
    return named.rank


def _file_tag(item: Path) -> str:
    """The tag a file's name gives (see the module docstring), made valid."""
    named = layout.engine_snapshot(item)
    for text in (layout.parse_snapshot_file(item), named.tag if named else None, _stem(item.name)):
        tag = layout.sanitize_tag(text) if text else None
        if tag:
            return tag
    raise UsageError(f"{item}: no tag can be made from the file name: give --tag")


def _in_place(item: Path, e: RunEntry) -> Path:
    """Where a run directory's pickle is converted to without -o: beside it in its rank directory, or for an
    engine's dump under `item`, the directory given."""
    assert e.pickle is not None
    if layout.parse_rank_dir(e.pickle.parent) == e.rank:
        return e.pickle.parent / f"{layout.TAG_PREFIX}{e.tag}"
    return layout.tag_dir(item, e.rank, e.tag)


def _check_output(output: str | None) -> Path | None:
    if output is None:
        return None
    out = Path(output)
    if os.path.lexists(out) and not out.is_dir():
        raise UsageError(f"{out}: is {describe(out)}, not a directory: -o names the run directory to write")
    return out


def convert_plan(inputs: tuple[str, ...] | list[str], output: str | None, rank: int | None, tag: str | None,
                 force: bool) -> list[tuple[Path, Path]]:
    if (rank is not None or tag is not None) and len(inputs) > 1:
        raise UsageError("--rank and --tag name a single input file; give one file at a time")
    if tag is not None:
        try:
            layout.check_tag(tag)
        except ValueError as exc:
            raise UsageError(f"--tag: {exc}") from None
    if rank is not None and not 0 <= rank < layout.MAX_WORLD_SIZE:
        raise UsageError(f"--rank: {rank} is not a rank (0 to {layout.MAX_WORLD_SIZE - 1:,})")
    out = _check_output(output)
    jobs: list[tuple[Path, Path]] = []
    for item in map(Path, inputs):
        if item.is_dir():
            for e in entries(item):
                if e.pickle is not None:
                    jobs.append((e.pickle, layout.tag_dir(out, e.rank, e.tag) if out else _in_place(item, e)))
            continue
        if out is None:
            raise UsageError(f"{item}: give -o RUN_DIRECTORY to convert a file")
        jobs.append((item, layout.tag_dir(out, _file_rank(item, rank), tag or _file_tag(item))))
    targets = [t for _, t in jobs]
    dupes = sorted({str(t) for t in targets if targets.count(t) > 1})
    if dupes:
        raise UsageError(f"several inputs would be written to {', '.join(dupes)}; convert them one by one "
                         "with --rank/--tag")
    for target in targets:
        if os.path.lexists(target):
            if not force:
                raise UsageError(f"{target}: already exists (use --force to replace it)")
            check_replaceable(target)
        for above in (target.parent, target.parent.parent):
            if os.path.lexists(above) and not above.is_dir():
                raise UsageError(f"{above}: is {describe(above)}, not a directory: cannot write {target.name} in it")
    if not jobs:
        raise UsageError("nothing to convert: no snapshot pickles found")
    return jobs
