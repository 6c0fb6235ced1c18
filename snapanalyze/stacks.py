"""Intern stack frames: each distinct frame and each distinct stack is stored once and named by an int id;
and what a frame is: Python or native (`is_python_frame`), its path without the install prefix
(`short_path`; a frame's label is `sites.Site.label`).

Contract: `StackInterner.intern(lists)` maps raw frames lists (each innermost first, dicts with filename/
line/name) to stack ids (-1 for none), equal stacks to one id however they were stored; the loader calls it
a chunk at a time while it reads, then `finish()` drops every reference to a raw object, so that nothing
unpickled outlives the load. A list is found among the known ones by the identity of its frame objects
(torch's pickle shares one dict per distinct frame), a new stack is interned by its frames' values. Frames
are untrusted input: a field of the wrong type reads as "<malformed …>" (never str() of a nested object),
every string goes through `clean_text` (lone surrogates escaped, length capped), and a stack keeps at most
MAX_STACK_DEPTH innermost frames.
"""

from __future__ import annotations

import operator
from itertools import compress, repeat
from operator import itemgetter
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

Frame = tuple[str, int, str]  # (filename, line, name)
NATIVE_SUFFIXES = (".cpp", ".cc", ".cu", ".h", ".hpp", ".c")
MAX_TEXT = 4096                # characters kept of any one string from a snapshot (a path, a name, a tag)
MAX_STACK_DEPTH = 10_000       # frames kept per stack, innermost first (real stacks hold tens to hundreds)
_LIST, _SID = itemgetter(0), itemgetter(1)   # of a (list, stack id) pair `intern` knows
_UNKNOWN = (None, -1)          # the pair of a list whose key `intern` does not know
_BATCH = 4096                  # lists `intern` compares at a time against the stacks known before


def clean_text(value: str) -> str:
    """`value` printable and encodable anywhere: lone surrogates (which no UTF-8 output accepts) become
    backslash escapes, and anything past MAX_TEXT characters becomes "…"."""
    if len(value) > MAX_TEXT:
        value = value[:MAX_TEXT] + "…"
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _frame_value(frame: Any) -> Frame:
    """(filename, line, name) of one raw frame dict, whatever it holds."""
    if not isinstance(frame, dict):
        return ("??", 0, f"<malformed frame: a {type(frame).__name__}>")
    filename, line, name = frame.get("filename", ""), frame.get("line", 0), frame.get("name", "")
    return (clean_text(filename.replace("\\", "/")) if isinstance(filename, str) else "<malformed filename>",
            line if isinstance(line, int) and not isinstance(line, bool) and 0 <= line < 1 << 31 else 0,
            clean_text(name) if isinstance(name, str) else "<malformed name>")


def is_python_frame(filename: str) -> bool:
    """A Python frame: a file name that is neither unknown ("", "??") nor a C/C++/CUDA source."""
    return filename not in ("", "??") and not filename.endswith(NATIVE_SUFFIXES)


def short_path(filename: str) -> str:
    """Drop the install prefix: everything up to site-/dist-packages, or all but the last 3 parts."""
    for marker in ("site-packages/", "dist-packages/"):
        cut = filename.rfind(marker)
        if cut >= 0:
            return filename[cut + len(marker):]
    parts = filename.split("/")
    return "/".join(parts[-3:]) if len(parts) > 3 else filename


class _Known:
    """The frames lists of one length `intern` has seen, one per distinct stack: the places where they
    differ (`at`), and each one's frame object ids there → (the list, its stack id)."""

    def __init__(self) -> None:
        self.at: list[int] = []
        self.table: dict[tuple[int, ...], tuple[list[Any], int]] = {}


class StackInterner:
    """Frame and stack tables, grown by `intern` (or read from a converted run: `from_tables`)."""

    def __init__(self) -> None:
        self._stack_by_key: dict[tuple[int, ...], int] = {}
        self._frame_by_obj: dict[int, int] = {}
        self._frame_by_value: dict[Frame, int] = {}
        self._keepalive: list[Any] = []
        self._by_length: dict[int, _Known] = {}
        self.frames: list[Frame] = []
        self.stacks: list[tuple[int, ...]] = []

    def _frame_id(self, frame: Any) -> int:
        fid = self._frame_by_obj.get(id(frame))
        if fid is None:
            value = _frame_value(frame)
            fid = self._frame_by_value.get(value)
            if fid is None:
                fid = len(self.frames)
                self.frames.append(value)
                self._frame_by_value[value] = fid
            self._frame_by_obj[id(frame)] = fid
            self._keepalive.append(frame)
        return fid

    def _stack_id(self, frames: list[Any] | tuple[Any, ...]) -> int:
        """The id of a non-empty frames list's stack, by the frames' values (the slow path)."""
        head = frames[:MAX_STACK_DEPTH]
        seen = tuple(map(self._frame_by_obj.get, map(id, head)))   # frames interned before, found in C
        key = cast(tuple[int, ...], seen) if None not in seen else tuple(self._frame_id(f) for f in head)
        sid = self._stack_by_key.get(key)
        if sid is None:
            sid = len(self.stacks)
            self.stacks.append(key)
            self._stack_by_key[key] = sid
        return sid

    def intern(self, lists: list[Any]) -> np.ndarray:
        """The stack id of each of `lists` (int64; -1 for an empty or missing one), keeping no list referenced
        but one per distinct stack. A list is looked up among the known ones of its length by its frame
        objects at the places where those differ, then checked with one C-level list compare (identical
        frame objects compare at once): nearly every list is found that way, and only a new stack is
        interned by its frames' values."""
        ids = np.full(len(lists), -1, dtype=np.int64)
        for start in range(0, len(lists), _BATCH):   # batches, so that a stack seen once is known to the rest
            batch = lists[start:start + _BATCH]
            if not set(map(type, batch)) <= {list}:  # None or a malformed value among them: one by one
                ids[start:start + len(batch)] = [self._intern_one(f) for f in batch]
                continue
            lengths = np.fromiter(map(len, batch), dtype=np.int64, count=len(batch))
            order = np.argsort(lengths, kind="stable")
            cuts = np.flatnonzero(np.diff(lengths[order])) + 1
            for rows in np.split(order, cuts):
                length = int(lengths[rows[0]])
                if length:
                    ids[start + rows] = self._intern_length(list(map(batch.__getitem__, rows.tolist())), length)
        return ids

    def _intern_length(self, lists: list[list[Any]], length: int) -> list[int]:
        known = self._by_length.setdefault(length, _Known())
        at = known.at
        keys = list(zip(*(map(id, map(itemgetter(k), lists)) for k in at))) if at else [()] * len(lists)
        found = list(map(known.table.get, keys, repeat(_UNKNOWN)))     # (list, stack id) pairs
        try:
            same = list(map(operator.eq, lists, map(_LIST, found)))
        except RecursionError:                           # frames nested past any real one: one by one
            same = [False] * len(lists)
        sids = list(map(_SID, found))
        if not all(same):                                # a new stack, or one its key did not confirm
            for k in compress(range(len(lists)), map(operator.not_, same)):
                sids[k] = self._find(known, lists[k])
        return sids

    def _find(self, known: _Known, frames: list[Any]) -> int:
        """The stack id of a list that its lookup key did not confirm (`_intern_length`): a known stack the
        key missed, or a new one, added to `known` (with one more place to compare where it must)."""
        while True:
            key = tuple(id(frames[k]) for k in known.at)
            seen = known.table.get(key)
            if seen is None:
                sid = self._stack_id(frames)
                known.table[key] = (frames, sid)
                return sid
            other, sid = seen
            try:
                if other == frames:
                    return sid
            except RecursionError:
                pass
            where = next((k for k in range(len(frames)) if frames[k] is not other[k]), None)
            if where is None:                            # the same frame objects: the same stack
                return sid
            known.at.append(where)
            known.table = {tuple(id(f[k]) for k in known.at): (f, s) for f, s in known.table.values()}

    def _intern_one(self, frames: Any) -> int:
        if type(frames) is list and frames:
            return self._find(self._by_length.setdefault(len(frames), _Known()), frames)
        return self._stack_id(frames) if type(frames) is tuple and frames else -1

    def finish(self) -> StackInterner:
        """Drop every reference to the raw frames (the known lists, the frame objects by identity): the tables
        stay, `intern` may not be called again. Returns self."""
        self._by_length.clear()
        self._frame_by_obj.clear()
        self._keepalive.clear()
        return self

    @classmethod
    def from_tables(cls, frames: pd.DataFrame, stacks: pd.DataFrame) -> StackInterner:
        """An interner pre-filled from `frames_table()` / `stacks_table()` output (e.g. read from Parquet)."""
        new = cls()
        new.frames = list(zip(frames["filename"].astype(str), frames["line"].astype(int),
                              frames["name"].astype(str)))
        new._frame_by_value = {f: i for i, f in enumerate(new.frames)}
        ordered = stacks.sort_values(["stack_id", "depth"], kind="stable")
        ids = ordered["stack_id"].to_numpy()
        fids = ordered["frame_id"].to_numpy()
        bounds = np.flatnonzero(np.diff(ids)) + 1 if len(ids) else np.zeros(0, dtype=np.int64)
        count = int(ids.max()) + 1 if len(ids) else 0
        new.stacks = [()] * count
        for sid, part in zip(ids[np.concatenate([[0], bounds])] if len(ids) else [], np.split(fids, bounds)):
            new.stacks[int(sid)] = tuple(int(f) for f in part)
        new._stack_by_key = {key: i for i, key in enumerate(new.stacks)}
        return new

    def frames_table(self) -> pd.DataFrame:
        """Columns: frame_id, filename, line, name."""
        import pandas as pd
        files, lines, names = zip(*self.frames) if self.frames else ((), (), ())
        return pd.DataFrame({"frame_id": range(len(self.frames)), "filename": list(files),
                             "line": list(lines), "name": list(names)})

    def stacks_table(self) -> pd.DataFrame:
        """Long format, one row per frame of each stack: stack_id, depth (0 = innermost), frame_id."""
        import pandas as pd
        sids: list[int] = []
        depths: list[int] = []
        fids: list[int] = []
        for sid, key in enumerate(self.stacks):
            sids.extend([sid] * len(key))
            depths.extend(range(len(key)))
            fids.extend(key)
        return pd.DataFrame({"stack_id": sids, "depth": depths, "frame_id": fids})
