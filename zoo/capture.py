"""Capture one zoo program: ``python -m zoo.capture FAMILY/NAME OUT``.

Contract: `capture(program, out)` imports ``zoo.programs.<family>.<name>``, seeds every generator, runs its
``main(cap)`` under `snapanalyze.collect.cpu.capture` (the program's ``SETTINGS``: allocator settings) with a
deterministic clock — what `main` returns is what the program still holds when it dumps its snapshot — and
writes into `out` the labelled-set layout for it (STEM = ``<family>-<name>``):
``STEM.pickle`` (the snapshot in the program's ``TORCH`` layout, file paths shown as another machine's:
``/home/user/zoo/…`` for the zoo, ``/opt/conda/lib/python3.11/…`` for the standard library and site-packages),
``labels/blocks-STEM.csv`` (every block live at the snapshot's global peak of active bytes, as `snapanalyze`
finds it, labelled by `truth.py`), ``labels/STEM.truth.json`` (that device's entry of ``truth.json``) and
``source/STEM/zoo/…`` (the program's folder, the checkout a user would pass as ``--source``). Returns the truth
entry. Nothing is downloaded (``HF_HUB_OFFLINE``).
"""

from __future__ import annotations

import csv
import importlib
import io
import itertools
import json
import os
import pickle
import random
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

ZOO = Path(__file__).resolve().parent
START_US = 1_780_000_000_000_000          # the deterministic clock's start (µs since the epoch), 1 µs per entry
SHOWN = {"zoo": "/home/user/zoo/", "site": "/opt/conda/lib/python3.11/site-packages/",
         "stdlib": "/opt/conda/lib/python3.11/"}


def stem_of(program: str) -> str:
    return program.replace("/", "-")


def shown_paths() -> dict[str, str]:
    """This machine's prefixes → the ones the snapshots show."""
    out = {str(ZOO) + "/": SHOWN["zoo"], sysconfig.get_paths()["stdlib"] + "/": SHOWN["stdlib"]}
    for key in ("purelib", "platlib"):
        out[sysconfig.get_paths()[key] + "/"] = SHOWN["site"]
    return out


def capture(program: str, out: Path) -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import numpy as np
    import torch

    import snapanalyze as sa
    from snapanalyze.analyze.peaks import global_peak_index
    from snapanalyze.atomic import write_atomic
    from snapanalyze.collect import cpu
    from zoo.truth import Mapping

    family, name = program.split("/")
    module = importlib.import_module(f"zoo.programs.{family}.{name}")
    stem = stem_of(program)
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ticks = itertools.count(START_US)
    with cpu.capture(settings=getattr(module, "SETTINGS", ""), clock=lambda: next(ticks)) as cap:
        alive = module.main(cap)        # what the program still holds when it dumps its snapshot
        snapshot = cap.snapshot(getattr(module, "TORCH", "2.13"), paths=shown_paths())
        rows_at = cap.rows                       # the truth is read before what the program held is let go
    (out / "labels").mkdir(parents=True, exist_ok=True)
    path = out / f"{stem}.pickle"
    data = pickle.dumps(snapshot, protocol=4)
    write_atomic(path, lambda f: f.write(data))
    snap = sa.load(path)
    timeline = sa.replay(snap)
    if not timeline.devices:
        raise SystemExit(f"{program}: the capture recorded no block")
    dt = timeline[0]
    index = global_peak_index(dt)
    mapping = Mapping.load(program)
    rows = rows_at(index, mapping.label)
    del alive
    total = sum(int(r["size"]) for r in rows)
    if total != dt.active_at(index):
        raise SystemExit(f"{program}: the truth holds {total} B at the peak, the replay {dt.active_at(index)} B")
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]) if rows else ["device"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(out / "labels" / f"blocks-{stem}.csv", lambda f: f.write(text.getvalue().encode()))
    labels: dict[str, int] = {}
    lifecycles: dict[str, int] = {}
    for r in rows:
        labels[str(r["label"])] = labels.get(str(r["label"]), 0) + int(r["size"])
        lifecycles[str(r["lifecycle"])] = lifecycles.get(str(r["lifecycle"]), 0) + int(r["size"])
    entry = {"0": {"peak_active_bytes": total, "labels": dict(sorted(labels.items(), key=lambda kv: -kv[1])),
                   "lifecycles": dict(sorted(lifecycles.items(), key=lambda kv: -kv[1])),
                   "confidence": "exact", "family": family, "program": name, "peak_event": index,
                   "notes": " ".join((module.__doc__ or "").split())}}
    doc = json.dumps({stem: entry}, indent=1).encode()
    write_atomic(out / "labels" / f"{stem}.truth.json", lambda f: f.write(doc))
    root = out / "source" / stem
    if root.exists():
        shutil.rmtree(root)
    source = root / "zoo" / "programs" / family
    source.mkdir(parents=True)
    for py in (ZOO / "programs" / family).glob("*.py"):
        shutil.copy(py, source / py.name)
    for relative in library_files(snapshot):
        # what `--source` reads on the machine that ran the program: the installed libraries its frames name
        for key in ("purelib", "platlib"):
            found = Path(sysconfig.get_paths()[key]) / relative
            if found.is_file():
                (root / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(found, root / relative)
                break
    return entry


def library_files(snapshot: dict[str, Any]) -> set[str]:
    """The installed files (package-relative paths) that a snapshot's frames name."""
    prefix = SHOWN["site"]
    found: set[str] = set()
    frames = [f for seg in snapshot.get("segments", []) for b in seg.get("blocks", []) for f in b.get("frames", [])]
    frames += [f for trace in snapshot.get("device_traces", []) for e in trace for f in e.get("frames", [])]
    for f in frames:
        name = f.get("filename", "")
        if name.startswith(prefix) and name.endswith(".py"):
            found.add(name[len(prefix):])
    return found


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m zoo.capture FAMILY/NAME OUT", file=sys.stderr)
        return 2
    capture(args[0], Path(args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
