"""Turn the raw builtins of a snapshot into the columnar Snapshot; the only code that reads raw dicts.

Contract: `to_snapshot(raw, source, container)` accepts every layout PyTorch has written — the dict of
2.0–2.14 (`segments`, `device_traces`, `allocator_settings`, `external_annotations`, …), the bare list of
segments of `torch.cuda.memory_snapshot()`, 2.0 blocks with `history` instead of addresses — ignores
unknown keys, and raises BadInputError for anything else, naming the file and what was wrong.
Per-event work is one list comprehension per column over the trace, run once; frames are kept as
references to the unpickled lists and interned later, only where an analysis needs them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from ..errors import BadInputError
from ..model import (
    ACTION_CODE,
    ACTIONS,
    BLOCK_COLUMNS,
    OOM,
    SEGMENT_COLUMNS,
    DeviceTrace,
    Format,
    Snapshot,
    TraceDetails,
    columns_from_rows,
)
from .safe_pickle import gc_paused


def _pool_text(pool: Any) -> str:
    if pool is None:
        return "0,0"
    if isinstance(pool, (list, tuple)):
        return ",".join(str(int(p)) for p in pool)
    return str(pool)


def _column(entries: list[dict[str, Any]], key: str, default: Any) -> list[Any]:
    try:
        return [e[key] for e in entries]
    except KeyError:
        return [e.get(key, default) for e in entries]


def _addresses(values: list[Any]) -> np.ndarray:
    return np.array(values, dtype=np.uint64) if values else np.zeros(0, dtype=np.uint64)


def _interned(values: list[Any]) -> tuple[np.ndarray, tuple[str, ...]]:
    table: dict[Any, int] = {}
    codes = [table.setdefault(v, len(table)) for v in values]
    return np.array(codes, dtype=np.int32), tuple("" if v is None else str(v) for v in table)


def _trace(device: int, entries: list[dict[str, Any]]) -> DeviceTrace:
    names = [e["action"] for e in entries]
    if not all(isinstance(a, str) for a in names):
        raise TypeError("a trace entry's 'action' is not a string")
    table: dict[str, int] = dict(ACTION_CODE)
    codes = [table.setdefault(a, len(table)) for a in names]
    action = np.array(codes, dtype=np.int16) if codes else np.zeros(0, dtype=np.int16)
    first = entries[0] if entries else {}
    times = None
    if any("time_us" in e for e in (first, entries[-1] if entries else {})):
        times = np.array(_column(entries, "time_us", 0), dtype=np.int64)
    user_metadata = compile_context = None
    um_names: tuple[str, ...] = ()
    cc_names: tuple[str, ...] = ()
    if "user_metadata" in first:
        user_metadata, um_names = _interned(_column(entries, "user_metadata", ""))
    if "compile_context" in first:
        compile_context, cc_names = _interned(_column(entries, "compile_context", ""))
    oom_code = ACTION_CODE["oom"]
    device_free = {int(i): int(entries[i].get("device_free", 0)) for i in np.flatnonzero(action == oom_code)}
    return DeviceTrace(
        device=device,
        action=action,
        addr=_addresses(_column(entries, "addr", 0)),
        size=np.array(_column(entries, "size", 0), dtype=np.int64),
        stream=np.array(_column(entries, "stream", 0), dtype=np.int64),
        time_us=times,
        frames=_column(entries, "frames", None),
        action_names=tuple(table),
        details_source=TraceDetails(user_metadata=user_metadata, user_metadata_names=um_names,
                                    compile_context=compile_context, compile_context_names=cc_names,
                                    device_free=device_free),
    )


def _segments(segments: list[dict[str, Any]]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[Any], bool]:
    seg_rows: list[tuple[Any, ...]] = []
    block_rows: list[tuple[Any, ...]] = []
    block_frames: list[Any] = []
    legacy = False
    for seg in segments:
        device = int(seg.get("device", 0))
        address = int(seg["address"])
        pool = _pool_text(seg.get("segment_pool_id"))
        stream = int(seg.get("stream", 0))
        kind = str(seg.get("segment_type", ""))
        expandable = bool(seg.get("is_expandable", False))
        blocks = seg.get("blocks") or []
        seg_rows.append((device, address, int(seg.get("total_size", 0)), int(seg.get("allocated_size", 0)),
                         int(seg.get("active_size", 0)), int(seg.get("requested_size", 0)), stream, kind,
                         pool, expandable))
        offset = address
        for block in blocks:
            size = int(block["size"])
            history = block.get("history")
            if "address" in block:
                block_address = int(block["address"])
            else:
                legacy = True
                block_address = offset
            requested = block.get("requested_size")
            frames = block.get("frames")
            if history:
                legacy = legacy or "address" not in block
                last = history[-1]
                if requested is None:
                    requested = last.get("real_size", size)
                if frames is None:
                    frames = last.get("frames")
            state = str(block.get("state", "inactive"))
            block_rows.append((device, address, block_address, size,
                               int(requested if requested is not None else 0), state, stream, pool, kind,
                               expandable))
            block_frames.append(frames)
            offset += size
    return (columns_from_rows(seg_rows, SEGMENT_COLUMNS), columns_from_rows(block_rows, BLOCK_COLUMNS),
            block_frames, legacy)


def _annotations(items: Any) -> pd.DataFrame:
    rows = [(int(a.get("device", 0)), str(a.get("name", "")), str(a.get("stage", "")),
             a.get("time_us")) for a in items or [] if isinstance(a, dict)]
    df = pd.DataFrame(rows, columns=["device", "name", "stage", "time_us"])
    df["time_us"] = df["time_us"].astype("Int64")
    return df


def _keys(items: Any, pick: Callable[[Any], Any] = lambda x: x, limit: int = 2000) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for item in items[:limit]:
        obj = pick(item)
        if isinstance(obj, dict):
            for k in obj:
                seen.setdefault(str(k), None)
    return tuple(seen)


def to_snapshot(raw: Any, source: str, container: str) -> Snapshot:
    """Build the columnar Snapshot from what the file held (see module docstring)."""
    try:
        with gc_paused():
            return _to_snapshot(raw, source, container)
    except BadInputError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as exc:
        what = f"missing key {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise BadInputError(source, f"not a PyTorch memory snapshot: unexpected structure ({what})") from None


def _to_snapshot(raw: Any, source: str, container: str) -> Snapshot:
    if isinstance(raw, list):
        if raw and not all(isinstance(s, dict) and "address" in s for s in raw):
            raise BadInputError(source, "not a PyTorch memory snapshot: a list whose items are not segments")
        layout, segments, traces_raw = "segment list", raw, None
        top: tuple[str, ...] = ()
        settings, annotations = None, None
    elif isinstance(raw, dict):
        if "segments" not in raw:
            keys = ", ".join(sorted(map(str, raw))[:8]) or "none"
            raise BadInputError(source, "not a PyTorch memory snapshot: no 'segments' key "
                                f"(top-level keys: {keys})")
        segments = raw["segments"]
        if not isinstance(segments, list):
            raise BadInputError(source, "not a PyTorch memory snapshot: 'segments' is not a list")
        layout, traces_raw, top = "dict", raw.get("device_traces"), tuple(map(str, raw))
        settings = raw.get("allocator_settings")
        annotations = raw.get("external_annotations")
    else:
        raise BadInputError(source, f"not a PyTorch memory snapshot: the file holds a {type(raw).__name__}, "
                            "expected a dict with 'segments' or a list of segments")
    if traces_raw is not None and not isinstance(traces_raw, list):
        raise BadInputError(source, "not a PyTorch memory snapshot: 'device_traces' is not a list")
    traces: dict[int, DeviceTrace] = {}
    entry_keys: dict[str, None] = {}
    for device, entries in enumerate(traces_raw or []):
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries[:1]):
            raise BadInputError(source, f"device_traces[{device}] is not a list of trace entries")
        if entries:
            traces[device] = _trace(device, entries)
            for k in _keys(entries) + _keys(entries[-50:]):
                entry_keys.setdefault(k, None)
    seg_columns, block_columns, block_frames, legacy = _segments(segments)
    fmt = Format(
        container=container,
        layout=layout,
        top_level_keys=top,
        entry_keys=tuple(entry_keys),
        segment_keys=_keys(segments),
        block_keys=_keys([b for s in segments[:200] for b in (s.get("blocks") or [])]),
        legacy_block_history=legacy,
        trace_included=traces_raw is not None,
    )
    return Snapshot(
        source=source,
        traces=traces,
        segment_columns=seg_columns,
        block_columns=block_columns,
        block_frames=block_frames,
        annotations_source=_annotations(annotations),
        allocator_settings=settings if isinstance(settings, dict) else None,
        format=fmt,
    )


__all__ = ["to_snapshot", "ACTIONS", "OOM"]
