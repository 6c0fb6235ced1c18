"""A capture as the snapshot `torch.cuda.memory._snapshot()` of that moment would be, in a given torch's layout.

Contract: `write(capture, torch_version)` returns the snapshot dict — `segments` (the allocator model's segments
with their blocks; a block's `frames` the stack its allocation recorded, [] before recording), `device_traces`
(one device: the entries since recording began, the last `max_entries` of them) and, by version, what that
torch writes (`PROFILES`): `time_us` (2.2+), `allocator_settings` (2.3+), `external_annotations` (2.5+, the
record_function spans), `compile_context` (2.8+), `user_metadata` (2.10+), `pool_id` (2.12+); frames as new
dicts per entry (2.1) or one shared dict per distinct frame (2.6 and later, as their pickles share them).
`VERSIONS` lists the layouts. Builtins only, as a real snapshot holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...allocator.settings import SIZE_MAX, AllocatorSettings, MiB

if TYPE_CHECKING:
    from .tracker import CpuCapture, Tracked


@dataclass(frozen=True)
class Profile:
    time: bool
    settings: bool
    annotations: bool
    compile_context: bool
    user_metadata: bool
    pool_id: bool
    shared_frames: bool
    stream_reuse: bool          # allocator_settings has graph_capture_record_stream_reuse (2.10+)


PROFILES = {
    "2.1": Profile(False, False, False, False, False, False, False, False),
    "2.6": Profile(True, True, True, False, False, False, True, False),
    "2.11": Profile(True, True, True, True, True, False, True, True),
    "2.13": Profile(True, True, True, True, True, True, True, True),
}
VERSIONS = tuple(PROFILES)


def write(cap: CpuCapture, torch_version: str = "2.13", paths: Mapping[str, str] | None = None) -> dict[str, Any]:
    """See the module docstring. `paths` maps path prefixes of this machine to those the snapshot shows (the
    longest prefix that matches, once per distinct file), as if the program had run elsewhere."""
    if torch_version not in PROFILES:
        raise ValueError(f"torch_version must be one of {', '.join(VERSIONS)}, not {torch_version!r}")
    profile = PROFILES[torch_version]
    cap._drain()
    frames = _Frames(cap, profile.shared_frames, paths or {})
    out: dict[str, Any] = {"segments": _segments(cap, frames), "device_traces": [_trace(cap, frames, profile)]}
    if profile.settings:
        out["allocator_settings"] = settings_document(cap.settings, profile.stream_reuse)
    if profile.annotations:
        out["external_annotations"] = [dict(a) for a in cap.annotations]
    return out


class _Frames:
    """Stacks as lists of frame dicts: one dict per distinct frame when shared, new dicts otherwise."""

    def __init__(self, cap: CpuCapture, shared: bool, paths: Mapping[str, str]) -> None:
        self.cap, self.shared = cap, shared
        self.dicts: dict[tuple[str, int, str], dict[str, Any]] = {}
        self.prefixes = sorted(paths.items(), key=lambda kv: -len(kv[0]))
        self.files: dict[str, str] = {}

    def file(self, filename: str) -> str:
        hit = self.files.get(filename)
        if hit is None:
            hit = next((new + filename[len(old):] for old, new in self.prefixes if filename.startswith(old)),
                       filename)
            self.files[filename] = hit
        return hit

    def of(self, stack_id: int) -> list[dict[str, Any]]:
        if stack_id < 0:
            return []
        out = []
        for local, line, name in self.cap.stacks[stack_id]:
            filename = self.file(local) if local.endswith(".py") else local
            if not self.shared:
                out.append({"name": name, "filename": filename, "line": line})
                continue
            d = self.dicts.get((local, line, name))
            if d is None:
                d = self.dicts[(local, line, name)] = {"name": name, "filename": filename, "line": line}
            out.append(d)
        return out


def _segments(cap: CpuCapture, frames: _Frames) -> list[dict[str, Any]]:
    by_addr: dict[int, Tracked] = {b.addr: b for b, _ in cap.live.values()}
    by_addr.update({b.addr: b for b in cap.blocks if b.free < 0 and "workspace" in b.roles})
    alloc = cap.allocator
    out = []
    for addr in sorted(alloc.segments):
        seg = alloc.segments[addr]
        run: list[dict[str, Any]] = []
        start = None
        for block in alloc.segment_blocks(seg):
            if not block.mapped:                           # an expandable segment: one segment per mapped run
                if run:
                    out.append(_segment(seg, start, run, frames))
                run, start = [], None
                continue
            if start is None:
                start = block.addr
            tracked = by_addr.get(block.addr) if block.allocated else None
            run.append({"address": block.addr, "size": block.size,
                        "requested_size": block.requested if block.allocated else 0,
                        "state": "active_allocated" if block.allocated else "inactive",
                        "frames": frames.of(tracked.frames) if tracked is not None else []})
        if run:
            out.append(_segment(seg, start, run, frames))
    return out


def _segment(seg: Any, start: int | None, blocks: list[dict[str, Any]], frames: _Frames) -> dict[str, Any]:
    active = [b for b in blocks if b["state"] == "active_allocated"]
    allocated = sum(b["size"] for b in active)
    return {"device": 0, "address": start if start is not None else seg.addr,
            "total_size": sum(b["size"] for b in blocks), "allocated_size": allocated, "active_size": allocated,
            "requested_size": sum(b["requested_size"] for b in active), "stream": seg.stream,
            "segment_type": "small" if seg.small else "large", "segment_pool_id": (0, 0),
            "is_expandable": seg.expandable, "frames": [], "blocks": blocks}


def _trace(cap: CpuCapture, frames: _Frames, profile: Profile) -> list[dict[str, Any]]:
    if cap.recording_from is None:
        return []
    start = max(cap.recording_from, len(cap.entries) - cap.max_entries)
    out = []
    for e in cap.entries[start:]:
        d: dict[str, Any] = {"action": e.action}
        if e.action == "oom":
            d["device_free"] = e.device_free
        else:
            d["addr"] = e.addr
        d["size"] = e.size
        d["stream"] = 0
        if profile.time:
            d["time_us"] = e.time_us
        if profile.compile_context:
            d["compile_context"] = "N/A"
        if profile.user_metadata:
            d["user_metadata"] = ""
        if profile.pool_id:
            d["pool_id"] = (0, 0)
        d["frames"] = frames.of(e.frames)
        out.append(d)
    return out


def trace_start(cap: CpuCapture) -> int:
    """The index in `cap.entries` of the first entry the snapshot's trace holds (len(entries): none)."""
    if cap.recording_from is None:
        return len(cap.entries)
    return max(cap.recording_from, len(cap.entries) - cap.max_entries)


def settings_document(s: AllocatorSettings, stream_reuse: bool) -> dict[str, Any]:
    """`allocator_settings` as torch writes it for these settings."""
    out: dict[str, Any] = {
        "PYTORCH_CUDA_ALLOC_CONF": s.conf(),
        "max_split_size": -1 if s.max_split_size == SIZE_MAX else s.max_split_size,
        "garbage_collection_threshold": s.garbage_collection_threshold,
        "expandable_segments": s.expandable_segments,
        "pinned_num_register_threads": 1,
        "release_lock_on_cudamalloc": False,
        "pinned_use_cuda_host_register": False,
    }
    if stream_reuse:
        out["graph_capture_record_stream_reuse"] = False
    out["roundup_power2_divisions"] = {str(1 << i): d for i, d in enumerate(s.roundup_power2_divisions)}
    if s.max_non_split_rounding_size != 20 * MiB:
        out["max_non_split_rounding_size"] = s.max_non_split_rounding_size
    return out
