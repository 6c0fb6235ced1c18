"""Which request allocated a block: the request identity of trace events.

Contract: `event_requests(trace, indices, markers)` returns, for each given event of one device's trace, the
request it was made for ("" when unknown) and whether that was inferred. The `user_metadata` of the event
is exact (the collector's `collect.request(id)` sets it to "req=<id>" where torch can). Without it, the
collector's request markers (`load.samples` markers of kind "request") decide by time: the event belongs to
the request span that covers its `time_us` (both ends included) — the innermost one when spans of one
thread nest — and is left unknown when spans of different threads cover it, because the trace does not
record which thread allocated. Markers and trace share the µs epoch clock. Names from markers take the
metadata's form, "req=<id>", so both sources name a request alike. `request_at(markers, t)` names the
request running at an instant. `RequestIndex.of(markers)` turns the request spans into owned time intervals
once (`spans.SpanIndex`); the index of the last markers table is kept, since every attribution of a run
asks for the same one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..model import DeviceTrace
from .spans import NOBODY, SEVERAL, SpanIndex

REQUEST_PREFIX = "req="


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
    """The request spans of a markers table as owned intervals (`spans.SpanIndex`) and their names."""

    spans: SpanIndex
    names: np.ndarray

    def __len__(self) -> int:
        return len(self.names)

    @staticmethod
    def of(markers: pd.DataFrame | None) -> RequestIndex:
        """The index of the request spans of a markers table (cached for the last table asked about)."""
        global _last
        if _last is not None and _last[0] is markers:
            return _last[1]
        spans = markers[markers["kind"] == "request"] if markers is not None and len(markers) else None
        if spans is None or not len(spans):
            index = RequestIndex(SpanIndex.build(pd.DataFrame()), np.zeros(0, dtype=object))
        else:
            index = RequestIndex(SpanIndex.build(spans),
                                 np.array([REQUEST_PREFIX + str(v) for v in spans["name"]], dtype=object))
        _last = (markers, index)
        return index

    def owner_at(self, times: np.ndarray) -> np.ndarray:
        """The owner of each time (an index into `names`, NOBODY or SEVERAL)."""
        return self.spans.owner_at(times)


_last: tuple[pd.DataFrame | None, RequestIndex] | None = None


def request_at(markers: pd.DataFrame | None, time_us: int | None) -> str | None:
    """The request whose marker span was running at `time_us` ("req=<id>"), or None: no span, or spans of
    several threads."""
    if markers is None or not len(markers) or time_us is None:
        return None
    index = RequestIndex.of(markers)
    owner = int(index.owner_at(np.array([time_us], dtype=np.int64))[0]) if len(index) else NOBODY
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
    return EventRequests(names, inferred, int((owner == SEVERAL).sum()))
