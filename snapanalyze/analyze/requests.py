"""Which request allocated a block: the request identity of trace events.

Contract: `event_requests(trace, indices, markers)` returns, for each given event of one device's trace, the
request it was made for ("" when unknown) and whether that was inferred. The `user_metadata` of the event
is exact (the collector's `collect.request(id)` sets it to "req=<id>" where torch can). Without it, the
collector's request markers (`load.samples` markers of kind "request") decide by time: the event belongs to
the request span that covers its `time_us` (both ends included) — the innermost one when spans of one
thread nest — and is left unknown when spans of different threads cover it, because the trace does not
record which thread allocated. Markers and trace share the µs epoch clock. Names from markers take the
metadata's form, "req=<id>", so both sources name a request alike. `request_at(markers, t)` names the
request running at an instant. `RequestIndex.of(markers)` turns the
spans into owned time intervals once (one sweep over their ends); the index of the last markers table is
kept, since every attribution of a run asks for the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..model import DeviceTrace

REQUEST_PREFIX = "req="
_NOBODY, _SEVERAL = -1, -2       # owners of an interval that no span, or spans of several threads, cover
_OPEN = np.iinfo(np.int64).max


@dataclass(frozen=True)
class EventRequests:
    """Per given event: `names` (object array, "" = unknown), `inferred` (bool array: named by time from a
    marker span, not by the event's own metadata) and `ambiguous` (how many events spans of several threads
    covered, left unknown)."""

    names: np.ndarray
    inferred: np.ndarray
    ambiguous: int = 0


@dataclass(frozen=True, eq=False)
class RequestIndex:
    """Request spans as disjoint intervals [starts[i], starts[i+1]) with one owner each: an index into
    `names`, _NOBODY or _SEVERAL."""

    starts: np.ndarray
    owners: np.ndarray
    names: np.ndarray

    def __len__(self) -> int:
        return len(self.names)

    @staticmethod
    def of(markers: pd.DataFrame | None) -> RequestIndex:
        """The index of the request spans of a markers table (cached for the last table asked about)."""
        global _last
        if _last is not None and _last[0] is markers:
            return _last[1]
        index = _build(markers)
        _last = (markers, index)
        return index

    def owner_at(self, times: np.ndarray) -> np.ndarray:
        """The owner of each time (an index into `names`, _NOBODY or _SEVERAL)."""
        if not len(self.starts):
            return np.full(len(times), _NOBODY, dtype=np.int64)
        pos = np.searchsorted(self.starts, times, side="right") - 1
        return np.where(pos >= 0, self.owners[np.maximum(pos, 0)], _NOBODY)


_last: tuple[pd.DataFrame | None, RequestIndex] | None = None


def _build(markers: pd.DataFrame | None) -> RequestIndex:
    empty = np.zeros(0, dtype=np.int64)
    if markers is None or not len(markers):
        return RequestIndex(empty, empty, np.zeros(0, dtype=object))
    spans = markers[markers["kind"] == "request"]
    if not len(spans):
        return RequestIndex(empty, empty, np.zeros(0, dtype=object))
    starts = spans["start_time_us"].to_numpy(dtype=np.int64)
    ends = spans["end_time_us"].astype("Int64")
    stops = np.where(ends.isna().to_numpy(), _OPEN, ends.fillna(0).to_numpy(dtype=np.int64) + 1)  # exclusive
    stops = np.maximum(stops, starts + 1)            # an end recorded before its start covers its start alone
    sessions = spans["session"].tolist() if "session" in spans else [0] * len(spans)
    threads = pd.factorize(pd.Series(list(zip(sessions, spans["thread_id"].tolist()))))[0].tolist()
    depths = spans["depth"].to_numpy(dtype=np.int64).tolist()
    # Sweep the span ends in time order; at equal times spans close before others open.
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
            owner = _NOBODY
        elif len(per_thread) > 1:
            owner = _SEVERAL
        else:                                        # one thread's nested spans: the innermost, latest begun
            owner = max(active, key=lambda k: (depths[k], int(starts[k]), k))
        if owners and owners[-1] == owner:
            continue
        points.append(time)
        owners.append(owner)
    names = np.array([REQUEST_PREFIX + str(v) for v in spans["name"]], dtype=object)
    return RequestIndex(np.array(points, dtype=np.int64), np.array(owners, dtype=np.int64), names)


def request_at(markers: pd.DataFrame | None, time_us: int | None) -> str | None:
    """The request whose marker span was running at `time_us` ("req=<id>"), or None: no span, or spans of
    several threads."""
    if markers is None or not len(markers) or time_us is None:
        return None
    index = RequestIndex.of(markers)
    owner = int(index.owner_at(np.array([time_us], dtype=np.int64))[0]) if len(index) else _NOBODY
    return str(index.names[owner]) if owner >= 0 else None


def event_requests(trace: DeviceTrace, indices: np.ndarray, markers: pd.DataFrame | None = None) -> EventRequests:
    """The request of each event `indices` of `trace` (see the module docstring)."""
    indices = np.asarray(indices, dtype=np.int64)
    n = len(indices)
    names = np.full(n, "", dtype=object)
    if trace.user_metadata is not None and n:
        table = np.array(trace.user_metadata_names, dtype=object)
        names[:] = table[trace.user_metadata[indices]]
    inferred = np.zeros(n, dtype=bool)
    unknown = np.flatnonzero(names == "")
    if markers is None or not len(markers) or trace.time_us is None or not len(unknown):
        return EventRequests(names, inferred)
    index = RequestIndex.of(markers)
    if not len(index):
        return EventRequests(names, inferred)
    owner = index.owner_at(trace.time_us[indices[unknown]])
    hit = owner >= 0
    names[unknown[hit]] = index.names[owner[hit]]
    inferred[unknown[hit]] = True
    return EventRequests(names, inferred, int((owner == _SEVERAL).sum()))
