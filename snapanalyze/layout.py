"""The run-directory layout: where the collector writes and the names a reader looks for.

A run directory holds one Hive partition per rank, ``RUN/rank=N/`` (see `rank_dir`), containing:

- ``snapshot-<tag>.pickle``: a pickled ``torch.cuda.memory._snapshot()``; never overwritten, a repeated tag
  gets a counter (``snapshot-final.pickle``, ``snapshot-final-1.pickle``, …). Tags ``final`` (on exit) and
  ``oom-<n>`` (from the out-of-memory observer) are the collector's own.
- ``nvml-part-NNNNN.parquet``: NVML samples, one part per flush, numbered from 1 and never rewritten; the
  series is the concatenation of all parts (read them all, e.g. with `rank_files(run, "nvml")`).
- ``markers.parquet``: phase/request spans; ``meta.json``: host, devices, versions, options, snapshots.
  A later recording into the same rank directory gets ``markers-1.parquet``/``meta-1.json`` (session 1), …

Every file is written to a temporary name starting with ``.`` in the same directory and then renamed, so a
reader (and ``pyarrow.dataset``, which ignores ``.``/``_`` names) only ever sees complete files, also after a
killed writer. Every Parquet file carries ``schema_version`` (== `SCHEMA_VERSION`) and ``kind`` in its
key-value metadata. ``snapanalyze convert`` adds ``rank=N/tag=<tag>/`` directories of snapshot tables
(see `schema`), each with a ``snapshot.json`` (`TABLES_META`) that marks it complete. This module is the one
place that names these files: pure path arithmetic plus one reader helper, shared by the collector that
writes them and the loaders that read them (which snapshot an analysis reads is `load.runs`); it never
imports torch.
"""

from __future__ import annotations

import re
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import pyarrow.dataset

SCHEMA_VERSION = 1
"""Version of the Parquet schemas and of meta.json; bump it when a column changes meaning or type."""

SCHEMA_VERSION_KEY = "schema_version"
KIND_KEY = "kind"

RANK_PREFIX = "rank="
SNAPSHOT_PREFIX = "snapshot-"
SNAPSHOT_SUFFIX = ".pickle"
NVML_PART_PREFIX = "nvml-part-"
MARKERS_STEM = "markers"
META_STEM = "meta"

FINAL_TAG = "final"
OOM_TAG_PREFIX = "oom-"
TAG_PREFIX = "tag="
TABLES_META = "snapshot.json"

Kind = Literal["nvml", "markers"]

_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_RANK_RE = re.compile(r"^rank=(\d+)$")
_TAG_DIR_RE = re.compile(r"^tag=(.+)$")
_SNAPSHOT_RE = re.compile(r"^snapshot-(.+)\.pickle$")
_PART_RE = re.compile(r"^nvml-part-(\d+)\.parquet$")
_SESSION_RE = {"markers": re.compile(r"^markers(?:-(\d+))?\.parquet$"), "meta": re.compile(r"^meta(?:-(\d+))?\.json$")}

StrPath = str | PathLike[str]


def rank_dir(run: StrPath, rank: int) -> Path:
    """``RUN/rank=N``: the Hive partition holding everything rank `rank` wrote."""
    if rank < 0:
        raise ValueError(f"rank must be >= 0, got {rank}")
    return Path(run) / f"{RANK_PREFIX}{rank}"


def parse_rank_dir(path: StrPath) -> int | None:
    """The rank of a ``rank=N`` directory name, or None if the name is not one."""
    m = _RANK_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def parse_tag_dir(path: StrPath) -> str | None:
    """The tag of a ``tag=<tag>`` tables directory name, or None if the name is not one."""
    m = _TAG_DIR_RE.match(Path(path).name)
    return m.group(1) if m else None


def parse_snapshot_file(path: StrPath) -> str | None:
    """The tag of a ``snapshot-<tag>.pickle`` file name (a counter suffix included), or None."""
    m = _SNAPSHOT_RE.match(Path(path).name)
    return m.group(1) if m else None


def tag_dir(run: StrPath, rank: int, tag: str) -> Path:
    """``RUN/rank=N/tag=<tag>``: where `snapanalyze convert` writes one snapshot's tables."""
    return rank_dir(run, rank) / f"{TAG_PREFIX}{tag}"


def is_tables_dir(path: StrPath) -> bool:
    """A complete converted snapshot: a directory holding `TABLES_META`."""
    return (Path(path) / TABLES_META).is_file()


def rank_dirs(run: StrPath) -> dict[int, Path]:
    """Every ``rank=N`` directory of a run, by rank (ascending); empty if the run does not exist."""
    root = Path(run)
    if not root.is_dir():
        return {}
    found = {r: p for p in root.iterdir() if p.is_dir() and (r := parse_rank_dir(p)) is not None}
    return dict(sorted(found.items()))


def check_tag(tag: str) -> str:
    """Return `tag` if it is a safe file-name part (≤128 letters, digits, ``.``, ``_``, ``-``); else ValueError."""
    if not isinstance(tag, str) or not _TAG_RE.match(tag):
        raise ValueError(
            f"snapshot tag {tag!r} is not usable in a file name: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return tag


def snapshot_name(tag: str, counter: int = 0) -> str:
    """``snapshot-<tag>.pickle``, or ``snapshot-<tag>-<counter>.pickle`` when `counter` > 0."""
    check_tag(tag)
    suffix = f"-{counter}" if counter else ""
    return f"{SNAPSHOT_PREFIX}{tag}{suffix}{SNAPSHOT_SUFFIX}"


def snapshot_files(rank_path: StrPath) -> list[Path]:
    """The snapshot pickles in one rank directory, sorted by name."""
    return sorted(Path(rank_path).glob(f"{SNAPSHOT_PREFIX}*{SNAPSHOT_SUFFIX}"))


def nvml_part_name(number: int) -> str:
    """``nvml-part-NNNNN.parquet`` (numbers start at 1; more than five digits simply widen the name)."""
    if number < 1:
        raise ValueError(f"NVML part numbers start at 1, got {number}")
    return f"{NVML_PART_PREFIX}{number:05d}.parquet"


def nvml_parts(rank_path: StrPath) -> list[Path]:
    """The NVML part files of one rank directory in write order (by number, not by name)."""
    root = Path(rank_path)
    if not root.is_dir():
        return []
    parts = [(int(m.group(1)), p) for p in root.iterdir() if (m := _PART_RE.match(p.name))]
    return [p for _, p in sorted(parts)]


def markers_name(session: int = 0) -> str:
    """``markers.parquet`` for a rank directory's first recording, ``markers-<session>.parquet`` after."""
    return f"{MARKERS_STEM}{f'-{session}' if session else ''}.parquet"


def meta_name(session: int = 0) -> str:
    """``meta.json`` for a rank directory's first recording, ``meta-<session>.json`` after."""
    return f"{META_STEM}{f'-{session}' if session else ''}.json"


def session_files(rank_path: StrPath, stem: Literal["markers", "meta"]) -> list[Path]:
    """The markers or meta files of one rank directory, by session number."""
    root = Path(rank_path)
    if not root.is_dir():
        return []
    pattern = _SESSION_RE[stem]
    found = [(int(m.group(1) or 0), p) for p in root.iterdir() if (m := pattern.match(p.name))]
    return [p for _, p in sorted(found)]


def next_session(rank_path: StrPath) -> int:
    """The first session number whose meta and markers names are both free in this rank directory."""
    root = Path(rank_path)
    session = 0
    while (root / meta_name(session)).exists() or (root / markers_name(session)).exists():
        session += 1
    return session


def rank_files(run: StrPath, kind: Kind) -> list[Path]:
    """Every file of one kind (``"nvml"`` parts or ``"markers"``) across all ranks of a run, in rank order."""
    out: list[Path] = []
    for path in rank_dirs(run).values():
        out.extend(nvml_parts(path) if kind == "nvml" else session_files(path, "markers"))
    return out


def dataset(run: StrPath, kind: Kind) -> pyarrow.dataset.Dataset:
    """All ranks' files of one kind as one ``pyarrow.dataset`` with a ``rank`` column from the Hive path."""
    import pyarrow.dataset as ds

    files = [str(p) for p in rank_files(run, kind)]
    return ds.dataset(files, format="parquet", partitioning="hive", partition_base_dir=str(Path(run)))


def is_temporary(path: StrPath) -> bool:
    """True for the collector's in-progress files (``.name.….tmp``), which readers must skip."""
    return Path(path).name.startswith(".")
