"""Grade `snapanalyze attribute` against a labelled set's truth, program by program and family by family.

Contract: `grade_stem(root, stem, source)` attributes ``root/STEM.pickle`` at its global peak (with
``root/source/STEM`` as `--source` when `source`) and compares every live block with ``labels/blocks-STEM.csv``
by (device, address): `Grade` holds the shares of the peak's active bytes whose category equals the label
(``activations_other`` and ``unknown`` agree with ``other``), whose lifecycle (attribute's ``lifecycle`` column)
equals the label's (weights, gradients, optimizer_state, inputs, kv_cache, workspace, logits, activations;
``unknown`` is no claim and agrees only where the label is ``activations_other``/``unknown``), that got a
different named category (wrong; ``other`` is honest) and the part of that not flagged ``inferred``.
`table(grades)` renders per-program rows and per-family medians, the held-out families (`zoo.HELD_OUT`) apart.
``python -m zoo.grade DIR [--source] [--show-held-out]`` prints it; without ``--show-held-out`` the held-out
families' rows stay hidden (their medians are shown), so rules are not written against them.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from zoo import FAMILIES, HELD_OUT

EQUIV = {"activations_other": "other", "unknown": "other"}
ACTIVATIONS = {"attention", "mlp", "fallback_kernel", "vision_encoder", "activations_other", "unknown",
               "concurrent_request", "communication", "graph_capture"}


def lifecycle_of(category: str) -> str:
    if category in ("weights", "gradients", "optimizer_state", "inputs", "kv_cache", "workspace", "logits"):
        return category
    if category == "other":
        return "unknown"
    return "activations"


@dataclass
class Grade:
    stem: str
    family: str
    total: int
    category: float
    lifecycle: float
    wrong: float
    unflagged: float
    confusion: Counter[tuple[str, str]] = field(default_factory=Counter)

    @property
    def held_out(self) -> bool:
        return self.family in HELD_OUT


def grade_stem(root: Path, stem: str, source: bool) -> Grade:
    import snapanalyze as sa
    truth = json.loads((root / "labels" / "truth.json").read_text())[stem]["0"]
    labels: dict[int, tuple[str, str, int]] = {}
    with open(root / "labels" / f"blocks-{stem}.csv") as f:
        for row in csv.DictReader(f):
            labels[int(row["address"])] = (row["label"], row.get("lifecycle", ""), int(row["size"]))
    roots = [root / "source" / stem] if source and (root / "source" / stem).is_dir() else None
    snap = sa.load(root / f"{stem}.pickle", source=roots)
    blocks = sa.attribute(snap, device=0).blocks
    got = {int(a): (c, bool(i), life) for a, c, i, life in
           zip(blocks["address"], blocks["category"], blocks["inferred"], blocks["lifecycle"])}
    total = int(truth["peak_active_bytes"])
    agree = life = wrong = unflagged = 0
    confusion: Counter[tuple[str, str]] = Counter()
    for addr, (label, truth_life, size) in labels.items():
        cat, inferred, predicted = got.get(addr, ("(missing)", False, "unknown"))
        want = EQUIV.get(label, label)
        if cat == want:
            agree += size
        else:
            confusion[(label, cat)] += size
            if cat not in ("other", "(missing)"):
                wrong += size
                unflagged += 0 if inferred else size
        if predicted == (truth_life or lifecycle_of(want)) or (predicted == "unknown" and want == "other"):
            life += size
    share = (lambda x: x / total) if total else (lambda x: 1.0)
    return Grade(stem, truth.get("family", stem.split("-")[0]), total, share(agree), share(life), share(wrong),
                 share(unflagged), confusion)


def grade_set(root: Path, source: bool) -> list[Grade]:
    truth = json.loads((root / "labels" / "truth.json").read_text())
    return [grade_stem(root, stem, source) for stem in sorted(truth)]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(grades: list[Grade], show_held_out: bool = False) -> str:
    lines = ["| family | program | lifecycle | category | wrong | not flagged |", "|---|---|---|---|---|---|"]
    for g in grades:
        if g.held_out and not show_held_out:
            continue
        name = g.stem.split("-", 1)[1]
        lines.append(f"| {g.family}{' (held out)' if g.held_out else ''} | {name} | {g.lifecycle:.2f} | "
                     f"{g.category:.2f} | {g.wrong:.2f} | {g.unflagged:.2f} |")
    lines += ["", "| family | programs | lifecycle median (min) | category median (min) | wrong max "
              "| not flagged max |", "|---|---|---|---|---|---|"]
    for family in FAMILIES:
        mine = [g for g in grades if g.family == family]
        if mine:
            lines.append(_summary(family + (" (held out)" if family in HELD_OUT else ""), mine))
    seen = [g for g in grades if not g.held_out]
    held = [g for g in grades if g.held_out]
    lines.append("")
    lines.append(_summary("**families in sight**", seen))
    lines.append(_summary("**held-out families**", held))
    lines.append(_summary("**all**", grades))
    return "\n".join(lines)


def _summary(name: str, grades: list[Grade]) -> str:
    if not grades:
        return f"| {name} | 0 | | | | |"
    life = [g.lifecycle for g in grades]
    cat = [g.category for g in grades]
    return (f"| {name} | {len(grades)} | {_median(life):.2f} ({min(life):.2f}) | {_median(cat):.2f} ({min(cat):.2f}) "
            f"| {max(g.wrong for g in grades):.2f} | {max(g.unflagged for g in grades):.2f} |")


def confusions(grades: list[Grade], show_held_out: bool = False, top: int = 12) -> str:
    total: Counter[tuple[str, str]] = Counter()
    for g in grades:
        if g.held_out and not show_held_out:
            continue
        for key, b in g.confusion.items():
            total[key] += b
    return "\n".join(f"  {b / 2**20:10.2f} MiB  {lab} → {cat}" for (lab, cat), b in total.most_common(top))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.grade")
    ap.add_argument("root", type=Path)
    ap.add_argument("--source", action="store_true", help="pass each program's source folder as --source")
    ap.add_argument("--show-held-out", action="store_true", help="show the held-out families' rows too")
    ap.add_argument("--stem", action="append", default=[], help="grade these stems only")
    a = ap.parse_args(argv)
    grades = grade_set(a.root, a.source) if not a.stem else [grade_stem(a.root, s, a.source) for s in a.stem]
    print(table(grades, a.show_held_out))
    print("\nlargest disagreements (label → category):")
    print(confusions(grades, a.show_held_out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
