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
killed writer (whose leftovers the next write into that directory removes, see `atomic`). Every Parquet file
carries ``schema_version`` (== `SCHEMA_VERSION`) and ``kind`` in its key-value metadata. ``snapanalyze
convert`` adds ``rank=N/tag=<tag>/`` directories of snapshot tables (see `schema`), each with a
``snapshot.json`` (`TABLES_META`) that marks it complete. This module is the one place that names these
files: path arithmetic, name parsing and two listing helpers (`rank_dirs`, `dataset`), shared by the
collector that writes them and the loaders that read them (which snapshot an analysis reads is
`load.runs`); it never imports torch.

Names read back are checked, never trusted: a rank is ASCII digits below `MAX_WORLD_SIZE` (leading zeros are
read, but two directories naming one rank, ``rank=0`` and ``rank=0000``, are refused by `rank_dirs`, as is a
rank past the bound), and a tag read from a name is used only when `check_tag` accepts it. Snapshots that
engines dump under their own names are read as runs too: `ENGINE_NAMINGS` is the table of those names (SGLang's
``<time or profile id>-TP-<rank>-memory[-<stage>].pickle``, torchtitan's
``memory_snapshot/iteration_<N>[_exit]/rank<R>_memory_snapshot.pickle``), `engine_snapshot` reads a rank and
a tag from one (the tag made valid by `sanitize_tag`). vLLM writes no allocator snapshot of its own (its
profiler writes Chrome traces), so it has no row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, Literal, NamedTuple

from .errors import BadInputError

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
# A snapshot's top-level key (and a converted run's snapshot.json key) saying it is an estimate, not a measurement:
# `snapanalyze estimate` wrote it from fake tensors (how, with which shapes, what CUDA choices it modelled).
ESTIMATE_KEY = "snapanalyze_estimate"
PEAK_TABLE = "peak_categories.parquet"   # convert's answer beside the tables: categories at each device's peak

MAX_WORLD_SIZE = 1_000_000
"""Ranks are 0 … MAX_WORLD_SIZE - 1: a name or a meta.json past it is damaged, not a larger job."""

Kind = Literal["nvml", "markers"]

# ASCII digits only: \d would also take other scripts' digits, which int() reads as numbers.
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_RANK_RE = re.compile(r"^rank=([0-9]+)$")
_TAG_DIR_RE = re.compile(r"^tag=(.+)$")
_SNAPSHOT_RE = re.compile(r"^snapshot-(.+)\.pickle$")
_PART_RE = re.compile(r"^nvml-part-([0-9]+)\.parquet$")
_SESSION_RE = {"markers": re.compile(r"^markers(?:-([0-9]+))?\.parquet$"),
               "meta": re.compile(r"^meta(?:-([0-9]+))?\.json$")}

StrPath = str | PathLike[str]


def rank_dir(run: StrPath, rank: int) -> Path:
    """``RUN/rank=N``: the Hive partition holding everything rank `rank` wrote."""
    if rank < 0:
        raise ValueError(f"rank must be >= 0, got {rank}")
    return Path(run) / f"{RANK_PREFIX}{rank}"


def parse_rank_dir(path: StrPath) -> int | None:
    """The rank of a ``rank=N`` directory name (ASCII digits, below MAX_WORLD_SIZE), or None if the name is
    not one; `rank_name_problem` says why a ``rank=<digits>`` name past the bound is refused."""
    m = _RANK_RE.match(Path(path).name)
    if not m:
        return None
    rank = int(m.group(1))
    return rank if rank < MAX_WORLD_SIZE else None


def rank_name_problem(path: StrPath) -> str | None:
    """Why a ``rank=<digits>`` name cannot be a rank's directory (its rank is past MAX_WORLD_SIZE), else None."""
    m = _RANK_RE.match(Path(path).name)
    if not m or int(m.group(1)) < MAX_WORLD_SIZE:
        return None
    digits = m.group(1) if len(m.group(1)) <= 24 else m.group(1)[:21] + "..."
    return (f"names rank {digits}, past the largest rank this reader accepts ({MAX_WORLD_SIZE - 1:,}): "
            "a damaged or foreign directory name")


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
    """Every ``rank=N`` directory of a run, by rank (ascending); empty if the run does not exist.

    Raises BadInputError for a ``rank=<digits>`` directory past MAX_WORLD_SIZE and for two directories that
    name one rank (``rank=0`` beside ``rank=0000``), naming both: which one holds the rank is not knowable."""
    root = Path(run)
    if not root.is_dir():
        return {}
    found: dict[int, Path] = {}
    for p in children(root):
        if not p.is_dir():
            continue
        problem = rank_name_problem(p)
        if problem:
            raise BadInputError(p, problem)
        rank = parse_rank_dir(p)
        if rank is None:
            continue
        if rank in found:
            raise BadInputError(root, f"{found[rank].name} and {p.name} both name rank {rank}: keep one of the "
                                "two directories (rename or remove the other)")
        found[rank] = p
    return dict(sorted(found.items()))


def children(directory: StrPath) -> list[Path]:
    """The entries of `directory`, sorted by name; BadInputError when it cannot be listed."""
    root = Path(directory)
    try:
        return sorted(root.iterdir())
    except OSError as exc:
        raise BadInputError(root, f"cannot list the directory ({exc.strerror or exc})") from None


def check_tag(tag: str) -> str:
    """Return `tag` if it is a safe file-name part (≤128 letters, digits, ``.``, ``_``, ``-``); else ValueError."""
    if not isinstance(tag, str) or not _TAG_RE.match(tag):
        shown = repr(tag) if len(repr(tag)) <= 60 else repr(tag)[:57] + "..."
        raise ValueError(
            f"snapshot tag {shown} is not usable in a file name: use 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return tag


def is_valid_tag(tag: str) -> bool:
    return isinstance(tag, str) and _TAG_RE.match(tag) is not None


def sanitize_tag(text: str) -> str | None:
    """`text` made a valid tag (for tags derived from file names): every character but ASCII letters, digits,
    ``.``, ``_`` and ``-`` becomes ``_``, leading characters that are not a letter or digit are dropped, and
    it is cut to 128; None when nothing is left."""
    cleaned = re.sub(r"^[^A-Za-z0-9]+", "", re.sub(r"[^A-Za-z0-9._-]", "_", text))[:128]
    return cleaned or None


# Tags of snapshots dumped at an out-of-memory error: the collector's oom-<n>, torchtitan's iteration_<N>_exit.
_OOM_TAG_RE = re.compile(rf"^{OOM_TAG_PREFIX}|^iteration_[0-9]+_exit$")


def is_oom_tag(tag: str) -> bool:
    """Whether `tag` names a snapshot dumped at an out-of-memory error (see _OOM_TAG_RE)."""
    return _OOM_TAG_RE.match(tag) is not None


@dataclass(frozen=True)
class EngineNaming:
    """How an engine names the snapshots it dumps. `file` matches a snapshot file's name and captures its
    ``rank`` (and, where the tag comes from the file, ``tag`` and an optional ``stage``); `folder`, when
    set, must match the name of the directory holding the file, which is then the tag."""

    engine: str
    file: re.Pattern[str]
    folder: re.Pattern[str] | None = None


_TORCHTITAN_DIR = re.compile(r"^iteration_[0-9]+(?:_exit)?$")

ENGINE_NAMINGS: tuple[EngineNaming, ...] = (
    # SGLang's profiler with the MEM activity (scheduler_profiler_mixin.py, profile_utils.py):
    # f"{time.time() or profile_id}-TP-{tp_rank}-memory{'-' + stage when profiled by stage}.pickle"
    EngineNaming("sglang", re.compile(r"^(?P<tag>.+?)-TP-(?P<rank>[0-9]+)-memory(?:-(?P<stage>.+))?\.pickle$")),
    # torchtitan (torchtitan/tools/profiling.py): memory_snapshot/iteration_<N>/rank<R>_memory_snapshot.pickle,
    # and iteration_<N>_exit/ when the step ran out of memory
    EngineNaming("torchtitan", re.compile(r"^rank(?P<rank>[0-9]+)_memory_snapshot\.pickle$"), folder=_TORCHTITAN_DIR),
    # Any pickle whose name states its rank as the word "rank" and a number, as a training or serving script
    # that dumps one file per rank names them (rank0_oom.pickle, snapshot_rank1.pickle, mem-rank-3-step10.pickle):
    # the rest of the name is the tag ("final" when nothing is left). Tried last: an engine's own naming wins.
    EngineNaming("rank-named", re.compile(r"^(?:(?P<tag>.*?)[_.-])?(?<![A-Za-z])rank[_=-]?(?P<rank>[0-9]+)"
                                          r"(?:[_.-](?P<stage>.+?))?\.pickle$", re.IGNORECASE)),
)


class EngineSnapshot(NamedTuple):
    engine: str
    rank: int          # as the name says: may be past MAX_WORLD_SIZE, which the reader refuses
    tag: str


def engine_folder(path: StrPath) -> bool:
    """Whether `path`'s name is a folder an engine puts its snapshots in (torchtitan's ``iteration_<N>``)."""
    name = Path(path).name
    return any(n.folder is not None and n.folder.match(name) for n in ENGINE_NAMINGS)


def engine_snapshot(path: StrPath) -> EngineSnapshot | None:
    """The engine, rank and tag of a snapshot file named as an engine in ENGINE_NAMINGS names it (the folder
    holding it included), or None."""
    p = Path(path)
    for naming in ENGINE_NAMINGS:
        m = naming.file.match(p.name)
        if m is None or (naming.folder is not None and not naming.folder.match(p.parent.name)):
            continue
        groups = m.groupdict()
        parts = [p.parent.name] if naming.folder is not None else []
        parts += [v for v in (groups.get("tag"), groups.get("stage")) if v]
        tag = sanitize_tag("-".join(parts)) if parts or naming.engine != "rank-named" else "final"
        if tag is not None:
            return EngineSnapshot(naming.engine, int(m.group("rank")), tag)
    return None


def snapshot_name(tag: str, counter: int = 0) -> str:
    """``snapshot-<tag>.pickle``, or ``snapshot-<tag>-<counter>.pickle`` when `counter` > 0."""
    check_tag(tag)
    suffix = f"-{counter}" if counter else ""
    return f"{SNAPSHOT_PREFIX}{tag}{suffix}{SNAPSHOT_SUFFIX}"


def rank_dir_of(path: StrPath) -> Path | None:
    """The ``rank=N`` directory that is `path` or holds it, or None outside a run."""
    p = Path(path)
    return next((c for c in (p, *p.parents) if parse_rank_dir(c) is not None), None)


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
