"""snapanalyze: explain GPU memory peaks from PyTorch allocator snapshots.

Public API: `load` a snapshot, `replay` it into a Timeline, `find_peaks` on it. Importing this package
never imports torch.
"""

from .errors import BadInputError, SnapanalyzeError, UnsafePickleError
from .load import load
from .model import Snapshot

__all__ = ["load", "Snapshot", "SnapanalyzeError", "BadInputError", "UnsafePickleError"]
__version__ = "0.1.0"
