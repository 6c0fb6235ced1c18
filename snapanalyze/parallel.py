"""Per-rank work mapped over an executor: in rank order, a damaged rank reported, never the run lost.

Contract: `map_ranks(fn, items, executor, progress)` calls `fn(item)` once per item — in this process when
`executor` is None or there are fewer than two items, else on `executor`, any `concurrent.futures.Executor`
(a process pool, a Dask client's ``get_executor()``, Ray's) — and yields one `Outcome` per item, in the
items' order, as soon as it and every item before it are done (so output can stream and is the same whatever
the executor). A failure a user's input causes (SnapanalyzeError, MemoryError, RecursionError: a damaged or
hostile snapshot) is that item's `Outcome.error`, a one-line message, and the other items still complete;
any other exception is a bug and propagates. On an executor, `fn` must be a module-level function (or a
`functools.partial` of one) whose arguments and result pickle, and should return a small result (tables,
downsampled curves), never a Snapshot, nor keep what it loads on its arguments (Dask keeps a task's
arguments until its future goes; each future is dropped as soon as its outcome is taken): each worker then
holds one rank's snapshot at a time. The worker runs
under the caller's input limits (`load.safe_pickle.limits_now`, the CLI's --max-memory), and the
InputWarnings it raises come back with its outcome and are raised again here, in item order, so the CLI
prints and lists them as if the work had run here. `progress(text)` hears "[####----] k/n ranks" as items
finish. `open_executor(jobs, scheduler)` is the executor the CLI's --jobs / --scheduler name, as a context
manager: None for one job, a process pool of `jobs` workers (forkserver: a clean process, never a fork of
one with threads; the server starts, and imports snapanalyze, as the pool opens, not at its first task), or
the executor of a `distributed.Client(scheduler)` — dask is imported only then.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from multiprocessing import forkserver
from typing import Any, Generic, TypeVar

from .errors import InputWarning, SnapanalyzeError, UsageError
from .load.safe_pickle import Limits, limits_in_effect, limits_now

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741
BAR = 20                          # characters of the progress bar
DASK_HINT = "pip install 'snapanalyze[dask]'"


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """One item's result, or the one-line message of the input error it met (`exit_code` its CLI code)."""

    result: T | None
    error: str | None = None
    exit_code: int = 0
    warnings: tuple[tuple[type[Warning], str], ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None


def default_jobs() -> int:
    """The cores this process may run on (the --jobs default)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                     # not on Linux
        return max(1, os.cpu_count() or 1)


def _run(fn: Callable[[Any], T], limits: Limits | None, item: Any) -> Outcome[T]:
    """`fn(item)` as an Outcome, with its InputWarnings kept (runs in the worker)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", InputWarning)
        try:
            with limits_in_effect(limits) if limits is not None else nullcontext():
                result = fn(item)
            error, code = None, 0
        except (SnapanalyzeError, MemoryError, RecursionError) as exc:
            result, code = None, getattr(exc, "exit_code", 2)
            error = str(exc) or type(exc).__name__
            if isinstance(exc, MemoryError):
                error = "ran out of memory analysing it (--max-memory refuses such inputs early)"
            elif isinstance(exc, RecursionError):
                error = "it nests deeper than any snapshot does (refused)"
    kept = tuple((w.category, str(w.message)) for w in caught if issubclass(w.category, InputWarning))
    return Outcome(result, error, code, kept)


def bar(done: int, total: int, unit: str = "ranks") -> str:
    """The progress text of `done` of `total` items."""
    filled = BAR * done // total if total else BAR
    return f"[{'#' * filled}{'-' * (BAR - filled)}] {done}/{total} {unit}"


def map_ranks(fn: Callable[[I], T], items: Iterable[I], executor: Executor | None = None,
              progress: Callable[[str], None] | None = None, unit: str = "ranks") -> Iterator[Outcome[T]]:
    """One Outcome per item, in order (see the module docstring)."""
    items = list(items)
    limits = limits_now()
    say = progress or (lambda _: None)
    if executor is None or len(items) < 2:
        for i, item in enumerate(items):
            say(bar(i, len(items), unit))
            outcome = _run(fn, limits, item)
            _warn(outcome)
            yield outcome
        say(bar(len(items), len(items), unit))
        return
    # Each future is dropped as soon as its outcome is taken (as_completed drops its own), so an executor that
    # keeps what a task holds until its future goes (Dask keeps the task's arguments) lets it go then.
    where: dict[Future[Outcome[T]], int] = {executor.submit(_run, fn, limits, item): i for i, item in enumerate(items)}
    finished: dict[int, Outcome[T]] = {}
    following = 0
    say(bar(0, len(items), unit))
    try:
        for future in as_completed(where):          # no enumerate: its reused tuple would keep the last one
            finished[where.pop(future)] = _result(future)
            del future
            say(bar(len(items) - len(where), len(items), unit))
            while following in finished:
                outcome = finished.pop(following)
                _warn(outcome)
                yield outcome
                following += 1
    finally:
        for f in where:                      # those not finished
            f.cancel()


def _result(future: Future[Outcome[T]]) -> Outcome[T]:
    try:
        return future.result()
    except BrokenProcessPool as exc:
        raise SnapanalyzeError(_died(exc)) from None


def _died(exc: BrokenProcessPool) -> str:
    """Why a worker died, as far as its exit says: killed by a signal (SIGKILL: most often the kernel's
    out-of-memory killer) or exited with an error it printed above."""
    text = str(exc)
    if "SIGKILL" in text or "terminated abruptly" in text and "signal 9" in text:
        return ("a worker process was killed (SIGKILL: most often for memory): run with fewer --jobs, or "
                "--max-memory to refuse an input too large for this machine")
    return (f"a worker process died ({text[:200] or 'no reason given'}); its own error, if it printed one, is "
            "above: run with --jobs 1 to see it in this process")


def _warn(outcome: Outcome[Any]) -> None:
    for category, message in outcome.warnings:
        warnings.warn(message, category, stacklevel=3)


@contextmanager
def open_executor(jobs: int | None = None, scheduler: str | None = None) -> Iterator[Executor | None]:
    """The executor --jobs / --scheduler name (see the module docstring); shut down on leaving."""
    if scheduler is not None:
        try:
            import distributed
        except ImportError:
            raise UsageError(f"--scheduler needs dask.distributed: {DASK_HINT}") from None
        try:
            client = distributed.Client(scheduler, timeout="20s")
        except (OSError, TimeoutError, ValueError) as exc:
            raise UsageError(f"--scheduler {scheduler}: cannot reach the scheduler ({exc})") from None
        with client:
            yield client.get_executor(pure=False)
        return
    n = default_jobs() if jobs is None else jobs
    if n < 1:
        raise UsageError(f"--jobs {n}: give 1 or more")
    if n == 1:
        yield None
        return
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["snapanalyze.session.runs"])     # workers fork from a server that imported it
    # The server is `python -c …`, whose sys.path starts with the working directory (Python 3.11's forkserver does
    # not take the caller's sys.path): run from a folder holding a folder named snapanalyze (a clone's parent), it
    # would import that instead of this package. PYTHONSAFEPATH keeps the working directory off its path.
    saved = os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        forkserver.ensure_running()  # now: the server imports while the caller goes on, not at the first task
    finally:
        if saved is None:
            os.environ.pop("PYTHONSAFEPATH", None)
        else:
            os.environ["PYTHONSAFEPATH"] = saved
    pool = ProcessPoolExecutor(max_workers=n, mp_context=context)
    try:
        yield pool
    finally:                                 # on an error or Ctrl-C, ranks not started yet never start
        pool.shutdown(wait=True, cancel_futures=True)
