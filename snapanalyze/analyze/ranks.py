"""Compare the ranks of a run: each rank's peak, what NVML saw there, and which rank stands out and why.

Contract: `compare_ranks(ranks)` takes one snapshot per rank (`RankInput`: its snapshot, replay, NVML rows
and markers; `session.compare_ranks` chooses them from a run directory, tag ``final`` unless told), takes
each device's global peak, attributes it, and joins the rank's NVML samples (`outside`) to get NVML used and
the memory outside the allocator at that peak. The median rank is
the row at the lower median of peak active bytes; a row is an outlier when its peak differs from the median
rank's by more than max(`threshold` × the median's peak, `min_bytes`), and `differences` lists, for each
outlier, the categories whose bytes at the peak differ from the median rank's, largest difference first. A
rank that holds no device joins the given `problems`, which are reported, not fatal. The work splits in two
so that ranks can be measured in parallel: `measure_rank(rank)` is one rank's part (a `RankMeasure`: a few
rows, small enough to send back from a worker), `combine_ranks(measures)` the comparison of them all, in the
order given; `compare_ranks` is the one composed with the other.

`RankComparison.table` columns: RANK_COLUMNS. `.categories`: rank, device, category, bytes, share.
`.differences`: rank, device, category, bytes, median_bytes, difference_bytes, share_of_difference.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from ..model import RunSamples, Snapshot
from ..replay import Timeline
from .attribute import attribute
from .outside import outside_at_peaks
from .peaks import find_peaks
from .rules import RuleSet, shipped_rules

RANK_COLUMNS = ["rank", "device", "tag", "source", "event_index", "time_us", "duration_us", "active_bytes",
                "reserved_bytes", "nvml_used_bytes", "nvml_used_measured", "outside_bytes", "outside_basis",
                "outside_uncertain", "outside_note", "top_category", "top_category_bytes", "difference_bytes",
                "outlier"]
CATEGORY_COLUMNS = ["rank", "device", "category", "bytes", "share"]
DIFF_COLUMNS = ["rank", "device", "category", "bytes", "median_bytes", "difference_bytes", "share_of_difference"]


@dataclass(frozen=True, eq=False)
class RankComparison:
    run: Path
    table: pd.DataFrame
    categories: pd.DataFrame
    differences: pd.DataFrame
    median_rank: int | None
    median_device: int | None
    problems: tuple[str, ...]
    samples: RunSamples | None


def rank_outliers(table: pd.DataFrame, categories: pd.DataFrame, threshold: float = 0.02,
                  min_bytes: int = 256 << 20) -> tuple[pd.DataFrame, pd.DataFrame, tuple[int, int] | None]:
    """(table with difference_bytes/outlier filled, differences, (median rank, device)) — see the docstring."""
    table = table.copy()
    if not len(table):
        table["difference_bytes"], table["outlier"] = pd.Series(dtype="int64"), pd.Series(dtype=bool)
        return table, pd.DataFrame(columns=DIFF_COLUMNS), None
    order = table.sort_values(["active_bytes", "rank", "device"], kind="stable")
    median = order.iloc[(len(order) - 1) // 2]
    key = (int(median["rank"]), int(median["device"]))
    base = int(median["active_bytes"])
    limit = max(threshold * base, min_bytes)
    table["difference_bytes"] = (table["active_bytes"] - base).astype("int64")
    table["outlier"] = table["difference_bytes"].abs() > limit
    mine = categories[(categories["rank"] == key[0]) & (categories["device"] == key[1])].set_index("category")["bytes"]
    rows = []
    for r in table[table["outlier"]].itertuples(index=False):
        theirs = categories[(categories["rank"] == r.rank) & (categories["device"] == r.device)] \
            .set_index("category")["bytes"]
        both = pd.concat([theirs.rename("bytes"), mine.rename("median_bytes")], axis=1).fillna(0).astype("int64")
        both["difference_bytes"] = both["bytes"] - both["median_bytes"]
        both = both[both["difference_bytes"] != 0]
        sign = 1 if r.difference_bytes > 0 else -1
        both = both.sort_values("difference_bytes", ascending=sign < 0, kind="stable")
        for cat, b in both.iterrows():
            rows.append({"rank": int(r.rank), "device": int(r.device), "category": str(cat), "bytes": int(b["bytes"]),
                         "median_bytes": int(b["median_bytes"]), "difference_bytes": int(b["difference_bytes"]),
                         "share_of_difference": float(b["difference_bytes"]) / r.difference_bytes
                         if r.difference_bytes else 0.0})
    return table, pd.DataFrame(rows, columns=DIFF_COLUMNS), key


class RankInput(Protocol):
    """What the comparison reads of one rank (`session.RankData` is one)."""

    @property
    def rank(self) -> int: ...
    @property
    def tag(self) -> str: ...
    @property
    def path(self) -> Path: ...
    @property
    def snapshot(self) -> Snapshot: ...
    @property
    def timeline(self) -> Timeline: ...
    @property
    def nvml(self) -> pd.DataFrame: ...
    @property
    def markers(self) -> pd.DataFrame: ...


@dataclass(frozen=True, eq=False)
class RankMeasure:
    """What one rank contributes to the comparison (small: a few rows), as `measure_rank` finds it."""

    rows: tuple[dict[str, Any], ...]
    categories: pd.DataFrame                   # rank, device, category, bytes, share
    problem: str | None = None                 # the rank holds no device


def measure_rank(entry: RankInput, rules: RuleSet | None = None) -> RankMeasure:
    """One rank's rows at each device's peak and the categories there (see the module docstring)."""
    rules = rules or shipped_rules()
    snapshot, timeline = entry.snapshot, entry.timeline
    devices = [d for d in sorted(timeline.devices) if len(timeline[d])] or sorted(timeline.devices)
    if not devices:
        return RankMeasure((), pd.DataFrame(columns=CATEGORY_COLUMNS),
                           f"rank {entry.rank}: {entry.path} holds no device")
    rows, cats = [], []
    for d in devices:
        peaks = find_peaks(timeline, top=1, device=d)
        outside = outside_at_peaks(timeline, entry.nvml, peaks).iloc[0]
        result = attribute(snapshot, at="peak", rules=rules, device=d, timeline=timeline, markers=entry.markers)
        summary = result.summary
        p = peaks.iloc[0]
        top = summary.iloc[0] if len(summary) else None
        rows.append({
            "rank": entry.rank, "device": d, "tag": entry.tag, "source": str(entry.path),
            "event_index": int(p["event_index"]), "time_us": p["time_us"], "duration_us": p["duration_us"],
            "active_bytes": int(p["active_bytes"]), "reserved_bytes": int(p["reserved_bytes"]),
            "nvml_used_bytes": outside["nvml_used_bytes"],
            "nvml_used_measured": bool(outside["nvml_used_measured"]),
            "outside_bytes": outside["outside_bytes"], "outside_basis": outside["basis"],
            "outside_uncertain": bool(outside["uncertain"]), "outside_note": outside["note"],
            "top_category": None if top is None else str(top["category"]),
            "top_category_bytes": None if top is None else int(top["bytes"]),
        })
        cats.append(summary.assign(rank=entry.rank)[CATEGORY_COLUMNS])
    return RankMeasure(tuple(rows), pd.concat(cats, ignore_index=True))


def combine_ranks(measures: Iterable[RankMeasure], threshold: float = 0.02, min_bytes: int = 256 << 20,
                  problems: Sequence[str] = (), run: str | Path = "", samples: RunSamples | None = None
                  ) -> RankComparison:
    """The comparison of the ranks measured (in the order given), outliers against the median rank."""
    problems = list(problems)
    rows: list[dict[str, Any]] = []
    cats = []
    for m in measures:
        if m.problem is not None:
            problems.append(m.problem)
        rows.extend(m.rows)
        if m.rows:
            cats.append(m.categories)
    table = pd.DataFrame(rows, columns=[c for c in RANK_COLUMNS if c not in ("difference_bytes", "outlier")])
    for c in ("time_us", "duration_us", "nvml_used_bytes", "outside_bytes", "top_category_bytes"):
        table[c] = table[c].astype("Int64")
    categories = pd.concat(cats, ignore_index=True) if cats else pd.DataFrame(columns=CATEGORY_COLUMNS)
    table, differences, median = rank_outliers(table, categories, threshold, min_bytes)
    return RankComparison(run=Path(run), table=table[RANK_COLUMNS], categories=categories, differences=differences,
                          median_rank=None if median is None else median[0],
                          median_device=None if median is None else median[1], problems=tuple(problems),
                          samples=samples)


def compare_ranks(ranks: Iterable[RankInput], rules: RuleSet | None = None, threshold: float = 0.02,
                  min_bytes: int = 256 << 20, problems: Sequence[str] = (), run: str | Path = "",
                  samples: RunSamples | None = None) -> RankComparison:
    """One row per rank (and device) at its peak; outliers against the median rank (see the docstring).
    `problems` (what choosing the snapshots found) are kept; `run` and `samples` name what they came from."""
    rules = rules or shipped_rules()
    return combine_ranks((measure_rank(entry, rules) for entry in ranks), threshold, min_bytes, problems, run,
                         samples)
