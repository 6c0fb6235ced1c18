"""Marker spans as disjoint owned time intervals: which span was running at a given µs.

Contract: `SpanIndex.build(spans)` takes marker rows (`load.samples` markers of one kind: start_time_us,
end_time_us (null: still open), thread_id, depth, session) and sweeps their ends once, in time order (at
equal times spans close before others open; an end recorded before its start covers its start alone), into
intervals [starts[i], starts[i+1]) owned by one span: the innermost (deepest, then latest begun) open span
when all open spans belong to one thread, SEVERAL when spans of several threads are open (the trace does not
record which thread allocated), NOBODY when none is. `owner_at(times)` looks the owners up, vectorised.
Owners are row positions in the given spans. Both ends of a span are inclusive.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

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
