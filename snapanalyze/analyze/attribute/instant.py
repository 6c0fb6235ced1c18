"""Which instant an attribution looks at, and whose it is.

Contract: `choose_instant(timeline, device, at)` turns `peak`, `peak:N`, `event:I`, `time:T` or an event
index (int) into an event index and a label (`time_us_of` reads T); `instant_event` finds the allocation that
reached an instant and `instant_request` the request the instant belongs to, with how it was chosen.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np
import pandas as pd

from ...errors import UsageError
from ...model import ALLOC, OOM, Snapshot
from ...replay import Timeline
from ...units import fmt_time_us
from ..peaks import find_peaks, global_peak_index
from ..requests import event_requests, request_at

STATE = "allocator state"     # the instant of a file without a trace: what its state shows, at no known time


def choose_instant(timeline: Timeline, device: int, at: str | int) -> tuple[int, str]:
    """The event index of `at` on a device and its label (see the package docstring for the forms; an int is
    an event index, as `event:I`, for the analyses that chose one)."""
    dt = timeline[device]

    def event(i: int, said: str) -> tuple[int, str]:
        if not -1 <= i < len(dt):
            raise UsageError(f"{said}: device {device} has events 0…{len(dt) - 1} (−1 = start)")
        return i, f"event {i}"
    if isinstance(at, int) and not isinstance(at, bool):
        return event(at, f"event {at}")
    kind, _, arg = str(at).partition(":")
    try:
        if kind == "peak" and not arg:
            if len(dt) <= 1:                  # the state alone (no trace, or a 1-entry legacy one): no peak to find
                return len(dt) - 1, STATE
            return global_peak_index(dt), "global peak"
        if kind == "peak":
            n = int(arg)
            peaks = find_peaks(timeline, top=max(n, 1), device=device)
            if n < 1 or n > len(peaks):
                raise UsageError(f"--at {at}: device {device} has {len(peaks)} peak(s)")
            return int(peaks.iloc[n - 1]["event_index"]), f"peak {n}"
        if kind == "event":
            return event(int(arg), f"--at {at}")
        if kind == "time":
            if dt.time_us is None or len(dt) == 0:
                raise UsageError(f"--at {at}: device {device}'s trace has no timestamps")
            t = time_us_of(arg, int(dt.time_us[0]))
            first, last = int(dt.time_us[0]), int(dt.time_us[-1])
            if not first <= t <= last:
                raise UsageError(f"--at {at}: {fmt_time_us(t)} is outside device {device}'s trace window "
                                 f"({fmt_time_us(first)} … {fmt_time_us(last)}): the trace does not say what was "
                                 "live then")
            return int(np.searchsorted(dt.time_us, t, side="right")) - 1, f"time {fmt_time_us(t)}"
    except ValueError:
        raise UsageError(f"--at {at}: {_AT_FORMS}") from None
    raise UsageError(f"--at {at}: {_AT_FORMS}")


_AT_FORMS = ("expected peak, peak:N, event:I or time:T (T: a UTC date-time as printed, e.g. 2026-04-18 "
             "02:34:01.223438 UTC or 2026-04-18T02:34:01.223438Z; an offset into the trace window, e.g. +2.38ms, "
             "+1.5s, +120us; or µs since the epoch)")
_OFFSET = re.compile(r"^\+\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(us|µs|ms|s)$")
_OFFSET_US = {"us": 1, "µs": 1, "ms": 1000, "s": 1_000_000}


def time_us_of(text: str, window_start_us: int) -> int:
    """µs since the epoch of a `time:` instant: digits (already µs since the epoch), ``+<n><us|ms|s>`` (that
    long after `window_start_us`, the trace's first event; a fraction of a µs rounds down), or a date-time —
    ``2026-04-18 02:34:01.223438 UTC`` as the outputs print it, or ISO 8601 (no zone: UTC). Raises
    ValueError for anything else."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    m = _OFFSET.match(text)
    if m:
        return window_start_us + int(Decimal(m.group(1)) * _OFFSET_US[m.group(2)])
    if text.endswith(" UTC"):
        text = text[:-4].rstrip() + "+00:00"
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)



def instant_event(trace: Any, index: int) -> int:
    """The event whose allocation reached the instant: the oom entry at it, else the last alloc at or before
    it (−1: none)."""
    if index < 0 or not len(trace):
        return -1
    if trace.action[index] == OOM:
        return index
    lo = index + 1
    while lo > 0:                      # look back in growing windows: the alloc is nearly always close
        lo, hi = max(0, lo - 1024 * (index + 1 - lo + 1)), lo
        allocs = np.flatnonzero(trace.action[lo:hi] == ALLOC)
        if len(allocs):
            return lo + int(allocs[-1])
    return -1


def instant_request(snapshot: Snapshot, device: int, event: int, markers: pd.DataFrame | None,
                     at_time: int | None, metadata: np.ndarray, sizes: np.ndarray) -> tuple[str | None, str]:
    """The instant's request and how it was chosen: the request of the allocation that reached it (at an OOM,
    the one whose allocation failed), else the request marker span running then, else — a stated last
    resort — the request holding most of the live transient bytes."""
    if event >= 0:
        own = event_requests(snapshot.trace(device), np.array([event]), markers)
        if own.names[0]:
            return str(own.names[0]), "the request whose allocation reached this instant"
    running = request_at(markers, at_time)
    if running:
        return running, "the request whose marker span was running at this instant"
    most = _main_request(metadata, sizes)
    return most, ("for want of a better sign, the request holding most of the live transient bytes at this "
                  "instant" if most else "")


def _main_request(metadata: np.ndarray, sizes: np.ndarray) -> str | None:
    """The request holding the most live bytes allocated in the window (the last resort for the instant's)."""
    named = np.flatnonzero(metadata != "")
    if not len(named):
        return None
    codes, requests = pd.factorize(metadata[named])
    totals = np.zeros(len(requests), dtype=np.int64)
    np.add.at(totals, codes, sizes[named].astype(np.int64))
    return str(max(zip(totals.tolist(), requests.tolist()))[1])
