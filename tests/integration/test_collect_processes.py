"""Cross-process behaviour: two ranks writing one run, a writer killed with SIGKILL, import isolation."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from snapanalyze import layout

RANK_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from snapanalyze import collect
    from snapanalyze.collect.testing import FakeCuda, FakeNvml, fake_backends

    rank = int(os.environ["RANK"])
    backends = fake_backends(FakeCuda(n_devices=1), FakeNvml(1), env=os.environ, host=f"node{rank}")
    with collect.record(sys.argv[1], nvml_interval_ms=1, _backends=backends):
        for step in range(3):
            with collect.phase("step", step=step, rank=rank):
                with collect.request(f"req-{rank}-{step}"):
                    pass
        collect.dump("mid")
    """
)

KILL_SCRIPT = textwrap.dedent(
    """
    import sys
    from snapanalyze import collect
    from snapanalyze.collect.testing import FakeCuda, FakeNvml, fake_backends

    class BigCuda(FakeCuda):  # a snapshot big enough that the kill often lands inside a write
        def snapshot(self):
            s = super().snapshot()
            s["segments"] = [{"pad": "x" * 1000, "i": i} for i in range(3000)]
            return s

    rec = collect.record(sys.argv[1], nvml_interval_ms=0.2, nvml_flush_rows=40,
                         _backends=fake_backends(BigCuda(), FakeNvml(4), env={"RANK": "0"}))
    step = 0
    while True:
        with collect.phase("step", step=step):
            collect.dump(f"step-{step % 3}")
        step += 1
    """
)


def _run_rank(run: Path, rank: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)}
    return subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(run)], env=env, stderr=subprocess.PIPE)


def test_two_ranks_write_one_hive_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    procs = [_run_rank(run, r) for r in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err.decode()
    assert list(layout.rank_dirs(run)) == [0, 1]
    for rank, rdir in layout.rank_dirs(run).items():
        meta = json.loads((rdir / "meta.json").read_text())
        assert (meta["rank"], meta["world_size"], meta["local_rank"], meta["host"]) == (rank, 2, rank, f"node{rank}")
        assert [p.name for p in layout.snapshot_files(rdir)] == ["snapshot-final.pickle", "snapshot-mid.pickle"]

    # every rank at once, the rank coming from the rank=N directories
    marker_files = [str(p) for p in layout.rank_files(run, "markers")]
    markers = ds.dataset(marker_files, partitioning="hive", partition_base_dir=str(run)).to_table()
    assert markers.num_rows == 12
    assert sorted(set(markers.column("rank").to_pylist())) == [0, 1]
    names = set(zip(markers.column("rank").to_pylist(), markers.column("name").to_pylist(), strict=True))
    assert (1, "req-1-2") in names and (0, "req-0-0") in names
    nvml = layout.dataset(run, "nvml").to_table()
    assert "rank" in nvml.schema.names and set(nvml.column("rank").to_pylist()) == {0, 1}
    assert pq.read_schema(layout.rank_files(run, "nvml")[0]).metadata[b"schema_version"] == b"1"


@pytest.mark.parametrize("delay_s", [0.0, 0.013, 0.037])
def test_a_killed_writer_leaves_earlier_files_readable(tmp_path: Path, delay_s: float) -> None:
    run = tmp_path / "run"
    rdir = layout.rank_dir(run, 0)
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(run)], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"writer exited early: {proc.stderr.read().decode()}")  # type: ignore[union-attr]
            if len(layout.nvml_parts(rdir)) >= 5 and len(layout.snapshot_files(rdir)) >= 3:
                break
            time.sleep(0.01)
        else:
            pytest.fail("writer made no progress")
        time.sleep(delay_s)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL

    # every visible file is complete; in-progress writes are dot-named and skipped by readers
    parts = layout.nvml_parts(rdir)
    assert len(parts) >= 5
    rows = sum(pq.read_table(p).num_rows for p in parts)
    assert layout.dataset(run, "nvml").count_rows() == rows > 0
    assert pq.read_table(rdir / "markers.parquet").num_rows >= 1
    json.loads((rdir / "meta.json").read_text())
    for snap in layout.snapshot_files(rdir):
        assert len(pickle.loads(snap.read_bytes())["segments"]) == 3000
    leftovers = [p for p in rdir.iterdir() if layout.is_temporary(p)]
    assert all(p.name.endswith(".tmp") for p in leftovers)


def test_importing_snapanalyze_imports_neither_torch_nor_pynvml() -> None:
    code = (
        "import sys, snapanalyze, snapanalyze.collect, snapanalyze.collect.testing\n"
        "from snapanalyze import collect\n"
        "collect.phase, collect.request, collect.record\n"
        "bad = sorted(m for m in ('torch', 'pynvml') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
