"""collect.sweep: a workload run at each shape inside one recording, one shaped phase per shape, written
where `capacity` and `budget` read a sweep (--shape-from markers); bad shapes refused before recording."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapanalyze import collect
from snapanalyze.collect.testing import FakeCuda, fake_backends
from snapanalyze.errors import CollectorError
from snapanalyze.load.samples import read_run


def test_each_shape_runs_in_its_phase_and_the_run_reads_back(tmp_path: Path) -> None:
    cuda = FakeCuda()
    seen: list[dict[str, int]] = []
    settled: list[int] = []

    def step(**shape: int) -> None:
        seen.append(shape)
        assert cuda.history_enabled                    # inside the recording

    shapes = [{"tokens": 2048}, {"tokens": 4096, "batch": 2}, {"chunk": 8192, "tokens": 16384}]
    rank_dir = collect.sweep(tmp_path / "run", shapes, step, between=lambda: settled.append(len(seen)),
                             nvml="off", _backends=fake_backends(cuda))
    assert rank_dir == tmp_path / "run" / "rank=0"
    assert seen == shapes and settled == [1, 2, 3]
    assert (rank_dir / "snapshot-final.pickle").is_file() and collect.active() is None
    markers = read_run(tmp_path / "run").markers
    phases = markers[markers["kind"] == "phase"]
    assert list(phases["name"]) == ["prefill"] * 3
    assert [dict(a) for a in phases["attrs"]] == shapes
    assert (phases["end_time_us"] >= phases["start_time_us"]).all()


@pytest.mark.parametrize(("shapes", "message"), [
    ([], "at least one shape"),
    ([{}], "non-empty mapping"),
    ([{"tokens": 8192, "prompt": 3}], "shape 0 has prompt"),
    ([{"tokens": 0}], "tokens must be positive integers"),
    ([{"tokens": 8192}, {"batch": True}], "shape 1: batch must be positive integers"),
])
def test_bad_shapes_are_refused_before_anything_is_recorded(tmp_path: Path, shapes: list, message: str) -> None:
    with pytest.raises(CollectorError, match=message):
        collect.sweep(tmp_path / "run", shapes, lambda **_: None, _backends=fake_backends(FakeCuda()))
    assert not (tmp_path / "run").exists()


def test_a_failing_step_stops_the_recording_and_propagates(tmp_path: Path) -> None:
    def step(**shape: int) -> None:
        if shape["tokens"] > 4096:
            raise RuntimeError("CUDA out of memory (fake)")

    with pytest.raises(RuntimeError, match="out of memory"):
        collect.sweep(tmp_path / "run", [{"tokens": 4096}, {"tokens": 8192}], step, nvml="off",
                      _backends=fake_backends(FakeCuda()))
    assert collect.active() is None
    assert (tmp_path / "run" / "rank=0" / "snapshot-final.pickle").is_file()
