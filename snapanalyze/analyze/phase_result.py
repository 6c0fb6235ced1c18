"""The `phases` command's typed result: each span's before / peak / after on each device, small and picklable.

Contract: `phases_of(table, source)` turns a `phases.phase_table` DataFrame (the notebook's API) into a frozen
`Phases` of `PhaseRow`s in the table's order, every value a plain Python one (None where the table has NA).
Its `to_json()` is the `phases --format json` document; the terminal renders the object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import pandas as pd

from ..plain import plain


@dataclass(frozen=True)
class PhaseRow:
    """One span on one device (the columns of `phases.PHASE_COLUMNS`, by name)."""

    device: int
    phase: str
    occurrence: int
    label: str                      # the name --phase accepts
    kind: str                       # "phase" | "request" | "annotation" | "metadata"
    source: str                     # "markers" | "annotations" | "user_metadata"
    start_us: int | None
    end_us: int | None
    clipped: bool                   # began before the trace window
    open: bool                      # no end recorded
    start_index: int
    end_index: int
    before_bytes: int
    peak_bytes: int
    peak_index: int
    peak_time_us: int | None
    after_bytes: int
    transient_bytes: int            # peak − before
    retained_bytes: int             # after − before
    reserved_peak_bytes: int
    top_categories: tuple[str, ...]
    top_category_bytes: tuple[int, ...]
    top_category_inferred_bytes: tuple[int, ...]
    attrs: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)                       # the fields are the document's keys, in its order


@dataclass(frozen=True)
class Phases:
    """The `phases` command's result (see the module docstring)."""

    source: str
    phases: tuple[PhaseRow, ...]
    problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "phases": [p.to_json() for p in self.phases], "problems": list(self.problems)}


def phases_of(table: pd.DataFrame, source: str) -> Phases:
    """See the module docstring."""
    rows = []
    for r in table.to_dict("records"):
        values: dict[str, Any] = {}
        for f in fields(PhaseRow):
            v = r[f.name]
            if isinstance(v, list):
                values[f.name] = tuple(plain(x) for x in v)
            elif isinstance(v, dict):
                values[f.name] = {str(a): plain(b) for a, b in v.items()}
            else:
                values[f.name] = plain(v)
        rows.append(PhaseRow(**values))
    return Phases(source, tuple(rows))
