"""What if the allocator had other settings: replay a snapshot's trace through the allocator simulator.

Contract: `whatif(snapshot, timeline, changes=(), capacity=None, total=None, device=None)` → WhatIf. For each
device with a trace: `replay`, how far a simulation under the recorded settings reproduces the trace (the
simulator's and the file's health check, see `allocator.trace_replay`), and, when `changes` are given
("key:value" as in PYTORCH_ALLOC_CONF, UsageError naming a bad one), `whatif`: the reserved peak, the
reserved-but-unallocated bytes and the largest free block at it and each OOM served or not, under the
recorded settings and under the changed ones on a device where PyTorch may reserve `capacity` bytes (given;
else what the device's first OOM proves; else unbounded), valid up to the first instant where the program
would have behaved differently. `total` is the device's memory (a memory fraction and an expandable
segment's range are sized from it; default: the capacity). `requires` names each change the torch that wrote the
file may not have (expandable segments before 2.1, …): the prediction is then for the same program on a
newer torch. A snapshot without a trace (state only) has nothing to simulate: `traced` is False. `to_json()`
is the command's JSON document.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..allocator.settings import AllocatorSettings, of_snapshot, requirements, with_changes
from ..allocator.state import SegmentEvent
from ..model import Snapshot
from ..replay import Timeline, replay
from .summary import torch_version_bounds, version_text
from .trace_replay import (
    DeviceReplay,
    DeviceWhatIf,
    Divergence,
    Prediction,
    replay_device,
    start_state,
    whatif_device,
)


@dataclass(frozen=True)
class DeviceResult:
    device: int
    replay: DeviceReplay
    whatif: DeviceWhatIf | None


@dataclass(frozen=True)
class Requirement:
    """A changed setting that needs a newer torch than the one that may have written the file."""

    setting: str                       # as PYTORCH_ALLOC_CONF writes it
    since: str                         # the torch release it appeared in
    file_torch: str                    # the releases that could have written the file (inferred)
    certain: bool                      # every one of them is older (else only some may be)


def newer_torch_needed(snapshot: Snapshot, recorded: AllocatorSettings,
                       changed: AllocatorSettings) -> tuple[Requirement, ...]:
    """The changes the torch that wrote `snapshot` may not have (`allocator.settings.requirements` against
    the file's inferred torch versions, `summary.torch_version_bounds`)."""
    lo, hi, _ = torch_version_bounds(snapshot)
    if (hi is not None and lo > hi) or lo == (0, 0):   # a contradictory fingerprint, a bare segment list: nothing
        return ()
    return tuple(Requirement(setting, f"{since[0]}.{since[1]}", version_text(lo, hi), hi is not None and hi < since)
                 for setting, since in requirements(recorded, changed) if lo < since)


@dataclass(frozen=True)
class WhatIf:
    """The replay (and the what-if, when settings were changed) of every traced device of a snapshot."""

    source: str
    recorded: AllocatorSettings
    changed: AllocatorSettings | None
    traced: bool                       # the file holds a trace of allocations to simulate
    devices: tuple[DeviceResult, ...]
    requires: tuple[Requirement, ...] = ()     # changes the torch that wrote the file may not have

    def to_json(self) -> dict[str, Any]:
        return {"file": self.source, "recorded_settings": self.recorded.conf(),
                "settings": None if self.changed is None else self.changed.conf(), "traced": self.traced,
                "requires": [dataclasses.asdict(r) for r in self.requires],
                "devices": [_device_json(d) for d in self.devices]}


def whatif(snapshot: Snapshot, timeline: Timeline | None = None, changes: Sequence[str] = (),
           capacity: int | None = None, total: int | None = None, device: int | None = None) -> WhatIf:
    """See the module docstring."""
    recorded = of_snapshot(snapshot.allocator_settings)
    changed = with_changes(recorded, changes) if changes else None
    timeline = timeline if timeline is not None else replay(snapshot)
    devices = [d for d in sorted(timeline.devices) if len(snapshot.trace(d)) and (device is None or d == device)]
    results = []
    for d in devices:
        start = start_state(snapshot, timeline, d)
        r = replay_device(snapshot, timeline, d, recorded, start)
        same = r.observed if r.agrees and capacity is None else None      # what the allocator did, reproduced
        w = None if changed is None else whatif_device(snapshot, timeline, d, changed, capacity, total, start, same)
        results.append(DeviceResult(device=d, replay=r, whatif=w))
    return WhatIf(source=str(snapshot.source), recorded=recorded, changed=changed,
                  traced=any(len(snapshot.trace(d)) for d in snapshot.devices), devices=tuple(results),
                  requires=newer_torch_needed(snapshot, recorded, changed) if changed is not None else ())


def _events(events: tuple[SegmentEvent, ...]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(e) for e in events]


def _divergence(d: Divergence | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {"index": d.index, "kind": d.kind, "recorded": _events(d.recorded), "simulated": _events(d.simulated),
            "recorded_addr": d.recorded_addr, "simulated_addr": d.simulated_addr, "size": d.size}


def _prediction(p: Prediction) -> dict[str, Any]:
    return {"settings": p.settings, "simulated_events": p.simulated, "reserved_peak": p.reserved_peak,
            "peak_index": p.peak_index, "unallocated_at_peak": p.unallocated_at_peak,
            "largest_free_at_peak": p.largest_free_at_peak,
            "ooms": [dataclasses.asdict(o) for o in p.ooms], "valid_until": _divergence(p.stop)}


def _device_json(d: DeviceResult) -> dict[str, Any]:
    r = d.replay
    out: dict[str, Any] = {
        "device": d.device,
        "replay": {"events": r.events, "simulated_events": r.simulated, "segment_events": r.segment_events,
                   "matched": r.matched, "allocations": r.allocations, "addresses_matched": r.addresses_matched,
                   "reserved_equal": r.reserved_equal, "start_exact": r.start_exact,
                   "first_divergence": _divergence(r.first_divergence)}}
    if d.whatif is not None:
        w = d.whatif
        out["whatif"] = {"capacity": w.capacity, "capacity_source": w.capacity_source,
                         "trace_reserved_peak": w.trace_reserved_peak, "recorded": _prediction(w.baseline),
                         "changed": _prediction(w.changed)}
    return out
