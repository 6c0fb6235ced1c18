"""Typed errors: every failure a user can cause is a SnapanalyzeError naming the file and the problem.

The CLI maps SnapanalyzeError (and only it) to a one-line message and exit code 2; anything else is a bug
and keeps its traceback. Messages say what was wrong with which file and, where possible, what to do.
"""

from __future__ import annotations


class InputWarning(UserWarning):
    """Something in an input the analysis can live with (it says what was withheld): the CLI prints it as one
    `snapanalyze: warning:` line on stderr and lists it under `warnings` in JSON output."""


class SnapanalyzeError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""

    exit_code = 2


class BadInputError(SnapanalyzeError):
    """A file that cannot be read as a snapshot: truncated, empty, not a pickle, hostile or wrong shape."""

    def __init__(self, path: object, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class UnsafePickleError(BadInputError):
    """A pickle that asks for a Python global: real snapshots never do, so it is refused unexecuted."""


class UsageError(SnapanalyzeError):
    """Arguments that do not fit the data (an unknown device, an instant outside the trace, …)."""


class RulesError(SnapanalyzeError):
    """A malformed attribution rules file."""


class CollectorError(SnapanalyzeError):
    """Collecting is impossible here (no CUDA, no NVML, recording failed)."""
