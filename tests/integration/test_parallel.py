"""Per-rank work on several processes or a Dask cluster: the same bytes out as one rank at a time, a damaged
rank named while the others complete, and dask imported only when --scheduler asks for it."""

from __future__ import annotations

import gc
import importlib
import json
import re
import shutil
import subprocess
import sys
import time
import warnings
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from snapanalyze.cli import main
from snapanalyze.errors import BadInputError, InputWarning
from snapanalyze.load.safe_pickle import Limits, limits_in_effect, limits_now
from snapanalyze.model import Snapshot
from snapanalyze.parallel import bar, map_ranks, open_executor
from snapanalyze.replay import Timeline
from snapanalyze.session import compare_ranks, load_rules, measure_task, open_run, rank_task

RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
FIXTURES = sorted(p for p in RUNS.iterdir() if p.is_dir())
TP2 = RUNS / "tp2_vision_encoder"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five ranks from the run fixtures (one without a `final` snapshot, ranks past meta.json's world size)."""
    root = tmp_path_factory.mktemp("fleet")
    ranks = [TP2 / "rank=0", TP2 / "rank=1", *(p / "rank=0" for p in FIXTURES if p != TP2)]
    for i, src in enumerate(ranks):
        shutil.copytree(src, root / f"rank={i}")
    return root


def _cli(*args: object) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


COMMANDS = {
    "ranks": lambda run: ["ranks", run],
    "ranks-json": lambda run: ["ranks", run, "--format", "json"],
    "peaks": lambda run: ["peaks", run, "--format", "json"],
    "summary": lambda run: ["summary", run],
    "attribute": lambda run: ["attribute", run, "--format", "json"],
    "phases": lambda run: ["phases", run, "--no-categories"],
    "diff": lambda run: ["diff", run, run, "--format", "json"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("run", [*FIXTURES, "fleet"], ids=lambda p: p if isinstance(p, str) else p.name)
def test_jobs_2_gives_the_bytes_of_jobs_1(command: str, run: Path | str, fleet: Path) -> None:
    path = fleet if run == "fleet" else run
    args = COMMANDS[command](path)
    one, two = _cli(*args, "--jobs", "1"), _cli(*args, "--jobs", "2")
    assert one[0] == 0, one[2]
    assert two == one


@pytest.mark.slow
def test_report_and_convert_with_jobs_2_write_what_jobs_1_writes(fleet: Path, tmp_path: Path) -> None:
    pages = []
    for jobs in ("1", "2"):
        out = tmp_path / f"report-{jobs}.html"
        code, _, err = _cli("report", fleet, "-o", out, "--jobs", jobs, "--samples", "4")
        assert code == 0, err
        pages.append(out.read_bytes())
    assert pages[0] == pages[1]
    written = []
    for jobs in ("1", "2"):
        run = shutil.copytree(fleet, tmp_path / f"run-{jobs}")
        code, out, err = _cli("convert", run, "--jobs", jobs)
        assert code == 0, err
        lines = [re.sub(r"[\d.]+ s\)$", "T s)", line).replace(str(run), "RUN") for line in out.splitlines()]
        files = {str(p.relative_to(run)): p.read_bytes().replace(str(run).encode(), b"RUN")
                 for p in sorted(run.rglob("tag=*/*"))}
        written.append((lines, files))
    assert len(written[0][0]) == 5 and written[0][1] and written[0] == written[1]


def test_the_report_of_many_ranks_compares_them_on_the_workers(fleet: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the detailed ranks, the comparison reads every rank on the executor: the same report."""
    import snapanalyze.report.context as context
    from snapanalyze.report.context import ReportOptions, build_path_context

    monkeypatch.setattr(context, "MAX_DETAILED_RANKS", 2)
    monkeypatch.setattr(context.detail_ranks, "__defaults__", (2,))
    here = build_path_context(fleet, options=ReportOptions(samples=4))
    with open_executor(2) as pool:
        there = build_path_context(fleet, options=ReportOptions(samples=4), executor=pool)
    assert here.run is not None and there.run is not None
    pd.testing.assert_frame_equal(here.run.comparison.table, there.run.comparison.table)
    assert [v.rank.rank for v in here.views] == [v.rank.rank for v in there.views] and len(here.views) == 2
    assert here.run.omitted == there.run.omitted and len(here.run.omitted) == 3


@pytest.mark.slow
def test_ranks_on_a_dask_local_cluster_equal_the_local_result(fleet: Path) -> None:
    distributed = pytest.importorskip("distributed")
    local = compare_ranks(fleet)
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) \
            as cluster, distributed.Client(cluster) as client:
        remote = compare_ranks(fleet, executor=client.get_executor())
        assert len({w["host"] + str(w["id"]) for w in client.scheduler_info()["workers"].values()}) == 2
        flags = _cli("ranks", fleet, "--format", "json", "--scheduler", cluster.scheduler_address)
    for name in ("table", "categories", "differences"):
        pd.testing.assert_frame_equal(getattr(local, name), getattr(remote, name))
    assert remote.problems == local.problems and remote.median_rank == local.median_rank
    assert flags == _cli("ranks", fleet, "--format", "json", "--jobs", "1")


SWEEPS = RUNS.parent / "sweeps"
SWEEP_INPUTS = {                                 # --shape-from → the inputs
    "filename": lambda: [str(p) for p in sorted(SWEEPS.glob("attention_threshold/*.pickle"))],
    str(SWEEPS / "chunked_prefill" / "manifest.csv"): lambda: [],
    "markers": lambda: [str(SWEEPS / "phase_markers" / "run")],
}


@pytest.mark.slow
@pytest.mark.parametrize("shape_from", sorted(SWEEP_INPUTS), ids=lambda s: Path(s).name)
def test_capacity_with_jobs_2_gives_the_bytes_of_jobs_1_and_of_one_process(shape_from: str) -> None:
    """Each input of the sweep is measured in a worker; the fit is the same as measuring all in one place."""
    from snapanalyze.analyze.capacity import fit_capacity
    from snapanalyze.analyze.sweep import measure_sweep
    from snapanalyze.session import measure_sweep_inputs, sweep_points

    inputs = SWEEP_INPUTS[shape_from]()
    one, two = (_cli("capacity", *inputs, "--shape-from", shape_from, "--format", "json", "--jobs", jobs)
                for jobs in ("1", "2"))
    assert one[0] == 0, one[2]
    assert two == one and json.loads(one[1])["points"]
    old = measure_sweep(sweep_points(inputs, shape_from))
    with open_executor(2) as pool:
        new = measure_sweep_inputs(inputs, shape_from, executor=pool)
    assert len(new.shapes) == len(old.shapes) > 1
    pd.testing.assert_frame_equal(old.shapes, new.shapes)
    pd.testing.assert_frame_equal(old.categories, new.categories)
    pd.testing.assert_frame_equal(fit_capacity(old).points, fit_capacity(new).points)


@pytest.fixture()
def damaged(fleet: Path, tmp_path: Path) -> Path:
    run = Path(shutil.copytree(fleet, tmp_path / "run"))
    pickle = run / "rank=1" / "snapshot-final.pickle"
    pickle.write_bytes(pickle.read_bytes()[:200])
    return run


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_damaged_rank_is_named_and_the_others_complete(damaged: Path, jobs: str) -> None:
    code, out, err = _cli("ranks", damaged, "--format", "json", "--jobs", jobs)
    assert code == 0, err
    doc = json.loads(out)
    assert [r["rank"] for r in doc["ranks"]] == [0, 2, 3, 4]
    named = [p for p in doc["problems"] if p.startswith("rank 1: ")]
    assert len(named) == 1 and "rank=1/snapshot-final.pickle" in named[0]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_convert_names_the_damaged_rank_after_converting_the_others(damaged: Path, jobs: str) -> None:
    code, out, err = _cli("convert", damaged, "--jobs", jobs)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "1 of 5 not converted" in err and "rank=1/snapshot-final" in err
    assert sorted(p.parent.parent.name for p in damaged.glob("rank=*/tag=*/snapshot.json")) == \
        ["rank=0", "rank=2", "rank=3", "rank=4"]
    assert len(out.splitlines()) == 4


@pytest.mark.parametrize("command", ["peaks", "summary", "attribute", "phases"])
def test_a_run_form_shows_the_other_ranks_then_names_the_damaged_one(damaged: Path, command: str) -> None:
    results = [_cli(command, damaged, "--jobs", jobs) for jobs in ("1", "2")]
    assert [r[1].splitlines() for r in results[1:]] == [results[0][1].splitlines()]      # stdout, line by line
    assert results[0] == results[1]
    code, out, err = results[0]
    assert code == 2 and err.startswith("snapanalyze: error: rank 1: ") and len(err.strip().splitlines()) == 1
    assert [line.split(" (")[0] for line in out.splitlines() if line.startswith("== rank")] == \
        ["== rank 0", "== rank 2", "== rank 3", "== rank 4"]
    assert any(line.startswith("warning: rank 1: ") for line in out.splitlines())
    code, out, _ = _cli(command, damaged, "--format", "json")
    doc = json.loads(out)
    assert code == 2 and [r["rank"] for r in doc["ranks"]] == [0, 2, 3, 4]
    assert [p for p in doc["problems"] if p.startswith("rank 1: ")]


def test_attribute_at_a_phase_some_ranks_lack_shows_the_ranks_that_have_it(fleet: Path) -> None:
    code, out, err = _cli("attribute", fleet, "--phase", "load_model", "--format", "json")
    doc = json.loads(out)
    assert code == 2 and [r["rank"] for r in doc["ranks"]] == [0, 1]
    assert [p.split(":")[0] for p in doc["problems"] if "load_model" in p] == ["rank 2", "rank 3", "rank 4"]
    assert err.startswith("snapanalyze: error: rank 2: ") and len(err.strip().splitlines()) == 1


def test_a_run_whose_every_rank_is_damaged_fails_in_one_line(fleet: Path, tmp_path: Path) -> None:
    run = Path(shutil.copytree(fleet, tmp_path / "run"))
    for pickle in run.glob("rank=*/*.pickle"):
        pickle.write_bytes(pickle.read_bytes()[:200])
    code, out, err = _cli("peaks", run, "--jobs", "2")
    assert code == 2 and out == "" and err.startswith("snapanalyze: error: rank 0: ")
    assert len(err.strip().splitlines()) == 1


def _slow(item: int) -> int:
    time.sleep(0.05 * (3 - item))                  # the first item finishes last
    warnings.warn(f"item {item}", InputWarning, stacklevel=1)
    if item == 1:
        raise BadInputError(f"file{item}", "damaged")
    limits = limits_now()
    return item * 10 + (0 if limits is None else limits.max_memory_bytes or 0)


def _noting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What a command does, in order: "executor" when it opens its executor, "plan" when it chooses a run's
    snapshots or opens the run."""
    import snapanalyze.cli.parallel as cli_parallel
    samples = importlib.import_module("snapanalyze.load.samples")
    import snapanalyze.session as session

    order: list[str] = []

    def noting(name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            order.append(name)
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(cli_parallel, "open_executor", noting("executor", cli_parallel.open_executor))
    monkeypatch.setattr(samples, "choose_snapshots", noting("plan", samples.choose_snapshots))
    monkeypatch.setattr(session, "open_run", noting("plan", session.open_run))
    return order


@pytest.mark.parametrize("command", ["ranks", "attribute"])
def test_a_command_over_several_ranks_opens_its_pool_before_it_plans(command: str, fleet: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # The pool's server then imports snapanalyze while the command plans and imports what it needs itself.
    order = _noting(monkeypatch)
    code, _, _ = _cli(*{"ranks": ["ranks", fleet], "attribute": ["attribute", fleet, "--format", "json"]}[command],
                      "--jobs", "2")
    assert code == 0 and order[0] == "executor" and "plan" in order


def test_a_command_over_one_snapshot_opens_no_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    order = _noting(monkeypatch)
    code, _, _ = _cli("attribute", TP2 / "rank=0" / "snapshot-final.pickle", "--format", "json", "--jobs", "2")
    assert code == 0 and "executor" not in order


def test_map_ranks_keeps_order_warnings_and_limits_and_names_a_failure() -> None:
    seen: list[str] = []
    with ThreadPoolExecutor(3) as pool, limits_in_effect(Limits(max_memory_bytes=5)), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcomes = list(map_ranks(_slow, [0, 1, 2], pool, seen.append))
    assert [o.result for o in outcomes] == [5, None, 25]
    assert outcomes[1].error == "file1: damaged" and outcomes[1].exit_code == 2
    assert [str(w.message) for w in caught] == ["item 0", "item 1", "item 2"]
    assert seen[0] == bar(0, 3) and seen[-1] == bar(3, 3) == "[####################] 3/3 ranks"
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        inline = list(map_ranks(_slow, [0, 1, 2]))
    assert [o.result for o in inline] == [0, None, 20]


class _Tracking(ThreadPoolExecutor):
    """A pool that keeps a weak reference to every future it makes."""

    def __init__(self) -> None:
        super().__init__(2)
        self.made: list[weakref.ref[Future[Any]]] = []

    def submit(self, *args: Any, **kwargs: Any) -> Future[Any]:   # type: ignore[override]
        future = super().submit(*args, **kwargs)
        self.made.append(weakref.ref(future))
        return future


def test_map_ranks_lets_each_future_go_once_its_outcome_is_out() -> None:
    # Dask keeps what a task holds (its arguments) while its future lives: a run over many ranks must not
    # keep every finished rank's future until the last rank is done.
    with _Tracking() as pool:
        outcomes = map_ranks(abs, [-1, -2, -3, -4], pool)
        first = next(outcomes)
        gc.collect()
        assert first.result == 1 and pool.made[0]() is None
        assert [o.result for o in outcomes] == [2, 3, 4]


def test_a_rank_task_never_keeps_the_snapshot_it_measured(fleet: Path) -> None:
    chosen, _ = open_run(fleet, frames="allocations").ranks()
    task = rank_task(chosen[0])
    measure = measure_task(task, load_rules())
    assert measure.rows and measure.rows[0]["rank"] == task.rank
    held = [v for v in vars(task).values() if isinstance(v, (Snapshot, Timeline, tuple))]
    assert held == []                           # only its path, tag, NVML rows and markers


@pytest.mark.slow
def test_plain_commands_never_import_dask() -> None:
    code = ("import sys; from snapanalyze.cli import main\n"
            "try:\n"
            f"    main(['ranks', {str(TP2)!r}, '--jobs', '2'], standalone_mode=False)\n"
            f"    main(['peaks', {str(TP2)!r}], standalone_mode=False)\n"
            "finally:\n"
            "    print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
