"""snapanalyze: explain GPU memory peaks from PyTorch allocator snapshots.

Public API: `load` a snapshot into a columnar Snapshot, `replay` it into a Timeline of exact curves,
`find_peaks` on it, `attribute` the live bytes at an instant to categories, `top_sites` to drill down,
`load_rules` to extend the rules, `summarize` to see what a file holds. Importing this package never
imports torch.
"""

from .analyze.attribute import Attribution, attribute, top_sites
from .analyze.peaks import find_peaks
from .analyze.rules import RuleSet, load_rules
from .analyze.summary import summarize
from .errors import BadInputError, RulesError, SnapanalyzeError, UnsafePickleError, UsageError
from .load import load
from .model import Snapshot
from .replay import Timeline, replay

__all__ = [
    "load", "replay", "find_peaks", "attribute", "top_sites", "load_rules", "summarize",
    "Snapshot", "Timeline", "Attribution", "RuleSet",
    "SnapanalyzeError", "BadInputError", "UnsafePickleError", "UsageError", "RulesError",
]
__version__ = "0.1.0"
