"""The `diff` command's typed result: aligned peaks, the categories and stacks that changed, as plain values.

Contract: `diff_result(d, everything=False)` turns a `diff.Diff` (two attributions and DataFrames) into a
frozen, picklable `DiffResult` small enough to send back from a worker: the aligned peaks (A, B and B − A),
the categories and stacks whose bytes changed (all of them with `everything`), the stacks counted by status,
and the notes. Its fields are the JSON's keys, so `to_json()` is the document `diff --format json` prints;
the terminal renders the object.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from typing import Any

from ..plain import plain
from ..sites import NO_FRAMES, PathText, Site, site_text, words_text
from ..stacks import short_path
from .diff import Diff

STATUSES = ("new", "vanished", "grew", "shrank", "same")


@dataclass(frozen=True)
class Side:
    """One side's peak (A or B)."""

    event_index: int
    active_bytes: int
    baseline_bytes: int
    transient_bytes: int
    reserved_bytes: int


@dataclass(frozen=True)
class Delta:
    """B − A at an aligned peak."""

    active_bytes: int
    baseline_bytes: int
    transient_bytes: int
    reserved_bytes: int


@dataclass(frozen=True)
class PeakDiff:
    device: int
    scope: str
    phase: str | None
    a: Side
    b: Side
    delta: Delta


@dataclass(frozen=True)
class CategoryDiff:
    device: int
    category: str
    a_bytes: int
    b_bytes: int
    delta_bytes: int
    a_baseline_bytes: int
    b_baseline_bytes: int
    a_transient_bytes: int
    b_transient_bytes: int
    a_blocks: int
    b_blocks: int
    a_inferred_bytes: int
    b_inferred_bytes: int


@dataclass(frozen=True)
class StackDiff:
    device: int
    stack: str
    status: str                     # one of STATUSES
    category_a: str | None
    category_b: str | None
    site: Site | None                  # the deciding frame of its largest block (None: no frames)
    frames: tuple[Site | str, ...]     # its Python frames without lines, or the text said instead
    a_bytes: int
    b_bytes: int
    delta_bytes: int
    a_transient_bytes: int
    b_transient_bytes: int
    a_blocks: int
    b_blocks: int
    matched: str = "stack"             # "stack": the same frames; "site": the same site, other callers (fuzzy)

    def labels(self, path: PathText = short_path) -> tuple[str, tuple[str, ...]]:
        """(site, frames) as text, each file shown by `path`."""
        return site_text(self.site, path) or NO_FRAMES, tuple(words_text((f,), path) for f in self.frames)

    def to_json(self) -> dict[str, Any]:
        site, frames = self.labels()
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "site": site,
                "frames": list(frames)}


@dataclass(frozen=True)
class StackCounts:
    new: int
    vanished: int
    grew: int
    shrank: int
    same: int


@dataclass(frozen=True)
class DiffResult:
    """The `diff` command's result (see the module docstring)."""

    a: str
    b: str
    instant: str
    identical: bool
    peaks: tuple[PeakDiff, ...]
    categories: tuple[CategoryDiff, ...]
    stacks: tuple[StackDiff, ...]
    counts: StackCounts
    notes: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(dataclasses.replace(self, stacks=()))
        doc["stacks"] = [s.to_json() for s in self.stacks]
        for key in ("peaks", "categories", "notes"):
            doc[key] = list(doc[key])
        return doc


def _side(row: Any, s: str) -> Side:
    return Side(*(int(getattr(row, f"{name}_{s}")) for name in
                  ("event_index", "active_bytes", "baseline_bytes", "transient_bytes", "reserved_bytes")))


def diff_result(d: Diff, everything: bool = False) -> DiffResult:
    """The typed result of a diff (see the module docstring)."""
    cats, stacks = (d.categories, d.stacks) if everything else d.changes()
    return DiffResult(
        a=d.a.snapshot.source, b=d.b.snapshot.source, instant=d.instant, identical=d.identical,
        peaks=tuple(PeakDiff(int(r.device), r.scope, plain(r.phase, nan_as_none=True), _side(r, "a"), _side(r, "b"),
                             Delta(int(r.delta_active_bytes), int(r.delta_baseline_bytes),
                                   int(r.delta_transient_bytes), int(r.delta_reserved_bytes)))
                    for r in d.peaks.itertuples()),
        categories=tuple(CategoryDiff(int(r.device), r.category, int(r.bytes_a), int(r.bytes_b), int(r.delta_bytes),
                                      int(r.baseline_bytes_a), int(r.baseline_bytes_b), int(r.transient_bytes_a),
                                      int(r.transient_bytes_b), int(r.blocks_a), int(r.blocks_b),
                                      int(r.inferred_bytes_a), int(r.inferred_bytes_b)) for r in cats.itertuples()),
        stacks=tuple(StackDiff(int(r.device), r.stack, r.status, plain(r.category_a, nan_as_none=True),
                               plain(r.category_b, nan_as_none=True), r.site_ref, tuple(r.frame_refs), int(r.bytes_a),
                               int(r.bytes_b), int(r.delta_bytes), int(r.transient_bytes_a),
                               int(r.transient_bytes_b), int(r.blocks_a), int(r.blocks_b),
                               str(getattr(r, "matched", "stack")))
                     for r in stacks.itertuples()),
        counts=StackCounts(*(int((d.stacks["status"] == s).sum()) for s in STATUSES)),
        notes=(*_estimates(d), *_fuzzy(d), *d.notes))


def _fuzzy(d: Diff) -> tuple[str, ...]:
    """How many stacks were matched by their site alone (a fuzzy match, said as such)."""
    n = int((d.stacks["matched"] == "site").sum()) if "matched" in d.stacks.columns else 0
    if not n:
        return ()
    return (f"{n:,} stack{'s' if n != 1 else ''} matched by {'their' if n != 1 else 'its'} site alone: the same code "
            "and category, other frames above it (the program's own script changed): a fuzzy match",)


def _estimates(d: Diff) -> tuple[str, ...]:
    """Which side is an estimate (`snapanalyze estimate`: fake tensors, no GPU), said before anything else."""
    made = [side for side, s in (("A", d.a.snapshot), ("B", d.b.snapshot)) if s.estimate is not None]
    if not made:
        return ()
    if len(made) == 2:
        return ("both sides are estimates (fake tensors on a CPU), not measurements",)
    other = "B" if made[0] == "A" else "A"
    return (f"{made[0]} is an estimate (fake tensors on a CPU), {other} a measurement: Δ is what the estimate "
            "missed or added",)
