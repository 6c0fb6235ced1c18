"""The `check` command's typed result for one snapshot: each limit per device, measured, and the verdict.

Contract: `check_report(result)` turns a `check.CheckResult` (a DataFrame of rows) into a frozen, picklable
`CheckReport` of plain values, small enough to come back from a worker: one `CheckRow` per limit and device
(the `ROW_COLUMNS` of `check`), whether all held, and the failures as `CheckResult.failures` words them.
`to_json()` is the document `check --format json` prints for one snapshot (a run's nests one per rank); the
terminal renders the objects.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .check import CheckResult


@dataclass(frozen=True)
class CheckRow:
    device: int
    check: str                   # "budget" | "transient" | "category"
    subject: str
    limit_bytes: int
    actual_bytes: int
    headroom_bytes: int          # limit − actual
    ok: bool
    at_peak_bytes: int
    event_index: int


@dataclass(frozen=True)
class CheckReport:
    """One snapshot's limits (see the module docstring)."""

    source: str
    metric: str
    passed: bool
    checks: tuple[CheckRow, ...]
    failures: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "metric": self.metric, "passed": self.passed,
                "checks": [asdict(r) for r in self.checks], "failures": list(self.failures)}


def check_report(result: CheckResult) -> CheckReport:
    """The typed result of one snapshot's check."""
    return CheckReport(
        source=result.source, metric=result.metric, passed=result.passed,
        checks=tuple(CheckRow(int(r.device), r.check, r.subject, int(r.limit_bytes), int(r.actual_bytes),
                              int(r.headroom_bytes), bool(r.ok), int(r.at_peak_bytes), int(r.event_index))
                     for r in result.rows.itertuples()),
        failures=tuple(result.failures()))
