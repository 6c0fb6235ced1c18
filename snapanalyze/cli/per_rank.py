"""Run-wide commands: which snapshots a command analyses, and the per-rank work merged in rank order.

Contract: `plan(path, rank, tag)` says what a command given PATH analyses: each rank of a run directory that
holds more than one rank (`Plan.multi`: one job per rank with a snapshot, in rank order, plus `Plan.problems`:
ranks without one, skipped names — reported, not fatal), or else one snapshot, as `session.open_input(path, rank, tag)`
reads it (a file, a tables or ``rank=N`` directory, a run of one rank, any run with --rank); `diff_plan(a, b,
…)` pairs two inputs rank by rank. Each `Job` is one rank's work: its rank and tag and the `Target`s
(snapshots) it reads. `each(plan, work, progress)` calls `work(job, step)` once per job, in rank order, and
returns the plan of the jobs that succeeded (a rank that failed on its input becomes one of its problems, and
its error is raised by `Plan.finish` once the others are shown) and their results; `work` must be a
module-level function (or a `functools.partial` of one) whose arguments pickle and whose result is small and
JSON-ready, so that the calls can go to a process pool unchanged. Output shapes: `run_document` is the JSON of
a multi-rank run, ``{"run", "ranks": [{"rank", "tag", **result}], "problems"}`` (one file or one rank keeps
the command's single document); `sections` the terminal's: one section per rank under a
``== rank N (tag T) ==`` heading, the problems as warnings last. `emit` prints either, the text fitted to the terminal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from ..errors import BadInputError, SnapanalyzeError
from .common import echo_text, emit_json, terminal_width
from .parallel import start_early
from .progress import Progress

T = TypeVar("T")
Step = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    """One snapshot to analyse: `session.open_input(path, rank, tag)` reads it (rank and tag None: the input is one)."""

    path: str
    rank: int | None = None
    tag: str | None = None


@dataclass(frozen=True)
class Job:
    """The work of one rank: the rank and tag it stands for in the output (None when the input is one
    snapshot) and the snapshots it reads (one; two for a diff: A and B)."""

    rank: int | None
    tag: str | None
    inputs: tuple[Target, ...]

    @property
    def target(self) -> Target:
        return self.inputs[0]


@dataclass(frozen=True)
class Plan:
    """What a command analyses (see the module docstring)."""

    path: str
    jobs: tuple[Job, ...]
    problems: tuple[str, ...] = ()
    multi: bool = False
    failed: SnapanalyzeError | None = None      # after `each`: the ranks whose work failed, named together

    def finish(self) -> None:
        """Once the output of the ranks that succeeded is out: raise the error naming those that failed."""
        if self.failed is not None:
            raise self.failed


def _ranks_of(path: str, tag: str | None) -> tuple[dict[int, Target], list[str]] | None:
    """The snapshot of each rank of a multi-rank run directory (`session.run_ranks`) as targets, and the problems
    met; None when `path` is one snapshot."""
    from ..session.inputs import run_ranks

    found = run_ranks(path, tag, on_count=start_early)
    if found is None:
        return None
    return {rank: Target(path, rank, t) for rank, t in found.tags.items()}, list(found.problems)


def plan(path: str, rank: int | None = None, tag: str | None = None) -> Plan:
    """Every rank of a multi-rank run directory (unless --rank chooses one), else the one snapshot."""
    found = _ranks_of(path, tag) if rank is None else None
    if found is None:
        return Plan(path, (Job(None, None, (Target(path, rank, tag),)),))
    targets, problems = found
    return Plan(path, tuple(Job(r, t.tag, (t,)) for r, t in targets.items()), tuple(problems), True)


def diff_plan(a: str, b: str, rank: int | None = None, tag: str | None = None) -> Plan:
    """A against B rank by rank when either is a multi-rank run: the ranks both have (a run of one rank, or
    a snapshot file, serves every rank of the other); a rank only one side has is a problem."""
    found_a, found_b = (_ranks_of(x, tag) if rank is None else None for x in (a, b))
    one_a, one_b = Target(a, rank, tag), Target(b, rank, tag)
    if found_a is None and found_b is None:
        return Plan(f"{a} → {b}", (Job(None, None, (one_a, one_b)),))
    by_a = found_a[0] if found_a is not None else None
    by_b = found_b[0] if found_b is not None else None
    problems = [f"A: {x}" for x in (found_a[1] if found_a else [])] + \
               [f"B: {x}" for x in (found_b[1] if found_b else [])]
    jobs = []
    for r in sorted(set(by_a or {}) | set(by_b or {})):
        ta = by_a.get(r) if by_a is not None else one_a
        tb = by_b.get(r) if by_b is not None else one_b
        if ta is None or tb is None:
            problems.append(f"rank {r}: only in {'B' if ta is None else 'A'}; not compared")
            continue
        jobs.append(Job(r, (by_a or by_b or {})[r].tag, (ta, tb)))
    if not jobs:
        raise BadInputError(a, f"no rank to compare with {b}: " + "; ".join(problems))
    return Plan(f"{a} → {b}", tuple(jobs), tuple(problems), True)


def each(p: Plan, work: Callable[[Job, Step], T], progress: Progress) -> tuple[Plan, list[T]]:
    """`work(job, step)` for each job of `p`, in rank order (see the module docstring); on the command's
    --jobs / --scheduler executor when it has several (`cli.parallel.map_jobs`). The plan returned holds the
    jobs that succeeded, with their results; a rank that failed on its input is one of its problems and
    `failed` names them all, for `finish` (which `emit` calls) to raise once the other ranks are shown."""
    from .parallel import map_jobs
    done, failed = map_jobs(p.jobs, work, progress)
    results = [result for _, result in done]
    if not failed:
        return p, results
    named = [f"rank {job.rank}: {message}" for job, message, _ in failed]
    error = SnapanalyzeError("; ".join(named))
    error.exit_code = failed[0][2]
    if not done:
        raise error
    return replace(p, jobs=tuple(job for job, _ in done), problems=(*p.problems, *named), failed=error), results


class Result(Protocol):
    """A typed analysis result: its JSON document is `to_json()`."""

    def to_json(self) -> dict[str, Any]: ...


R = TypeVar("R", bound="dict[str, Any] | Result")


def document(result: dict[str, Any] | Result) -> dict[str, Any]:
    """The JSON of one rank's result: a typed result's `to_json()`, else the document itself."""
    return result if isinstance(result, dict) else result.to_json()


def run_document(p: Plan, results: Sequence[dict[str, Any] | Result]) -> dict[str, Any]:
    """The JSON of a multi-rank run: each rank's document under `ranks`, with its rank and tag first."""
    return {"run": p.path,
            "ranks": [{"rank": j.rank, "tag": j.tag, **document(r)} for j, r in zip(p.jobs, results)],
            "problems": list(p.problems)}


def sections(p: Plan, texts: Sequence[str]) -> str:
    """One terminal section per rank, each under its heading; the run's problems close it as warnings."""
    if not p.multi:
        return "\n".join(texts)
    out = [p.path]
    for j, text in zip(p.jobs, texts):
        out += ["", f"== rank {j.rank} (tag {j.tag}) ==", text]
    out += [f"warning: {problem}" for problem in p.problems]
    return "\n".join(out)


def emit(p: Plan, results: Sequence[R], fmt: str, render: Callable[[R, int | None], str]) -> None:
    """JSON (one document, or the run's `ranks`) or the terminal text, one section per rank, fitted to the
    terminal's width (`render(result, width)` renders one)."""
    if fmt == "json":
        emit_json(run_document(p, results) if p.multi else document(results[0]))
    else:
        width = terminal_width()
        echo_text(sections(p, [render(r, width) for r in results]), width)
    p.finish()
