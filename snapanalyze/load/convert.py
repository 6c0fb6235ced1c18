"""Plan a conversion of snapshot pickles into a run directory: which file goes to which rank and tag.

Contract: `convert_plan(inputs, output, rank, tag, force)` returns [(source pickle, target tables dir)]
without touching anything. A run directory given as input converts in place (each rank's
`snapshot-<tag>.pickle` → `rank=N/tag=<tag>/`); files need `output`. A file's rank comes from `--rank`,
else a `rank=N` parent directory, else 0; its tag from `--tag`, else `snapshot-<tag>.pickle`, else the
file name. Two inputs mapping to one target, or an existing target without `force`, raise UsageError.
"""

from __future__ import annotations

from pathlib import Path

from .. import layout
from ..errors import UsageError
from .runs import entries


def _stem(name: str) -> str:
    for suffix in (".gz", ".pickle", ".pkl", ".json", ".pt", ".zip"):
        name = name.removesuffix(suffix)
    return name


def convert_plan(inputs: tuple[str, ...] | list[str], output: str | None, rank: int | None, tag: str | None,
                 force: bool) -> list[tuple[Path, Path]]:
    if (rank is not None or tag is not None) and len(inputs) > 1:
        raise UsageError("--rank and --tag name a single input file; give one file at a time")
    jobs: list[tuple[Path, Path]] = []
    for item in map(Path, inputs):
        if item.is_dir():
            for e in entries(item):
                if e.pickle is None:
                    continue
                run = Path(output) if output else e.pickle.parent.parent
                jobs.append((e.pickle, layout.tag_dir(run, e.rank, e.tag)))
            continue
        if output is None:
            raise UsageError(f"{item}: give -o RUN_DIRECTORY to convert a file")
        parent = layout.parse_rank_dir(item.parent)
        file_rank = rank if rank is not None else (parent if parent is not None else 0)
        file_tag = tag or layout.parse_snapshot_file(item) or _stem(item.name)
        jobs.append((item, layout.tag_dir(output, file_rank, file_tag)))
    targets = [t for _, t in jobs]
    dupes = sorted({str(t) for t in targets if targets.count(t) > 1})
    if dupes:
        raise UsageError(f"several inputs would be written to {', '.join(dupes)}; convert them one by one "
                         "with --rank/--tag")
    if not force:
        existing = [str(t) for t in targets if t.exists()]
        if existing:
            raise UsageError(f"{existing[0]}: already exists (use --force to replace it)")
    if not jobs:
        raise UsageError("nothing to convert: no snapshot pickles found")
    return jobs
