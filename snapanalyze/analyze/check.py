"""Gate a snapshot against memory limits, for CI: a device budget, per-category maxima, a transient maximum.

Contract: `check(snapshot, budget=…, max_category={…}, max_transient=…)` returns a CheckResult with one row
per limit and device: the budget against the peak of active bytes (or, with `metric="reserved"`, the highest
reserved bytes); the transient against `max_transient` — the global peak over the active bytes at the window
start, or with `phase=NAME` (and the run's `markers` for collector phases) the phase's peak over the active
bytes at its start, as `phases` gives it; and each named category's
highest live bytes anywhere in the trace (every block lifetime labelled as `attribute` labels it; never less
than its bytes at the peak) against its maximum. `passed` is False when any row is over its limit; the CLI
prints each limit's result and exits 1 then (`BudgetExceeded`, exit code 1 unlike the other errors' 2, is
for a library caller that wants to raise it). `parse_bytes` reads sizes such as 70GiB, 512MiB, 1.5GB, 4096
(binary units are powers of 1024, decimal ones of 1000); `parse_limits` reads `category=size` pairs.

`CheckResult.rows` columns: device, check ("budget" | "transient" | "category"), subject (what was measured,
e.g. "peak active bytes" or the category), limit_bytes, actual_bytes, headroom_bytes (limit − actual), ok,
at_peak_bytes (the subject's bytes at the global peak), event_index (of the global peak).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..errors import SnapanalyzeError, UsageError
from ..model import Snapshot
from ..replay import replay
from ..units import parse_bytes  # noqa: F401  (part of this module's API)
from .attribute import attribute
from .peaks import global_peak_index
from .phases import phase_instant
from .rules import RuleSet, shipped_rules
from .sweep import category_levels, label_window

ROW_COLUMNS = ["device", "check", "subject", "limit_bytes", "actual_bytes", "headroom_bytes", "ok", "at_peak_bytes",
               "event_index"]



class BudgetExceeded(SnapanalyzeError):
    """A limit given to `check` was exceeded: exit code 1, so CI tells it apart from bad input (2)."""

    exit_code = 1


def parse_limits(items: Iterable[str]) -> dict[str, int]:
    """`category=size` pairs → {category: bytes}. Raises UsageError on a malformed or repeated pair."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, size = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--max {item!r}: expected category=size, e.g. logits=4GiB")
        if name in out:
            raise UsageError(f"--max {name} is given twice")
        out[name] = parse_bytes(size)
    return out


@dataclass(frozen=True, eq=False)
class CheckResult:
    """The limits of one snapshot and how each device measured against them."""

    source: str
    rows: pd.DataFrame
    metric: str

    @property
    def passed(self) -> bool:
        return bool(self.rows["ok"].all())

    def failures(self) -> list[str]:
        """One sentence per exceeded limit."""
        out = []
        for r in self.rows[~self.rows["ok"]].itertuples():
            what = {"budget": f"{r.subject} {_human(r.actual_bytes)} exceed the budget",
                    "transient": f"the transient ({r.subject}: {_human(r.actual_bytes)}) exceeds --max-transient",
                    "category": f"category {r.subject} reaches {_human(r.actual_bytes)}, over its maximum"}[r.check]
            out.append(f"{self.source}: device {r.device}: {what} of {_human(r.limit_bytes)} "
                       f"by {_human(r.actual_bytes - r.limit_bytes)}")
        return out


def check(snapshot: Snapshot, budget: int | None = None, max_category: dict[str, int] | None = None,
          max_transient: int | None = None, metric: str = "active", rules: RuleSet | None = None,
          device: int | None = None, phase: str | None = None, markers: pd.DataFrame | None = None) -> CheckResult:
    """Measure `snapshot` against the limits given (see the module docstring)."""
    if budget is None and not max_category and max_transient is None:
        raise UsageError("check: give at least one limit (--budget, --max category=size, --max-transient)")
    if metric not in ("active", "reserved"):
        raise UsageError(f"check: metric must be 'active' or 'reserved', got {metric!r}")
    rules = rules or shipped_rules()
    unknown = sorted(set(max_category or {}) - set(rules.categories))
    if unknown:
        raise UsageError(f"check: unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(rules.categories))})")
    timeline = replay(snapshot)
    devices = sorted(timeline.devices) if device is None else [device]
    if device is not None and device not in timeline.devices:
        raise UsageError(f"{snapshot.source}: no device {device} (devices: {sorted(timeline.devices)})")
    if not devices:
        raise UsageError(f"{snapshot.source}: no devices (no segments and no trace)")
    rows = []
    for d in devices:
        dt = timeline[d]
        index = global_peak_index(dt)
        peak, base = dt.active_at(index), dt.baseline_active
        if budget is not None:
            if metric == "active":
                actual, subject, at_peak = peak, "peak active bytes", peak
            else:
                actual = int(max(np.max(dt.reserved, initial=0), dt.baseline_reserved))
                subject, at_peak = "highest reserved bytes", dt.reserved_at(index)
            rows.append(_row(d, "budget", subject, budget, actual, at_peak, index))
        if max_transient is not None and phase is None:
            rows.append(_row(d, "transient", "peak − active bytes at the window start", max_transient, peak - base,
                             peak - base, index))
        if max_category:
            summary = attribute(snapshot, at=int(index), rules=rules, device=d, timeline=timeline).summary
            at_peak_bytes = summary.set_index("category")["bytes"].to_dict()
            levels = category_levels(label_window(snapshot, timeline, d, rules), 0, len(dt) - 1)
            highest = levels.set_index("target")["max_bytes"].to_dict()
            for category, limit in max_category.items():
                at = int(at_peak_bytes.get(category, 0))
                rows.append(_row(d, "category", category, limit, max(int(highest.get(category, 0)), at), at, index))
    if max_transient is not None and phase is not None:
        d, at, row = phase_instant(snapshot, phase, timeline, markers, device)
        grown = int(row["peak_bytes"]) - int(row["before_bytes"])
        rows.append(_row(d, "transient", f"peak of phase {row['label']} − active bytes at its start", max_transient,
                         grown, grown, at))
    return CheckResult(source=snapshot.source, rows=pd.DataFrame(rows, columns=ROW_COLUMNS), metric=metric)


def _human(n: int) -> str:
    """Exact bytes with a binary-unit reading, for messages: 2,877,435,904 B (2.68 GiB)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n:,} B ({n / scale:.2f} {unit})"
    return f"{n:,} B"


def _row(device: int, kind: str, subject: str, limit: int, actual: int, at_peak: int, index: int) -> dict[str, object]:
    return {"device": device, "check": kind, "subject": subject, "limit_bytes": int(limit), "actual_bytes": int(actual),
            "headroom_bytes": int(limit) - int(actual), "ok": int(actual) <= int(limit), "at_peak_bytes": int(at_peak),
            "event_index": int(index)}
