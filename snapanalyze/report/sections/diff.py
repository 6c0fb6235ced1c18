"""Compared with the baseline (`--compare`): this input against the baseline, peak by aligned peak — the
categories and the stacks that changed (`diff_result`, the largest changes first) and bytes per category
side by side per device."""

from __future__ import annotations

from ... import plots
from ...analyze.diff_result import diff_result
from ...units import fmt_bytes
from ..context import Report
from ..templating import render
from .phrases import _join, _signed
from .section import ORDER, FigureSpec, Section

MAX_DIFF_STACKS = 15          # changed stacks listed per diff (the largest changes)


def diff_section(report: Report) -> Section | None:
    """This input against the baseline (`--compare`): aligned peaks, the categories and stacks that changed
    (`diff_result`), and bytes per category side by side."""
    if not report.diffs:
        return None
    views = {(view.rank.rank if view.rank is not None else None): view for view in report.views}
    parts, figures, verdict = [], [], []
    for item in report.diffs:
        view = views.get(item.rank, report.views[0])
        result = diff_result(item.diff)
        doc = result.to_json()
        baseline = report.redactor.path(item.baseline)
        peaks = [{"device": p["device"], "phase": p["phase"], "a": p["a"]["active_bytes"], "b": p["b"]["active_bytes"],
                  "delta": p["delta"]} for p in doc["peaks"]]
        stacks = []
        for s, shown in zip(result.stacks[:MAX_DIFF_STACKS], doc["stacks"]):
            site, frames = s.labels(view.redactor.site_path)
            stacks.append({**shown, "site": site, "frames": list(frames)})
        devices = []
        for device in sorted({p["device"] for p in doc["peaks"]}):
            fig_id = f"fig-diff-{view.key(device)}"
            figures.append(FigureSpec(fig_id, plots.compare_figure(item.diff.a, item.diff.b, device,
                                                                   labels=("baseline", "this input"))))
            devices.append({"device": device, "heading": view.heading(device), "figure": fig_id})
        parts.append({"rank": item.rank, "baseline": baseline, "instant": doc["instant"], "identical": doc["identical"],
                      "peaks": peaks, "categories": doc["categories"], "stacks": stacks, "counts": doc["counts"],
                      "more_stacks": max(0, len(doc["stacks"]) - MAX_DIFF_STACKS), "notes": doc["notes"],
                      "devices": devices})
        for p in doc["peaks"]:
            if p["scope"] != "global" or p["device"] not in view.devices:
                continue
            where = view.where(p["device"])
            delta = p["delta"]["active_bytes"]
            if doc["identical"]:
                verdict.append(f"Against the baseline {baseline}, the peak on {where} is unchanged: every category and "
                               "every stack holds the same bytes.")
                continue
            move = (f"rose by {fmt_bytes(delta)}" if delta > 0 else f"fell by {fmt_bytes(-delta)}" if delta < 0
                    else "kept its height")
            cats = [c for c in doc["categories"] if c["device"] == p["device"]]
            cats.sort(key=lambda c: (-abs(c["delta_bytes"]), c["category"]))
            named = _join([f"{c['category']} {_signed(c['delta_bytes'])}" for c in cats[:3]])
            counts = doc["counts"]
            moved = _join([f"{counts[k]} {k}" for k in ("new", "vanished", "grew", "shrank") if counts[k]])
            verdict.append(f"Against the baseline {baseline}, the peak on {where} {move} "
                           f"({fmt_bytes(p['a']['active_bytes'])} → {fmt_bytes(p['b']['active_bytes'])})"
                           + (f": {named}" if named else "") + (f"; stacks: {moved}" if moved else "") + ".")
    body = render("sections/diff.html.j2", parts=parts, problems=list(report.problems))
    return Section(id="diff", title="Compared with the baseline", body=body, figures=tuple(figures),
                   verdict=tuple(verdict), order=ORDER["diff"])
