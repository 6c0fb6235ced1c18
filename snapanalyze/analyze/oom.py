"""Why an allocation failed: the numbers at each `oom` entry and a verdict in plain words.

Contract: `explain_oom(snapshot, …)` returns an `OomExplanation`. For each `oom` trace entry (the rounded
request, its stream, the bytes the driver reported free) it states the live active bytes, reserved,
reserved-but-free (reserved − Σ sizes of blocks in use), the largest free block that could have served the
request (same stream, default pool, small/large pool by the request's size, honouring max_split_size) and
the memory outside the allocator (capacity − reserved − device free when the capacity is known; NVML
splits it into this process and other processes). The free blocks come from the end state's segments when
the `oom` entry is the device's last block-changing event — a snapshot dumped by the OOM observer — and are
otherwise estimated from the replay (live blocks at the entry laid into the segments of that moment), which
`exact` and `state_source` say. Verdicts:
- "fragmentation": no single usable free block fits the request, although reserved-but-free + device free
  (or reserved-but-free alone) would;
- "outside_pressure": the device could not give the request (reserved-but-free + device free < request) and
  NVML measured, around the failure, other processes' bytes or growth of memory outside the allocator at
  least as large as what was missing (NVML samples from idle moments alone never decide);
- "live_exhaustion": the device could not give the request and nothing outside explains it;
- "unexplained" (checked first): a usable free block was large enough, so the state at the failure differs
  from what the file shows.
Each verdict comes with `why` (the arithmetic in words) and `advice` drawn from the numbers and from the
categories live at the failure (`attribute` at the entry). Without any `oom` entry, `no_oom` says that no
allocation failure was recorded — a rejected request (named when a request marker says so, see
`rejected_requests`) was refused by an admission limit — and how far the peak stayed below capacity (NVML
used at the peak, else reserved; or that the capacity is unknown). `explain_path(file_or_run)` does this
for a file or every rank of a run, with each rank's NVML samples, markers and capacity.

`OomExplanation.ooms` columns: OOM_COLUMNS. `.categories` columns: device, index, category, bytes, share,
blocks, window_bytes (of those, allocated inside the trace window).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .. import units
from ..model import (
    ACTIVE_STATES,
    ALLOC,
    FREE_COMPLETED,
    FREE_REQUESTED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    Snapshot,
)
from ..replay import DeviceTimeline, Timeline, replay
from .attribute import attribute
from .outside import join_samples, outside_at_instant
from .peaks import global_peak_index
from .rules import RuleSet

MiB = 1 << 20
SMALL_REQUEST = MiB            # rounded requests up to 1 MiB use the small pool
LARGE_BUFFER = 20 * MiB        # torch's kLargeBuffer: an oversize request never takes a block ≥ request + this
OOM_COLUMNS = [
    "device", "index", "time_us", "stream", "request_bytes", "device_free_bytes", "active_bytes",
    "allocated_bytes", "reserved_bytes", "reserved_free_bytes", "largest_free_block_bytes",
    "largest_free_block_any_bytes", "free_blocks", "pool", "segment_type", "exact", "state_source",
    "capacity_bytes", "capacity_source", "outside_bytes", "outside_source", "own_outside_bytes",
    "other_processes_bytes", "outside_growth_bytes", "shortfall_bytes", "split_segments", "verdict", "why", "advice",
]
CATEGORY_COLUMNS = ["device", "index", "category", "bytes", "share", "blocks", "window_bytes"]
_BLOCK_CHANGING = (ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP)
_ACTIVATIONS = ("attention", "mlp", "logits", "other")
CATEGORY_ADVICE = {
    "kv_cache": "a smaller KV cache / request pool (gpu_memory_utilization, mem_fraction_static, max_model_len, "
                "max_num_seqs / max_running_requests, max_total_tokens)",
    "weights": "smaller weights: a quantized checkpoint or more tensor/pipeline parallelism",
    "logits": "fewer positions through lm_head at once: no prompt_logprobs over the whole prompt, or a smaller "
              "chunk (max_num_batched_tokens / chunked_prefill_size)",
    "fallback_kernel": "a fused attention backend (flash / memory-efficient SDPA, FlashAttention) instead of the "
                       "math fallback that materialises B·H·L² scores",
    "vision_encoder": "a smaller vision batch (fewer images per request, max_pixels, a smaller encoder budget or "
                      "chunked ViT)",
    "graph_capture": "fewer captured batch sizes (cudagraph_capture_sizes) or a lower gpu_memory_utilization",
    "concurrent_request": "fewer requests in flight (max_num_seqs)",
    "communication": "smaller communication buffers (NCCL_BUFFSIZE, fewer communicators)",
    "workspace": "smaller library workspaces (CUBLAS_WORKSPACE_CONFIG, engine workspace limits)",
    "optimizer_state": "less optimizer state per device: shard it (ZeRO / FSDP / a distributed optimizer), an "
                       "8-bit or factored optimizer, or offload it",
    "gradients": "fewer gradients held at once: zero_grad(set_to_none=True) before the forward, shard them "
                 "(ZeRO-2 / FSDP), or accumulate in lower precision",
    "inputs": "smaller input batches on the device (micro-batches, keep the dataset on the host)",
}
def fmt_bytes(n: int | None) -> str:
    """Binary units for the sentences of `why` and `advice`; None is "unknown"."""
    return units.fmt_bytes(n, none="unknown")


UNKNOWN_CAPACITY = "unknown: no NVML samples or meta.json (give the run directory, or --capacity)"
CHUNK_ADVICE = ("a smaller chunk (max_num_batched_tokens / chunked_prefill_size): the transient of a forward "
                "scales with the tokens scheduled at once")


@dataclass(frozen=True, eq=False)
class OomExplanation:
    """One row per `oom` entry, the categories live at each, or — without any — the no-OOM statement."""

    snapshot: Snapshot
    timeline: Timeline
    ooms: pd.DataFrame
    categories: pd.DataFrame
    no_oom: list[dict[str, Any]] = field(default_factory=list)   # one per device, only when there is no oom
    notes: tuple[str, ...] = ()


def is_last_block_change(snapshot: Snapshot, device: int, index: int) -> bool:
    """Whether no event after `index` on `device` allocated, freed or (un)mapped memory."""
    action = snapshot.trace(device).action[index + 1:]
    return not np.isin(action, _BLOCK_CHANGING).any()


def _end_state_free(snapshot: Snapshot, device: int) -> tuple[pd.DataFrame, int]:
    """Free blocks of the end state (size, stream, pool, segment_type) and Σ sizes of blocks in use."""
    b = snapshot.blocks[snapshot.blocks["device"] == device]
    in_use = b["state"].isin(ACTIVE_STATES).to_numpy()
    free = b[~in_use]
    out = pd.DataFrame({"size": free["size"].to_numpy(dtype=np.int64),
                        "stream": free["stream"].to_numpy(dtype=np.int64),
                        "pool": free["pool_id"].astype(str).to_numpy(),
                        "segment_type": free["segment_type"].astype(str).to_numpy(),
                        "segment_address": free["segment_address"].to_numpy(dtype=np.uint64)})
    return out, int(b["size"].to_numpy(dtype=np.int64)[in_use].sum())


def _estimated_free(snapshot: Snapshot, dt: DeviceTimeline, index: int) -> tuple[pd.DataFrame, int]:
    """Free gaps at event `index`: segments of that moment minus the live blocks (rounded sizes), estimated."""
    device = dt.device
    segs = snapshot.segments[snapshot.segments["device"] == device]
    seg = {int(a): (int(s), int(st), str(p), str(ty)) for a, s, st, p, ty in zip(
        segs["address"], segs["total_size"], segs["stream"], segs["pool_id"].astype(str), segs["segment_type"])}
    t = snapshot.trace(device)
    later = np.arange(index + 1, len(t))
    for i in later[::-1]:                                   # undo segment events after the instant, newest first
        a, act = int(t.addr[i]), int(t.action[i])
        size = int(t.size[i])
        if act in (SEGMENT_ALLOC, SEGMENT_MAP):
            seg.pop(a, None)
        elif act in (SEGMENT_FREE, SEGMENT_UNMAP):
            seg[a] = (size, int(t.stream[i]), "0,0", "small" if size <= 2 * MiB else "large")
    live = dt.live_at(index)
    starts = live["addr"].to_numpy(dtype=np.uint64)
    sizes = live["allocated_est"].to_numpy(dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    starts, sizes = starts[order], sizes[order]
    rows = []
    for a in sorted(seg):
        total, stream, pool, kind = seg[a]
        lo = int(np.searchsorted(starts, np.uint64(a), side="left"))
        hi = int(np.searchsorted(starts, np.uint64(a + total), side="left"))
        pos = a
        for s, n in zip(starts[lo:hi].tolist(), sizes[lo:hi].tolist()):
            if s > pos:
                rows.append((s - pos, stream, pool, kind, a))
            pos = max(pos, s + n)
        if a + total > pos:
            rows.append((a + total - pos, stream, pool, kind, a))
    out = pd.DataFrame(rows, columns=["size", "stream", "pool", "segment_type", "segment_address"])
    out["size"] = out["size"].astype(np.int64)
    out["segment_address"] = out["segment_address"].astype(np.uint64)
    return out, dt.allocated_est_at(index)


def _usable(free: pd.DataFrame, request: int, stream: int, pool: str, max_split: int) -> pd.DataFrame:
    kind = "small" if request <= SMALL_REQUEST else "large"
    ok = (free["stream"] == stream) & (free["pool"] == pool) & (free["segment_type"] == kind)
    if max_split > 0:
        size = free["size"]
        ok &= ~((request < max_split) & (size >= max_split))
        ok &= ~((request >= max_split) & (size >= request + LARGE_BUFFER))
    return free[ok]


def _split_segments(snapshot: Snapshot, device: int) -> pd.DataFrame:
    """Large-pool segments of the end state that hold a live block and a free block over 1 MiB (split)."""
    b = snapshot.blocks[(snapshot.blocks["device"] == device) & (snapshot.blocks["segment_type"] == "large")]
    if not len(b):
        return pd.DataFrame(columns=["segment_address", "segment_size", "free_bytes"])
    in_use = b["state"].isin(ACTIVE_STATES)
    g = b.assign(in_use=in_use, free=np.where(in_use, 0, b["size"]),
                 big_free=(~in_use) & (b["size"] > MiB)).groupby("segment_address")
    agg = g.agg(segment_size=("size", "sum"), free_bytes=("free", "sum"), any_use=("in_use", "any"),
                any_big_free=("big_free", "any")).reset_index()
    return agg[agg["any_use"] & agg["any_big_free"]][["segment_address", "segment_size", "free_bytes"]]


def _advice_for_categories(cats: pd.DataFrame) -> list[str]:
    """Advice for the category that grew the most inside the window (else the largest live one)."""
    if not len(cats):
        return []
    window = cats[cats["window_bytes"] > 0].sort_values("window_bytes", ascending=False, kind="stable")
    pick = window.iloc[0] if len(window) else cats.sort_values("bytes", ascending=False, kind="stable").iloc[0]
    name = str(pick["category"])
    amount = int(pick["window_bytes"]) if len(window) else int(pick["bytes"])
    text = CATEGORY_ADVICE.get(name, CHUNK_ADVICE) if name not in _ACTIVATIONS else CHUNK_ADVICE
    where = "allocated in the trace window and live at the failure" if len(window) else "live at the failure"
    return [f"{text} — {name} holds {fmt_bytes(amount)} {where}"]


def _capacity_outside(capacity: int | None, reserved: int, free: int | None) -> int | None:
    if capacity is None or free is None:
        return None
    return capacity - reserved - free


def _one_oom(snapshot: Snapshot, timeline: Timeline, row: Any, cats: pd.DataFrame, nvml: pd.DataFrame | None,
             capacity: int | None, capacity_source: str) -> dict[str, Any]:
    device, index = int(row.device), int(row.index)
    dt = timeline[device]
    request = int(row.size)
    stream = int(row.stream)
    device_free = None if row.device_free is None or pd.isna(row.device_free) else int(row.device_free)
    free_known = device_free if device_free is not None else 0
    settings = snapshot.allocator_settings or {}
    max_split = int(settings.get("max_split_size") or -1)
    pool = "0,0"
    exact = is_last_block_change(snapshot, device, index)
    if exact:
        free, in_blocks = _end_state_free(snapshot, device)
        reserved = int(snapshot.segments["total_size"][snapshot.segments["device"] == device].sum())
        source = "end state (the oom entry is the last block-changing event)"
    else:
        free, in_blocks = _estimated_free(snapshot, dt, index)
        reserved = dt.reserved_at(index)
        source = "estimated from the replay (events after the oom entry changed memory)"
    reserved_free = reserved - in_blocks
    usable = _usable(free, request, stream, pool, max_split)
    largest = int(usable["size"].max()) if len(usable) else 0
    largest_any = int(free["size"].max()) if len(free) else 0
    active = dt.active_at(index)
    gives = reserved_free + free_known
    outside = _capacity_outside(capacity, reserved, device_free)
    outside_source = "capacity − reserved − device free at the failure" if outside is not None else None
    own = others = growth = None
    near = ""
    if nvml is not None and len(nvml):
        joined = join_samples(dt, nvml)
        at = outside_at_instant(dt, joined, index, 0, what="the failure")
        if at["outside_bytes"] is not None:
            own, others = at["own_outside_bytes"], at["other_processes_bytes"]
            if outside is None:
                outside, outside_source = int(at["outside_bytes"]), f"NVML ({at['basis']})"
            known = joined["outside_bytes"].dropna()
            if len(known):
                growth = int(at["outside_bytes"]) - int(known.min())
            sample = at["sample_before_us"] if at["sample_before_us"] is not None else at["sample_after_us"]
            if sample is not None and at["time_us"] is not None:
                gap = int(at["time_us"]) - int(sample)
                near = f" (NVML sample {abs(gap) / 1000:.1f} ms {'before' if gap >= 0 else 'after'} the failure)"
    splits = _split_segments(snapshot, device) if exact else pd.DataFrame(columns=["segment_size"])
    kind = "small" if request <= SMALL_REQUEST else "large"
    shortfall = max(0, request - gives)
    advice: list[str] = []
    if largest >= request:
        verdict = "unexplained"
        why = (f"a free block of {fmt_bytes(largest)} on stream {stream} could have served the {fmt_bytes(request)} "
               f"request; the state at the failure differs from what the file shows ({source})")
    elif request <= gives:
        verdict = "fragmentation"
        alone = request <= reserved_free
        why = (f"allocation failure from fragmentation: the {fmt_bytes(request)} request did not fit in any single "
               f"free block (largest usable: {fmt_bytes(largest)} in the {kind} pool of stream {stream}) although "
               + (f"{fmt_bytes(reserved_free)} was reserved but free, more than the request by itself"
                  if alone else
                  f"reserved-but-free ({fmt_bytes(reserved_free)}) + device free ({fmt_bytes(free_known)}) = "
                  f"{fmt_bytes(gives)} would have covered it")
               + "; the holes sit in segments that also hold live blocks, so the allocator could not release them")
        if not settings.get("expandable_segments"):
            advice.append(f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True — {fmt_bytes(reserved_free)} is reserved "
                          f"but free in holes of at most {fmt_bytes(largest_any)}; expandable segments grow one "
                          "mapping instead of leaving holes between live blocks")
        if len(splits) and max_split <= 0:
            smallest = int(splits["segment_size"].min()) // MiB
            suggest = max(20, 1 << (max(smallest, 1).bit_length() - 1))
            advice.append(f"max_split_size_mb:{suggest} — {len(splits)} large cached segment(s) were split, leaving "
                          f"{fmt_bytes(int(splits['free_bytes'].sum()))} free beside live blocks; blocks of at "
                          "least that size are then never split, so they can be released whole")
    else:
        pressure = [(others, "other processes held {} on the device")] if others is not None else []
        pressure.append((growth, "memory outside the allocator had grown by {} since the lowest NVML sample"))
        found = [(v, text) for v, text in pressure if v is not None and v >= shortfall and v > 0]
        base = (f"the device could not give the {fmt_bytes(request)} request: reserved-but-free "
                f"({fmt_bytes(reserved_free)}) + device free ({fmt_bytes(free_known)}) = {fmt_bytes(gives)}, "
                f"{fmt_bytes(shortfall)} short")
        if found:
            verdict = "outside_pressure"
            v, text = found[0]
            why = (f"pressure from outside the allocator: {base}; {text.format(fmt_bytes(v))} at the failure"
                   f"{near}, at least the {fmt_bytes(shortfall)} that was missing")
            advice.append("give this process the device to itself (CUDA_VISIBLE_DEVICES, MPS / MIG limits) or lower "
                          "gpu_memory_utilization so its budget leaves room for what runs beside it")
        else:
            verdict = "live_exhaustion"
            why = (f"live memory exhaustion: {base}; live bytes ({fmt_bytes(active)} requested, "
                   f"{fmt_bytes(in_blocks)} in blocks) + the request exceed what the device can give"
                   + (f" ({fmt_bytes(capacity)} capacity, {fmt_bytes(outside)} of it outside the allocator)"
                      if capacity is not None and outside is not None else ""))
            advice.extend(_advice_for_categories(cats))
            advice.append(f"free at least {fmt_bytes(shortfall)} of live memory before this allocation")
    return {
        "device": device, "index": index, "time_us": None if pd.isna(row.time_us) else int(row.time_us),
        "stream": stream, "request_bytes": request, "device_free_bytes": device_free, "active_bytes": active,
        "allocated_bytes": in_blocks, "reserved_bytes": reserved, "reserved_free_bytes": reserved_free,
        "largest_free_block_bytes": largest, "largest_free_block_any_bytes": largest_any, "free_blocks": len(free),
        "pool": pool, "segment_type": kind, "exact": exact, "state_source": source, "capacity_bytes": capacity,
        "capacity_source": capacity_source if capacity is not None else UNKNOWN_CAPACITY, "outside_bytes": outside,
        "outside_source": outside_source, "own_outside_bytes": own, "other_processes_bytes": others,
        "outside_growth_bytes": growth, "shortfall_bytes": shortfall, "split_segments": len(splits),
        "verdict": verdict, "why": why, "advice": advice,
    }


def _categories(snapshot: Snapshot, timeline: Timeline, device: int, index: int, rules: RuleSet | None,
                markers: pd.DataFrame | None) -> pd.DataFrame:
    result = attribute(snapshot, at=f"event:{index}", rules=rules, device=device, timeline=timeline,
                       markers=markers)
    b = result.blocks
    total = int(b["size"].sum())
    g = b.assign(window=np.where(b["alloc_index"] >= 0, b["size"], 0)).groupby("category", sort=False).agg(
        bytes=("size", "sum"), blocks=("size", "size"), window_bytes=("window", "sum")).reset_index()
    g["share"] = g["bytes"] / total if total else 0.0
    g.insert(0, "index", index)
    g.insert(0, "device", device)
    return g.sort_values(["bytes", "category"], ascending=[False, True], kind="stable")[CATEGORY_COLUMNS]


def rejected_requests(markers: pd.DataFrame | None) -> pd.DataFrame:
    """Request markers the engine marked refused: attrs `rejected` truthy or `status` rejected/refused/aborted."""
    if markers is None or not len(markers):
        return pd.DataFrame(columns=["name", "time_us", "reason"])
    rows = []
    for m in markers.itertuples(index=False):
        attrs = m.attrs if isinstance(m.attrs, dict) else {}
        status = str(attrs.get("status", "")).lower()
        if m.kind == "request" and (bool(attrs.get("rejected")) or status in ("rejected", "refused", "aborted")):
            reason = attrs.get("reason") or attrs.get("error") or ""
            rows.append({"name": str(m.name), "time_us": int(m.start_time_us), "reason": str(reason)})
    return pd.DataFrame(rows, columns=["name", "time_us", "reason"])


def _no_oom(dt: DeviceTimeline, nvml: pd.DataFrame | None, capacity: int | None, capacity_source: str,
            rejected: pd.DataFrame) -> dict[str, Any]:
    index = global_peak_index(dt)
    active, reserved = dt.active_at(index), dt.reserved_at(index)
    used = None
    basis = "allocator reserved only (no NVML samples: memory outside the allocator unknown)"
    if nvml is not None and len(nvml):
        at = outside_at_instant(dt, join_samples(dt, nvml), index, None)
        if at["nvml_used_bytes"] is not None:
            used = int(at["nvml_used_bytes"])
            basis = ("NVML used at the peak" if at["nvml_used_measured"] else
                     "reserved at the peak + memory outside the allocator from the NVML samples around it, an "
                     "estimate: no sample fell inside the peak")
    held = used if used is not None else reserved
    headroom = capacity - held if capacity is not None else None
    if len(rejected):
        names = ", ".join(f"{r.name}" + (f" ({r.reason})" if r.reason else "") for r in rejected.itertuples())
        who = f"the rejected request{'s' if len(rejected) > 1 else ''} {names} {'were' if len(rejected) > 1 else 'was'}"
    else:
        who = "any rejected request was"
    message = f"no allocation failure was recorded; {who} refused by an admission limit, not by the allocator"
    if headroom is not None:
        message += (f"; the peak stayed {fmt_bytes(headroom)} below capacity ({fmt_bytes(capacity)}, "
                    f"{capacity_source}; peak {fmt_bytes(held)}: {basis})")
    else:
        message += (f"; the peak reached {fmt_bytes(held)} ({basis}) but the device capacity is unknown "
                    "(no NVML samples or meta.json), so its distance to capacity cannot be said")
    return {"device": dt.device, "peak_index": index, "peak_time_us": dt.time_at(index), "active_bytes": active,
            "reserved_bytes": reserved, "nvml_used_bytes": used, "peak_basis": basis, "capacity_bytes": capacity,
            "capacity_source": capacity_source if capacity is not None else "unknown", "headroom_bytes": headroom,
            "rejected_requests": rejected.to_dict("records"), "message": message}


def explain_oom(snapshot: Snapshot, timeline: Timeline | None = None, *, nvml: pd.DataFrame | None = None,
                capacity: int | Mapping[int, tuple[int | None, str]] | None = None,
                markers: pd.DataFrame | None = None, rules: RuleSet | None = None) -> OomExplanation:
    """Explain every `oom` entry of `snapshot` (see the module docstring).

    `nvml`: the rank's NVML rows (`load.samples`); `capacity`: the device total in bytes for every device,
    or per device (bytes, where it came from), else the NVML total; `markers`: the rank's markers (for
    rejected requests)."""
    timeline = timeline or replay(snapshot)

    def cap(device: int) -> tuple[int | None, str]:
        if isinstance(capacity, int):
            return capacity, "given"
        if capacity is not None and capacity.get(device, (None, ""))[0] is not None:
            return capacity[device]
        if nvml is not None and len(nvml) and (nvml["device"] == device).any():
            return int(nvml[nvml["device"] == device]["total_bytes"].iloc[-1]), "NVML total"
        return None, "unknown"

    ooms = snapshot.ooms
    rows, cats = [], []
    for row in ooms.itertuples(index=False):
        c = _categories(snapshot, timeline, int(row.device), int(row.index), rules, markers)
        cats.append(c)
        total, source = cap(int(row.device))
        rows.append(_one_oom(snapshot, timeline, row, c, nvml, total, source))
    table = pd.DataFrame(rows, columns=OOM_COLUMNS)
    for c in ("time_us", "device_free_bytes", "capacity_bytes", "outside_bytes", "own_outside_bytes",
              "other_processes_bytes", "outside_growth_bytes"):
        table[c] = table[c].astype("Int64")
    categories = pd.concat(cats, ignore_index=True) if cats else pd.DataFrame(columns=CATEGORY_COLUMNS)
    no_oom = []
    notes = []
    if not len(ooms):
        rejected = rejected_requests(markers)
        no_oom = [_no_oom(timeline[d], nvml, *cap(d), rejected) for d in sorted(timeline.devices)
                  if len(timeline[d]) or d in snapshot.traces]
    if (table["exact"] == False).any():  # noqa: E712 - pandas element-wise comparison
        notes.append("estimated: events after an oom entry changed memory, so its free blocks are laid out from the "
                     "replay (live blocks at the entry, rounded sizes), not read from the end state")
    return OomExplanation(snapshot=snapshot, timeline=timeline, ooms=table, categories=categories, no_oom=no_oom,
                          notes=tuple(notes))


@dataclass(frozen=True, eq=False)
class SnapshotOoms:
    """The explanation of one snapshot of a run (or of a lone file: rank and tag None)."""

    rank: int | None
    tag: str | None
    path: Path
    explanation: OomExplanation
