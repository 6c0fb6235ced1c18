"""record()/dump(): the files of one rank, their order of events, OOM snapshots and every failure path.

All but the first tests inject fakes through `_Backends` (snapanalyze.collect.testing); the first checks the
real torch CPU build (no CUDA) gives a clear CollectorError and leaves nothing behind.
"""

from __future__ import annotations

import json
import pickle
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from snapanalyze import collect, layout
from snapanalyze.collect import CollectorError, CollectorWarning
from snapanalyze.collect.recorder import RecordOptions
from snapanalyze.collect.testing import EPOCH_2024_US, GIB, FakeClock, FakeCuda, FakeNvml, failing_nvml, fake_backends


@pytest.fixture(autouse=True)
def _no_recording_left() -> Iterator[None]:
    yield
    rec = collect.active()
    if rec is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rec.stop(_exception=RuntimeError("test cleanup"))
        pytest.fail("a test left a recording running")


def _meta(rank_path: Path, name: str = "meta.json") -> dict[str, Any]:
    return json.loads((rank_path / name).read_text())


def test_cpu_build_raises_a_clear_error_and_creates_nothing(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this test needs a torch without CUDA")
    run = tmp_path / "runs" / "prefill"
    with pytest.raises(CollectorError, match="CUDA is not available") as info:
        with collect.record(run):
            pass
    # a CPU build says so; a CUDA build on a machine without a GPU or driver says it sees none
    assert "GPU node" in str(info.value)
    assert ("CPU-only build" if torch.version.cuda is None else "sees no GPU") in str(info.value)
    assert not (tmp_path / "runs").exists()  # decided: a failed start leaves no directory at all
    assert collect.active() is None


def test_missing_torch_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(CollectorError, match=r"pip install 'snapanalyze\[collect\]'"):
        collect.record(tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_recording_writes_every_file_of_its_rank(tmp_path: Path) -> None:
    cuda = FakeCuda(n_devices=2)
    cuda.allocated = {0: 3 * GIB, 1: 1 * GIB}
    cuda.reserved = {0: 4 * GIB, 1: 2 * GIB}
    nvml = FakeNvml(2)
    nvml.used = [10 * GIB, 3 * GIB]
    clock = FakeClock()
    run = tmp_path / "runs" / "prefill-32k"
    with collect.record(run, max_entries=1_000, nvml_interval_ms=1,
                        _backends=fake_backends(cuda, nvml, clock=clock)) as rec:
        assert collect.active() is rec and rec.rank_dir == run / "rank=0"
        with collect.phase("prefill", tokens=32768, batch=4):
            with collect.request("req-17"):
                assert cuda.get_metadata() == "req=req-17"
            assert cuda.get_metadata() == ""
        first = collect.dump("after-prefill")
        assert first == run / "rank=0" / "snapshot-after-prefill.pickle"
    assert collect.active() is None
    rdir = run / "rank=0"

    # allocator history: enabled as asked, the final snapshot taken before it was disabled
    assert cuda.history_args == {"enabled": "all", "context": "all", "stacks": "python", "max_entries": 1_000,
                                 "global_record_annotations": True}
    assert cuda.calls.index("stop_history") > max(i for i, c in enumerate(cuda.calls) if c == "snapshot")
    assert cuda.calls[-1] == "stop_history" and not cuda.history_enabled
    final = pickle.loads((rdir / "snapshot-final.pickle").read_bytes())
    assert final["allocator_settings"]["history_enabled"] is True  # dumped while history was still on
    assert [a["name"] for a in final["external_annotations"]] == ["phase:prefill", "phase:prefill"]

    # markers
    m = pq.read_table(rdir / "markers.parquet").to_pylist()
    assert [(r["kind"], r["name"], r["depth"]) for r in m] == [("phase", "prefill", 0), ("request", "req-17", 1)]
    assert json.loads(m[0]["attrs"]) == {"batch": 4, "tokens": 32768}
    assert EPOCH_2024_US < m[0]["start_time_us"] < m[1]["start_time_us"] < m[1]["end_time_us"] < m[0]["end_time_us"]

    # NVML: at least the rows sampled before the final flush, torch stats at the same instant
    parts = layout.nvml_parts(rdir)
    assert parts and not (rdir / "nvml.parquet").exists()
    rows = [r for p in parts for r in pq.read_table(p).to_pylist()]
    assert {r["device"] for r in rows} == {0, 1}
    r0 = next(r for r in rows if r["device"] == 0)
    assert (r0["used_bytes"], r0["torch_allocated_bytes"], r0["torch_reserved_bytes"]) == (10 * GIB, 3 * GIB, 4 * GIB)
    assert nvml.closed

    # meta.json
    meta = _meta(rdir)
    assert meta["schema_version"] == layout.SCHEMA_VERSION
    assert (meta["rank"], meta["world_size"], meta["rank_source"], meta["host"]) == (0, 1, "default", "fake-host")
    assert meta["snapshots"] == ["snapshot-after-prefill.pickle", "snapshot-final.pickle"]
    assert [d["index"] for d in meta["devices"]] == [0, 1]
    assert meta["devices"][0]["total_memory_bytes"] == 80 * GIB
    assert meta["devices"][1]["nvml_name"] == "Fake GPU 1"
    assert meta["versions"]["driver"] == "999.99"
    assert meta["options"]["stacks"] == "python" and meta["options"]["max_entries"] == 1_000
    assert isinstance(meta["start_time_us"], int) and meta["end_time_us"] > meta["start_time_us"]
    assert meta["nvml"]["enabled"] and meta["nvml"]["rows"] == len(rows)
    assert meta["oom_observer"] is True
    assert not any(layout.is_temporary(p) for p in rdir.iterdir())


def test_nothing_a_user_had_is_overwritten(tmp_path: Path) -> None:
    rdir = layout.rank_dir(tmp_path, 0)
    rdir.mkdir(parents=True)
    (rdir / "snapshot-final.pickle").write_bytes(b"yesterday's final")
    (rdir / "meta.json").write_text('{"from": "yesterday"}')
    (rdir / "markers.parquet").write_bytes(b"yesterday's markers")
    (rdir / layout.nvml_part_name(1)).write_bytes(b"yesterday's samples")
    with collect.record(tmp_path, _backends=fake_backends()):
        collect.dump("x")
        collect.dump("x")
    assert (rdir / "snapshot-final.pickle").read_bytes() == b"yesterday's final"
    assert (rdir / "meta.json").read_text() == '{"from": "yesterday"}'
    assert (rdir / "markers.parquet").read_bytes() == b"yesterday's markers"
    assert (rdir / layout.nvml_part_name(1)).read_bytes() == b"yesterday's samples"
    names = {p.name for p in rdir.iterdir()}
    assert {"snapshot-final-1.pickle", "snapshot-x.pickle", "snapshot-x-1.pickle", "meta-1.json",
            "markers-1.parquet", layout.nvml_part_name(2)} <= names
    meta = _meta(rdir, "meta-1.json")
    assert meta["session"] == 1
    assert meta["snapshots"] == ["snapshot-x.pickle", "snapshot-x-1.pickle", "snapshot-final-1.pickle"]


def test_oom_observer_dumps_before_the_exception_unwinds(tmp_path: Path) -> None:
    cuda = FakeCuda()
    with collect.record(tmp_path, max_oom_snapshots=2, _backends=fake_backends(cuda)) as rec:
        with collect.phase("prefill"):
            cuda.trigger_oom(device=0, alloc=2 * GIB, device_allocated=78 * GIB, device_free=1 * GIB)
            # what the user sees at the moment torch raises: the snapshot and an open phase are on disk
            rdir = rec.rank_dir
            assert rdir is not None and (rdir / "snapshot-oom-1.pickle").exists()
            open_phase = pq.read_table(rdir / "markers.parquet").to_pylist()
            assert open_phase[0]["name"] == "prefill" and open_phase[0]["end_time_us"] is None
            cuda.trigger_oom()
            cuda.trigger_oom()  # over the limit: listed in meta, no snapshot
    assert [p.name for p in layout.snapshot_files(rdir)] == [
        "snapshot-final.pickle", "snapshot-oom-1.pickle", "snapshot-oom-2.pickle"]
    ooms = _meta(rdir)["ooms"]
    assert [o["snapshot"] for o in ooms] == ["snapshot-oom-1.pickle", "snapshot-oom-2.pickle", None]
    assert ooms[0]["alloc_bytes"] == 2 * GIB and ooms[0]["device_free_bytes"] == 1 * GIB
    cuda.trigger_oom()  # after the recording: the observer stays attached in torch but does nothing
    assert len(layout.snapshot_files(rdir)) == 3


def test_a_failing_oom_snapshot_warns_and_never_raises(tmp_path: Path) -> None:
    cuda = FakeCuda()
    rec = collect.record(tmp_path, _backends=fake_backends(cuda))
    cuda.fail_snapshot = True
    with pytest.warns(CollectorWarning, match="OOM snapshot failed"):
        cuda.trigger_oom()  # must not raise: it would replace the user's OutOfMemoryError
    cuda.fail_snapshot = False
    rec.stop()
    assert [p.name for p in layout.snapshot_files(tmp_path / "rank=0")] == ["snapshot-final.pickle"]


def test_oom_snapshot_can_be_turned_off(tmp_path: Path) -> None:
    cuda = FakeCuda()
    with collect.record(tmp_path, oom_snapshot=False, _backends=fake_backends(cuda)):
        cuda.trigger_oom()
    assert "attach_oom_observer" not in cuda.calls
    assert [p.name for p in layout.snapshot_files(tmp_path / "rank=0")] == ["snapshot-final.pickle"]


def test_torch_without_an_oom_observer_warns(tmp_path: Path) -> None:
    with pytest.warns(CollectorWarning, match="cannot observe CUDA OOMs"):
        with collect.record(tmp_path, _backends=fake_backends(FakeCuda(has_oom_observer=False))):
            pass
    assert _meta(tmp_path / "rank=0")["oom_observer"] is False


def test_nvml_optional_warns_and_writes_no_nvml_file(tmp_path: Path) -> None:
    with pytest.warns(CollectorWarning, match="without NVML samples.*no driver"):
        with collect.record(tmp_path, nvml="optional", _backends=fake_backends(nvml_factory=failing_nvml())):
            collect.dump("mid")
    rdir = tmp_path / "rank=0"
    assert layout.nvml_parts(rdir) == [] and not (rdir / "nvml.parquet").exists()
    meta = _meta(rdir)
    assert meta["nvml"]["enabled"] is False and "no driver" in meta["nvml"]["reason"]
    assert meta["versions"]["driver"] is None
    assert (rdir / "snapshot-final.pickle").exists()


def test_nvml_required_fails_before_creating_anything(tmp_path: Path) -> None:
    cuda = FakeCuda()
    with pytest.raises(CollectorError, match="no driver.*nvml='optional'"):
        collect.record(tmp_path / "run", nvml="required", _backends=fake_backends(cuda, nvml_factory=failing_nvml()))
    assert not (tmp_path / "run").exists() and cuda.calls == []


def test_nvml_off_samples_nothing(tmp_path: Path) -> None:
    nvml = FakeNvml()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with collect.record(tmp_path, nvml="off", _backends=fake_backends(nvml=nvml)):
            pass
    assert nvml.reads == 0 and layout.nvml_parts(tmp_path / "rank=0") == []


def test_the_body_raising_still_dumps_final_and_propagates(tmp_path: Path) -> None:
    cuda = FakeCuda()
    with pytest.raises(ZeroDivisionError):
        with collect.record(tmp_path, _backends=fake_backends(cuda)):
            with collect.phase("doomed"):
                1 / 0  # noqa: B018
    assert (tmp_path / "rank=0" / "snapshot-final.pickle").exists()
    assert not cuda.history_enabled and collect.active() is None
    (row,) = pq.read_table(tmp_path / "rank=0" / "markers.parquet").to_pylist()
    assert row["end_time_us"] is not None


def test_a_failed_final_dump_is_an_error_after_a_clean_body(tmp_path: Path) -> None:
    cuda = FakeCuda()
    rec = collect.record(tmp_path, _backends=fake_backends(cuda))
    cuda.fail_snapshot = True
    with pytest.raises(CollectorError, match="final snapshot failed"):
        rec.stop()
    assert not cuda.history_enabled and collect.active() is None  # stopped anyway
    assert _meta(tmp_path / "rank=0")["end_time_us"] is not None


def test_a_failed_final_dump_only_warns_while_the_body_raises(tmp_path: Path) -> None:
    cuda = FakeCuda()
    with pytest.warns(CollectorWarning, match="final snapshot failed"), pytest.raises(KeyError):
        with collect.record(tmp_path, _backends=fake_backends(cuda)):
            cuda.fail_snapshot = True
            raise KeyError("the user's error wins")


def test_dump_needs_a_recording_and_a_safe_tag(tmp_path: Path) -> None:
    with pytest.raises(CollectorError, match="needs an active"):
        collect.dump("x")
    with collect.record(tmp_path, _backends=fake_backends()) as rec:
        with pytest.raises(ValueError, match="tag"):
            collect.dump("../../etc/passwd")
    with pytest.raises(CollectorError, match="not running"):
        rec.dump("late")
    rec.stop()  # idempotent


def test_one_recording_per_process(tmp_path: Path) -> None:
    with collect.record(tmp_path / "a", _backends=fake_backends()):
        with pytest.raises(CollectorError, match="already active"):
            collect.record(tmp_path / "b", _backends=fake_backends())
    assert not (tmp_path / "b").exists()
    with collect.record(tmp_path / "c", _backends=fake_backends()):  # free again afterwards
        pass


def test_rank_comes_from_distributed_then_env(tmp_path: Path) -> None:
    with collect.record(tmp_path, _backends=fake_backends(env={"RANK": "2", "WORLD_SIZE": "4"})) as rec:
        pass
    assert rec.rank_dir == tmp_path / "rank=2" and _meta(rec.rank_dir)["world_size"] == 4
    cuda = FakeCuda(dist=(5, 8))
    with collect.record(tmp_path, _backends=fake_backends(cuda, env={"RANK": "2"})) as rec:
        pass
    assert rec.rank_dir == tmp_path / "rank=5" and _meta(rec.rank_dir)["rank_source"] == "torch.distributed"


def test_ranks_of_one_run_read_back_as_one_dataset(tmp_path: Path) -> None:
    for rank in (0, 1):
        with collect.record(tmp_path, _backends=fake_backends(env={"RANK": str(rank), "WORLD_SIZE": "2"})):
            with collect.phase("step", rank=rank):
                pass
    markers = layout.dataset(tmp_path, "markers").to_table()
    nvml = layout.dataset(tmp_path, "nvml").to_table()
    assert sorted(markers.column("rank").to_pylist()) == [0, 1]
    assert set(nvml.column("rank").to_pylist()) == {0, 1}


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="stacks"):
        RecordOptions(stacks="cpp")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nvml"):
        RecordOptions(nvml="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_entries"):
        RecordOptions(max_entries=0)


def test_start_failure_after_mkdir_leaves_no_directory(tmp_path: Path) -> None:
    class BrokenHistory(FakeCuda):
        def start_history(self, **kw: object) -> dict[str, object]:
            raise CollectorError("enabling allocator history failed: fake")

    nvml = FakeNvml()
    with pytest.raises(CollectorError, match="allocator history"):
        collect.record(tmp_path / "run", _backends=fake_backends(BrokenHistory(), nvml))
    assert not (tmp_path / "run").exists() and nvml.closed and collect.active() is None


def test_late_start_failure_removes_what_it_wrote(tmp_path: Path) -> None:
    class BrokenObserver(FakeCuda):
        def attach_oom_observer(self, fn: object) -> bool:
            import time

            time.sleep(0.05)  # the sampler has flushed a part or two by now
            raise RuntimeError("fake torch failure")

    cuda = BrokenObserver()
    with pytest.raises(CollectorError, match="starting the recording.*fake torch failure"):
        collect.record(tmp_path / "run", nvml_interval_ms=1, nvml_flush_rows=1, _backends=fake_backends(cuda))
    assert not (tmp_path / "run").exists()
    assert not cuda.history_enabled and collect.active() is None
