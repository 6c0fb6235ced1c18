"""Turn the raw builtins of a snapshot into the columnar Snapshot; the only code that reads raw dicts.

Contract: `to_snapshot(raw, source, container, stream_bytes=None)` accepts every layout PyTorch has written —
the dict of 2.0–2.14 (`segments`, `device_traces`, `allocator_settings`, `external_annotations`, …), the bare
list of segments of `torch.cuda.memory_snapshot()`, 2.0 blocks with `history` instead of addresses — ignores
unknown keys, and raises BadInputError for anything else, naming the file, the field with the index of its first
bad entry (`device_traces[0][41].size`) and what was expected. Pinned host memory (`host_segments`,
`host_traces`, torch ≥ 2.14) becomes `Snapshot.host`, a Snapshot of its own on device HOST_DEVICE (−1, as torch
writes it). The raw objects are untrusted: every value is type-checked before it is hashed, converted or printed
(no str() of a nested object, no hashing of a deep tuple), strings go through `clean_text`, and `stream_bytes`
(the size of the pickle stream) bounds the rows: more segments, blocks and entries than half the stream's bytes
can only come from shared references repeated (a blow-up), and is refused. Per-event work is one list
comprehension per column over the trace, run once; frames are kept as references to the unpickled lists and
interned later, only where an analysis needs them. Whether the values make sense together is `validate`'s job.
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
    HOST_DEVICE,
    OOM,
    SEGMENT_COLUMNS,
    DeviceTrace,
    Format,
    Snapshot,
    TraceDetails,
    columns_from_rows,
)
from ..stacks import clean_text
from .safe_pickle import gc_paused

MAX_SETTINGS_DEPTH = 4          # allocator_settings nest a dict or two; deeper parts are not settings
MAX_SETTINGS_ITEMS = 1000


class Malformed(Exception):
    """A raw value of the wrong type: `where` it is (a path into the snapshot) and what was wrong."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where} {problem}")


def described(value: Any) -> str:
    """A short, safe description of an untrusted value (never its repr when it is a container)."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= 40 else f"an integer of {len(text)} digits"
    if isinstance(value, str):
        return f"the string {clean_text(value[:40])!r}" + ("…" if len(value) > 40 else "")
    return f"a {type(value).__name__}"


def _integer(value: Any, where: str) -> int:
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise Malformed(where, f"is {described(value)}, expected an integer")


def _text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return clean_text(value)
    if value is None:
        return ""
    raise Malformed(where, f"is {described(value)}, expected a string")


def _pool_text(pool: Any, where: str) -> str:
    """A pool id as text: "a,b" from the (int, int) torch writes (a list in JSON), a short string as is."""
    if pool is None:
        return "0,0"
    if isinstance(pool, (list, tuple)) and 1 <= len(pool) <= 4 and all(
            isinstance(p, int) or (isinstance(p, float) and p.is_integer()) for p in pool):
        return ",".join(str(int(p)) for p in pool)
    if isinstance(pool, str) and len(pool) <= 64:
        return clean_text(pool)
    items = f" of {len(pool)} items" if isinstance(pool, (list, tuple)) else ""
    raise Malformed(where, f"is {described(pool)}{items}, expected a pair of integers")


def _pool_codes(values: list[Any], where: Callable[[int], str]) -> tuple[np.ndarray, tuple[str, ...]]:
    """Codes into a table of pool id texts, one per event. Values are checked to be flat pairs of ints before
    any is hashed (a deep tuple would recurse in hash)."""
    try:
        flat = all(v is None or (type(v) in (tuple, list) and len(v) == 2 and type(v[0]) is int and type(v[1]) is int)
                   for v in values)
    except TypeError:
        flat = False
    if not flat:
        for i, v in enumerate(values):
            _pool_text(v, where(i))
    table: dict[Any, int] = {}
    codes = [table.setdefault(v if type(v) is not list else tuple(v), len(table)) for v in values]
    names = tuple(_pool_text(v, "") for v in table)
    return np.array(codes, dtype=np.int32), names


def _column(entries: list[dict[str, Any]], key: str, default: Any) -> list[Any]:
    try:
        return [e[key] for e in entries]
    except KeyError:
        return [e.get(key, default) for e in entries]


def _numbers(values: list[Any], dtype: Any, where: Callable[[int], str]) -> np.ndarray:
    """`values` as a numpy column of `dtype`; a value that is not an integer there is Malformed."""
    try:
        column = np.array(values, dtype=dtype) if values else np.zeros(0, dtype=dtype)
        if column.ndim == 1:
            return column
    except (TypeError, ValueError, OverflowError):
        pass
    expected = "a non-negative integer below 2**64" if dtype == np.uint64 else "an integer below 2**63"
    for i, v in enumerate(values):              # only on the error path: name the first bad entry
        try:
            if isinstance(v, (list, tuple, dict)):
                raise TypeError
            np.array([v], dtype=dtype)
        except (TypeError, ValueError, OverflowError):
            raise Malformed(where(i), f"is {described(v)}, expected {expected}") from None
    raise Malformed(where(0).rsplit("[", 1)[0], f"holds values that are not {expected}")


def _interned(values: list[Any], where: Callable[[int], str]) -> tuple[np.ndarray, tuple[str, ...]]:
    for i, v in enumerate(values):              # type first: hashing an untrusted object could recurse
        if v is not None and not isinstance(v, str):
            raise Malformed(where(i), f"is {described(v)}, expected a string")
    table: dict[Any, int] = {}
    codes = [table.setdefault(v, len(table)) for v in values]
    return np.array(codes, dtype=np.int32), tuple("" if v is None else clean_text(v) for v in table)


def _trace(device: int, entries: list[dict[str, Any]], name: str | None = None) -> DeviceTrace:
    name = name or f"device_traces[{device}]"

    def at(key: str) -> Callable[[int], str]:
        return lambda i: f"{name}[{i}].{key}"

    names = [e["action"] for e in entries]
    for i, a in enumerate(names):
        if not isinstance(a, str):
            raise Malformed(at("action")(i), f"is {described(a)}, expected a string")
    table: dict[str, int] = dict(ACTION_CODE)
    codes = [table.setdefault(a, len(table)) for a in names]
    action = np.array(codes, dtype=np.int16) if codes else np.zeros(0, dtype=np.int16)
    first = entries[0] if entries else {}
    times = None
    if any("time_us" in e for e in (first, entries[-1] if entries else {})):
        times = _numbers(_column(entries, "time_us", 0), np.int64, at("time_us"))
    user_metadata = compile_context = None
    um_names: tuple[str, ...] = ()
    cc_names: tuple[str, ...] = ()
    if "user_metadata" in first:
        user_metadata, um_names = _interned(_column(entries, "user_metadata", ""), at("user_metadata"))
    if "compile_context" in first:
        compile_context, cc_names = _interned(_column(entries, "compile_context", ""), at("compile_context"))
    pool_key = next((k for k in ("pool_id", "segment_pool_id") if k in first), None)  # the C++ / the viewer's
    pools: tuple[np.ndarray | None, tuple[str, ...]] = (None, ())
    if pool_key is not None:
        pools = _pool_codes(_column(entries, pool_key, None), at(pool_key))
    oom_code = ACTION_CODE["oom"]
    device_free = {int(i): _integer(entries[i].get("device_free", 0), at("device_free")(int(i)))
                   for i in np.flatnonzero(action == oom_code)}
    return DeviceTrace(
        device=device,
        action=action,
        addr=_numbers(_column(entries, "addr", 0), np.uint64, at("addr")),
        size=_numbers(_column(entries, "size", 0), np.int64, at("size")),
        stream=_numbers(_column(entries, "stream", 0), np.int64, at("stream")),
        time_us=times,
        frames=_column(entries, "frames", None),
        action_names=tuple(clean_text(a) for a in table),
        details_source=TraceDetails(user_metadata=user_metadata, user_metadata_names=um_names,
                                    compile_context=compile_context, compile_context_names=cc_names,
                                    device_free=device_free, pool_id=pools[0], pool_id_names=pools[1]),
    )


def _segments(segments: list[dict[str, Any]], name: str = "segments",
              ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[Any], bool]:
    seg_rows: list[tuple[Any, ...]] = []
    block_rows: list[tuple[Any, ...]] = []
    block_frames: list[Any] = []
    legacy = False
    for i, seg in enumerate(segments):
        where = f"{name}[{i}]"
        if not isinstance(seg, dict):
            raise Malformed(where, f"is {described(seg)}, expected a segment dict")
        device = _integer(seg.get("device", 0), f"{where}.device")
        address = _integer(seg["address"], f"{where}.address")
        pool = _pool_text(seg.get("segment_pool_id"), f"{where}.segment_pool_id")
        stream = _integer(seg.get("stream", 0), f"{where}.stream")
        kind = _text(seg.get("segment_type", ""), f"{where}.segment_type")
        expandable = seg.get("is_expandable", False) is True
        blocks = seg.get("blocks") or []
        if not isinstance(blocks, list):
            raise Malformed(f"{where}.blocks", f"is {described(blocks)}, expected a list of blocks")
        seg_rows.append((device, address, *(_integer(seg.get(k, 0), f"{where}.{k}") for k in
                                            ("total_size", "allocated_size", "active_size", "requested_size")),
                         stream, kind, pool, expandable))
        offset = address
        for j, block in enumerate(blocks):
            here = f"{where}.blocks[{j}]"
            if not isinstance(block, dict):
                raise Malformed(here, f"is {described(block)}, expected a block dict")
            size = _integer(block["size"], f"{here}.size")
            history = block.get("history")
            if "address" in block:
                block_address = _integer(block["address"], f"{here}.address")
            else:
                legacy = True
                block_address = offset
            requested = block.get("requested_size")
            frames = block.get("frames")
            if history:
                if not isinstance(history, list) or not isinstance(history[-1], dict):
                    raise Malformed(f"{here}.history", f"is {described(history)}, expected a list of dicts")
                legacy = legacy or "address" not in block
                last = history[-1]
                if requested is None:
                    requested = last.get("real_size", size)
                if frames is None:
                    frames = last.get("frames")
            state = _text(block.get("state", "inactive"), f"{here}.state")
            block_rows.append((device, address, block_address, size,
                               _integer(requested if requested is not None else 0, f"{here}.requested_size"),
                               state, stream, pool, kind, expandable))
            block_frames.append(frames)
            offset += size
    try:
        return (columns_from_rows(seg_rows, SEGMENT_COLUMNS), columns_from_rows(block_rows, BLOCK_COLUMNS),
                block_frames, legacy)
    except OverflowError:
        raise Malformed(name, "hold an address or size that does not fit 64 bits") from None


def _annotations(items: Any) -> pd.DataFrame:
    rows = []
    for i, a in enumerate(items if isinstance(items, list) else []):
        if isinstance(a, dict):
            where = f"external_annotations[{i}]"
            time_us = a.get("time_us")
            rows.append((_integer(a.get("device", 0), f"{where}.device"), _text(a.get("name", ""), f"{where}.name"),
                         _text(a.get("stage", ""), f"{where}.stage"),
                         None if time_us is None else _integer(time_us, f"{where}.time_us")))
    df = pd.DataFrame(rows, columns=["device", "name", "stage", "time_us"])
    df["time_us"] = df["time_us"].astype("Int64")
    return df


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON-like copy of untrusted settings: bounded depth and size, strings cleaned, other objects named."""
    if isinstance(value, str):
        return clean_text(value)
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if depth >= MAX_SETTINGS_DEPTH:
        return f"<{described(value)} nested too deep>"
    if isinstance(value, dict):
        return {clean_text(k) if isinstance(k, str) else described(k): _plain(v, depth + 1)
                for k, v in list(value.items())[:MAX_SETTINGS_ITEMS]}
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1) for v in value[:MAX_SETTINGS_ITEMS]]
    return f"<{described(value)}>"


def _keys(items: Any, pick: Callable[[Any], Any] = lambda x: x, limit: int = 2000) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for item in items[:limit]:
        obj = pick(item)
        if isinstance(obj, dict):
            for k in obj:
                seen.setdefault(clean_text(k) if isinstance(k, str) else described(k), None)
    return tuple(seen)


def to_snapshot(raw: Any, source: str, container: str, stream_bytes: int | None = None) -> Snapshot:
    """Build the columnar Snapshot from what the file held (see module docstring)."""
    try:
        with gc_paused():
            return _to_snapshot(raw, source, container, stream_bytes)
    except BadInputError:
        raise
    except Malformed as exc:
        raise BadInputError(source, f"not a valid memory snapshot: {exc}") from None
    except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as exc:
        what = f"missing key {described(exc.args[0]) if exc.args else ''}" if isinstance(exc, KeyError) \
            else f"{type(exc).__name__}: {clean_text(str(exc))[:200]}"
        raise BadInputError(source, f"not a PyTorch memory snapshot: unexpected structure ({what})") from None
    except RecursionError:
        raise BadInputError(source, "not a PyTorch memory snapshot: a value nests deeper than any snapshot "
                            "does") from None
    except MemoryError:
        raise BadInputError(source, "ran out of memory building the snapshot's tables") from None


def _row_count(segments: list[Any], traces: list[Any]) -> int:
    blocks = sum(len(b) for s in segments if isinstance(s, dict) and isinstance(b := s.get("blocks"), list))
    return len(segments) + blocks + sum(len(e) for e in traces if isinstance(e, list))


def _to_snapshot(raw: Any, source: str, container: str, stream_bytes: int | None) -> Snapshot:
    if isinstance(raw, list):
        if raw and not all(isinstance(s, dict) and "address" in s for s in raw):
            raise BadInputError(source, "not a PyTorch memory snapshot: a list whose items are not segments")
        layout, segments, traces_raw = "segment list", raw, None
        top: tuple[str, ...] = ()
        settings, annotations = None, None
    elif isinstance(raw, dict):
        if "segments" not in raw:
            keys = ", ".join(sorted(_keys([raw]))[:8]) or "none"
            raise BadInputError(source, "not a PyTorch memory snapshot: no 'segments' key "
                                f"(top-level keys: {keys})")
        segments = raw["segments"]
        if not isinstance(segments, list):
            raise BadInputError(source, "not a PyTorch memory snapshot: 'segments' is not a list")
        layout, traces_raw, top = "dict", raw.get("device_traces"), _keys([raw])
        settings = raw.get("allocator_settings")
        annotations = raw.get("external_annotations")
    else:
        kind = type(raw).__name__
        article = "an" if kind[0] in "aeiou" else "a"
        raise BadInputError(source, f"not a PyTorch memory snapshot: the file holds {article} {kind} "
                            f"({described(raw)}), expected a dict with 'segments' or a list of segments")
    if traces_raw is not None and not isinstance(traces_raw, list):
        raise BadInputError(source, "not a PyTorch memory snapshot: 'device_traces' is not a list")
    if stream_bytes is not None and (rows := _row_count(segments, traces_raw or [])) > max(stream_bytes // 2, 1000):
        raise BadInputError(source, f"refused to load: {rows:,} segments, blocks and trace entries from a "
                            f"{stream_bytes:,}-byte pickle: shared references repeated to exhaust the reader "
                            "(a blow-up), not a snapshot")
    traces: dict[int, DeviceTrace] = {}
    entry_keys: dict[str, None] = {}
    for device, entries in enumerate(traces_raw or []):
        if not isinstance(entries, list):
            raise Malformed(f"device_traces[{device}]", f"is {described(entries)}, expected a list of trace entries")
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise Malformed(f"device_traces[{device}][{i}]", f"is {described(e)}, expected a trace entry dict")
        if entries:
            traces[device] = _trace(device, entries)
            for k in _keys(entries) + _keys(entries[-50:]):
                entry_keys.setdefault(k, None)
    seg_columns, block_columns, block_frames, legacy = _segments(segments)
    host = _host(raw, source, container) if isinstance(raw, dict) else None
    fmt = Format(
        container=container,
        layout=layout,
        top_level_keys=top,
        entry_keys=tuple(entry_keys),
        segment_keys=_keys(segments),
        block_keys=_keys([b for s in segments[:200] for b in (s.get("blocks") or [])]),
        legacy_block_history=legacy,
        trace_included=traces_raw is not None,
        trace_devices=len(traces_raw or []),
    )
    return Snapshot(
        source=source,
        traces=traces,
        segment_columns=seg_columns,
        block_columns=block_columns,
        block_frames=block_frames,
        annotations_source=_annotations(annotations),
        allocator_settings=_plain(settings) if isinstance(settings, dict) else None,
        format=fmt,
        host=host,
    )


def _host(raw: dict[str, Any], source: str, container: str) -> Snapshot | None:
    """Pinned host memory (torch ≥ 2.14: `host_segments`, one flat `host_traces` list), as a Snapshot of its
    own on device HOST_DEVICE, so that it is reported beside the GPU numbers and never mixed into them."""
    segments, entries = raw.get("host_segments"), raw.get("host_traces")
    if segments is None and entries is None:
        return None
    for name, value in (("host_segments", segments), ("host_traces", entries)):
        if value is not None and not isinstance(value, list):
            raise Malformed(name, f"is {described(value)}, expected a list")
    segments, entries = segments or [], entries or []
    if not segments and not entries:
        return None
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise Malformed(f"host_traces[{i}]", f"is {described(e)}, expected a trace entry dict")
    seg_columns, block_columns, block_frames, _ = _segments(segments, "host_segments")
    traces = {HOST_DEVICE: _trace(HOST_DEVICE, entries, "host_traces")} if entries else {}
    return Snapshot(
        source=source, traces=traces, segment_columns=seg_columns, block_columns=block_columns,
        block_frames=block_frames, annotations_source=_annotations(None), allocator_settings=None,
        format=Format(container=container, layout="host", top_level_keys=(), entry_keys=_keys(entries),
                      segment_keys=_keys(segments), block_keys=(), legacy_block_history=False,
                      trace_included=raw.get("host_traces") is not None),
    )


__all__ = ["to_snapshot", "ACTIONS", "OOM"]
