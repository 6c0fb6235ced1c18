"""Intern stack frames: each distinct frame and each distinct stack is stored once and named by an int id;
and what a frame is: Python or native (`is_python_frame`), its path without the install prefix
(`short_path`), its one-line label (`frame_site`).

Contract: `StackInterner.intern(frames)` maps a raw frames list (innermost first, dicts with filename/line/
name) to a stack id (-1 for none), interning lazily so that only the stacks an analysis asks for are ever
touched. Identity of the unpickled objects is the cheap first key (torch's pickle shares frame dicts and
many frames lists), the frame values the second, so equal stacks get one id however they were stored.
The raw lists stay referenced by the Snapshot, which keeps the identity keys valid. Frames are untrusted
input: a field of the wrong type reads as "<malformed …>" (never str() of a nested object), every string goes
through `clean_text` (lone surrogates escaped, length capped), and a stack keeps at most MAX_STACK_DEPTH
innermost frames.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

Frame = tuple[str, int, str]  # (filename, line, name)
NATIVE_SUFFIXES = (".cpp", ".cc", ".cu", ".h", ".hpp", ".c")
MAX_TEXT = 4096                # characters kept of any one string from a snapshot (a path, a name, a tag)
MAX_STACK_DEPTH = 10_000       # frames kept per stack, innermost first (real stacks hold tens to hundreds)


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


def frame_site(frame: Frame | None, qualname: str = "") -> str:
    """"file:line:function" for a Python frame (the function as `qualname` when the source named it), the
    name without its argument list for a native one, "" for none."""
    if frame is None:
        return ""
    filename, line, name = frame
    if is_python_frame(filename):
        return f"{short_path(filename)}:{line}:{qualname or name}"
    return name.split("(", 1)[0] or name


class StackInterner:
    """Frame and stack tables, grown on demand."""

    def __init__(self) -> None:
        self._stack_by_list: dict[int, int] = {}
        self._stack_by_key: dict[tuple[int, ...], int] = {}
        self._frame_by_obj: dict[int, int] = {}
        self._frame_by_value: dict[Frame, int] = {}
        self._keepalive: list[Any] = []
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

    def intern(self, frames: Any) -> int:
        if not frames or not isinstance(frames, (list, tuple)):
            return -1
        sid = self._stack_by_list.get(id(frames))
        if sid is not None:
            return sid
        head = frames[:MAX_STACK_DEPTH]
        seen = tuple(map(self._frame_by_obj.get, map(id, head)))   # frames interned before, found in C
        key = cast(tuple[int, ...], seen) if None not in seen else tuple(self._frame_id(f) for f in head)
        sid = self._stack_by_key.get(key)
        if sid is None:
            sid = len(self.stacks)
            self.stacks.append(key)
            self._stack_by_key[key] = sid
        self._stack_by_list[id(frames)] = sid
        self._keepalive.append(frames)
        return sid

    def intern_many(self, lists: Sequence[Any], rows: Sequence[int] | np.ndarray) -> np.ndarray:
        """`intern` of `lists[r]` for each of `rows`, as int64 stack ids, iterated in C (one call per row)."""
        picked = map(lists.__getitem__, np.asarray(rows, dtype=np.int64).tolist())
        return np.fromiter(map(self.intern, picked), dtype=np.int64, count=len(rows))

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
