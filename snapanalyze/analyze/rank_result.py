"""The `ranks` command's typed result: each rank at its peak, the median rank and the outliers.

Contract: `ranks_of(comparison)` turns a `ranks.RankComparison` (DataFrames, for the report and the notebook)
into a frozen, picklable `Ranks` of plain values: one `RankRow` per rank and device, with its categories at the
peak, and one `Outlier` per outlier with the categories that set it apart from the median rank. `to_json()` is
the document `ranks --format json` prints (bytes exact integers, times µs since the Unix epoch, shares rounded
to 6 digits); the terminal renders the object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..plain import plain
from .ranks import RankComparison


@dataclass(frozen=True)
class RankCategory:
    category: str
    bytes: int
    share: float


@dataclass(frozen=True)
class RankRow:
    """One rank's device at its peak (RANK_COLUMNS of `ranks`, as plain values)."""

    rank: int
    device: int
    tag: str | None
    source: str
    event_index: int
    time_us: int | None
    duration_us: int | None
    active_bytes: int
    reserved_bytes: int
    nvml_used_bytes: int | None
    nvml_used_measured: bool
    outside_bytes: int | None
    outside_basis: str | None
    outside_uncertain: bool
    outside_note: str | None
    top_category: str | None
    top_category_bytes: int | None
    difference_bytes: int
    outlier: bool
    categories: tuple[RankCategory, ...]

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "device": self.device, "tag": self.tag, "source": self.source,
                "peak": {"event_index": self.event_index, "time_us": self.time_us,
                         "duration_us": self.duration_us, "active_bytes": self.active_bytes,
                         "reserved_bytes": self.reserved_bytes},
                "nvml_used_bytes": self.nvml_used_bytes, "nvml_used_measured": self.nvml_used_measured,
                "outside_bytes": self.outside_bytes,
                "outside": {"basis": self.outside_basis, "uncertain": self.outside_uncertain,
                            "note": self.outside_note},
                "top_category": self.top_category, "top_category_bytes": self.top_category_bytes,
                "difference_bytes": self.difference_bytes, "outlier": self.outlier,
                "categories": [{"category": c.category, "bytes": c.bytes, "share": round(c.share, 6)}
                               for c in self.categories]}


@dataclass(frozen=True)
class OutlierCategory:
    category: str
    bytes: int
    median_bytes: int
    difference_bytes: int
    share_of_difference: float


@dataclass(frozen=True)
class Outlier:
    """A rank whose peak differs from the median rank's by more than the tolerance, and by which categories."""

    rank: int
    device: int
    difference_bytes: int
    categories: tuple[OutlierCategory, ...]

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "device": self.device, "difference_bytes": self.difference_bytes,
                "categories": [{"category": c.category, "bytes": c.bytes, "median_bytes": c.median_bytes,
                                "difference_bytes": c.difference_bytes,
                                "share_of_difference": round(c.share_of_difference, 6)} for c in self.categories]}


@dataclass(frozen=True)
class Ranks:
    """The `ranks` command's result (see the module docstring)."""

    run: str
    median_rank: int | None
    median_device: int | None
    ranks: tuple[RankRow, ...]
    outliers: tuple[Outlier, ...]
    problems: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "median_rank": self.median_rank, "median_device": self.median_device,
                "ranks": [r.to_json() for r in self.ranks], "outliers": [o.to_json() for o in self.outliers],
                "problems": list(self.problems)}


def ranks_of(comparison: RankComparison) -> Ranks:
    """The typed result of a rank comparison (see the module docstring)."""
    cats, diffs, table = comparison.categories, comparison.differences, comparison.table
    rows = []
    for _, r in table.iterrows():
        mine = cats[(cats["rank"] == r["rank"]) & (cats["device"] == r["device"])]
        rows.append(RankRow(
            rank=int(r["rank"]), device=int(r["device"]), tag=r["tag"], source=r["source"],
            event_index=int(r["event_index"]), time_us=plain(r["time_us"]), duration_us=plain(r["duration_us"]),
            active_bytes=int(r["active_bytes"]), reserved_bytes=int(r["reserved_bytes"]),
            nvml_used_bytes=plain(r["nvml_used_bytes"]), nvml_used_measured=bool(r["nvml_used_measured"]),
            outside_bytes=plain(r["outside_bytes"]), outside_basis=r["outside_basis"],
            outside_uncertain=bool(r["outside_uncertain"]), outside_note=r["outside_note"],
            top_category=r["top_category"], top_category_bytes=plain(r["top_category_bytes"]),
            difference_bytes=int(r["difference_bytes"]), outlier=bool(r["outlier"]),
            categories=tuple(RankCategory(c.category, int(c.bytes), float(c.share)) for c in mine.itertuples())))
    outliers = []
    for _, r in table[table["outlier"]].iterrows():
        mine = diffs[(diffs["rank"] == r["rank"]) & (diffs["device"] == r["device"])]
        outliers.append(Outlier(
            rank=int(r["rank"]), device=int(r["device"]), difference_bytes=int(r["difference_bytes"]),
            categories=tuple(OutlierCategory(d.category, int(d.bytes), int(d.median_bytes), int(d.difference_bytes),
                                             float(d.share_of_difference)) for d in mine.itertuples())))
    return Ranks(run=str(comparison.run), median_rank=comparison.median_rank,
                 median_device=comparison.median_device, ranks=tuple(rows), outliers=tuple(outliers),
                 problems=tuple(comparison.problems))
