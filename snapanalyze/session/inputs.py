"""What a command names → the data it reads, without the analyses: one snapshot with its rank's markers, the
ranks of a run directory, the program's source, an engine's start-up log.

Contract: `open_input(path, rank, tag, frames, source)` loads the one snapshot `path` names (a file, a
tables or ``rank=N`` directory, a run of one rank, any run with a rank; `load.runs.resolve` chooses once, and
says what to add when it cannot) as an `Input`; its `markers` (the rank's phase, request and module spans;
empty outside a run) are read on first use, so a command that never reads them never imports pandas.
`run_ranks(path, tag)` is the snapshot each rank of a multi-rank run directory analyses (`RunRanks`, chosen
by `load.samples.choose_snapshots`: the tag asked for, else ``final``, else a rank's only one) with the ranks
it skipped as problems, or None when `path` names one snapshot. `source_index(dirs, environment)` is
--source / --env-source resolved (`load.source.SourceIndex`); `engine_config(log, engine, figures, given_as)`
an engine's budget figures from its log and options (`load.engine_log`); `load_rules(user_file)` the rules
with a user's --rules file read here (`analyze.rules.rules_from_toml`; the shipped set without one). This
module imports only the loader (no pandas at import), so that the fast commands stay fast.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import layout
from ..confine import open_confined
from ..errors import BadInputError, RulesError
from ..load import Limits, SourceIndex, SourceRoots, load
from ..load.runs import resolve
from ..load.safe_pickle import limits_in_effect
from ..model import Snapshot

if TYPE_CHECKING:
    import pandas as pd

    from ..analyze.rules import RuleSet
    from ..engine_config import EngineConfig


@dataclass(frozen=True)
class Input:
    """One snapshot a user named, and the file or tables directory it was read from (to find its rank's
    markers)."""

    snapshot: Snapshot
    target: Path

    @cached_property
    def markers(self) -> pd.DataFrame:
        """The markers of the rank the snapshot belongs to (empty for a file outside a run)."""
        from ..load.samples import markers_for
        return markers_for(self.target)


def open_input(path: str | Path, rank: int | None = None, tag: str | None = None, frames: bool | str = True,
               source: SourceRoots = None) -> Input:
    """The snapshot `path` (with `rank` and `tag` inside a run) names, its frames resolved against `source`:
    a run directory is resolved once, and the snapshot and its markers are both read from what it chose."""
    target = resolve(path, rank, tag) if os.path.isdir(path) else Path(path)  # never raises (as `load`)
    return Input(load(target, frames=frames, source=source), target)


@dataclass(frozen=True)
class RunRanks:
    """The snapshot each rank of a run analyses (rank → its tag, in rank order) and the problems met."""

    tags: Mapping[int, str | None]
    problems: tuple[str, ...]


def run_ranks(path: str | Path, tag: str | None = None,
              on_count: Callable[[int], None] | None = None) -> RunRanks | None:
    """The ranks of a multi-rank run directory (see the module docstring); None when `path` is one snapshot
    (a file, a tables or ``rank=N`` directory, a run of one rank). `on_count(n)` hears the number of ranks
    once it is known, before the snapshots are chosen (a caller starts its workers then)."""
    p = Path(path)
    try:
        is_dir = p.is_dir()
    except OSError:                                     # a name too long, say: the loader names the problem
        return None
    if not is_dir or layout.is_tables_dir(p) or layout.parse_rank_dir(p) is not None:
        return None
    from ..load.runs import scan

    listing = scan(p)                                   # names the damage of a broken layout
    dirs = layout.rank_dirs(p)
    ranks = set(dirs) | {e.rank for e in listing.entries}
    if len(ranks) <= 1:
        return None                                     # (a run of one rank reads no pandas: fast start)
    if on_count is not None:
        on_count(len(ranks))
    from ..load.samples import choose_snapshots

    chosen, problems = choose_snapshots(listing.entries, dirs, p, tag)
    if not chosen:
        raise BadInputError(p, "no rank has a snapshot to analyse: " + "; ".join(problems))
    return RunRanks({e.rank: e.tag for e in chosen}, (*listing.problems, *problems))


def source_index(dirs: SourceRoots, environment: bool = False) -> SourceIndex | None:
    """--source DIR … and --env-source as the index each load resolves its frames with (None for neither; a
    UsageError names a missing directory)."""
    return SourceIndex.of(dirs, environment=environment)


def engine_config(log: str | Path | None, engine: str | None, figures: Mapping[str, Any],
                  given_as: Mapping[str, str]) -> EngineConfig:
    """An engine's budget figures: its start-up log's lines, then the figures given as options."""
    from ..load.engine_log import engine_config as from_log
    return from_log(log, engine, figures, given_as)


def load_rules(user_file: str | Path | None = None) -> RuleSet:
    """The shipped categories and rule packs with the user's TOML file `user_file` layered on top (the
    shipped set, shared, without one); a file that cannot be read, or is not UTF-8 text, is a RulesError
    naming it, as a malformed one is."""
    from ..analyze.rules import rules_from_toml, shipped_rules

    if user_file is None:
        return shipped_rules()
    where = str(user_file)
    try:
        with open_confined(user_file) as f:
            text = f.read().decode("utf-8")
    except OSError as exc:
        raise RulesError(f"{where}: cannot read the rules file ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise RulesError(f"{where}: not UTF-8 text (byte {exc.start})") from None
    return rules_from_toml(text, where)


def reading_limits(max_memory_bytes: int) -> AbstractContextManager[None]:
    """A context in which every read refuses an input that would take more than `max_memory_bytes`."""
    return limits_in_effect(Limits(max_memory_bytes=max_memory_bytes))
