"""Turn the raw builtins of a snapshot into the columnar Snapshot; the only code that reads raw dicts.

Contract: `to_snapshot(raw, source, container, stream_bytes=None, consume=False, frames=True)` accepts every
layout PyTorch has written — the dict of 2.0–2.14 (`segments`, `device_traces`, `allocator_settings`,
`external_annotations`, …), the bare list of segments of `torch.cuda.memory_snapshot()`, 2.0 blocks with
`history` instead of addresses — ignores unknown keys, and raises BadInputError for anything else, naming the
file, the field with the index of its first bad entry (`device_traces[0][41].size`,
`segments[3].blocks[2].size`) and what was expected. Pinned host memory (`host_segments`, `host_traces`, torch
≥ 2.14) becomes `Snapshot.host`, a Snapshot of its own on device HOST_DEVICE (−1, as torch writes it). The raw
objects are untrusted: every value is type-checked before it is hashed, converted or printed (no str() of a
nested object, no hashing of a deep tuple), strings go through `clean_text`, and `stream_bytes` (the size of
the pickle stream) bounds the rows: more segments, blocks and entries than half the stream's bytes can only
come from shared references repeated (a blow-up), and is refused. Events, segments and blocks alike are built
a column at a time — the raw dicts read a cache-sized chunk at a time for all their keys (`_fields`), a block
row taking its segment's fields by index — never a Python call per row: a column's types are checked at once
(an integer column by converting it with `array("Q")`, which refuses anything but a non-negative int, or
else by its sum, an int only when every value is; a text column by the set of its types, or by one
`list.count` when it holds one text throughout), and only a column that fails is scanned value by value, to
name its first bad entry; texts (actions, segment types, states, pool ids, user metadata) are interned, one
object per distinct value. Stacks are interned as they are read (`stacks.StackInterner`), into stack id
columns of the events and blocks: every one (`frames=True`, "all"), only those an analysis of live bytes
reads ("allocations": see `_read_stacks`), or none (False); no raw object outlives the build. With
`consume`, the trace is freed a chunk at a time as it is read and every other raw list once its columns
exist, so memory shrinks as the columns grow. Whether the values make sense together is `validate`'s job.
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Callable
from itertools import accumulate, chain, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..errors import BadInputError
from ..gcpause import gc_paused
from ..layout import ESTIMATE_KEY
from ..model import (
    ACTIONS,
    ALLOC,
    BLOCK_COLUMNS,
    FREE_COMPLETED,
    FREE_REQUESTED,
    HOST_DEVICE,
    OOM,
    SEGMENT_COLUMNS,
    DeviceTrace,
    Format,
    Snapshot,
    TraceDetails,
)
from ..stacks import StackInterner, clean_text
from ..units import fmt_untrusted_int

if TYPE_CHECKING:
    import pandas as pd

MAX_SETTINGS_DEPTH = 4          # allocator_settings nest a dict or two; deeper parts are not settings
MAX_SETTINGS_ITEMS = 1000
_MISSING = object()             # a key the raw dict does not have (None is a value)
REQUIRED = object()             # in a `_fields` spec: a key every entry must have
FRAMES_KEPT = ("all", "allocations", "none")   # which stacks `to_snapshot` keeps
CHUNK = 8192                    # entries `_fields` reads per pass: small enough for their dicts to stay cached


class Malformed(Exception):
    """A raw value of the wrong type: `where` it is (a path into the snapshot) and what was wrong."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where} {problem}")


def described(value: Any) -> str:
    """A short, safe description of an untrusted value (never its repr when it is a container)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return fmt_untrusted_int(value).replace(",", "")
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return repr(value)
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


def _first(values: list[Any], bad: Callable[[Any], bool]) -> int:
    """The index of the first value `bad` holds for (only called once a column is known to hold one)."""
    return next(i for i, v in enumerate(values) if bad(v))


def _pool_keys(values: list[Any], where: Callable[[int], str]) -> tuple[list[Any], dict[Any, str]]:
    """Hashable keys for pool ids (a list becomes its tuple) and the text of each distinct one. Whole columns
    are checked to be None, short strings or flat tuples/lists of 1–4 ints before anything is hashed (a deep
    tuple would recurse in hash); only a column that fails is scanned per value, to name the first bad one."""
    types = set(map(type, values))
    seqs = values if types in ({tuple}, {list}) else \
        [v for v in values if type(v) is tuple or type(v) is list] if types & {tuple, list} else []
    strs = [v for v in values if type(v) is str] if str in types else []
    fast = (types <= {tuple, list, str, type(None)} and set(map(len, seqs)) <= {1, 2, 3, 4}
            and set(map(type, chain.from_iterable(seqs))) <= {int} and max(map(len, strs), default=0) <= 64)
    if not fast:                     # rare: floats or bools in pool ids, or a bad value to name
        texts = [_pool_text(v, where(i)) for i, v in enumerate(values)]
        return texts, {t: t for t in dict.fromkeys(texts)}
    keys = [tuple(v) if type(v) is list else v for v in values] if list in types else values
    shared: dict[str, str] = {}      # None and (0, 0) are both "0,0": one string
    return keys, {k: shared.setdefault(t := _pool_text(k, ""), t) for k in dict.fromkeys(keys)}


def _pool_codes(values: list[Any], where: Callable[[int], str]) -> tuple[np.ndarray, tuple[str, ...]]:
    """Codes into a table of distinct pool id texts, one per event (see _pool_keys)."""
    keys, names = _pool_keys(values, where)
    table = {t: i for i, t in enumerate(dict.fromkeys(names.values()))}
    code = {k: table[t] for k, t in names.items()}
    return np.fromiter(map(code.__getitem__, keys), dtype=np.int32, count=len(keys)), tuple(table)


def _pool_column(values: list[Any], where: Callable[[int], str]) -> np.ndarray:
    """The pool id texts as an object column; each distinct text is one shared string."""
    keys, names = _pool_keys(values, where)
    return _objects(list(map(names.__getitem__, keys)))


def _objects(values: list[Any]) -> np.ndarray:
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def _strings(values: list[Any], where: Callable[[int], str]) -> tuple[list[Any], dict[Any, str]]:
    """`values` checked, as a whole column, to be strings or None (the first other value is Malformed), and
    the cleaned text of each distinct one (None is "")."""
    if not set(map(type, values)) <= {str, type(None)}:
        i = _first(values, lambda v: v is not None and type(v) is not str)
        raise Malformed(where(i), f"is {described(values[i])}, expected a string")
    return values, {v: "" if v is None else clean_text(v) for v in dict.fromkeys(values)}


def _text_column(values: list[Any], where: Callable[[int], str]) -> np.ndarray:
    """Strings (or None: "") as an object column of cleaned, shared strings."""
    values, texts = _strings(values, where)
    return _objects(list(map(texts.__getitem__, values)))


def _exact_ints(values: list[Any], dtype: Any) -> np.ndarray | None:
    """`values` as a column of `dtype` (uint64 or int64) when every one is a non-negative int that fits it (a
    bool counts), converted and checked in one C pass — `array("Q")` refuses anything else; None otherwise,
    for the slower paths that take the rest (negative numbers, integral floats) or name what is wrong."""
    try:
        column = np.frombuffer(array("Q", values), dtype=np.uint64)
    except (TypeError, OverflowError):
        return None
    if dtype == np.uint64:
        return column
    signed = column.view(np.int64)                 # a value past 2**63 reads negative here
    return None if len(signed) and int(signed.min()) < 0 else signed


def _int_column(values: list[Any], dtype: Any, where: Callable[[int], str], whole: str) -> np.ndarray:
    """Integers (bools and integral floats count, as `_integer` takes them) as a numpy column of `dtype`. The
    whole column's types are checked at once; only a column holding something else is scanned per value, to
    name the first offender. A value that does not fit is Malformed for the `whole` table."""
    exact = _exact_ints(values, dtype)
    if exact is not None:
        return exact
    if not _all_ints(values):
        values = [_integer(v, where(i)) for i, v in enumerate(values)]
    try:
        return np.fromiter(values, dtype=dtype, count=len(values))
    except OverflowError:
        raise Malformed(whole, "hold an address or size that does not fit 64 bits") from None


def _only_dicts(values: list[Any], where: Callable[[int], str], kind: str, offset: int = 0) -> None:
    """Malformed naming the first of `values` that is not a dict (`kind`: what it should be; `values` start at
    `offset` of what `where` names), if one is not."""
    if not set(map(type, values)) <= {dict}:
        k = _first(values, lambda v: type(v) is not dict)
        raise Malformed(where(offset + k), f"is {described(values[k])}, expected {kind}")


def _fields(entries: list[Any], spec: dict[str, Any], where: Callable[[int], str], kind: str
            ) -> dict[str, list[Any]]:
    """Each key of `spec` → its values over `entries` (dicts), the key's default in `spec` where one lacks it
    (REQUIRED: the KeyError is raised). The entries are read CHUNK at a time, every key of a chunk while its
    dicts are still in the CPU cache: over a million entries that is about 40 % faster than a pass per key,
    which reads every dict from memory again. Each chunk is first checked to hold only dicts (`_only_dicts`:
    `where` names an entry, `kind` what it should be), while it is in the cache too."""
    out: dict[str, list[Any]] = {key: [] for key in spec}
    plans = [(out[key], itemgetter(key), key, default) for key, default in spec.items()]
    for start in range(0, len(entries), CHUNK):
        chunk = entries[start:start + CHUNK]
        _only_dicts(chunk, where, kind, start)
        for column, get, key, default in plans:
            done = len(column)
            try:
                column.extend(map(get, chunk))
            except KeyError:
                if default is REQUIRED:
                    raise
                del column[done:]
                column.extend(map(dict.get, chunk, repeat(key), repeat(default)))
    return out


def _all_ints(values: list[Any]) -> bool:
    """Whether every value is an int (a bool counts), checked at C speed: their sum is an int only then (a float
    makes it a float; a string, None or a container raises TypeError). Only builtins reach here."""
    try:
        return type(sum(values)) is int
    except (TypeError, OverflowError):      # OverflowError: an int too large to add to a float
        return False


def _numbers(values: list[Any], dtype: Any, where: Callable[[int], str]) -> np.ndarray:
    """`values` as a numpy column of `dtype`; a value that is not an integer there is Malformed."""
    exact = _exact_ints(values, dtype)
    if exact is not None:
        return exact
    try:
        if _all_ints(values):
            return np.fromiter(values, dtype=dtype, count=len(values))
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


class _Codes:
    """Codes of the distinct texts of a column read in parts: one code per distinct raw value (given ones
    first), and the cleaned text of each code."""

    def __init__(self, given: tuple[str, ...] = ()) -> None:
        self.code: dict[Any, int] = {v: i for i, v in enumerate(given)}
        self.names: list[str] = [clean_text(v) for v in given]

    def of(self, values: list[Any], where: Callable[[int], str], dtype: Any = np.int32,
           none: bool = True) -> np.ndarray:
        """The codes of `values`: strings, or None ("") where `none` allows it; another value is Malformed."""
        first = values[0] if values else None
        if type(first) is str and values.count(first) == len(values):   # one text throughout ("", "N/A"):
            return np.full(len(values), self._add(first, clean_text(first)), dtype=dtype)  # compared at C speed
        types = set(map(type, values))              # types first: hashing an untrusted object could recurse
        if types <= {str}:
            try:
                return np.fromiter(map(self.code.__getitem__, values), dtype=dtype, count=len(values))
            except KeyError:                        # a value not seen before
                pass
        elif not none:
            bad = _first(values, lambda v: type(v) is not str)
            raise Malformed(where(bad), f"is {described(values[bad])}, expected a string")
        values, texts = _strings(values, where)
        for value, text in texts.items():
            self._add(value, text)
        return np.fromiter(map(self.code.__getitem__, values), dtype=dtype, count=len(values))

    def _add(self, value: Any, text: str) -> int:
        code = self.code.get(value)
        if code is None:
            code = self.code[value] = len(self.names)
            self.names.append(text)
        return code


def _trace(device: int, entries: list[Any], name: str | None = None,
           interner: StackInterner | None = None, every: bool = True, consume: bool = False) -> DeviceTrace:
    """One device's trace columns, read CHUNK entries at a time into preallocated columns. Each chunk's stacks
    are interned into `interner` (none: no stacks) while its lists are still in the CPU cache — every
    event's, or (`every=False`) only those an analysis of live bytes reads (`_read_stacks`) — and with
    `consume` its entries are then freed, so the trace's memory shrinks as its columns grow."""
    name = name or f"device_traces[{device}]"
    n = len(entries)
    if n and (type(entries[0]) is not dict or type(entries[-1]) is not dict):   # their keys are read first
        _only_dicts(entries, lambda i: f"{name}[{i}]", "a trace entry dict")
    first = entries[0] if entries else {}
    pool_key = next((k for k in ("pool_id", "segment_pool_id") if k in first), None)  # the C++ / the viewer's
    has_times = any("time_us" in e for e in (first, entries[-1] if entries else {}))
    spec: dict[str, Any] = {"action": REQUIRED, "addr": 0, "size": 0, "stream": 0}
    spec.update({key: default for key, default, wanted in (
        ("time_us", 0, has_times), ("user_metadata", "", "user_metadata" in first),
        ("compile_context", "", "compile_context" in first), ("frames", None, interner is not None)) if wanted})
    if pool_key is not None:
        spec[pool_key] = None
    action = np.empty(n, dtype=np.int16)
    ints = {key: np.empty(n, dtype=dtype) for key, dtype in (
        ("addr", np.uint64), ("size", np.int64), ("stream", np.int64), ("time_us", np.int64)) if key in spec}
    texts = {key: (_Codes(), np.empty(n, dtype=np.int32)) for key in ("user_metadata", "compile_context")
             if key in spec}
    actions = _Codes(ACTIONS)
    pools: dict[str, int] = {}                  # each distinct pool id text → its code
    pool = np.empty(n, dtype=np.int32) if pool_key is not None else None
    device_free: dict[int, int] = {}
    stack_ids = np.full(n, -1, dtype=np.int64) if interner is not None else None
    allocated: set[int] = set()                 # not `every`: the addresses the trace allocated so far
    for start in range(0, n, CHUNK):
        chunk = entries[start:start + CHUNK]
        part = slice(start, start + len(chunk))

        def at(key: str, start: int = start) -> Callable[[int], str]:
            return lambda i: f"{name}[{start + i}]" + (f".{key}" if key else "")

        got = _fields(chunk, spec, at(""), "a trace entry dict")
        codes = action[part] = actions.of(got.pop("action"), at("action"), np.int16, none=False)
        for key, column in ints.items():
            column[part] = _numbers(got.pop(key), column.dtype, at(key))
        for key, (table, coded) in texts.items():
            coded[part] = table.of(got.pop(key), at(key))
        if pool is not None and pool_key is not None:
            local, local_names = _pool_codes(got.pop(pool_key), at(pool_key))
            pool[part] = np.array([pools.setdefault(t, len(pools)) for t in local_names], dtype=np.int32)[local]
        for k in np.flatnonzero(codes == OOM).tolist():
            device_free[start + k] = _integer(chunk[k].get("device_free", 0), at("device_free")(k))
        if interner is not None and stack_ids is not None:
            lists = got.pop("frames")
            if every:
                stack_ids[part] = interner.intern(lists)
            else:
                read = np.flatnonzero(_read_stacks(codes, ints["addr"][part], allocated))
                stack_ids[start + read] = interner.intern(list(map(lists.__getitem__, read.tolist())))
            del lists
        del got
        if consume:
            del chunk
            entries[part] = [None] * (part.stop - part.start)
    um, cc = texts.get("user_metadata"), texts.get("compile_context")
    return DeviceTrace(
        device=device,
        action=action,
        addr=ints["addr"],
        size=ints["size"],
        stream=ints["stream"],
        time_us=ints.get("time_us"),
        action_names=tuple(actions.names),
        details_source=TraceDetails(
            user_metadata=um[1] if um else None, user_metadata_names=tuple(um[0].names) if um else (),
            compile_context=cc[1] if cc else None, compile_context_names=tuple(cc[0].names) if cc else (),
            device_free=device_free, pool_id=pool, pool_id_names=tuple(pools), stack_ids=stack_ids),
    )


def _read_stacks(action: np.ndarray, addr: np.ndarray, allocated: set[int]) -> np.ndarray:
    """Which events of a run of a trace have stacks an analysis of live bytes reads (a bool mask): the
    allocations' and OOMs', and the frees of blocks allocated before the trace began — no allocation at
    their address before them, neither in the run nor in `allocated` (the addresses the trace allocated
    before the run, to which the run's are added) — whose stack is what can decide such a block."""
    is_alloc = action == ALLOC
    keep = is_alloc | (action == OOM)
    rows = np.flatnonzero(is_alloc | (action == FREE_REQUESTED) | (action == FREE_COMPLETED))
    if len(rows):
        order = rows[np.argsort(addr[rows], kind="stable")]    # by address, then trace order
        at, alloc = addr[order], is_alloc[order]
        allocs = np.cumsum(alloc)                              # allocations up to each row, all addresses
        first = np.r_[True, at[1:] != at[:-1]]
        before = allocs - np.maximum.accumulate(np.where(first, allocs - alloc, 0))  # … at this address
        lone = np.flatnonzero((before == 0) & ~alloc)          # frees with no allocation before them here
        if len(lone):
            earlier = np.fromiter(map(allocated.__contains__, at[lone].tolist()), dtype=np.bool_, count=len(lone))
            keep[order[lone[~earlier]]] = True
        allocated.update(addr[is_alloc].tolist())
    return keep


class _Segments(NamedTuple):
    """The segment columns and, for the block columns built after them, each segment's raw blocks."""

    columns: dict[str, np.ndarray]   # SEGMENT_COLUMNS
    blocks: list[list[Any]]          # each segment's list of blocks (none: [])
    counts: np.ndarray               # blocks per segment


def _segment_columns(segments: list[Any], name: str = "segments") -> _Segments:
    """The segment columns, every segment dict read once (checked to be a dict, its `blocks` a list)."""

    def at(key: str) -> Callable[[int], str]:
        return lambda i: f"{name}[{i}].{key}"

    got = _fields(segments, {"device": 0, "address": REQUIRED, "total_size": 0, "allocated_size": 0, "active_size": 0,
                             "requested_size": 0, "stream": 0, "segment_type": "", "segment_pool_id": None,
                             "is_expandable": False, "blocks": None}, lambda i: f"{name}[{i}]", "a segment dict")
    blocks: list[Any] = got.pop("blocks")
    if not set(map(type, blocks)) <= {list}:
        blocks = [b or [] for b in blocks]          # none, or an empty value: no blocks
    if not set(map(type, blocks)) <= {list}:
        i = _first(blocks, lambda b: type(b) is not list)
        raise Malformed(f"{name}[{i}].blocks", f"is {described(blocks[i])}, expected a list of blocks")
    columns = {
        "device": _int_column(got.pop("device"), np.int64, at("device"), name),
        "address": _int_column(got.pop("address"), np.uint64, at("address"), name),
        **{k: _int_column(got.pop(k), np.int64, at(k), name)
           for k in ("total_size", "allocated_size", "active_size", "requested_size")},
        "stream": _int_column(got.pop("stream"), np.int64, at("stream"), name),
        "segment_type": _text_column(got.pop("segment_type"), at("segment_type")),
        "pool_id": _pool_column(got.pop("segment_pool_id"), at("segment_pool_id")),
        "is_expandable": np.fromiter(map(operator.is_, got.pop("is_expandable"), repeat(True)), dtype=np.bool_,
                                     count=len(segments)),
    }
    return _Segments({k: columns[k] for k in SEGMENT_COLUMNS}, blocks,
                     np.fromiter(map(len, blocks), dtype=np.int64, count=len(blocks)))


def _block_columns(segments: _Segments, name: str = "segments", interner: StackInterner | None = None,
                   every: bool = True) -> tuple[dict[str, np.ndarray], bool]:
    """The block columns, built a column at a time over the flattened raw blocks (and whether they are torch
    2.0's, without addresses); block rows repeat their segment's device, address, stream, pool, type and
    expandable flag, and `stack_id` holds the stacks interned into `interner` (`every=False`: only those of
    blocks holding bytes; none: −1)."""
    seg, blocks, counts = segments
    owner = np.repeat(np.arange(len(blocks)), counts)        # each block's segment
    starts = np.cumsum(counts) - counts                      # each segment's first block

    def block_at(key: str) -> Callable[[int], str]:
        return lambda k: f"{name}[{owner[k]}].blocks[{k - starts[owner[k]]}]" + (f".{key}" if key else "")

    flat = list(chain.from_iterable(blocks))
    got = _fields(flat, {"size": REQUIRED, "address": _MISSING, "requested_size": None, "state": "inactive",
                         "history": None, **({"frames": None} if interner is not None else {})},
                  block_at(""), "a block dict")
    size = _int_column(got.pop("size"), np.int64, block_at("size"), name)
    addresses = got.pop("address")
    address = _exact_ints(addresses, np.uint64)
    # torch 2.0: a block without an address starts where the one before ends (`in` compares by identity
    # first, so no value's __eq__ can match the sentinel).
    legacy = address is None and _MISSING in addresses
    if legacy:
        missing = np.array([a is _MISSING for a in addresses], dtype=np.bool_)
        addresses = [0 if a is _MISSING else a for a in addresses]
    if address is None:
        address = _int_column(addresses, np.uint64, block_at("address"), name)
    del addresses
    if legacy:
        address = np.where(missing, _running_addresses(seg["address"], size, owner, starts, name), address)
    requested = got.pop("requested_size")
    kept = got.pop("frames") if interner is not None else None
    history = got.pop("history")
    if any(history):                 # torch 2.0: the last history entry holds the requested size and frames
        rows = [k for k, h in enumerate(history) if h]
        bad = [k for k in rows if type(history[k]) is not list or type(history[k][-1]) is not dict]
        if bad:
            raise Malformed(block_at("history")(bad[0]), f"is {described(history[bad[0]])}, expected a list of dicts")
        sizes = size.tolist()
        for k in rows:
            last = history[k][-1]
            if requested[k] is None:
                requested[k] = last.get("real_size", sizes[k])
            if kept is not None and kept[k] is None:
                kept[k] = last.get("frames")
    del history
    requested_size = _exact_ints(requested, np.int64)
    if requested_size is None:
        if None in requested:
            requested = [0 if r is None else r for r in requested]
        requested_size = _int_column(requested, np.int64, block_at("requested_size"), name)
    del requested
    state = _text_column(got.pop("state"), block_at("state"))
    stack_id = np.full(len(flat), -1, dtype=np.int64)
    if interner is not None and kept is not None:   # a history's frames were filled in above
        holding = np.arange(len(flat)) if every else np.flatnonzero(state != "inactive")   # only those hold bytes
        stack_id[holding] = interner.intern(list(map(kept.__getitem__, holding.tolist())))
    del kept
    block = {
        "device": seg["device"][owner], "segment_address": seg["address"][owner], "address": address,
        "size": size, "requested_size": requested_size,
        "state": state,
        "stream": seg["stream"][owner], "pool_id": seg["pool_id"][owner], "segment_type": seg["segment_type"][owner],
        "is_expandable": seg["is_expandable"][owner], "stack_id": stack_id,
    }
    return {k: block[k] for k in (*BLOCK_COLUMNS, "stack_id")}, legacy


def _running_addresses(seg_address: np.ndarray, size: np.ndarray, owner: np.ndarray, starts: np.ndarray,
                       name: str) -> np.ndarray:
    """Each block's segment address plus the sizes of the blocks before it in its segment, in exact integers
    (a sum past 64 bits is Malformed, never wrapped)."""
    before = np.array(list(accumulate(size.tolist(), initial=0))[:-1], dtype=object)
    if not len(before):
        return np.zeros(0, dtype=np.uint64)
    running = seg_address.astype(object)[owner] + before - before[starts[owner]]
    try:
        return np.array(running.tolist(), dtype=np.uint64)
    except OverflowError:
        raise Malformed(name, "hold an address or size that does not fit 64 bits") from None


def _annotations(items: Any) -> Callable[[], pd.DataFrame]:
    """The annotation rows, checked now; their DataFrame is made on first use (peaks never imports pandas)."""
    rows = []
    for i, a in enumerate(items if isinstance(items, list) else []):
        if isinstance(a, dict):
            where = f"external_annotations[{i}]"
            time_us = a.get("time_us")
            rows.append((_integer(a.get("device", 0), f"{where}.device"), _text(a.get("name", ""), f"{where}.name"),
                         _text(a.get("stage", ""), f"{where}.stage"),
                         None if time_us is None else _integer(time_us, f"{where}.time_us")))

    def frame() -> pd.DataFrame:
        import pandas as pd
        df = pd.DataFrame(rows, columns=["device", "name", "stage", "time_us"])
        df["time_us"] = df["time_us"].astype("Int64")
        return df
    return frame


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON-like copy of untrusted settings: bounded depth and size, strings cleaned, other objects named."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 1 << 64:
        return f"<{described(value)}>"      # printing or serialising it would fail: no setting is that large
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


def _keys(items: list[Any], limit: int = 2000) -> tuple[str, ...]:
    """The distinct keys of the dicts among the first `limit` items, in the order first seen, as safe text."""
    keys = list(chain.from_iterable(item for item in items[:limit] if isinstance(item, dict)))
    if set(map(type, keys)) <= {str}:           # strings hash safely: the distinct ones first, in C
        keys = list(dict.fromkeys(keys))
    return tuple(dict.fromkeys(clean_text(k) if isinstance(k, str) else described(k) for k in keys))


def to_snapshot(raw: Any, source: str, container: str, stream_bytes: int | None = None,
                consume: bool = False, frames: bool | str = True) -> Snapshot:
    """Build the columnar Snapshot from what the file held (see module docstring). With `consume`, the raw
    lists are emptied as their columns are built, so their objects are freed while the rest is built (the
    caller must not use `raw` afterwards). `frames` says which stacks are kept (FRAMES_KEPT; True is "all",
    False "none": every event and block then reads as frameless)."""
    kept = frames_kept(frames)
    try:
        with gc_paused():
            return _to_snapshot(raw, source, container, stream_bytes, consume, kept)
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


def frames_kept(frames: bool | str) -> str:
    """The one of FRAMES_KEPT that `frames` names (True: "all", False: "none")."""
    if frames is True or frames is False:
        return "all" if frames else "none"
    if frames not in FRAMES_KEPT:
        raise ValueError(f"frames={frames!r}: expected True, False or one of {', '.join(FRAMES_KEPT)}")
    return str(frames)


def _interning(kept: str) -> tuple[StackInterner | None, bool]:
    """The interner a build of `kept` stacks fills (None: "none") and whether it takes every stack."""
    return (StackInterner() if kept != "none" else None), kept == "all"


def _refuse_blowup(source: str, rows: int, stream_bytes: int | None) -> None:
    """BadInputError when a pickle of `stream_bytes` holds more `rows` (segments, blocks, trace entries) than
    its bytes can: shared references repeated, so that reading them would exhaust the machine."""
    if stream_bytes is not None and rows > max(stream_bytes // 2, 1000):
        raise BadInputError(source, f"refused to load: {rows:,} segments, blocks and trace entries from a "
                            f"{stream_bytes:,}-byte pickle: shared references repeated to exhaust the reader "
                            "(a blow-up), not a snapshot")


def _to_snapshot(raw: Any, source: str, container: str, stream_bytes: int | None, consume: bool,
                 kept: str) -> Snapshot:
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
    rows = len(segments) + sum(len(e) for e in traces_raw or [] if isinstance(e, list))
    _refuse_blowup(source, rows, stream_bytes)               # before reading any segment
    segs = _segment_columns(segments)
    _refuse_blowup(source, rows + int(segs.counts.sum()), stream_bytes)
    interner, every = _interning(kept)
    traces: dict[int, DeviceTrace] = {}
    entry_keys: dict[str, None] = {}
    for device, entries in enumerate(traces_raw or []):
        if not isinstance(entries, list):
            raise Malformed(f"device_traces[{device}]", f"is {described(entries)}, expected a list of trace entries")
        if entries:
            for k in _keys(entries) + _keys(entries[-50:]):
                entry_keys.setdefault(k, None)
            traces[device] = _trace(device, entries, interner=interner, every=every, consume=consume)
            if consume:
                entries.clear()
    block_columns, legacy = _block_columns(segs, interner=interner, every=every)
    segment_keys, block_keys = _keys(segments), _keys(list(chain.from_iterable(segs.blocks[:200])))
    seg_columns = segs.columns
    del segs
    if consume:
        segments.clear()
    host = _host(raw, source, container, kept) if isinstance(raw, dict) else None
    fmt = Format(
        container=container,
        layout=layout,
        top_level_keys=top,
        entry_keys=tuple(entry_keys),
        segment_keys=segment_keys,
        block_keys=block_keys,
        legacy_block_history=legacy,
        trace_included=traces_raw is not None,
        trace_devices=len(traces_raw or []),
    )
    return Snapshot(
        source=source,
        traces=traces,
        segment_columns=seg_columns,
        block_columns=block_columns,
        annotations_source=_annotations(annotations),
        allocator_settings=_plain(settings) if isinstance(settings, dict) else None,
        estimate=_plain(made) if isinstance(made := raw.get(ESTIMATE_KEY) if isinstance(raw, dict) else None, dict)
        else None,
        format=fmt,
        host=host,
        interner_source=(interner or StackInterner()).finish(),
    )


def _host(raw: dict[str, Any], source: str, container: str, kept: str) -> Snapshot | None:
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
    _only_dicts(entries, lambda i: f"host_traces[{i}]", "a trace entry dict")
    interner, every = _interning(kept)
    segs = _segment_columns(segments, "host_segments")
    block_columns, _ = _block_columns(segs, "host_segments", interner=interner, every=every)
    seg_columns = segs.columns
    traces = {HOST_DEVICE: _trace(HOST_DEVICE, entries, "host_traces", interner=interner, every=every)} \
        if entries else {}
    return Snapshot(
        source=source, traces=traces, segment_columns=seg_columns, block_columns=block_columns,
        annotations_source=_annotations(None), allocator_settings=None,
        format=Format(container=container, layout="host", top_level_keys=(), entry_keys=_keys(entries),
                      segment_keys=_keys(segments), block_keys=(), legacy_block_history=False,
                      trace_included=raw.get("host_traces") is not None),
        interner_source=(interner or StackInterner()).finish(),
    )


__all__ = ["to_snapshot", "ACTIONS", "OOM"]
