"""The columnar Snapshot: what every analysis reads, built only by the loader.

Contract: a Snapshot holds, per device, the trace as numpy columns (`DeviceTrace`) and the end state as
numpy columns too (shown as the DataFrames `segments` and `blocks`, made on first use), plus annotations,
allocator settings and format facts (`Format`). Replay reads only numpy, so this module and replay never
import pandas before a DataFrame is asked for.
Nothing here touches raw snapshot dicts: stacks arrive interned, as stack ids into the `interner`'s tables
(which stacks the loader kept is its choice: all, those of allocations, or none).
Units are in column names' meaning: bytes for sizes, µs since the epoch for `time_us`.

DataFrame columns:
- `events`: device, index (position in that device's trace), action, addr, size, stream, time_us
  (nullable), stack_id (−1: no frames, or not kept), user_metadata, compile_context, pool_id (torch ≥ 2.12; else null).
- `segments`: device, address, total_size, allocated_size, active_size, requested_size, stream,
  segment_type, pool_id (str "a,b"; "0,0" is the default pool), is_expandable.
- `blocks`: device, segment_address, address, size, requested_size, state, stream, pool_id,
  segment_type, is_expandable, stack_id (only meaningful for active blocks).
- `ooms`: device, index, size (rounded request), stream, device_free, time_us.
- `annotations`: device, name, stage (START/END), time_us.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .display import HtmlDisplay
from .frame_source import FrameSources
from .stacks import StackInterner

if TYPE_CHECKING:                     # pandas loads on first use: `peaks` on a converted run never needs it
    import pandas as pd

ACTIONS: tuple[str, ...] = (
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
    "segment_unmap", "snapshot", "oom", "annotate",
)
ACTION_CODE: dict[str, int] = {name: code for code, name in enumerate(ACTIONS)}
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, \
    SNAPSHOT, OOM, ANNOTATE = range(len(ACTIONS))
ACTIVE_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free")  # C++ name; docstring's
HOST_DEVICE = -1            # the device torch writes on pinned host memory segments (Snapshot.host)

# The end state as numpy columns (name → dtype); object columns hold str and become categoricals in the
# DataFrames. A converted run's blocks also carry `stack_id`.
SEGMENT_COLUMNS: dict[str, Any] = {
    "device": np.int64, "address": np.uint64, "total_size": np.int64, "allocated_size": np.int64,
    "active_size": np.int64, "requested_size": np.int64, "stream": np.int64, "segment_type": object,
    "pool_id": object, "is_expandable": np.bool_}
BLOCK_COLUMNS: dict[str, Any] = {
    "device": np.int64, "segment_address": np.uint64, "address": np.uint64, "size": np.int64,
    "requested_size": np.int64, "state": object, "stream": np.int64, "pool_id": object, "segment_type": object,
    "is_expandable": np.bool_}
CATEGORICAL = ("segment_type", "pool_id", "state")


def columns_from_rows(rows: Sequence[tuple[Any, ...]], spec: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Rows of values in `spec`'s column order → one numpy array per column, of `spec`'s dtype."""
    values = list(zip(*rows)) if rows else [()] * len(spec)
    return {name: np.array(list(col), dtype=dtype) for (name, dtype), col in zip(spec.items(), values)}


def _frame(columns: Mapping[str, np.ndarray]) -> pd.DataFrame:
    import pandas as pd
    return pd.DataFrame({name: pd.Categorical(col) if name in CATEGORICAL else col
                         for name, col in columns.items()})


@dataclass(frozen=True)
class TraceDetails:
    """The per-event columns of a trace that only some analyses read.

    `user_metadata` / `compile_context` / `pool_id` hold codes into their `*_names` tables, or are None when
    the file has no such field (`pool_id` on events: torch ≥ 2.12, "a,b" like a segment's); `device_free`
    maps the index of each oom entry to the bytes the driver reported free; `stack_ids` holds each event's
    stack id (−1: none kept, or none recorded), or is None when no stacks were kept at all.
    """

    user_metadata: np.ndarray | None = None
    user_metadata_names: tuple[str, ...] = ()
    compile_context: np.ndarray | None = None
    compile_context_names: tuple[str, ...] = ()
    device_free: dict[int, int] = field(default_factory=dict)
    stack_ids: np.ndarray | None = None
    pool_id: np.ndarray | None = None
    pool_id_names: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class DeviceTrace:
    """One device's trace as parallel columns, oldest event first.

    `action` holds codes into `action_names` (the ACTIONS first, then any unknown action names the file
    used, which replay ignores). `time_us` is None when the file records no times. The rarer columns, the
    events' stack ids among them, live in `details`, given
    as a TraceDetails or as a function that reads them on first use (so replay and peaks never pay for
    request ids or stacks); the properties below read through it.
    """

    device: int
    action: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    time_us: np.ndarray | None
    action_names: tuple[str, ...] = ACTIONS
    details_source: TraceDetails | Callable[[], TraceDetails] = field(default_factory=TraceDetails, repr=False)

    def __len__(self) -> int:
        return len(self.action)

    @cached_property
    def details(self) -> TraceDetails:
        source = self.details_source
        return source() if callable(source) else source

    @property
    def user_metadata(self) -> np.ndarray | None:
        return self.details.user_metadata

    @property
    def user_metadata_names(self) -> tuple[str, ...]:
        return self.details.user_metadata_names

    @property
    def compile_context(self) -> np.ndarray | None:
        return self.details.compile_context

    @property
    def compile_context_names(self) -> tuple[str, ...]:
        return self.details.compile_context_names

    @property
    def device_free(self) -> dict[int, int]:
        return self.details.device_free

    @property
    def stack_ids(self) -> np.ndarray | None:
        return self.details.stack_ids

    def pools_of(self, indices: np.ndarray) -> np.ndarray | None:
        """The pool id text ("a,b") each event `indices` names, or None when the trace names none."""
        details = self.details
        if details.pool_id is None:
            return None
        return np.array(details.pool_id_names, dtype=object)[details.pool_id[np.asarray(indices, dtype=np.int64)]]


@dataclass(frozen=True)
class Format:
    """What the file turned out to be, and which optional parts it carried."""

    container: str                 # pickle, gzip pickle, torch.save zip, json, …
    layout: str                    # "dict", "segment list", or "host" (the pinned host memory of Snapshot.host)
    top_level_keys: tuple[str, ...]
    entry_keys: tuple[str, ...]    # union of trace-entry keys seen
    segment_keys: tuple[str, ...]
    block_keys: tuple[str, ...]
    legacy_block_history: bool     # 2.0-style blocks (history, no address)
    trace_included: bool           # device_traces present (even if empty)
    trace_devices: int = 0         # how many per-device trace lists it had (torch writes one per device)


@dataclass(frozen=True, eq=False)
class Snapshot(HtmlDisplay):
    """A loaded memory snapshot: columnar, device-indexed, its stacks interned.

    The end state is held as numpy columns (`segment_columns`, `block_columns`: SEGMENT_COLUMNS and
    BLOCK_COLUMNS, what replay reads) and shown as DataFrames (`segments`, `blocks`) made on first use;
    `annotations` is given, or read on first use."""

    source: str
    traces: dict[int, DeviceTrace]
    segment_columns: Mapping[str, np.ndarray]
    block_columns: Mapping[str, np.ndarray]
    annotations_source: pd.DataFrame | Callable[[], pd.DataFrame]
    allocator_settings: dict[str, Any] | None
    format: Format
    interner_source: StackInterner | Callable[[], StackInterner] = field(default_factory=StackInterner, repr=False)
    _frameless: dict[int, bool] = field(default_factory=dict, repr=False, compare=False)
    warnings: tuple[str, ...] = ()   # what validation found the analysis can live with (load.validate)
    host: Snapshot | None = None     # pinned host memory (torch ≥ 2.14), on device HOST_DEVICE; never in the above
    sources: FrameSources | None = field(default=None, repr=False)   # its frames' source (`load(source=...)`)
    estimate: dict[str, Any] | None = None   # how `snapanalyze estimate` made it (layout.ESTIMATE_KEY): no measurement

    @cached_property
    def segments(self) -> pd.DataFrame:
        return _frame(self.segment_columns)

    @cached_property
    def blocks(self) -> pd.DataFrame:
        return _frame(self.block_columns)

    @cached_property
    def annotations(self) -> pd.DataFrame:
        source = self.annotations_source
        return source() if callable(source) else source

    @cached_property
    def interner(self) -> StackInterner:
        """Frame and stack tables (given, or read on first use: a converted run's frames and stacks)."""
        source = self.interner_source
        return source() if callable(source) else source

    @property
    def devices(self) -> list[int]:
        """Devices that appear in the trace or the end state, ascending."""
        seen = set(self.traces) | set(np.unique(self.segment_columns["device"]).tolist())
        return sorted(seen)

    def trace(self, device: int) -> DeviceTrace:
        found = self.traces.get(device)
        if found is None:
            return _empty_trace(device)
        return found

    # -- stacks -----------------------------------------------------------------------------------
    def event_stack_ids(self, device: int, indices: np.ndarray) -> np.ndarray:
        """Stack id of each given event of `device` (−1 where the event carries no frames, or none were kept)."""
        return _pick_ids(self.trace(device).stack_ids, indices)

    def allocation_stack_ids(self) -> np.ndarray:
        """The distinct stacks of what allocated: every allocation of every device's trace and every block of
        the end state. Whether a file's other stacks (frees) were kept (`load(frames=...)`) changes none of
        them, so the call tree built over them, and every role, is the same either way."""
        found = [self.block_stack_ids(np.arange(len(self.block_columns.get("address", ()))))]
        for device in self.devices:
            found.append(self.event_stack_ids(device, np.flatnonzero(self.trace(device).action == ALLOC)))
        ids = np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
        return ids[ids >= 0]

    def allocation_order(self) -> np.ndarray:
        """The stack id of every allocation of the traces, in trace order, device after device (−1: no frames)."""
        found = [self.event_stack_ids(d, np.flatnonzero(self.trace(d).action == ALLOC)) for d in self.devices]
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def block_stack_ids(self, rows: np.ndarray) -> np.ndarray:
        """Stack id of each given row of `blocks` (−1 where the block carries no frames, or none were kept)."""
        return _pick_ids(self.block_columns.get("stack_id"), rows)

    def frameless_allocations(self, device: int) -> bool:
        """Whether some allocations of the device's trace carry no frames while others carry some: a thread
        without a Python stack allocated (on CUDA, the autograd engine's device thread runs backward)."""
        found = self._frameless.get(device)
        if found is None:
            trace = self.trace(device)
            framed = self.event_stack_ids(device, np.flatnonzero(trace.action == ALLOC)) >= 0
            found = self._frameless[device] = bool(framed.any() and not framed.all())
        return found

    def stack(self, stack_id: int) -> list[tuple[str, int, str]]:
        """The frames of one stack, innermost first, as (filename, line, name)."""
        if stack_id < 0:
            return []
        frames = self.interner.frames
        return [frames[f] for f in self.interner.stacks[stack_id]]

    @cached_property
    def events(self) -> pd.DataFrame:
        """All devices' trace entries as one DataFrame (see the module docstring)."""
        import pandas as pd
        parts = [self._events_of(d, self.traces[d]) for d in sorted(self.traces)]
        return pd.concat(parts, ignore_index=True) if parts else self._events_of(0, _empty_trace(0))

    def _events_of(self, device: int, t: DeviceTrace) -> pd.DataFrame:
        import pandas as pd
        n = len(t)
        return pd.DataFrame({
            "device": np.full(n, device, dtype=np.int64),
            "index": np.arange(n, dtype=np.int64),
            "action": pd.Categorical.from_codes(t.action, categories=list(t.action_names)),
            "addr": t.addr,
            "size": t.size,
            "stream": t.stream,
            "time_us": pd.array(t.time_us if t.time_us is not None else [None] * n, dtype="Int64"),
            "stack_id": self.event_stack_ids(device, np.arange(n)),
            "user_metadata": _decode(t.user_metadata, t.user_metadata_names, n),
            "compile_context": _decode(t.compile_context, t.compile_context_names, n),
            "pool_id": _decode(t.details.pool_id, t.details.pool_id_names, n),
        })

    @property
    def ooms(self) -> pd.DataFrame:
        import pandas as pd
        rows = []
        for device in sorted(self.traces):
            t = self.traces[device]
            for index in np.flatnonzero(t.action == OOM):
                rows.append({"device": device, "index": int(index), "size": int(t.size[index]),
                             "stream": int(t.stream[index]), "device_free": t.device_free.get(int(index)),
                             "time_us": int(t.time_us[index]) if t.time_us is not None else None})
        return pd.DataFrame(rows, columns=["device", "index", "size", "stream", "device_free", "time_us"])

    def oom_mentions(self) -> tuple[dict[str, Any], ...]:
        """Each `oom` entry in a few plain fields (device, index, request bytes, device free bytes), for every answer
        about the file to say that the program ran out of memory."""
        out = []
        for device in sorted(self.traces):
            t = self.traces[device]
            for index in np.flatnonzero(t.action == OOM).tolist():
                free = t.device_free.get(int(index))
                out.append({"device": int(device), "index": int(index), "request_bytes": int(t.size[index]),
                            "device_free_bytes": None if free is None else int(free)})
        return tuple(out)

    def frames_table(self) -> pd.DataFrame:
        """Every frame interned so far: frame_id, filename, line, name (call `events` first for all)."""
        return self.interner.frames_table()

    def stacks_table(self) -> pd.DataFrame:
        """Every stack interned so far, long format: stack_id, depth (0 = innermost), frame_id."""
        return self.interner.stacks_table()

    def __repr__(self) -> str:
        n = sum(len(t) for t in self.traces.values())
        return (f"<Snapshot {self.source!r}: {len(self.devices)} device(s), {n:,} events, "
                f"{len(self.segment_columns['device']):,} segments>")


def _decode(codes: np.ndarray | None, names: tuple[str, ...], n: int) -> pd.Categorical:
    import pandas as pd
    if codes is None or not names:
        return pd.Categorical([None] * n, categories=pd.Index([], dtype=object))
    return pd.Categorical.from_codes(codes, categories=list(names))


def _pick_ids(ids: np.ndarray | None, rows: np.ndarray) -> np.ndarray:
    """`ids` at `rows`, or −1 for each row when no ids were kept."""
    rows = np.asarray(rows, dtype=np.int64)
    return ids[rows] if ids is not None else np.full(len(rows), -1, dtype=np.int64)


def _empty_trace(device: int) -> DeviceTrace:
    empty = np.zeros(0, dtype=np.int64)
    return DeviceTrace(device=device, action=np.zeros(0, dtype=np.int8), addr=np.zeros(0, dtype=np.uint64),
                       size=empty, stream=empty, time_us=None)


@dataclass(frozen=True)
class RunSamples:
    """Everything but the snapshots of one run directory, as `load.samples.read_run` reads it (columns in its
    docstring): NVML series, marker spans and meta.json documents of every rank, and the problems found."""

    run: Path
    ranks: tuple[int, ...]                       # ranks with a rank=N directory
    nvml: pd.DataFrame
    markers: pd.DataFrame
    meta: dict[int, list[dict[str, Any]]]        # rank → meta documents, by session
    problems: tuple[str, ...] = ()
    nvml_ranks: tuple[int, ...] = field(default=())   # ranks that have at least one NVML part

    @property
    def world_size(self) -> int | None:
        """The world size meta.json states (the largest over ranks and sessions), or None."""
        return world_size(self.meta)

    def nvml_of(self, rank: int, device: int | None = None) -> pd.DataFrame:
        """The NVML rows of one rank (and device), in time order."""
        rows = self.nvml[self.nvml["rank"] == rank]
        if device is not None:
            rows = rows[rows["device"] == device]
        return rows.reset_index(drop=True)

    def markers_of(self, rank: int) -> pd.DataFrame:
        return self.markers[self.markers["rank"] == rank].reset_index(drop=True)

    def capacity(self, rank: int, device: int) -> tuple[int | None, str]:
        """Total memory of a rank's device and where it came from: NVML total, else meta.json, else unknown."""
        rows = self.nvml_of(rank, device)
        if len(rows):
            return int(rows["total_bytes"].iloc[-1]), "NVML total"
        for doc in reversed(self.meta.get(rank, [])):
            for d in doc.get("devices") or []:
                if isinstance(d, dict) and d.get("index") == device and isinstance(d.get("total_memory_bytes"), int):
                    return int(d["total_memory_bytes"]), "meta.json total_memory_bytes"
        return None, "unknown (no NVML samples and no meta.json device entry)"

    def nvml_interval_ms(self, rank: int) -> float | None:
        for doc in reversed(self.meta.get(rank, [])):
            nv = doc.get("nvml") or {}
            if isinstance(nv.get("interval_ms"), (int, float)):
                return float(nv["interval_ms"])
        return None


def world_size(meta: dict[int, list[dict[str, Any]]]) -> int | None:
    """The largest world size the meta.json documents state, or None."""
    sizes = [int(d["world_size"]) for docs in meta.values() for d in docs if isinstance(d.get("world_size"), int)]
    return max(sizes) if sizes else None
