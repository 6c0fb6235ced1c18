"""`--jobs N` and `--scheduler ADDRESS`: where the commands over several ranks or snapshots run their per-rank work.

Contract: `parallel_options` adds both options to a command and keeps them out of its arguments; the command
(or `per_rank.each`) asks `executor()` for the executor they name, built on first use — or as soon as the
command knows it has several inputs (`start_early`) — and shut down when the command ends
(`parallel.open_executor`: None for --jobs 1, a process pool of N workers — default: the number of cores,
or $SNAPANALYZE_JOBS — or a Dask cluster's executor for --scheduler, dask imported only
then). Output never depends on them: results merge in rank order. `map_jobs(jobs, work, progress)` is
`per_rank.each`'s engine: one job runs here with its steps shown; several run through `parallel.map_ranks`
(in this process with their steps shown, or on the executor with a bar counting ranks); the ranks that
failed on their input are returned with their errors beside the others' results.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..parallel import map_ranks, open_executor
from .progress import Progress, rank_step

if TYPE_CHECKING:
    from .per_rank import Job

T = TypeVar("T")
KEY = "snapanalyze.parallel"           # ctx.meta: the _Choice of this command


class _Choice:
    """--jobs / --scheduler as given, and the executor once built."""

    def __init__(self, jobs: int | None, scheduler: str | None, ctx: click.Context) -> None:
        self.jobs, self.scheduler, self.ctx = jobs, scheduler, ctx
        self.built = False
        self.executor: Executor | None = None

    def get(self) -> Executor | None:
        if not self.built:
            self.executor = self.ctx.with_resource(open_executor(self.jobs, self.scheduler))
            self.built = True
        return self.executor


def parallel_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add --jobs and --scheduler to a command (see the module docstring); put it just above the `def`."""

    @functools.wraps(func)
    def command(*args: Any, jobs: int | None, scheduler: str | None, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        ctx.meta[KEY] = _Choice(jobs, scheduler, ctx)
        return func(*args, **kwargs)

    command = click.option(
        "--scheduler", metavar="ADDRESS", default=None,
        help="Run the per-rank work on the Dask cluster whose scheduler is at ADDRESS (e.g. tcp://host:8786); "
             "needs `pip install 'snapanalyze[dask]'` here and snapanalyze on the workers. Overrides --jobs.")(command)
    command = click.option(
        "-j", "--jobs", type=click.IntRange(1), default=None, envvar="SNAPANALYZE_JOBS", show_envvar=True,
        help="Ranks (or files) analysed at once, each in its own process (default: the number of cores). The "
             "output is the same for any N.")(command)
    return command


def executor() -> Executor | None:
    """The executor of the running command's --jobs / --scheduler (None: work here, one rank at a time)."""
    ctx = click.get_current_context(silent=True)
    choice = ctx.meta.get(KEY) if ctx is not None else None
    return choice.get() if choice is not None else None


def start_early(count: int) -> None:
    """The running command will work over `count` ranks or files: with two or more, build its executor now,
    so that a process pool's server imports snapanalyze while this process goes on planning and importing
    what it needs itself, instead of after (`ranks` over 32 ranks, --jobs 2 on 2 cores: 6.4 → 5.6 s)."""
    if count > 1:
        executor()


def _quiet(work: Callable[[Job, Callable[[str], None]], T], job: Job) -> T:
    """`work(job, step)` in a worker, whose steps nobody sees."""
    return work(job, _silent)


def _silent(_: str) -> None:
    return None


def map_jobs(jobs: Sequence[Job], work: Callable[[Job, Callable[[str], None]], T], progress: Progress,
             ) -> tuple[list[tuple[Job, T]], list[tuple[Job, str, int]]]:
    """Each job that succeeded with its result, and each that failed on its input with its error and exit
    code, both in order (see the module docstring). One job's failure is raised as it is."""
    if len(jobs) < 2:
        return [(j, work(j, rank_step(progress.step, j.rank))) for j in jobs], []
    pool = executor()
    if pool is None:
        outcomes = map_ranks(lambda j: work(j, rank_step(progress.step, j.rank)), jobs)
    else:
        outcomes = map_ranks(functools.partial(_quiet, work), jobs, pool, progress.step)
    pairs = list(zip(jobs, outcomes))
    done = [(job, outcome.result) for job, outcome in pairs if outcome.ok]
    failed = [(job, str(outcome.error), outcome.exit_code) for job, outcome in pairs if not outcome.ok]
    return done, failed  # type: ignore[return-value]
