"""NVML sampler against a fake backend and a fake clock; the real backend's failures."""

from __future__ import annotations

import sys
import threading
import time
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from snapanalyze import layout
from snapanalyze.collect import CollectorError, CollectorWarning, nvml
from snapanalyze.collect.nvml import NvmlSampler, split_processes
from snapanalyze.collect.testing import GIB, FakeClock, FakeNvml
from snapanalyze.schema import NVML_SCHEMA

PID = 4242


def _sampler(tmp_path: Path, backend: FakeNvml, **kw: object) -> NvmlSampler:
    kw.setdefault("clock_us", FakeClock(start_us=1_000_000, step_us=10))
    kw.setdefault("pid", PID)
    return NvmlSampler(backend, tmp_path, **kw)  # type: ignore[arg-type]


def test_fake_backend_is_an_nvml_backend() -> None:
    assert isinstance(FakeNvml(), nvml.NvmlBackend)


def test_rows_per_device_with_process_split_and_torch_stats(tmp_path: Path) -> None:
    fake = FakeNvml(2, total_bytes=80 * GIB, pid=PID)
    fake.used = [30 * GIB, 5 * GIB]
    fake.procs = [[(PID, 20 * GIB), (7, 6 * GIB), (8, 1 * GIB)], [(PID, 4 * GIB)]]
    stats = {0: (10 * GIB, 12 * GIB), 1: (1 * GIB, 2 * GIB)}
    s = _sampler(tmp_path, fake, allocator_stats=lambda d: stats[d])
    rows = s.sample_once()
    assert [r.device for r in rows] == [0, 1]
    r0, r1 = rows
    assert r0.time_us == 1_000_000 and r1.time_us == 1_000_010
    assert (r0.used_bytes, r0.free_bytes, r0.total_bytes) == (30 * GIB, 50 * GIB, 80 * GIB)
    assert (r0.process_used_bytes, r0.other_processes_used_bytes) == (20 * GIB, 7 * GIB)
    assert (r0.torch_allocated_bytes, r0.torch_reserved_bytes) == (10 * GIB, 12 * GIB)
    assert (r1.process_used_bytes, r1.other_processes_used_bytes) == (4 * GIB, 0)
    path = s.flush()
    assert path is not None and path.name == "nvml-part-00001.parquet"
    table = pq.read_table(path)
    assert table.schema.equals(NVML_SCHEMA, check_metadata=True)
    assert table.column("process_used_bytes").to_pylist() == [20 * GIB, 4 * GIB]
    assert table.schema.metadata[b"schema_version"] == b"1"


@pytest.mark.parametrize(
    ("procs", "expected"),
    [
        (None, (None, None)),                           # NVML cannot list processes
        ([(1, 5), (2, 6)], (None, None)),               # our pid not visible (container): others unknown too
        ([(PID, None), (2, 6)], (None, None)),          # our usage not reported
        ([(PID, 3), (2, None)], (3, None)),             # another process's usage not reported
        ([(PID, 3), (PID, 4), (9, 1)], (7, 1)),         # two contexts of ours
    ],
)
def test_process_split_says_unknown_rather_than_guessing(procs: object, expected: tuple[object, object]) -> None:
    assert split_processes(procs, PID) == expected  # type: ignore[arg-type]


def test_allocator_stats_failure_leaves_nulls(tmp_path: Path) -> None:
    def broken(_d: int) -> tuple[int, int]:
        raise RuntimeError("no CUDA")

    row = _sampler(tmp_path, FakeNvml(pid=PID), allocator_stats=broken).sample_once()[0]
    assert row.torch_allocated_bytes is None and row.torch_reserved_bytes is None


def test_flush_batches_into_numbered_atomic_parts(tmp_path: Path) -> None:
    s = _sampler(tmp_path, FakeNvml(2, pid=PID))
    for _ in range(3):
        s.sample_once()
    first = s.flush()
    assert s.flush() is None  # nothing buffered: no empty part
    s.sample_once()
    second = s.flush()
    assert [p.name for p in layout.nvml_parts(tmp_path)] == [first.name, second.name]  # type: ignore[union-attr]
    assert [pq.read_table(p).num_rows for p in layout.nvml_parts(tmp_path)] == [6, 2]
    assert s.rows_written == 8 and s.parts == [first, second]
    assert all(not layout.is_temporary(p) for p in tmp_path.iterdir())
    times = pq.read_table(second).column("time_us").to_pylist()  # type: ignore[arg-type]
    assert times == sorted(times)


def test_numbering_continues_after_existing_parts(tmp_path: Path) -> None:
    (tmp_path / layout.nvml_part_name(7)).write_bytes(b"from an earlier recording")
    s = _sampler(tmp_path, FakeNvml(pid=PID))
    s.sample_once()
    assert s.flush().name == "nvml-part-00008.parquet"  # type: ignore[union-attr]
    assert (tmp_path / layout.nvml_part_name(7)).read_bytes() == b"from an earlier recording"


def test_buffer_is_bounded_and_drops_are_counted(tmp_path: Path) -> None:
    s = _sampler(tmp_path, FakeNvml(pid=PID), flush_rows=2, max_buffer_rows=5)
    first_times = [s.sample_once()[0].time_us for _ in range(8)]
    assert s.buffered_rows == 5 and s.dropped_rows == 3
    s.flush()
    kept = pq.read_table(layout.nvml_parts(tmp_path)[0]).column("time_us").to_pylist()
    assert kept == first_times[3:]  # the oldest rows went


def test_failed_flush_keeps_rows_for_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = _sampler(tmp_path, FakeNvml(pid=PID))
    s.sample_once()
    real = nvml.schemas.write_new_table

    def disk_full(*a: object, **k: object) -> Path:
        raise OSError("No space left on device")

    monkeypatch.setattr(nvml.schemas, "write_new_table", disk_full)
    with pytest.raises(OSError):
        s.flush()
    assert s.buffered_rows == 1 and layout.nvml_parts(tmp_path) == []
    monkeypatch.setattr(nvml.schemas, "write_new_table", real)
    s.sample_once()
    s.flush()
    assert pq.read_table(layout.nvml_parts(tmp_path)[0]).num_rows == 2


def test_thread_samples_flushes_and_stop_joins(tmp_path: Path) -> None:
    fake = FakeNvml(2, pid=PID)
    s = NvmlSampler(fake, tmp_path, interval_ms=1, flush_rows=10, flush_interval_s=60, pid=PID).start()
    deadline = time.monotonic() + 10
    while len(layout.nvml_parts(tmp_path)) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(layout.nvml_parts(tmp_path)) >= 2  # flushed in batches while running
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.stop()
    assert not s.running
    assert not any(t.name == "snapanalyze-nvml" and t.is_alive() for t in threading.enumerate())
    total = sum(pq.read_table(p).num_rows for p in layout.nvml_parts(tmp_path))
    assert total == s.rows_written == fake.reads  # stop() flushed the rest: nothing sampled is lost
    assert s.buffered_rows == 0 and s.error is None


def test_thread_survives_backend_errors_then_reports_them(tmp_path: Path) -> None:
    fake = FakeNvml(pid=PID)
    fake.fail_reads = True
    s = NvmlSampler(fake, tmp_path, interval_ms=1, max_consecutive_errors=3, pid=PID).start()
    deadline = time.monotonic() + 10
    while s.running and time.monotonic() < deadline:
        time.sleep(0.005)
    with pytest.warns(CollectorWarning, match="NVML sampling stopped early"):
        s.stop()
    assert isinstance(s.error, RuntimeError)


def test_sampler_rejects_bad_settings(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        NvmlSampler(FakeNvml(), tmp_path, interval_ms=0)
    with pytest.raises(ValueError):
        NvmlSampler(FakeNvml(), tmp_path, flush_rows=0)


def test_nvml_init_failure_is_a_collector_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pynvml = pytest.importorskip("pynvml")

    def no_driver() -> None:
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    with pytest.raises(CollectorError, match="NVML could not start.*NVIDIA driver"):
        nvml.open_nvml()


def test_missing_pynvml_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(CollectorError, match=r"pip install 'snapanalyze\[collect\]'"):
        nvml.open_nvml()


class _Handle:
    def __init__(self, i: int) -> None:
        self.i = i


class _FakePynvml:
    """Just enough of the pynvml module to check the real backend's mapping and conversions."""

    class NVMLError(Exception):
        pass

    def __init__(self, uuids: list[str]) -> None:
        self.uuids = uuids
        self.shutdowns = 0

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
    def nvmlDeviceGetCount(self) -> int:
        return len(self.uuids)
    def nvmlDeviceGetHandleByIndex(self, i: int) -> _Handle:
        return _Handle(i)
    def nvmlDeviceGetUUID(self, h: _Handle) -> bytes:
        return self.uuids[h.i].encode()
    def nvmlDeviceGetMemoryInfo(self, h: _Handle) -> object:
        return type("M", (), {"used": 10 + h.i, "free": 90 - h.i, "total": 100})()
    def nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[object]:
        return [type("P", (), {"pid": 1, "usedGpuMemory": 5})(), type("P", (), {"pid": 2, "usedGpuMemory": None})()]
    def nvmlDeviceGetName(self, h: _Handle) -> str:
        return f"GPU {h.i}"
    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54"


def test_real_backend_maps_cuda_order_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakePynvml(["GPU-aaaa", "GPU-bbbb", "GPU-cccc"])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    backend = nvml.open_nvml(["cccc", "aaaa"])  # torch's uuids lack the GPU- prefix; CUDA order differs
    assert backend.device_count() == 2
    assert backend.memory(0) == (12, 88, 100) and backend.name(1) == "GPU 0"
    assert backend.processes(0) == [(1, 5), (2, None)]
    assert backend.driver_version() == "550.54"
    backend.close()
    assert fake.shutdowns == 1


def test_real_backend_falls_back_to_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _FakePynvml(["GPU-a", "GPU-b", "GPU-c"]))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    with pytest.warns(CollectorWarning, match="do not match"):
        backend = nvml.open_nvml(["MIG-zzz", None])
    assert [backend.name(i) for i in range(backend.device_count())] == ["GPU 2", "GPU 0"]


def test_no_gpu_is_a_collector_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakePynvml([])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with pytest.raises(CollectorError, match="no GPU"):
        nvml.open_nvml()
    assert fake.shutdowns == 1
