"""Marker spans as disjoint owned time intervals: which span was running at a given µs.

Contract: `SpanIndex.build(spans)` takes marker rows (`load.samples` markers of one kind: start_time_us,
end_time_us (null: still open), thread_id, depth, session) and sweeps their ends once, in time order (at
equal times spans close before others open; an end recorded before its start covers its start alone), into
intervals [starts[i], starts[i+1]) owned by one span: the innermost (deepest, then latest begun) open span
when all open spans belong to one thread, SEVERAL when spans of several threads are open (the trace does not
record which thread allocated), NOBODY when none is. `owner_at(times)` looks the owners up, vectorised.
Owners are row positions in the given spans. Both ends of a span are inclusive.
`annotation_spans(snapshot)` pairs the snapshot's `record_function` START/END annotations into spans;
`open_spans(snapshot, device, times)` names the innermost of them open at each time ("" where none is), the
span a block's allocation ran in (`Optimizer.step#AdamW.step`, a program's own `prefill` range).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..model import Snapshot

NOBODY, SEVERAL = -1, -2
_OPEN = np.iinfo(np.int64).max


@dataclass(frozen=True, eq=False)
class SpanIndex:
    starts: np.ndarray
    owners: np.ndarray
    count: int                     # spans indexed

    def __len__(self) -> int:
        return self.count

    @staticmethod
    def build(spans: pd.DataFrame) -> SpanIndex:
        empty = np.zeros(0, dtype=np.int64)
        if not len(spans):
            return SpanIndex(empty, empty, 0)
        starts = spans["start_time_us"].to_numpy(dtype=np.int64)
        ends = spans["end_time_us"].astype("Int64")
        stops = np.where(ends.isna().to_numpy(), _OPEN, ends.fillna(0).to_numpy(dtype=np.int64) + 1)  # exclusive
        stops = np.maximum(stops, starts + 1)
        sessions = spans["session"].tolist() if "session" in spans else [0] * len(spans)
        threads = pd.factorize(pd.Series(list(zip(sessions, spans["thread_id"].tolist()))))[0].tolist()
        depths = spans["depth"].to_numpy(dtype=np.int64).tolist()
        edges = sorted([(int(t), 0, k) for k, t in enumerate(stops.tolist())]
                       + [(int(t), 1, k) for k, t in enumerate(starts.tolist())])
        active: set[int] = set()
        per_thread: dict[int, int] = {}                 # open spans of each thread
        points: list[int] = []
        owners: list[int] = []
        i = 0
        while i < len(edges):
            time = edges[i][0]
            while i < len(edges) and edges[i][0] == time:
                _, opens, k = edges[i]
                th = threads[k]
                if opens:
                    active.add(k)
                    per_thread[th] = per_thread.get(th, 0) + 1
                else:
                    active.discard(k)
                    per_thread[th] -= 1
                    if not per_thread[th]:
                        del per_thread[th]
                i += 1
            if not active:
                owner = NOBODY
            elif len(per_thread) > 1:
                owner = SEVERAL
            else:                                        # one thread's nested spans: the innermost, latest begun
                owner = max(active, key=lambda k: (depths[k], int(starts[k]), k))
            if owners and owners[-1] == owner:
                continue
            points.append(time)
            owners.append(owner)
        return SpanIndex(np.array(points, dtype=np.int64), np.array(owners, dtype=np.int64), len(spans))

    def owner_at(self, times: np.ndarray) -> np.ndarray:
        """The owner of each time (a row position in the spans, NOBODY or SEVERAL)."""
        if not len(self.starts):
            return np.full(len(times), NOBODY, dtype=np.int64)
        pos = np.searchsorted(self.starts, times, side="right") - 1
        return np.where(pos >= 0, self.owners[np.maximum(pos, 0)], NOBODY)


def annotation_spans(snapshot: Snapshot) -> list[dict[str, Any]]:
    """`record_function` START/END pairs per (device, name), innermost first: dicts of name, device,
    start_us (None: an END whose START was before the window), end_us (None: still open), depth."""
    out: list[dict[str, Any]] = []
    ann = snapshot.annotations
    if not len(ann):
        return out
    ann = ann.sort_values("time_us", kind="stable", na_position="first")
    open_: dict[tuple[int, str], list[int | None]] = {}
    for row in ann.itertuples(index=False):
        key = (int(row.device), str(row.name))
        t = None if row.time_us is pd.NA else int(row.time_us)
        if str(row.stage).upper() == "START":
            open_.setdefault(key, []).append(t)
        elif str(row.stage).upper() == "END":
            starts = open_.get(key)
            start = starts.pop() if starts else None         # an END without START began before the window
            out.append({"name": key[1], "device": key[0], "start_us": start, "end_us": t,
                        "depth": len(starts or [])})
    for (device, name), starts in open_.items():
        out.extend({"name": name, "device": device, "start_us": s, "end_us": None, "depth": i}
                   for i, s in enumerate(starts))
    return out


_OPEN_INDEX: weakref.WeakKeyDictionary[Snapshot, dict[int, tuple[SpanIndex, np.ndarray]]] = \
    weakref.WeakKeyDictionary()
_BEFORE = np.iinfo(np.int64).min // 2         # the start of a span that began before the trace window


def open_spans(snapshot: Snapshot, device: int, times: np.ndarray) -> np.ndarray:
    """The name of the innermost `record_function` span of `device` open at each time (µs), "" where none is
    (object array); where no annotation names the device, every span counts. Built once per device."""
    per = _OPEN_INDEX.setdefault(snapshot, {})
    hit = per.get(device)
    if hit is None:
        every = annotation_spans(snapshot)
        found = [s for s in every if s["device"] == device] or every
        rows = pd.DataFrame({
            "start_time_us": [s["start_us"] if s["start_us"] is not None else _BEFORE for s in found],
            "end_time_us": pd.array([s["end_us"] for s in found], dtype="Int64"),
            "thread_id": [0] * len(found), "depth": [s["depth"] for s in found]})
        names = np.array([""] + [s["name"] for s in found], dtype=object)
        hit = per[device] = (SpanIndex.build(rows), names)
    index, names = hit
    if not len(index) or not len(times):
        return np.full(len(times), "", dtype=object)
    owner = index.owner_at(np.asarray(times, dtype=np.int64))
    return names[np.where(owner >= 0, owner + 1, 0)]
