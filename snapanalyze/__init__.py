"""snapanalyze: explain GPU memory peaks from PyTorch allocator snapshots.

Public API: `load` a snapshot (or a run directory) into a columnar Snapshot, `replay` it into a Timeline
of exact curves, `find_peaks` on it, `attribute` the live bytes at an instant to categories, `top_sites`
to drill down, `load_rules` to extend the rules, `summarize` to see what a file holds; for runs
`open_run`, `read_run`, `compare_ranks`, `phase_table`, `attribute_phase`, `outside_at_peaks`, `explain_oom`,
`explain_path`; to compare `diff`, `capacity`, `check`; a serving engine's budget against measured shapes
`budget` (`read_engine_log`, `engine_budget`, `check_budget`); other allocator settings `whatif`. Functions
that take paths live in `session`; the
analyses take loaded data. Collecting lives in `snapanalyze.collect`. Importing this package
never imports torch.
"""

from typing import TYPE_CHECKING

# Light modules (numpy and pyarrow only) are imported now; `load` and `replay` also name subpackages, which
# importing them would otherwise leave bound here in place of the functions.
from . import display, lazy
from .errors import BadInputError, RulesError, SnapanalyzeError, UnsafePickleError, UsageError
from .load import load
from .load.safe_pickle import Limits
from .model import Snapshot
from .replay import Timeline, replay
from .units import parse_bytes

# The analyses (pandas), imported on first use (PEP 562): `snapanalyze peaks` on a converted run needs none.
_EXPORTS = {
    ".analyze.attribute": ("Attribution", "attribute", "label_lifetimes", "top_sites"),
    ".analyze.capacity": ("Capacity", "capacity_contract", "fit_capacity"),
    ".analyze.sweep": ("Sweep", "measure_sweep"),
    ".analyze.check": ("BudgetExceeded", "CheckResult", "check"),
    ".analyze.diff": ("Diff", "diff"),
    ".analyze.oom": ("OomExplanation", "explain_oom"),
    ".analyze.outside": ("join_samples", "outside_at_peaks"),
    ".analyze.peaks": ("find_peaks",),
    ".analyze.phases": ("attribute_phase", "phase_table"),
    ".analyze.ranks": ("RankComparison",),
    ".analyze.rules": ("RuleSet",),
    ".analyze.summary": ("summarize",),
    ".load.samples": ("RunSamples", "read_run"),
    ".session": ("Run", "open_run", "compare_ranks", "explain_path", "sweep_points", "capacity", "budget",
                 "load_rules"),
    ".analyze.budget": ("BudgetCheck", "check_budget", "engine_budget"),
    ".analyze.whatif": ("WhatIf", "whatif"),
    ".load.engine_log": ("read_engine_log",),
}
__getattr__, __dir__ = lazy.exports(__name__, _EXPORTS, globals())
display.provide("snapanalyze.report.notebook")      # Snapshot, Timeline, Attribution render there in Jupyter


if TYPE_CHECKING:  # the same names, eagerly, for type checkers and editors
    from .analyze.attribute import Attribution, attribute, label_lifetimes, top_sites
    from .analyze.budget import BudgetCheck, check_budget, engine_budget
    from .analyze.capacity import Capacity, capacity_contract, fit_capacity
    from .analyze.check import BudgetExceeded, CheckResult, check
    from .analyze.diff import Diff, diff
    from .analyze.oom import OomExplanation, explain_oom
    from .analyze.outside import join_samples, outside_at_peaks
    from .analyze.peaks import find_peaks
    from .analyze.phases import attribute_phase, phase_table
    from .analyze.ranks import RankComparison
    from .analyze.rules import RuleSet
    from .analyze.summary import summarize
    from .analyze.sweep import Sweep, measure_sweep
    from .load.engine_log import read_engine_log
    from .load.samples import RunSamples, read_run
    from .session import Run, budget, capacity, compare_ranks, explain_path, load_rules, open_run, sweep_points

__all__ = [
    "load", "replay", "find_peaks", "attribute", "label_lifetimes", "top_sites", "load_rules", "summarize",
    "read_run", "compare_ranks", "phase_table", "attribute_phase", "outside_at_peaks", "join_samples",
    "explain_oom", "explain_path", "diff", "capacity", "sweep_points", "measure_sweep", "fit_capacity",
    "capacity_contract", "check", "parse_bytes", "Limits", "budget", "check_budget", "engine_budget",
    "read_engine_log", "BudgetCheck",
    "Snapshot", "Timeline", "Attribution", "RuleSet", "RunSamples", "RankComparison", "OomExplanation",
    "Diff", "Capacity", "CheckResult", "Sweep", "Run", "open_run",
    "SnapanalyzeError", "BadInputError", "UnsafePickleError", "UsageError", "RulesError", "BudgetExceeded",
]
__version__ = "0.1.0"
