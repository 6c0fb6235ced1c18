"""Fleet benchmark: `snapanalyze ranks` over many generated ranks with --jobs 1, --jobs 2 and a 2-worker Dask cluster.

Contract: ``python benchmarks/fleet.py [--ranks 32] [--events 100000] [--workers 2] [--repeat 1]`` makes
sure ``benchmarks/data/fleet-<R>x<N>/rank=K/snapshot-final.pickle`` exist (generated with
``benchmarks/generate.py``'s `generate`, rank K with seed 20251130 + K, so each rank's run differs a little),
then times, each in its own subprocess (wall time with ``time.perf_counter`` around the child):

  jobs 1     ``snapanalyze ranks RUN --format json --jobs 1`` (one rank at a time, the serial baseline)
  jobs W     ``... --jobs W`` (a process pool of W workers)
  dask W     ``... --scheduler ADDRESS`` on a ``distributed.LocalCluster(n_workers=W, processes=True,
             threads_per_worker=1)`` started before, its workers having imported snapanalyze (neither is
             timed: a cluster is there already)

checks that the three print the same JSON, and prints the median times, the speed-up over jobs 1 (the median
over the rounds of jobs 1's time over the mode's in the same round: paired, as `run.py` does, since on a
shared machine the same serial run took 7.4-10.9 s within minutes), the parallel efficiency (speed-up / W;
goal >= 0.8) and the peak RSS of the largest process (the command, a
pool worker, a Dask worker: each holds one rank at a time) as a table, also written to
``benchmarks/results/fleet.json``.
It measures, it does not pass or fail on time: on a machine other work shares, the numbers are noisy.
Exit status 0; 1 when a command failed or the outputs differ.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pickle
import statistics
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from generate import generate  # noqa: E402  (benchmarks/ is not a package)

SEED = 20251130
GOAL = 0.8


def _write_rank(args: tuple[Path, int, int]) -> None:
    run, rank, events = args
    out = run / f"rank={rank}" / "snapshot-final.pickle"
    if out.exists():
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    snapshot, _ = generate(events, SEED + rank)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    os.replace(tmp, out)


def make_fleet(ranks: int, events: int, workers: int) -> Path:
    run = HERE / "data" / f"fleet-{ranks}x{events // 1000}k"
    missing = [(run, r, events) for r in range(ranks) if not (run / f"rank={r}" / "snapshot-final.pickle").exists()]
    if missing:
        print(f"generating {len(missing)} ranks of {events:,} events into {run} …", file=sys.stderr)
        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_write_rank, missing))
    return run


# Runs the command and prints its wall time and the peak RSS of the largest process it made (itself or a pool
# worker: a worker reaped by the command counts among its children, so among this wrapper's).
_WRAPPER = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "done = subprocess.run(sys.argv[1:]); "
            "sys.stderr.write(f'\\n@@ {time.perf_counter() - t} "
            "{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n'); sys.exit(done.returncode)")


def timed(args: list[str]) -> tuple[float, int, str]:
    """(wall s, peak RSS in KiB of the largest process, stdout) of one `snapanalyze` command (Linux units)."""
    done = subprocess.run([sys.executable, "-c", _WRAPPER, sys.executable, "-m", "snapanalyze", *args], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fleet: {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    wall, rss = done.stderr.rsplit("@@ ", 1)[1].split()
    return float(wall), int(rss), done.stdout


def _peak_rss_kib() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=32)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each (round-robin); the median is shown")
    a = parser.parse_args(argv)
    from distributed import Client, LocalCluster

    run = make_fleet(a.ranks, a.events, a.workers)
    base = ["ranks", str(run), "--format", "json"]
    modes = {"jobs 1": ["--jobs", "1"], f"jobs {a.workers}": ["--jobs", str(a.workers)]}
    times: dict[str, list[float]] = {}
    rss: dict[str, int] = {}
    outputs: dict[str, str] = {}
    dask = f"dask {a.workers}"
    with LocalCluster(n_workers=a.workers, processes=True, threads_per_worker=1, dashboard_address=None) as cluster:
        with Client(cluster) as client:          # a cluster already there has imported snapanalyze
            client.run(importlib.import_module, "snapanalyze.session.runs")
            modes[dask] = ["--scheduler", cluster.scheduler_address]
            for _ in range(a.repeat):
                for name, extra in modes.items():
                    wall, peak, out = timed(base + extra)
                    times.setdefault(name, []).append(wall)
                    rss[name] = max(rss.get(name, 0), peak)
                    outputs[name] = out
            workers = client.run(_peak_rss_kib)      # the cluster's workers: not children of the command
            rss[dask] = max(max(workers.values()), rss[dask])
    same = len(set(outputs.values())) == 1
    serial = times["jobs 1"]
    rows = []
    print(f"snapanalyze ranks over {a.ranks} ranks x {a.events:,} events ({os.cpu_count()} cores; noisy on a shared "
          "machine)")
    print(f"{'mode':<10} {'wall s':>8} {'speed-up':>9} {'efficiency':>11} {'peak RSS MiB':>13}")
    for name, walls in times.items():
        wall = statistics.median(walls)
        workers = 1 if name == "jobs 1" else a.workers
        speedup = statistics.median(s / w for s, w in zip(serial, walls))    # paired: each round's own jobs 1
        rows.append({"mode": name, "wall_s": wall, "walls_s": walls, "speedup": speedup,
                     "efficiency": speedup / workers, "peak_rss_mib": rss[name] / 1024})
        print(f"{name:<10} {wall:>8.2f} {speedup:>8.2f}x {speedup / workers:>11.2f} {rss[name] / 1024:>13.0f}")
    print("peak RSS: the largest process of the command (its own or a pool worker's; for Dask, a cluster "
          "worker's since it started)")
    print(f"goal: efficiency >= {GOAL} with {a.workers} workers; outputs identical: {same}")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "fleet.json").write_text(json.dumps(
        {"ranks": a.ranks, "events": a.events, "workers": a.workers, "cores": os.cpu_count(), "rows": rows,
         "identical": same, "goal_efficiency": GOAL}, indent=1) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
