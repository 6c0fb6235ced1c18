"""Request identity of trace events: user_metadata is exact; without it, the collector's request markers name
the request by time, only where one thread's spans cover the event; and attribution uses it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from conftest import BASE, SnapshotBuilder, write_pickle

from snapanalyze import attribute, load
from snapanalyze.analyze.requests import event_requests, request_at

MiB = 1 << 20


def _markers(*spans: tuple[str, int, int | None, int, int]) -> pd.DataFrame:
    """(request id, start_us, end_us or None, thread_id, depth) → a markers table as `load.samples` reads it."""
    return pd.DataFrame({
        "rank": 0, "session": 0, "kind": "request", "name": [s[0] for s in spans],
        "start_time_us": [s[1] for s in spans], "end_time_us": pd.array([s[2] for s in spans], dtype="Int64"),
        "attrs": [{} for _ in spans], "thread_id": [s[3] for s in spans], "depth": [s[4] for s in spans]})


def _two_requests(tmp_path: Path, metadata: bool = False, kept: int = 10 * MiB, peak: int = 40 * MiB):
    """Request A allocates `kept` bytes it keeps (a cached output), then request B runs and allocates `peak`."""
    b = SnapshotBuilder()
    b.segment(BASE, [(kept, kept, "active_allocated"), (peak, peak, "active_allocated"), (14 * MiB, 0, "inactive")])
    b.alloc(BASE, kept, user_metadata="req=A" if metadata else "")            # event 0, during A
    b.alloc(BASE + kept, peak, user_metadata="req=B" if metadata else "")     # event 1, during B
    raw = b.build()
    times = [e["time_us"] for e in raw["device_traces"][0]]
    return load(write_pickle(tmp_path / f"two-{metadata}-{kept}.pickle", raw)), times


def test_metadata_is_exact_and_markers_fill_the_gaps(tmp_path):
    snap, t = _two_requests(tmp_path)
    markers = _markers(("A", t[0] - 5, t[0] + 5, 1, 0), ("B", t[1] - 5, None, 1, 0))
    found = event_requests(snap.trace(0), np.array([0, 1]), markers)
    assert found.names.tolist() == ["req=A", "req=B"]
    assert found.inferred.tolist() == [True, True]
    assert event_requests(snap.trace(0), np.array([0, 1])).names.tolist() == ["", ""]
    exact, _ = _two_requests(tmp_path, metadata=True)
    found = event_requests(exact.trace(0), np.array([0, 1]), _markers(("C", t[0] - 5, None, 1, 0)))
    assert found.names.tolist() == ["req=A", "req=B"] and not found.inferred.any()


def test_nested_spans_of_one_thread_pick_the_innermost_and_threads_that_overlap_are_unknown(tmp_path):
    snap, t = _two_requests(tmp_path)
    nested = _markers(("outer", t[0] - 10, t[1] + 10, 7, 0), ("inner", t[1] - 1, t[1] + 1, 7, 1))
    assert event_requests(snap.trace(0), np.array([0, 1]), nested).names.tolist() == ["req=outer", "req=inner"]
    overlapping = _markers(("A", t[0] - 10, t[1] + 10, 1, 0), ("B", t[1] - 1, t[1] + 1, 2, 0))
    found = event_requests(snap.trace(0), np.array([0, 1]), overlapping)
    assert found.names.tolist() == ["req=A", ""] and found.ambiguous == 1


def test_another_requests_live_bytes_are_concurrent_request_by_marker(tmp_path):
    snap, t = _two_requests(tmp_path)
    markers = _markers(("A", t[0] - 5, t[0] + 5, 1, 0), ("B", t[1] - 5, None, 1, 0))
    result = attribute(snap, at="event:1", markers=markers)
    assert result.instants[0].request == "req=B"
    other = result.blocks[result.blocks["category"] == "concurrent_request"]
    assert other["size"].tolist() == [10 * MiB]
    assert other.iloc[0]["rule"] == "signal.request_marker" and bool(other.iloc[0]["inferred"])
    assert other.iloc[0]["user_metadata"] == "req=A"
    # The same bytes per category as when torch recorded the request in user_metadata.
    exact = attribute(_two_requests(tmp_path, metadata=True)[0], at="event:1")
    assert result.summary.set_index("category")["bytes"].to_dict() == \
        exact.summary.set_index("category")["bytes"].to_dict()
    assert exact.blocks.loc[exact.blocks["category"] == "concurrent_request", "rule"].tolist() == \
        ["signal.user_metadata"]
    assert not any("no request identity" in n for n in result.notes)


def test_the_request_identity_note_is_for_serving_engines_once_per_file() -> None:
    """Only a serving engine batches requests into one forward; a training run or a plain program has none to
    tell apart, so the note would be noise there."""
    scenarios = Path(__file__).resolve().parents[2] / "fixtures"
    serving = attribute(load(scenarios / "scenarios" / "kv_weights_baseline.pickle")).notes
    assert [n for n in serving if "no request identity" in n] == [
        "device 0: no request identity recorded (user_metadata empty, no request markers), so bytes of other "
        "requests batched into the same forward cannot be told apart"]
    training = attribute(load(scenarios / "real" / "cs336-medium-ctx1024-training-t2.11.pickle")).notes
    assert not any("no request identity" in n for n in training)


def test_adjacent_and_open_spans(tmp_path):
    snap, t = _two_requests(tmp_path)
    # A ends exactly one µs before B begins, and B is still open: each event falls in exactly one of them.
    adjacent = _markers(("A", t[0], t[1] - 1, 1, 0), ("B", t[1], None, 2, 0))
    assert event_requests(snap.trace(0), np.array([0, 1]), adjacent).names.tolist() == ["req=A", "req=B"]
    assert request_at(adjacent, t[1] - 1) == "req=A" and request_at(adjacent, t[1] + 10**9) == "req=B"
    assert request_at(adjacent, t[0] - 1) is None and request_at(None, t[0]) is None
    backwards = _markers(("A", t[0], t[0] - 7, 1, 0))                        # a clock that stepped back
    assert request_at(backwards, t[0]) == "req=A" and request_at(backwards, t[0] + 1) is None
    ends_on_b = _markers(("A", t[0], t[1], 1, 0), ("B", t[1], None, 2, 0))      # both cover t[1], two threads
    found = event_requests(snap.trace(0), np.array([0, 1]), ends_on_b)
    assert found.names.tolist() == ["req=A", ""] and request_at(ends_on_b, t[1]) is None


def test_the_request_whose_allocation_reached_the_instant_is_the_instants_request(tmp_path):
    """A kept more bytes than B holds at B's peak: by bytes alone A would be the instant's request. B's allocation
    reached the instant, so B is, named by its metadata or by the marker span around that allocation; A's
    bytes are the other request's."""
    snap, t = _two_requests(tmp_path, kept=40 * MiB, peak=10 * MiB)
    markers = _markers(("A", t[0] - 5, t[0] + 5, 1, 0), ("B", t[1] - 5, None, 1, 0))
    exact = _two_requests(tmp_path, metadata=True, kept=40 * MiB, peak=10 * MiB)[0]
    for result in (attribute(snap, at="event:1", markers=markers), attribute(exact, at="event:1")):
        assert result.instants[0].request == "req=B"
        other = result.blocks[result.blocks["category"] == "concurrent_request"]
        assert other["size"].tolist() == [40 * MiB]
        assert "whose allocation reached this instant is 'req=B'" in other.iloc[0]["reason"]


def test_without_the_allocations_request_the_most_bytes_decide_as_a_last_resort(tmp_path):
    """B's allocation carries no identity and no span covers it: the request holding the most bytes is taken,
    and a block of another request says that this was only a last resort."""
    snap, t = _two_requests(tmp_path, kept=10 * MiB, peak=40 * MiB)
    a_and_c = _markers(("A", t[0] - 5, t[0] + 5, 1, 0), ("C", t[0] + 6, t[0] + 7, 1, 0))
    by_bytes = attribute(snap, at="event:1", markers=a_and_c)
    assert by_bytes.instants[0].request == "req=A"      # the only request with live bytes
    assert not (by_bytes.blocks["category"] == "concurrent_request").any()
    exact = attribute(_two_requests(tmp_path, metadata=True, kept=40 * MiB, peak=10 * MiB)[0], at="event:0")
    assert exact.instants[0].request == "req=A"
