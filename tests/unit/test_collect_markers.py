"""Phase and request markers: µs epoch times, nesting, per-thread metadata set and restored."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from snapanalyze.collect import CollectorWarning, markers, phase, request
from snapanalyze.collect.markers import MarkerLog, TraceHooks
from snapanalyze.collect.testing import FakeClock, FakeCuda


@pytest.fixture
def cuda() -> FakeCuda:
    return FakeCuda()


@pytest.fixture
def log(cuda: FakeCuda) -> Iterator[MarkerLog]:
    log = MarkerLog(rank=3, hooks=cuda.trace_hooks())
    markers.set_active(log)
    yield log
    markers.set_active(None)


def test_times_are_microseconds_since_the_epoch_and_nest(log: MarkerLog) -> None:
    before = time.time_ns() // 1000
    with phase("prefill", tokens=32768, batch=4):
        with request("req-17"):
            time.sleep(0.002)
    after = time.time_ns() // 1000
    outer, inner = log.markers()
    assert (outer.kind, outer.name, inner.kind, inner.name) == ("phase", "prefill", "request", "req-17")
    assert before <= outer.start_time_us <= inner.start_time_us
    assert inner.end_time_us is not None and outer.end_time_us is not None
    assert inner.start_time_us + 2000 <= inner.end_time_us <= outer.end_time_us <= after
    assert (outer.depth, inner.depth) == (0, 1)
    assert json.loads(outer.attrs) == {"batch": 4, "tokens": 32768}
    assert outer.rank == inner.rank == 3 and outer.thread_id == threading.get_native_id()


def test_request_metadata_is_set_then_restored(log: MarkerLog, cuda: FakeCuda) -> None:
    cuda.set_metadata("user-value")
    with request("a"):
        assert cuda.get_metadata() == "req=a"
        with request("b"):
            assert cuda.get_metadata() == "req=b"
        assert cuda.get_metadata() == "req=a"
    assert cuda.get_metadata() == "user-value"


def test_metadata_restores_without_a_getter(cuda: FakeCuda) -> None:
    values: list[str] = []
    log = MarkerLog(0, hooks=TraceHooks(set_metadata=values.append))
    markers.set_active(log)
    try:
        with request("a"):
            with request("b"):
                pass
    finally:
        markers.set_active(None)
    assert values == ["req=a", "req=b", "req=a", ""]


def test_metadata_and_nesting_are_per_thread(log: MarkerLog, cuda: FakeCuda) -> None:
    inside = threading.Barrier(2)
    seen: dict[str, str] = {}

    def worker(req: str) -> None:
        with request(req):
            inside.wait(timeout=5)  # both threads are inside their request at once
            seen[req] = cuda.get_metadata()
            inside.wait(timeout=5)
        seen[req + "-after"] = cuda.get_metadata()

    threads = [threading.Thread(target=worker, args=(r,)) for r in ("r1", "r2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"r1": "req=r1", "r2": "req=r2", "r1-after": "", "r2-after": ""}
    rows = log.markers()
    assert {m.depth for m in rows} == {0}
    assert len({m.thread_id for m in rows}) == 2


def test_phase_annotates_the_trace(log: MarkerLog, cuda: FakeCuda) -> None:
    with phase("decode"):
        pass
    assert [(a["name"], a["stage"]) for a in cuda.annotations] == [("phase:decode", "START"), ("phase:decode", "END")]


def test_open_markers_have_no_end_and_the_table_has_the_schema(log: MarkerLog) -> None:
    with phase("outer"):
        with phase("closed"):
            pass
        table = log.table()
    assert table.column("name").to_pylist() == ["outer", "closed"]
    assert table.column("end_time_us").to_pylist()[0] is None
    assert table.column("end_time_us").to_pylist()[1] is not None
    assert table.schema.metadata[b"kind"] == b"markers"


def test_an_exception_still_closes_the_span(log: MarkerLog, cuda: FakeCuda) -> None:
    with pytest.raises(KeyError):
        with phase("p"), request("r"):
            raise KeyError("boom")
    assert all(m.end_time_us is not None for m in log.markers())
    assert cuda.get_metadata() == ""
    with phase("next"):
        pass
    assert log.markers()[-1].depth == 0


def test_fake_clock_drives_marker_times() -> None:
    log = MarkerLog(0, clock_us=FakeClock(start_us=100, step_us=5))
    markers.set_active(log)
    try:
        with phase("a"):
            with phase("b"):
                pass
    finally:
        markers.set_active(None)
    a, b = log.markers()
    assert (a.start_time_us, b.start_time_us, b.end_time_us, a.end_time_us) == (100, 105, 110, 115)


def test_failing_hooks_warn_once_and_never_break_the_workload() -> None:
    def bad_set(_value: str) -> None:
        raise RuntimeError("no CUDA here")

    def bad_annotate(_label: str) -> object:
        raise RuntimeError("no profiler")

    log = MarkerLog(0, hooks=TraceHooks(annotate=bad_annotate, set_metadata=bad_set))  # type: ignore[arg-type]
    markers.set_active(log)
    try:
        with pytest.warns(CollectorWarning) as caught:
            for _ in range(3):
                with phase("p"), request("r"):
                    pass
    finally:
        markers.set_active(None)
    assert len(caught) == 2  # one per hook
    assert len(log.markers()) == 6


def test_markers_are_no_ops_without_a_recording() -> None:
    assert markers.active() is None
    with phase("p", x=1), request("r"):
        pass
