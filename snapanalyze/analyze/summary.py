"""What a snapshot file holds: format, inferred torch version range, devices, actions, optional parts.

Contract: `summarize(snapshot)` returns a frozen, picklable `Summary` of facts read off the file; its
`to_json()` is the document `summary --format json` prints, and the terminal and the report render the object
itself. Nothing is replayed. The device type (cuda, xpu) is inferred from the allocator settings' key; pinned
host memory (torch ≥ 2.14) is described under `host`, apart from the devices. The torch version range is
inferred from which keys are present or absent (a fingerprint built from the "since" column of the format
notes) and is always labelled as inferred, with its evidence.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..model import ANNOTATE, OOM, SEGMENT_MAP, SEGMENT_UNMAP, Snapshot
from ..stacks import is_python_frame

_ROUND_MAX_ENTRIES = {10**k for k in range(3, 9)} | {2**k for k in range(10, 28)} | {
    m * 10**k for m in (2, 5) for k in range(3, 8)}


@dataclass(frozen=True)
class VersionRange:
    """The torch versions that could have written the file, always inferred, with the keys that say so."""

    range: str
    inferred: bool
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class DeviceType:
    """The accelerator the file came from (inferred: no field names it)."""

    value: str
    inferred: bool
    evidence: str


@dataclass(frozen=True)
class DeviceFacts:
    """One device's trace and end state (`device` is "host" for pinned host memory)."""

    device: int | str
    events: int
    actions: Mapping[str, int]
    first_time_us: int | None
    last_time_us: int | None
    duration_us: int | None
    events_with_frames: int
    segments: int
    reserved_bytes: int
    active_blocks: int
    ring_buffer: str


@dataclass(frozen=True)
class Parts:
    """Which optional parts the file holds."""

    trace: bool
    frames: bool
    cpp_frames: bool
    annotations: int
    user_metadata_entries: int
    compile_context: bool
    private_pools: tuple[str, ...]
    expandable_segments: bool
    legacy_block_history: bool


@dataclass(frozen=True)
class Summary:
    """What a snapshot file holds (see the module docstring)."""

    source: str
    container: str
    layout: str
    torch_version: VersionRange
    device_type: DeviceType
    devices: tuple[DeviceFacts, ...]
    has: Parts
    allocator_settings: Mapping[str, Any] | None
    host: tuple[DeviceFacts, ...] | None        # pinned host memory, apart from the devices (torch >= 2.14)
    ooms: tuple[Mapping[str, Any], ...]
    unknown_actions: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The JSON document: every field by name, in order."""
        return asdict(self)


Version = tuple[int, int]
NO_UPPER: Version = (9, 99)


def torch_version_bounds(s: Snapshot) -> tuple[Version, Version | None, list[str]]:
    """The oldest and newest torch (major, minor) that could have written the file (newest None: no bound), and
    the evidence, from which keys it holds (always an inference). A bare segment list says nothing: (0, 0)–None."""
    f = s.format
    entry = set(f.entry_keys)
    has_entries = any(len(t) for t in s.traces.values())
    lo, hi = (2, 0), NO_UPPER
    evidence: list[str] = []

    def since(v: tuple[int, int], why: str) -> None:
        nonlocal lo
        if v > lo:
            lo = v
        evidence.append(f"{why} → ≥ {v[0]}.{v[1]}")

    def until(v: tuple[int, int], why: str) -> None:
        nonlocal hi
        if v < hi:
            hi = v
        evidence.append(f"{why} → ≤ {v[0]}.{v[1]}")

    if f.layout == "segment list":
        return (0, 0), None, ["a bare list of segments (no trace)"]
    if f.legacy_block_history:
        until((2, 0), "blocks carry 'history' and no address")
    if "time_us" in entry:
        since((2, 2), "trace entries have time_us")
    elif has_entries:
        until((2, 1), "trace entries have no time_us")
    if "allocator_settings" in f.top_level_keys:
        since((2, 3), "allocator_settings present")
    elif f.trace_included:
        until((2, 2), "no allocator_settings")
    if "external_annotations" in f.top_level_keys:
        since((2, 5), "external_annotations present")
    elif "allocator_settings" in f.top_level_keys:
        until((2, 4), "no external_annotations")
    if "compile_context" in entry:
        since((2, 8), "trace entries have compile_context")
    elif has_entries and "time_us" in entry:
        until((2, 7), "trace entries have no compile_context")
    if "user_metadata" in entry:
        since((2, 10), "trace entries have user_metadata")
    elif "compile_context" in entry:
        until((2, 9), "trace entries have no user_metadata")
    if "pool_id" in entry:
        since((2, 12), "trace entries have pool_id")
    elif "user_metadata" in entry:
        until((2, 11), "trace entries have no pool_id")
    if "host_segments" in f.top_level_keys or any((t.action == ANNOTATE).any() for t in s.traces.values()):
        since((2, 14), "pinned host segments or annotate entries")
    elif "pool_id" in entry:
        until((2, 13), "no host_segments")
    return lo, None if hi == NO_UPPER else hi, evidence


def _version_range(s: Snapshot) -> tuple[str, list[str]]:
    if s.format.layout == "segment list":
        return "≤ 1.13 or memory_snapshot() output", ["a bare list of segments (no trace)"]
    lo, hi, evidence = torch_version_bounds(s)
    return version_text(lo, hi), evidence


def version_text(lo: Version, hi: Version | None) -> str:
    """"2.3–2.4", "2.0", "≥ 2.10", or "unknown (contradictory fingerprint)" when the bounds cross."""
    if hi is not None and lo > hi:
        return "unknown (contradictory fingerprint)"
    low = f"{lo[0]}.{lo[1]}"
    if hi is None:
        return f"≥ {low}"
    high = f"{hi[0]}.{hi[1]}"
    return low if low == high else f"{low}–{high}"


def _device_type(s: Snapshot) -> DeviceType:
    """The accelerator a snapshot came from: no field names it, so it is inferred from the allocator
    settings' key (CUDA writes PYTORCH_CUDA_ALLOC_CONF, XPU and the generic accelerator PYTORCH_ALLOC_CONF)."""
    settings = s.allocator_settings or {}
    if "PYTORCH_CUDA_ALLOC_CONF" in settings:
        return DeviceType("cuda", True, "allocator_settings has PYTORCH_CUDA_ALLOC_CONF")
    if "PYTORCH_ALLOC_CONF" in settings:
        return DeviceType("xpu", True,
                          "allocator_settings has PYTORCH_ALLOC_CONF, not PYTORCH_CUDA_ALLOC_CONF (torch.xpu)")
    return DeviceType("unknown", True, "no allocator settings name their accelerator")


def _has_cpp_frames(s: Snapshot, sample: int = 200) -> bool:
    """Whether native frames were recorded (stacks="all"): among the first `sample` events of each device and
    blocks, through the interned stacks (a converted run keeps no raw frames)."""
    stacks = [s.event_stack_ids(d, np.arange(min(sample, len(t)))) for d, t in s.traces.items()]
    stacks.append(s.block_stack_ids(np.arange(min(sample, len(s.block_columns["device"])))))
    frames = s.interner.frames
    return any(not is_python_frame(frames[f][0]) for ids in stacks for sid in set(ids.tolist()) if sid >= 0
               for f in s.interner.stacks[sid])


def summarize(s: Snapshot) -> Summary:
    """Facts about the file (see the module docstring)."""
    version, evidence = _version_range(s)
    devices = []
    for d in s.devices:
        t = s.trace(d)
        n = len(t)
        counts: Counter[str] = Counter()
        for code, k in zip(*np.unique(t.action, return_counts=True)):
            counts[t.action_names[int(code)]] = int(k)
        with_frames = int((s.event_stack_ids(d, np.arange(n)) >= 0).sum())
        times = t.time_us
        first = int(times[0]) if times is not None and n else None
        last = int(times[-1]) if times is not None and n else None
        segs = s.segments[s.segments["device"] == d]
        blocks = s.blocks[s.blocks["device"] == d]
        devices.append(DeviceFacts(
            device=d,
            events=n,
            actions=dict(sorted(counts.items())),
            first_time_us=first,
            last_time_us=last,
            duration_us=(last - first) if first is not None and last is not None else None,
            events_with_frames=with_frames,
            segments=len(segs),
            reserved_bytes=int(segs["total_size"].sum()),
            active_blocks=int(blocks["state"].isin(["active_allocated", "active_pending_free",
                                                    "active_awaiting_free"]).sum()),
            ring_buffer=_ring_buffer_note(n, counts),
        ))
    pools = sorted(p for p in s.segments["pool_id"].astype(str).unique() if p != "0,0") \
        if len(s.segments) else []
    expandable = bool(s.segments["is_expandable"].any()) if len(s.segments) else False
    expandable = expandable or any(((t.action == SEGMENT_MAP) | (t.action == SEGMENT_UNMAP)).any()
                                   for t in s.traces.values())
    user_md = 0
    for t in s.traces.values():
        if t.user_metadata is not None:
            nonempty = [i for i, name in enumerate(t.user_metadata_names) if name]
            user_md += int(np.isin(t.user_metadata, nonempty).sum())
    ooms = s.ooms
    return Summary(
        source=s.source,
        container=s.format.container,
        layout=s.format.layout,
        torch_version=VersionRange(version, True, tuple(evidence)),
        device_type=_device_type(s),
        devices=tuple(devices),
        has=Parts(
            trace=any(len(t) for t in s.traces.values()),
            frames=any(d.events_with_frames for d in devices) or
            bool((s.block_stack_ids(np.arange(len(s.block_columns["device"]))) >= 0).any()),
            cpp_frames=_has_cpp_frames(s),
            annotations=len(s.annotations),
            user_metadata_entries=user_md,
            compile_context="compile_context" in s.format.entry_keys,
            private_pools=tuple(pools),
            expandable_segments=expandable,
            legacy_block_history=s.format.legacy_block_history,
        ),
        allocator_settings=s.allocator_settings,
        host=(tuple(dataclasses.replace(d, device="host") for d in summarize(s.host).devices)
              if s.host is not None else None),
        ooms=tuple(ooms.astype(object).where(ooms.notna(), None).to_dict("records")),
        unknown_actions=tuple(sorted({n for t in s.traces.values() for n in t.action_names[10:]})),
    )


def _ring_buffer_note(n: int, counts: Counter[str]) -> str:
    if n == 0:
        return "no trace"
    if n <= 1:
        return "state only (1-entry legacy trace)"
    if n in _ROUND_MAX_ENTRIES:
        return f"probably full: {n:,} is a typical max_entries value; older events were likely evicted"
    return "not full (event count is not a typical max_entries value; inferred)"


__all__ = ["summarize", "Summary", "DeviceFacts", "Parts", "VersionRange", "DeviceType", "OOM"]
