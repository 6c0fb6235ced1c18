"""The `attribute` command's typed result: what a reader is shown of an `Attribution`, small and picklable.

Contract: `attribution_result(attribution, explain=False, top=3)` returns a frozen `AttributionResult`: per
device the instant (its event, time, active and reserved bytes, the baseline it rises from, the request that
made it), the categories live there (bytes, share, blocks, the `top` allocation sites by bytes, inferred bytes;
they sum exactly to the instant's active bytes), the forward-pass tensors there that outlived a training step
(`analyze.kept`, None for none) and, with `explain`, which rule fired on which frame (`rule_firings`). Its
`to_json()` is the `attribute --format json` document; the terminal renders the object. A process pool
carries it instead of the Attribution (which holds the snapshot).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..kept import KeptAcrossStep, kept_across_step
from .result import SUMMARY_TOP, Attribution, summarize_blocks


@dataclass(frozen=True)
class CategoryShare:
    """One category's live bytes at the instant."""

    category: str
    bytes: int
    share: float                        # of the device's active bytes, rounded to 6 places
    blocks: int
    top_frames: tuple[str, ...]         # allocation sites, most bytes first
    top_frame_bytes: tuple[int, ...]
    inferred_bytes: int                 # of `bytes`, those decided by inference


@dataclass(frozen=True)
class RuleFiring:
    """Which rule fired on which frame, for how many bytes, blocks and stacks."""

    category: str
    rule: str
    frame: str
    reason: str
    tags: tuple[str, ...]
    inferred: bool
    bytes: int
    blocks: int
    stacks: int


@dataclass(frozen=True)
class DeviceAttribution:
    """A device's instant and what held its live bytes."""

    device: int
    instant: str                        # its label: "global peak", "peak 2", "event 1,234", …
    event_index: int                    # −1: before the first event
    time_us: int | None
    active_bytes: int
    reserved_bytes: int
    baseline_active_bytes: int
    baseline: str                       # the instant `baseline_active_bytes` is measured at
    request: str | None
    categories: tuple[CategoryShare, ...]
    explain: tuple[RuleFiring, ...] | None
    kept: KeptAcrossStep | None = None  # forward-pass tensors live here that outlived a training step

    @property
    def transient_bytes(self) -> int:
        return self.active_bytes - self.baseline_active_bytes

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "device": self.device, "baseline_active_bytes": self.baseline_active_bytes, "baseline": self.baseline,
            "instant": self.instant,
            "peak": {"event_index": self.event_index, "time_us": self.time_us, "active_bytes": self.active_bytes,
                     "reserved_bytes": self.reserved_bytes},
            "transient_bytes": self.transient_bytes, "request": self.request,
            "kept_across_step": dataclasses.asdict(self.kept) if self.kept is not None else None,
            "categories": [dataclasses.asdict(c) for c in self.categories]}     # fields in the document's order
        if self.explain is not None:
            entry["explain"] = [dataclasses.asdict(e) for e in self.explain]
        return entry


@dataclass(frozen=True)
class AttributionResult:
    """The `attribute` command's result (see the module docstring)."""

    source: str
    devices: tuple[DeviceAttribution, ...]
    notes: tuple[str, ...]
    rules: tuple[str, ...]              # the rule files consulted, first first

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "devices": [d.to_json() for d in self.devices], "notes": list(self.notes),
                "rules": list(self.rules)}


def attribution_result(attribution: Attribution, explain: bool = False, top: int = SUMMARY_TOP) -> AttributionResult:
    """See the module docstring."""
    summaries = attribution.summary if top == SUMMARY_TOP else summarize_blocks(attribution.blocks, top=top)
    devices = []
    for device, instant in sorted(attribution.instants.items()):
        summary = summaries[summaries["device"] == device]
        devices.append(DeviceAttribution(
            device=device, instant=instant.label, event_index=instant.event_index, time_us=instant.time_us,
            active_bytes=instant.active_bytes, reserved_bytes=instant.reserved_bytes,
            baseline_active_bytes=instant.baseline_active_bytes, baseline=instant.baseline, request=instant.request,
            categories=tuple(CategoryShare(str(r.category), int(r.bytes), round(float(r.share), 6), int(r.blocks),
                                           tuple(r.top_frames), tuple(int(n) for n in r.top_frame_bytes),
                                           int(r.inferred_bytes)) for r in summary.itertuples()),
            explain=rule_firings(attribution, device) if explain else None,
            kept=kept_across_step(attribution.snapshot, device, instant.event_index, attribution.blocks,
                                  attribution.rules.per_forward)))
    return AttributionResult(str(attribution.snapshot.source), tuple(devices), tuple(attribution.notes),
                             tuple(attribution.rules.sources))


def rule_firings(attribution: Attribution, device: int) -> tuple[RuleFiring, ...]:
    """Which rule fired on which frame at the device's instant, grouped by (category, rule, frame), largest
    first."""
    b = attribution.blocks[attribution.blocks["device"] == device]
    g = (b.groupby(["category", "rule", "frame", "reason", "tags", "inferred"], sort=False, observed=True)
         .agg(bytes=("size", "sum"), blocks=("size", "size"), stacks=("stack_id", "nunique"))
         .reset_index().sort_values("bytes", ascending=False, kind="stable"))
    return tuple(RuleFiring(str(r.category), str(r.rule), str(r.frame), str(r.reason),
                            tuple(t for t in str(r.tags).split(",") if t), bool(r.inferred), int(r.bytes),
                            int(r.blocks), int(r.stacks)) for r in g.itertuples())
