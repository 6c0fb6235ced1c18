"""Run every command on every shipped fixture in every format and keep the outputs, to prove a refactor
changes no output byte.

    python tools/outputs.py OUT_DIR             # write one file per (command, fixture, format)
    python tools/outputs.py OUT_DIR --compare REF_DIR   # and exit 1 naming each output that differs

Each output file holds the exit status, stdout and stderr of one command line. Commands run in one process
(click's runner), in a sorted order, so two runs of the same tree write the same files.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def cases() -> list[tuple[str, list[str]]]:
    fx = ROOT / "fixtures"
    files = sorted([*fx.glob("scenarios/*.pickle"), *fx.glob("real/*.pickle")])
    runs = [*sorted(p for p in (fx / "runs").iterdir() if p.is_dir()), fx / "sweeps/phase_markers/run"]
    out: list[tuple[str, list[str]]] = []
    for f in [*files, *runs]:
        name = f.relative_to(fx).as_posix().replace("/", "__")
        src = fx / "real/source" / f.stem
        for fmt in ("table", "json"):
            out += [(f"summary-{fmt}-{name}", ["summary", str(f), "--format", fmt]),
                    (f"peaks-{fmt}-{name}", ["peaks", str(f), "--format", fmt]),
                    (f"attribute-{fmt}-{name}", ["attribute", str(f), "--format", fmt]),
                    (f"explain-oom-{fmt}-{name}", ["explain-oom", str(f), "--format", fmt]),
                    (f"phases-{fmt}-{name}", ["phases", str(f), "--format", fmt]),
                    (f"check-{fmt}-{name}", ["check", str(f), "--budget", "1GiB", "--format", fmt])]
            out.append((f"whatif-{fmt}-{name}", ["whatif", str(f), "--format", fmt]))
            out.append((f"whatif-set-{fmt}-{name}", ["whatif", str(f), "--format", fmt,
                                                     "--set", "expandable_segments:True"]))
            if src.is_dir():
                out.append((f"attribute-source-{fmt}-{name}",
                            ["attribute", str(f), "--format", fmt, "--source", str(src)]))
        if src.is_dir():
            out.append((f"report-source-redacted-{name}", ["report", str(f), "--source", str(src), "--redact-paths",
                                                           "-o", "{tmp}/r.html"]))
        out.append((f"report-redacted-{name}", ["report", str(f), "--redact-paths", "-o", "{tmp}/r.html"]))
        out.append((f"attribute-csv-{name}", ["attribute", str(f), "--format", "csv"]))
        out.append((f"attribute-explain-{name}", ["attribute", str(f), "--explain"]))
        out.append((f"report-{name}", ["report", str(f), "-o", "{tmp}/r.html"]))
    for run in runs[:-1]:
        name = run.name
        for fmt in ("table", "json"):
            out.append((f"ranks-{fmt}-{name}", ["ranks", str(run), "--format", fmt]))
    sw = fx / "sweeps"
    for fmt in ("table", "json"):
        out.append((f"diff-{fmt}-logits", ["diff", str(sw / "logits_float_fix/before.pickle"),
                                           str(sw / "logits_float_fix/after.pickle"), "--format", fmt]))
        points = sorted(map(str, (sw / "attention_threshold").glob("*.pickle")))
        out.append((f"capacity-{fmt}-attention", ["capacity", *points, "--format", fmt]))
    for f in (fx / "whatif").glob("*.pickle"):
        for fmt in ("table", "json"):
            out.append((f"whatif-{fmt}-{f.stem}", ["whatif", str(f), "--format", fmt]))
            out.append((f"whatif-set-{fmt}-{f.stem}", ["whatif", str(f), "--format", fmt,
                                                       "--set", "max_split_size_mb:200"]))
    for engine in ("vllm", "sglang"):
        d = sw / f"{engine}_budget"
        logs = sorted(d.glob("*.log"))
        for fmt in ("table", "json"):
            out.append((f"budget-{fmt}-{engine}", ["budget", *map(str, sorted(d.glob("*.pickle"))), "--format", fmt,
                                                   "--shape-from", str(d / "manifest.csv"),
                                                   *(["--engine-log", str(logs[0])] if logs else [])]))
        out.append((f"budget-explain-{engine}", ["budget", *map(str, sorted(d.glob("*.pickle"))), "--explain",
                                                 "--shape-from", str(d / "manifest.csv"), "--engine-log",
                                                 str(logs[0]), "--total", "80GiB"]))
        last = str(sorted(d.glob("*.pickle"))[-1])
        for fmt in ("table", "json"):
            out.append((f"check-engine-{fmt}-{engine}", ["check", last, "--engine-log", str(logs[0]), "--total",
                                                         "80GiB", "--format", fmt]))
            out.append((f"check-engine-budget-{fmt}-{engine}", ["check", last, "--engine-log", str(logs[0]),
                                                                "--total", "80GiB", "--budget", "1GiB",
                                                                "--format", fmt]))
        out.append((f"report-engine-{engine}", ["report", last, "--engine-log", str(logs[0]), "--capacity", "80GiB",
                                                "-o", "{tmp}/r.html"]))
    out.append(("report-compare-logits", ["report", str(sw / "logits_float_fix/after.pickle"), "--compare",
                                          str(sw / "logits_float_fix/before.pickle"), "-o", "{tmp}/r.html"]))
    out.append(("report-compare-logits-redacted", ["report", str(sw / "logits_float_fix/after.pickle"), "--compare",
                                                   str(sw / "logits_float_fix/before.pickle"), "--redact-paths",
                                                   "-o", "{tmp}/r.html"]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--compare")
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    args = ap.parse_args()
    from snapanalyze.cli import main as cli
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "_tmp"
    tmp.mkdir(exist_ok=True)
    runner = CliRunner()
    for name, argv in cases():
        if args.k not in name:
            continue
        argv = [a.replace("{tmp}", str(tmp)) for a in argv]
        html = tmp / "r.html"
        if html.exists():
            html.unlink()
        r = runner.invoke(cli, argv, catch_exceptions=True)
        text = f"exit {r.exit_code}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}\n"
        if r.exception and not isinstance(r.exception, SystemExit):
            text += f"--- exception\n{type(r.exception).__name__}: {r.exception}\n"
        if html.exists():
            text += "--- html sha256 " + hashlib.sha256(html.read_bytes()).hexdigest() + "\n"
        (out / f"{name}.txt").write_text(text.replace(str(tmp), "<tmp>").replace(str(ROOT), "<root>"))
    if not args.compare:
        return 0
    ref = Path(args.compare)
    names = sorted(p.name for p in out.glob("*.txt"))
    bad = [n for n in names if not (ref / n).exists() or (ref / n).read_bytes() != (out / n).read_bytes()]
    print(f"{len(names) - len(bad)} of {len(names)} outputs identical")
    for n in bad:
        print("differs:", n)
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("COLUMNS", "160")
    sys.exit(main())
