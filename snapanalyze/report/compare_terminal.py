"""Terminal rendering of the comparison results as plain text: the typed `DiffResult`, `CapacityResult` and
`CheckReport`s (an engine check is `budget_terminal.render_engine_check`).

Contract: `render_diff`, `render_capacity` and `render_check` take the result and return the text a person
reads in a terminal (`render_check`: one line per limit, its verdict first; `width`, the
terminal's columns, fits the diff's tables into it); nothing here analyses, prints or reads files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .. import units
from . import text

if TYPE_CHECKING:
    from ..analyze.capacity import ContractLimit
    from ..analyze.capacity_result import CapacityResult
    from ..analyze.check_result import CheckReport, CheckRow
    from ..analyze.diff_result import DiffResult

TOP_CATEGORIES = 6          # columns of the per-category transient table
# What one unit of each capacity driver is, for coefficients per unit ("bytes/token", "bytes/token²").
DRIVER_UNIT = {"tokens": "token", "chunk": "token", "images": "image", "batch": "sequence"}


def _signed(n: int | float) -> str:
    return units.fmt_signed_bytes(n)


def render_diff(d: DiffResult, top: int = 15, width: int | None = None) -> str:
    out = [f"A: {d.a}", f"B: {d.b}", f"compared at the {d.instant} of each"]
    rows = []
    for p in d.peaks:
        rows.append([str(p.device), p.phase or "(global)", units.fmt_bytes(p.a.active_bytes),
                     units.fmt_bytes(p.b.active_bytes), _signed(p.delta.active_bytes),
                     _signed(p.delta.baseline_bytes), _signed(p.delta.transient_bytes),
                     _signed(p.delta.reserved_bytes)])
    out.append("\npeaks (B − A):")
    out.append(text.table(["device", "phase", "peak A", "peak B", "Δ peak", "Δ baseline", "Δ transient",
                           "Δ reserved"], rows, right=[True, False] + [True] * 6, width=width))
    if d.identical:
        out.append("\nno difference: every category and every stack holds the same bytes at the peak")
    else:
        if d.categories:
            out.append("\ncategories that changed at the peak (baseline = allocated before the window):")
            out.append(text.table(
                ["device", "category", "A", "B", "Δ", "Δ baseline", "Δ transient", "inferred (A / B)"],
                [[str(c.device), c.category, units.fmt_bytes(c.a_bytes), units.fmt_bytes(c.b_bytes),
                  _signed(c.delta_bytes), _signed(c.b_baseline_bytes - c.a_baseline_bytes),
                  _signed(c.b_transient_bytes - c.a_transient_bytes),
                  f"{text.inferred_share(c.a_inferred_bytes, c.a_bytes) or '–'} / "
                  f"{text.inferred_share(c.b_inferred_bytes, c.b_bytes) or '–'}"]
                 for c in d.categories],
                right=[True, False] + [True] * 6, width=width))
            if any(c.a_inferred_bytes or c.b_inferred_bytes for c in d.categories):
                out.append(f"{text.INFERRED_LEGEND} (attribute --explain shows the arithmetic)")
        n = d.counts
        out.append(f"\nstacks at the peak: {n.new} new, {n.vanished} vanished, {n.grew} grew, "
                   f"{n.shrank} shrank, {n.same} unchanged (frames compared without line numbers)")
        shown = d.stacks[:top]
        if shown:
            out.append(text.table(
                ["status", "Δ", "A", "B", "category", "site"],
                [[s.status + ("*" if s.matched == "site" else ""), _signed(s.delta_bytes), units.fmt_bytes(s.a_bytes),
                  units.fmt_bytes(s.b_bytes), s.category_b or s.category_a or "", s.labels()[0]] for s in shown],
                right=[False, True, True, True, False, False], width=width))
            if len(d.stacks) > top:
                out.append(f"… {len(d.stacks) - top} more (--top, or --format json)")
            if any(s.matched == "site" for s in shown):
                out.append("* matched by its site (the same code and category; the stacks above it differ, as when "
                           "the program's own script moved): a fuzzy match")
    for note in d.notes:
        out.append(f"note: {note}")
    return "\n".join(out)


def _per(unit: str, value: float | None) -> str:
    """A fit coefficient in bytes per unit of the driver: `331 bytes/token²`, `32.00 KiB/token`."""
    if value is None:
        return "–"
    if not value:
        return "0"
    size = f"{value:.3g} bytes" if abs(value) < 1024 else units.fmt_bytes(value)
    return f"{size}/{unit}"


def _limit(lim: ContractLimit, driver: str) -> str:
    """One contract answer: the number and what it rests on (extrapolated, bounded), or why there is none."""
    if lim.insufficient:
        return "insufficient data"
    if lim.max_x is None:
        return f"beyond the measured {driver} ({text.bound_label()})" if lim.bounded else "none fits"
    if lim.bounded:
        return f"{lim.max_x:,} ({text.bound_label()}" + (", model never reaches the budget)" if lim.unbounded
                                                         else ")")
    return f"{lim.max_x:,}" + (" (extrapolated)" if lim.extrapolated else "")


def _short_labels(labels: list[str]) -> list[str]:
    """Labels without what they all share at either end (cut at a separator), for narrow tables:
    `llama-tokens=1024.pickle`, `llama-tokens=2048.pickle` → `1024`, `2048`; the labels when nothing is left."""
    if len(labels) < 2:
        return labels
    seps = "-_=.:#/ "

    def common(items: list[str]) -> int:
        n = 0
        while all(len(x) > n for x in items) and len({x[n] for x in items}) == 1:
            n += 1
        while n and items[0][n - 1] not in seps:
            n -= 1
        return n

    head = common(labels)
    cut = [x[head:] for x in labels]
    tail = common([x[::-1] for x in cut])
    short = [x[: len(x) - tail] for x in cut]
    return short if all(short) and len(set(short)) == len(short) else labels


def _fits_lines(c: CapacityResult, unit: str) -> list[str]:
    """The fits as one sentence each (for terminals too narrow for the fits table)."""
    out = []
    for f in c.fits:
        span = f"{c.driver} {f.from_x:g}–{f.to_x:g}, {f.points} shapes"
        if f.model in ("insufficient", "none"):
            out.append(f"  {f.target}: insufficient data ({span})")
            continue
        terms = [units.fmt_bytes(f.intercept_bytes)] if f.intercept_bytes else []
        terms += [f"{_per(unit, f.linear_bytes)} · t"] if f.linear_bytes else []
        terms += [f"{_per(unit + '²', f.quadratic_bytes)} · q"] if f.quadratic_bytes else []
        out.append(f"  {f.target}: {f.model}, {' + '.join(terms) or '0'}; max residual "
                   f"{100 * (f.max_rel_residual or 0.0):.1f}% ({span})")
    return out


def render_capacity(c: CapacityResult, width: int | None = None) -> str:
    driver = c.driver
    points = c.points
    shapes = [dict(p.shape) for p in points]
    targets = [dict(p.categories) for p in points]
    out = [f"sweep of {len(points)} shapes; the transient follows {driver} (x = {driver} per sequence)"]
    keys = [k for k in ("tokens", "batch", "chunk", "images") if any(k in shape for shape in shapes)]
    rows = [[p.label, *[str(shape.get(k, "–")) for k in keys], units.fmt_bytes(p.baseline_bytes),
             units.fmt_bytes(p.peak_bytes), units.fmt_bytes(p.transient_bytes),
             units.fmt_bytes(p.reserved_bytes)] for p, shape in zip(points, shapes)]
    out.append(text.table(["shape", *keys, "baseline", "peak", "transient", "reserved"], rows,
                          right=[False] + [True] * (len(keys) + 4), width=width))
    cats = sorted({name for t in targets for name, v in t.items() if v.transient_bytes},
                  key=lambda name: (-max(t[name].transient_bytes if name in t else 0 for t in targets), name))
    hidden = cats[TOP_CATEGORIES:]
    cats = cats[:TOP_CATEGORIES]
    if cats:
        out.append("\ntransient per category (high-water of bytes allocated in the window; families marked *):")
        labels = [p.label for p in points]
        if width is not None:                    # the shape table above maps them back
            labels = _short_labels(labels)
        rows = [[lb, *[units.fmt_bytes(t[name].transient_bytes) if name in t else "–" for name in cats]]
                for lb, t in zip(labels, targets)]
        heads = [name + ("*" if any(name in t and t[name].kind == "family" for t in targets) else "")
                 for name in cats]
        out.append(text.table(["shape", *heads], rows, right=[False] + [True] * len(cats), width=width))
        if hidden:
            out.append(f"… and {', '.join(hidden)} (--format json has every category)")
    out.append(f"\nfits ({c.model}):")
    unit = DRIVER_UNIT.get(driver, driver)
    rows = [[f.target, "insufficient data" if f.model == "insufficient" else f.model,
             units.fmt_bytes(f.intercept_bytes), _per(unit, f.linear_bytes), _per(f"{unit}²", f.quadratic_bytes),
             "–" if f.max_rel_residual is None else f"{100 * f.max_rel_residual:.1f}%", str(f.points),
             f"{f.from_x:g}–{f.to_x:g}"] for f in c.fits]
    fits = text.table(["target", "model", "intercept", "linear", "quadratic", "max rel. residual", "points",
                       f"{driver} range"], rows, right=[False, False, True, True, True, True, True, False])
    if width is not None and max(map(len, fits.split("\n"))) > width:
        out.extend(_fits_lines(c, unit))
    else:
        out.append(fits)
    if c.jumps:
        out.append("\njumps (a shape crossed a threshold: more than the shapes before predict):")
        for j in c.jumps:
            out.append(f"  {driver} {j.from_x:g} → {j.to_x:g}: {j.category} {j.how} "
                       f"({units.fmt_bytes(j.bytes_before)} → {units.fmt_bytes(j.bytes_after)}, predicted "
                       f"{units.fmt_bytes(j.predicted_bytes)}); total transient "
                       f"{units.fmt_bytes(j.total_before)} → "
                       f"{units.fmt_bytes(j.total_after)}")
    else:
        out.append("\nno jumps: every category grows as the shapes before it predict")
    k = c.contract
    if k:
        budget = (f"budget {units.fmt_bytes(k.budget_bytes)}" if k.budget_bytes is not None
                  else "a transient budget")
        room = k.transient_budget_bytes
        out.append(f"\ncontract for {budget}: baseline (weights, KV, buffers) {units.fmt_bytes(k.baseline_bytes)}, "
                   + (f"transient may use {units.fmt_bytes(room)} " if room > 0 else
                      f"over the budget by {units.fmt_bytes(-room)} before any transient ")
                   + ("(no model to add a margin to)" if k.limits and all(lim.insufficient for lim in k.limits)
                      else f"(models get a {100 * k.margin:.1f}% margin)"))
        rows = []
        for lim in k.limits:
            total = f"{lim.max_total:,}" if lim.max_total is not None else "–"
            rows.append([str(lim.concurrency), _limit(lim, driver), total, units.fmt_bytes(lim.predicted_bytes)])
        if rows:
            out.append(text.table(["concurrency", f"max {driver}", f"{driver} × concurrency", "modelled transient"],
                                  rows, right=[True, True, True, True], width=width))
        r = k.reserve
        shape = f"{driver} {r.x:g}" + ("" if r.multiplier == 1 else f" × {r.multiplier:g}")
        if r.reserve_bytes is None:
            out.append(f"  reserve for {shape}: insufficient data (not measured, and too few shapes to model it)")
        else:
            headroom = r.headroom_bytes or 0
            out.append(f"  hold back {units.fmt_bytes(r.reserve_bytes)} of workspace beside the baseline for {shape}"
                       + (" (extrapolated)" if r.extrapolated else "")
                       + (f": fits, {units.fmt_bytes(headroom)} to spare" if r.fits else
                          f": does NOT fit, short by {units.fmt_bytes(-headroom)}"))
        for note in k.notes:
            out.append(f"  note: {note}")
    for note in c.notes:
        out.append(f"note: {note}")
    return "\n".join(out)


def render_check(reports: Sequence[tuple[int | None, CheckReport]], title: str, engine_fits: bool | None = None,
                 problems: Sequence[str] = ()) -> str:
    """One line per limit, its verdict first (FAIL, or ok), then the verdict of the whole check: `reports` are
    (rank — None for a lone snapshot —, its CheckReport); `engine_fits` the serving engine's budget's verdict
    when one was checked too."""
    out = [title]
    for rank, report in reports:
        for r in report.checks:
            out.append(_check_line(r, rank))
    failed = [r for _, report in reports for r in report.checks if not r.ok]
    total = sum(len(report.checks) for _, report in reports)
    if failed:
        ranks = sorted({rank for rank, report in reports if rank is not None and not report.passed})
        where = f" (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})" if ranks else ""
        out.append(f"FAILED: {len(failed)} of {total} limit{'s' if total > 1 else ''} exceeded{where}")
    elif engine_fits is None or engine_fits:
        out.append(f"passed: {'all ' if total > 1 else ''}{total} limit{'s' if total > 1 else ''} held")
    else:
        out.append(f"FAILED: the serving engine's budget (above); {'all ' if total > 1 else ''}{total} "
                   f"other limit{'s' if total > 1 else ''} held")
    out.extend(f"warning: {p}" for p in problems)
    return "\n".join(out)


_LIMIT_NAMES = {"budget": "budget", "transient": "max transient", "category": "max"}


def _check_line(r: CheckRow, rank: int | None) -> str:
    """`FAIL  peak active 59.41 GiB > budget 56.00 GiB by 3.41 GiB (rank 1, device 0)`."""
    subject = {"category": f"category {r.subject}", "transient": f"transient ({r.subject})"}.get(
        r.check, r.subject.removesuffix(" bytes"))
    where = ", ".join(([f"rank {rank}"] if rank is not None else []) + [f"device {r.device}"])
    actual, limit = units.fmt_bytes(r.actual_bytes), units.fmt_bytes(r.limit_bytes)
    if r.ok:
        return (f"ok    {subject} {actual} ≤ {_LIMIT_NAMES[r.check]} {limit}, "
                f"{units.fmt_bytes(r.headroom_bytes)} to spare ({where})")
    return (f"FAIL  {subject} {actual} > {_LIMIT_NAMES[r.check]} {limit} by "
            f"{units.fmt_bytes(-r.headroom_bytes)} ({where})")
