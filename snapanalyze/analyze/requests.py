"""Which request allocated a block: the request identity of trace events.

Contract: `event_requests(trace, indices, markers)` returns, for each given event of one device's trace, the
request it was made for ("" when unknown) and whether that was inferred. The `user_metadata` of the event
is exact (the collector's `collect.request(id)` sets it to "req=<id>" where torch can). Without it, the
collector's request markers (`load.samples` markers of kind "request") decide by time: the event belongs to
the request span that covers its `time_us` — the innermost one when spans of one thread nest — and is left
unknown when spans of different threads cover it, because the trace does not record which thread
allocated. Markers and trace share the µs epoch clock. Names from markers take the metadata's form,
"req=<id>", so both sources name a request alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..model import DeviceTrace

REQUEST_PREFIX = "req="


@dataclass(frozen=True)
class EventRequests:
    """Per given event: `names` (object array, "" = unknown), `inferred` (bool array: named by time from a
    marker span, not by the event's own metadata) and `ambiguous` (how many events spans of several threads
    covered, left unknown)."""

    names: np.ndarray
    inferred: np.ndarray
    ambiguous: int = 0


def request_markers(markers: pd.DataFrame | None) -> pd.DataFrame:
    """The rows of kind "request" of a markers table (empty when there is none)."""
    if markers is None or not len(markers):
        return pd.DataFrame(columns=["name", "start_time_us", "end_time_us", "thread_id", "depth", "session"])
    return markers[markers["kind"] == "request"]


def event_requests(trace: DeviceTrace, indices: np.ndarray, markers: pd.DataFrame | None = None) -> EventRequests:
    """The request of each event `indices` of `trace` (see the module docstring)."""
    indices = np.asarray(indices, dtype=np.int64)
    n = len(indices)
    names = np.full(n, "", dtype=object)
    if trace.user_metadata is not None and n:
        table = np.array(trace.user_metadata_names, dtype=object)
        names[:] = table[trace.user_metadata[indices]]
    inferred = np.zeros(n, dtype=bool)
    spans = request_markers(markers)
    unknown = np.flatnonzero(names == "")
    if not len(spans) or trace.time_us is None or not len(unknown):
        return EventRequests(names, inferred)

    times = trace.time_us[indices[unknown]]
    order = np.argsort(times, kind="stable")
    sorted_times = times[order]
    owner = np.full(len(unknown), -1, dtype=np.int64)
    depth = np.full(len(unknown), -1, dtype=np.int64)
    thread = np.full(len(unknown), -1, dtype=np.int64)
    clash = np.zeros(len(unknown), dtype=bool)
    sessions = spans["session"].to_numpy() if "session" in spans else np.zeros(len(spans), dtype=np.int64)
    threads = pd.factorize(pd.Series(list(zip(sessions.tolist(), spans["thread_id"].tolist()))))[0]
    ends = spans["end_time_us"].astype("Int64").fillna(np.iinfo(np.int64).max).to_numpy(dtype=np.int64)
    for k, (start, end, th, d) in enumerate(zip(spans["start_time_us"].to_numpy(dtype=np.int64), ends,
                                                threads, spans["depth"].to_numpy(dtype=np.int64))):
        covered = order[np.searchsorted(sorted_times, start, "left"):np.searchsorted(sorted_times, end, "right")]
        other = (thread[covered] >= 0) & (thread[covered] != th)
        clash[covered[other]] = True
        take = covered[(thread[covered] < 0) | ((thread[covered] == th) & (depth[covered] < d))]
        owner[take], depth[take], thread[take] = k, d, th
    owner[clash] = -1
    span_names = np.array([REQUEST_PREFIX + str(v) for v in spans["name"]], dtype=object)
    hit = owner >= 0
    names[unknown[hit]] = span_names[owner[hit]]
    inferred[unknown[hit]] = True
    return EventRequests(names, inferred, int(clash.sum()))
