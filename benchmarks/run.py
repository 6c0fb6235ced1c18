"""Benchmark snapanalyze against a bare ``pickle.load`` of a large generated snapshot.

Contract: ``python benchmarks/run.py [--events N | --quick] [--segments K] [--data DIR] [--repeat R]
[--check-goals]`` makes sure two files of N events exist in DIR (default ``benchmarks/data``; made by
``benchmarks/generate.py`` when missing): ``large-<N>.pickle`` (the serving run's own ~180 segments) and the
segment-heavy ``large-<N>-<K>seg.pickle`` (K more segments, default N / 4; ``--segments 0`` skips it). On each
it runs the commands below R times, round-robin, each run its own subprocess, measuring wall time
(``time.perf_counter`` around the child) and peak resident memory (``ru_maxrss`` from ``os.wait4``, KiB on
Linux); the Parquet-run, startup and in-process rows are measured on the few-segment file only:

  pickle.load  ``python -c "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))" FILE`` (the baseline)
  peaks        ``snapanalyze peaks FILE --format json``
  attribute    ``snapanalyze attribute FILE --format json`` (skipped, with a note, while it does not exist)
  whatif       ``snapanalyze whatif FILE --set expandable_segments:True --format json``: three simulations of
               the whole trace (the replay check, the recorded settings, the changed ones)
  peaks (run)  ``snapanalyze peaks RUN --format json`` on the same snapshot converted to Parquet once
               (``snapanalyze convert FILE -o RUN``, not timed)
  startup      ``snapanalyze --version``: what every command pays before it reads a byte

Its speed-up over ``peaks`` on the pickle is printed three ways: for the whole command, for the command
beyond ``startup``, and in process (load + replay + find_peaks after imports — snapanalyze, pandas and
pyarrow, which the two paths would otherwise import inside the timed call — each path in a fresh process of
its own: the analysis itself; the goal is >= 10x, missed goals are listed in ``goals_missed``)

and, in process on the converted run, ``phase_table`` with the categories of 2,000 back-to-back request
marker spans (a serving run's markers; each span's peak is attributed), reported without a goal.

It prints a table per file (median wall time; the time ratio is the median of the per-round ratios to the
baseline run just before it, so a slow spell of a shared machine divides out; the largest max RSS of the repeats
over the baseline's; the goals: peaks <= 1.0x time, attribute <= 1.1x time, both <= 1.15x RSS, whatif <= 3x
time and <= 1.25x RSS, on both files) and
writes the same results as JSON to ``benchmarks/results/latest.json``.  ``--quick`` means ``--events 100000``.
Exit status: 0; 1 when a command failed (its stderr tail is printed) or printed something other than JSON, or,
with ``--check-goals``, when a goal was missed; 2 for usage errors or when the file cannot be generated.
snapanalyze is run as ``python -m snapanalyze`` when that works, else through the ``snapanalyze`` console
script, else by calling ``snapanalyze.cli.main`` from ``python -c``; children run in the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
from generate import default_name  # noqa: E402

PICKLE_LOAD = "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))"
QUICK_EVENTS = 100_000
PEAKS_GOAL = (1.0, 1.15)          # time and peak RSS, as multiples of the bare pickle.load's
ATTRIBUTE_GOAL = (1.1, 1.15)
WHATIF_GOAL = (3.0, 1.25)         # issue 30: 1M events simulated in at most 3x a bare pickle.load


@dataclass
class Goal:
    time_ratio: float | None = None
    rss_ratio: float | None = None

    def describe(self) -> str:
        parts = []
        if self.time_ratio is not None:
            parts.append(f"time <= {self.time_ratio:g}x")
        if self.rss_ratio is not None:
            parts.append(f"RSS <= {self.rss_ratio:g}x")
        return ", ".join(parts) or "(reported)"


@dataclass
class Run:
    wall_s: float
    max_rss_kib: int
    returncode: int
    stdout_bytes: int
    stderr_tail: str


@dataclass
class Result:
    name: str
    argv: list[str]
    goal: Goal
    status: str = "ok"  # ok | failed | not available
    note: str = ""
    runs: list[Run] = field(default_factory=list)
    baseline_s: list[float] = field(default_factory=list)   # the pickle.load run just before each run
    wall_s_median: float | None = None
    max_rss_mib: float | None = None
    time_ratio: float | None = None
    rss_ratio: float | None = None
    meets_goal: bool | None = None


def measure(argv: list[str], timeout_s: float) -> tuple[Run, str]:
    """Run ``argv`` once; return its measurements and its stdout text."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=REPO)
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; keep Popen from waiting again
        out.seek(0)
        stdout = out.read().decode(errors="replace")
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    if proc.returncode < 0:
        stderr += f"\n[killed by signal {-proc.returncode}{' (timeout)' if wall >= timeout_s else ''}]"
    return Run(wall, usage.ru_maxrss, proc.returncode, len(stdout), tail(stderr)), stdout


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def snapanalyze_command() -> list[str]:
    """How to start the CLI: ``python -m snapanalyze``, the console script, or ``snapanalyze.cli.main``."""
    probe = subprocess.run(
        [sys.executable, "-m", "snapanalyze", "--help"], cwd=REPO, capture_output=True, text=True
    )
    if probe.returncode == 0:
        return [sys.executable, "-m", "snapanalyze"]
    script = shutil.which("snapanalyze")
    if script:
        return [script]
    return [sys.executable, "-c", "import sys; from snapanalyze.cli import main; sys.exit(main())"]


def ensure_file(events: int, segments: int, data: Path, stacks: int = 0) -> Path:
    path = data / default_name(events, segments, stacks)
    if not path.exists():
        print(f"generating {path} ({events:,} events, {segments:,} pinned segments, {stacks:,} distinct stacks) ...",
              flush=True)
        cmd = [sys.executable, str(BENCH / "generate.py"), "--events", str(events), "--segments", str(segments),
               "--distinct-stacks", str(stacks), "-o", str(path)]
        if subprocess.run(cmd, cwd=REPO).returncode != 0 or not path.exists():
            raise SystemExit(f"run: could not generate {path}")
    return path


def ensure_run(path: Path, cli: list[str]) -> Path:
    """The snapshot converted to a Parquet run directory next to it (made once, not timed)."""
    run = path.with_suffix(".run")
    if not (run / "rank=0" / "tag=final" / "snapshot.json").exists():
        print(f"converting {path} to {run} ...", flush=True)
        cmd = [*cli, "convert", str(path), "-o", str(run), "--tag", "final", "--force"]
        if subprocess.run(cmd, cwd=REPO).returncode != 0:
            raise SystemExit(f"run: could not convert {path}")
    return run


INPROCESS = """
import sys, time
import pandas, pyarrow.parquet     # the libraries the two paths import on first use: imports, not analysis
import snapanalyze as sa
t = time.perf_counter()
sa.find_peaks(sa.replay(sa.load(sys.argv[1])), top=5)
print(time.perf_counter() - t)
"""


PHASES = """
import json, sys, time
import numpy as np, pandas as pd
import snapanalyze as sa
snapshot = sa.load(sys.argv[1])
timeline = sa.replay(snapshot)
n = int(sys.argv[2])
t = snapshot.trace(0).time_us
edges = np.linspace(t[0], t[-1], n + 1).astype(np.int64)
markers = pd.DataFrame({"rank": 0, "session": 0, "kind": "request", "name": [f"req-{i}" for i in range(n)],
                        "start_time_us": edges[:-1], "end_time_us": pd.array(edges[1:] - 1, dtype="Int64"),
                        "attrs": [{} for _ in range(n)], "thread_id": 1, "depth": 0})
start = time.perf_counter()
table = sa.phase_table(snapshot, timeline, markers)
print(json.dumps({"seconds": time.perf_counter() - start, "rows": len(table)}))
"""
PHASE_SPANS = 2000


def phases_time(run: Path, repeat: int) -> float:
    """Median seconds of phase_table (with categories) over PHASE_SPANS request spans on the converted run."""
    samples = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", PHASES, str(run), str(PHASE_SPANS)], cwd=REPO,
                              capture_output=True, text=True, check=True)
        samples.append(json.loads(done.stdout)["seconds"])
    return statistics.median(samples)


INPROCESS_ROUNDS = 9            # at least: the run's analysis takes 0.13-0.48 s for the same work here


def inprocess_times(path: Path, run: Path, repeat: int) -> dict[str, Any]:
    """Seconds of load + replay + find_peaks, after imports, from the pickle and from the run (medians), and
    the speed-up: the median over the rounds of the pickle's time over the run's in the same round (paired,
    as the commands are). Each path runs in a fresh process of its own, as a user runs one or the other, the
    two alternating round by round. (Run after the pickle in one process, the run's analysis took about 0.3 s
    instead of 0.15-0.2 s; so it does after freeing three million unrelated dicts: what the freeing leaves
    behind, not the run's own cost.)"""
    samples: dict[str, list[float]] = {"pickle": [], "run": []}
    for _ in range(max(repeat, INPROCESS_ROUNDS)):
        for key, source in (("pickle", path), ("run", run)):
            done = subprocess.run([sys.executable, "-c", INPROCESS, str(source)], cwd=REPO,
                                  capture_output=True, text=True, check=True)
            samples[key].append(float(done.stdout))
    ratios = [p / r for p, r in zip(samples["pickle"], samples["run"])]
    return {"pickle": statistics.median(samples["pickle"]), "run": statistics.median(samples["run"]),
            "speedup": statistics.median(ratios), "speedup_range": [min(ratios), max(ratios)], "samples": samples}


def warm_page_cache(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(1 << 24):
            pass


def run_once(result: Result, timeout_s: float, check_json: bool) -> None:
    """One measured run of ``result``'s command; marks the result failed or not available as needed."""
    run, stdout = measure(result.argv, timeout_s)
    result.runs.append(run)
    if run.returncode != 0:
        if result.name == "attribute" and "No such command" in run.stderr_tail:
            result.status, result.note = "not available", "attribute: not available yet"
        else:
            result.status, result.note = "failed", f"exit status {run.returncode}"
    elif check_json and len(result.runs) == 1:
        try:
            json.loads(stdout)
        except ValueError as exc:
            result.status, result.note = "failed", f"output is not JSON: {exc}"
            run.stderr_tail = tail(stdout)


def summarize(result: Result) -> None:
    if result.status == "ok":
        result.wall_s_median = statistics.median(r.wall_s for r in result.runs)
        result.max_rss_mib = max(r.max_rss_kib for r in result.runs) / 1024


def compare(result: Result, base: Result) -> None:
    if result.wall_s_median is None or base.wall_s_median is None or base.max_rss_mib is None:
        return
    assert result.max_rss_mib is not None
    # The median of paired ratios: each run of the command follows a run of the baseline, so a slow spell of
    # a shared machine divides out.
    pairs = zip(result.runs, result.baseline_s or [b.wall_s for b in base.runs])
    result.time_ratio = statistics.median(r.wall_s / b for r, b in pairs)
    result.rss_ratio = result.max_rss_mib / base.max_rss_mib
    goal = result.goal
    if goal.time_ratio is None and goal.rss_ratio is None:
        return
    result.meets_goal = (goal.time_ratio is None or result.time_ratio <= goal.time_ratio) and (
        goal.rss_ratio is None or result.rss_ratio <= goal.rss_ratio
    )


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(results: list[Result]) -> None:
    header = ("command", "wall s", "max RSS MiB", "time x", "RSS x", "goal", "")
    rows = [header]
    for r in results:
        verdict = {True: "ok", False: "MISSED", None: ""}[r.meets_goal] if r.status == "ok" else r.status
        rows.append(
            (
                r.name,
                fmt(r.wall_s_median, ".2f"),
                fmt(r.max_rss_mib, ".0f"),
                fmt(r.time_ratio, ".2f"),
                fmt(r.rss_ratio, ".2f"),
                "baseline" if r is results[0] else r.goal.describe(),
                verdict,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:5], widths[1:5], strict=True)]
        cells += [row[5].ljust(widths[5]), row[6]]
        print("  ".join(cells).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths[:6]))


def measure_shape(label: str, path: Path, cli: list[str], repeat: int, timeout: float,
                  extra: list[Result]) -> list[Result]:
    """pickle.load, peaks, attribute (and `extra`) on one file, round-robin, compared with the baseline."""
    file_arg = str(path)
    results = [
        Result("pickle.load", [sys.executable, "-c", PICKLE_LOAD, file_arg], Goal()),
        Result("peaks", [*cli, "peaks", file_arg, "--format", "json"], Goal(*PEAKS_GOAL)),
        Result("attribute", [*cli, "attribute", file_arg, "--format", "json"], Goal(*ATTRIBUTE_GOAL)),
        Result("whatif", [*cli, "whatif", file_arg, "--set", "expandable_segments:True", "--format", "json"],
               Goal(*WHATIF_GOAL)),
        *extra,
    ]
    warm_page_cache(path)
    size_mib = path.stat().st_size / 2**20
    print(f"\n{label}: {path} ({size_mib:.0f} MiB); {repeat} runs each")
    # Round-robin over the commands, each right after a run of the baseline, so that a slow spell of the
    # machine hits a command and its baseline alike.
    base = results[0]
    for i in range(repeat):
        print(f"  round {i + 1}/{repeat}:", end="", flush=True)
        for result in results[1:]:
            if result.status == "ok" and base.status == "ok":
                run_once(base, timeout, check_json=False)
                run_once(result, timeout, check_json=result.name != "startup")
                result.baseline_s.append(base.runs[-1].wall_s)
                print(f" {result.name} {result.runs[-1].wall_s:.2f} s ({base.runs[-1].wall_s:.2f})", end="", flush=True)
        print()
    for result in results:
        summarize(result)
    for result in results[1:]:
        compare(result, results[0])
    print()
    print_table(results)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--events", type=int, default=1_000_000, help="trace entries in the file (default 1M)")
    size.add_argument("--quick", action="store_true", help=f"use {QUICK_EVENTS:,} events")
    parser.add_argument("--segments", type=int, default=None,
                        help="pinned segments of the segment-heavy file (default: a quarter of --events; "
                             "0: measure the few-segment file only)")
    parser.add_argument("--stacks", type=int, default=4000,
                        help="distinct random stacks of the many-stacks file (25-55 frames from 850, a third C++, "
                             "random nesting; 0: skip that shape)")
    parser.add_argument("--data", type=Path, default=BENCH / "data", help="where the generated files live")
    parser.add_argument("--repeat", type=int, default=3, help="runs per command; the median time is used")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds before a run is killed")
    parser.add_argument("--check-goals", action="store_true", help="exit 1 when a goal is missed")
    parser.add_argument(
        "--output", type=Path, default=BENCH / "results" / "latest.json", help="where to write JSON results"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    events = QUICK_EVENTS if args.quick else args.events
    segments = events // 4 if args.segments is None else args.segments
    if segments < 0:
        parser.error("--segments must not be negative")

    path = ensure_file(events, 0, args.data)
    heavy = ensure_file(events, segments, args.data) if segments else None
    stacked = ensure_file(events, 0, args.data, args.stacks) if args.stacks else None
    # An installed package has bytecode; without it (PYTHONDONTWRITEBYTECODE is set on some machines) every
    # run would recompile snapanalyze and time the compiler.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "snapanalyze")], check=True)
    cli = snapanalyze_command()
    results = measure_shape(f"few segments ({events:,} events)", path, cli, args.repeat, args.timeout, [
        Result("peaks (run)", [*cli, "peaks", str(ensure_run(path, cli)), "--format", "json"], Goal()),
        Result("startup", [*cli, "--version"], Goal()),
    ])
    heavy_results = (measure_shape(f"segment-heavy ({events:,} events, {segments:,} more segments)", heavy, cli,
                                   args.repeat, args.timeout, []) if heavy else [])
    stacked_results = (measure_shape(f"many stacks ({events:,} events, {args.stacks:,} distinct deep stacks)",
                                     stacked, cli, args.repeat, args.timeout, []) if stacked else [])
    print()
    for label, shape in (("few segments", results), ("segment-heavy", heavy_results),
                         ("many stacks", stacked_results)):
        for r in shape[1:3]:
            if r.time_ratio is not None:
                print(f"{label:14s} {r.name:9s}  {r.time_ratio:.2f}x pickle.load's time (paired median of "
                      f"{len(r.runs)}), {r.rss_ratio:.2f}x its peak RSS  "
                      f"{'ok' if r.meets_goal else 'MISSED'} ({r.goal.describe()})")
    failed = False
    for r in results + heavy_results + stacked_results:
        if r.status == "not available":
            print(f"\n{r.note}")
        elif r.status == "failed":
            failed = True
            print(f"\n{r.name} FAILED ({r.note}): {shlex.join(r.argv)}")
            if r.runs and r.runs[-1].stderr_tail:
                print(r.runs[-1].stderr_tail)
    missed = [r.name for r in results if r.meets_goal is False]
    missed += [f"{r.name} (segment-heavy)" for r in heavy_results if r.meets_goal is False]
    missed += [f"{r.name} (many stacks)" for r in stacked_results if r.meets_goal is False]
    speedup = beyond = None
    named = {r.name: r for r in results}
    pickle_peaks, run_peaks, startup = named["peaks"], named["peaks (run)"], named["startup"]
    if pickle_peaks.wall_s_median and run_peaks.wall_s_median and startup.wall_s_median:
        speedup = pickle_peaks.wall_s_median / run_peaks.wall_s_median
        floor = startup.wall_s_median
        beyond = (pickle_peaks.wall_s_median - floor) / max(run_peaks.wall_s_median - floor, 1e-3)
        print(f"\npeaks from the Parquet run: {run_peaks.wall_s_median:.2f} s vs {pickle_peaks.wall_s_median:.2f} s "
              f"from the pickle: {speedup:.1f}x faster for the whole command; {beyond:.1f}x beyond the "
              f"{floor:.2f} s every command pays (`snapanalyze --version`: Python, numpy, click)")
    library = inprocess_times(path, Path(run_peaks.argv[-3]), args.repeat)
    library_speedup = library["speedup"]
    low, high = library["speedup_range"]
    verdict = "ok" if library_speedup >= 10 else "MISSED"
    print(f"analysis in process (load + replay + find_peaks, after imports): {library['pickle']:.2f} s from the "
          f"pickle, {library['run']:.3f} s from the run (medians of {len(library['samples']['run'])}): "
          f"{library_speedup:.1f}x faster, paired median ({low:.1f}-{high:.1f}x) (goal >= 10x) {verdict}")
    if library_speedup < 10:
        missed.append("analysis from the Parquet run")
    phases_s = phases_time(Path(run_peaks.argv[-3]), args.repeat)
    print(f"phase_table with categories over {PHASE_SPANS:,} request spans (run, in process): {phases_s:.2f} s")

    def describe(p: Path, n_segments: int) -> dict[str, Any]:
        return {"path": str(p), "bytes": p.stat().st_size, "events": events, "pinned_segments": n_segments}

    doc: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "file": describe(path, 0),
        "repeat": args.repeat,
        "results": [asdict(r) for r in results],
        "segment_heavy": {"file": describe(heavy, segments), "results": [asdict(r) for r in heavy_results]}
        if heavy else None,
        "many_stacks": {"file": describe(stacked, 0), "distinct_stacks": args.stacks,
                        "results": [asdict(r) for r in stacked_results]} if stacked else None,
        "failed": failed,
        "goals_missed": missed,
        "parquet_speedup": speedup,
        "parquet_speedup_beyond_startup": beyond,
        "parquet_inprocess": library,
        "parquet_inprocess_speedup": library_speedup,
        "phase_table_s": {"request_spans": PHASE_SPANS, "seconds": phases_s},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nresults written to {args.output}")
    return 1 if failed or (args.check_goals and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
