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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ...sites import Site, Words, site_codes, site_text, words_text
from ..kept import KeptAcrossStep, kept_across_step
from .result import SUMMARY_TOP, Attribution, CategoryShare


@dataclass(frozen=True)
class RuleFiring:
    """Which rule fired on which frame (None: none), for how many bytes, blocks and stacks."""

    category: str
    rule: str
    frame: Site | None
    reason: Words
    tags: tuple[str, ...]
    inferred: bool
    bytes: int
    blocks: int
    stacks: int

    def to_json(self) -> dict[str, Any]:
        return {"category": self.category, "rule": self.rule, "frame": site_text(self.frame),
                "reason": words_text(self.reason), "tags": list(self.tags), "inferred": self.inferred,
                "bytes": self.bytes, "blocks": self.blocks, "stacks": self.stacks}


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
        """What rose above the baseline by this instant (0 when memory is below it: see `below_baseline_bytes`)."""
        return max(0, self.active_bytes - self.baseline_active_bytes)

    @property
    def below_baseline_bytes(self) -> int:
        """How far below the baseline the active bytes are at this instant (freed since; 0 at or above it)."""
        return max(0, self.baseline_active_bytes - self.active_bytes)

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "device": self.device, "baseline_active_bytes": self.baseline_active_bytes, "baseline": self.baseline,
            "instant": self.instant,
            "peak": {"event_index": self.event_index, "time_us": self.time_us, "active_bytes": self.active_bytes,
                     "reserved_bytes": self.reserved_bytes},
            "transient_bytes": self.transient_bytes, "below_baseline_bytes": self.below_baseline_bytes,
            "request": self.request,
            "kept_across_step": self.kept.to_json() if self.kept is not None else None,
            "categories": [c.to_json() for c in self.categories]}
        if self.explain is not None:
            entry["explain"] = [e.to_json() for e in self.explain]
        return entry


@dataclass(frozen=True)
class AttributionResult:
    """The `attribute` command's result (see the module docstring)."""

    source: str
    devices: tuple[DeviceAttribution, ...]
    notes: tuple[str, ...]
    rules: tuple[str, ...]              # the rule files consulted, first first
    estimate: bool = False              # the file is an estimate (`snapanalyze estimate`), not a measurement
    ooms: tuple[Mapping[str, Any], ...] = ()    # the file's oom entries (`Snapshot.oom_mentions`): it ran out

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "estimate": self.estimate, "ooms": [dict(o) for o in self.ooms],
                "devices": [d.to_json() for d in self.devices], "notes": list(self.notes), "rules": list(self.rules)}


def attribution_result(attribution: Attribution, explain: bool = False, top: int = SUMMARY_TOP) -> AttributionResult:
    """See the module docstring."""
    devices = []
    for device, instant in sorted(attribution.instants.items()):
        devices.append(DeviceAttribution(
            device=device, instant=instant.label, event_index=instant.event_index, time_us=instant.time_us,
            active_bytes=instant.active_bytes, reserved_bytes=instant.reserved_bytes,
            baseline_active_bytes=instant.baseline_active_bytes, baseline=instant.baseline, request=instant.request,
            categories=tuple(dataclasses.replace(c, share=round(c.share, 6))
                             for c in attribution.shares(device, top)),
            explain=rule_firings(attribution, device) if explain else None,
            kept=kept_across_step(attribution, device, instant.event_index, attribution.rules.per_forward)))
    return AttributionResult(str(attribution.snapshot.source), tuple(devices), tuple(attribution.notes),
                             tuple(attribution.rules.sources), attribution.snapshot.estimate is not None,
                             attribution.snapshot.oom_mentions())


def rule_firings(attribution: Attribution, device: int) -> tuple[RuleFiring, ...]:
    """Which rule fired on which frame at the device's instant, grouped by what a reader is shown of them
    (category, rule, frame, reason, tags, inferred), largest first."""
    b = attribution.blocks[attribution.blocks["device"] == device]
    if not len(b):
        return ()
    # What a reader is shown of each decision, as a code: decisions that differ only in what is not shown
    # (their context, owner) are one row.
    codes, decisions = pd.factorize(b["decision"].to_numpy())
    shown: dict[tuple[str, str, Words, tuple[str, ...], bool], int] = {}
    key = np.array([shown.setdefault((d.category, d.rule, d.reason, d.tags, d.inferred), len(shown))
                    for d in map(attribution.decision, decisions.tolist())], dtype=np.int64)[codes]
    site, sites = site_codes(b["frame_id"].to_numpy(), attribution.site)
    rows = list(shown)
    g = (pd.DataFrame({"key": key, "site": site, "size": b["size"].to_numpy(), "stack_id": b["stack_id"].to_numpy()})
         .groupby(["key", "site"], sort=False)
         .agg(bytes=("size", "sum"), blocks=("size", "size"), stacks=("stack_id", "nunique"))
         .reset_index().sort_values("bytes", ascending=False, kind="stable"))
    out = []
    for r in g.itertuples():
        category, rule, reason, tags, inferred = rows[int(r.key)]
        out.append(RuleFiring(category, rule, sites[int(r.site)], reason, tags, inferred,
                              int(r.bytes), int(r.blocks), int(r.stacks)))
    return tuple(out)
