"""``make zoo``: capture every zoo program into one labelled set and grade attribution on it.

Contract: ``python -m zoo.run [--out build/zoo] [--jobs N] [--only FAMILY[/NAME] …] [--show-held-out]`` runs
`zoo.capture` for each program (`programs()`: ``zoo/programs/<family>/<name>.py``, files starting with ``_``
are shared helpers) in its own interpreter, N at a time, merges their truth into ``labels/truth.json``, grades
`attribute` without and with each program's source (`zoo.grade`) and writes the tables to ``grades.md`` beside
them. A program that fails is named with the tail of its error; the others still complete, and the exit
status is 1. The held-out families' rows stay out of the printed tables unless asked for (their medians are
always there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from zoo import FAMILIES

ZOO = Path(__file__).resolve().parent
REPO = ZOO.parent


def programs(only: list[str] | None = None) -> list[str]:
    """Every program as FAMILY/NAME, families in `FAMILIES` order (only those `only` names, if given)."""
    out = []
    for family in FAMILIES:
        for path in sorted((ZOO / "programs" / family).glob("*.py")):
            if path.name.startswith("_"):
                continue
            name = f"{family}/{path.stem}"
            if not only or any(name == o or family == o for o in only):
                out.append(name)
    return out


def run_one(program: str, out: Path, timeout: float) -> tuple[str, float, str | None]:
    start = time.monotonic()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONHASHSEED": "0",
           "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                                os.environ.get("PYTHONPATH")]))}
    try:
        done = subprocess.run([sys.executable, "-m", "zoo.capture", program, str(out)], capture_output=True,
                              text=True, env=env, cwd=REPO, timeout=timeout)
    except subprocess.TimeoutExpired:
        return program, time.monotonic() - start, f"took longer than {timeout:.0f} s"
    error = None if done.returncode == 0 else (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return program, time.monotonic() - start, error


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.run")
    ap.add_argument("--out", type=Path, default=REPO / "build" / "zoo")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--show-held-out", action="store_true")
    ap.add_argument("--no-grade", action="store_true")
    a = ap.parse_args(argv)
    from zoo.grade import confusions, grade_set, table
    a.out.mkdir(parents=True, exist_ok=True)
    todo = programs(a.only)
    start = time.monotonic()
    failed = []
    with ThreadPoolExecutor(max(1, a.jobs)) as pool:
        for program, seconds, error in pool.map(lambda p: run_one(p, a.out, a.timeout), todo):
            print(f"{'FAIL' if error else 'ok  '} {program:40s} {seconds:6.1f} s" + (f"  {error}" if error else ""),
                  flush=True)
            if error:
                failed.append(program)
    truth = {}
    for program in programs():               # a partial run (--only) keeps the others' captures in the set
        part = a.out / "labels" / f"{program.replace('/', '-')}.truth.json"
        if program not in failed and part.exists():
            truth.update(json.loads(part.read_text()))
    (a.out / "labels" / "truth.json").write_text(json.dumps(dict(sorted(truth.items())), indent=1))
    print(f"captured {len(todo) - len(failed)} of {len(todo)} programs in {time.monotonic() - start:.0f} s")
    if a.no_grade or not truth:
        return 1 if failed else 0
    report = []
    for source in (False, True):
        grades = grade_set(a.out, source)
        title = "with each program's source (--source)" if source else "without the source"
        report += [f"## attribute against the truth, {title}", "", table(grades, a.show_held_out), "",
                   "largest disagreements (label → category):", "```", confusions(grades, a.show_held_out), "```", ""]
    text = "\n".join(report)
    (a.out / "grades.md").write_text(text)
    print(text)
    print(f"total {time.monotonic() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
