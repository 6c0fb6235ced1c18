"""Ranks compared (a run only): every rank's peak side by side (`compare_ranks`) as a table and stacked
categories per rank, and for each outlier the categories that differ from the median rank's; its verdict
names the outliers, or says that no rank stands out."""

from __future__ import annotations

import pandas as pd

from ... import plots
from ...units import fmt_bytes
from ..context import Report
from ..templating import render
from .phrases import _capital, _join, _signed, phase_at
from .section import ORDER, FigureSpec, Section
from .view import _instant_anchor, category_rows


def ranks_section(report: Report) -> Section | None:
    """A run's ranks side by side at their peaks (`compare_ranks`): table, stacked categories per rank, and
    for each outlier the categories that differ from the median rank's."""
    if report.run is None or report.run.comparison is None or len(report.run.comparison.table) < 2:
        return None
    comparison = report.run.comparison
    table = comparison.table
    views = {view.rank.rank: view for view in report.views if view.rank is not None}
    multi = table["device"].nunique() > 1
    rows = []
    for r in table.itertuples(index=False):
        rank, device = int(r.rank), int(r.device)
        view = views.get(rank)
        at_peak = ({c["category"]: c["inferred"] for c in category_rows(view, device, int(r.event_index))}
                   if view is not None and device in view.devices else {})
        rows.append({
            "rank": rank, "device": device, "active": int(r.active_bytes), "reserved": int(r.reserved_bytes),
            "nvml_used": None if pd.isna(r.nvml_used_bytes) else int(r.nvml_used_bytes),
            "measured": bool(r.nvml_used_measured),
            "outside": None if pd.isna(r.outside_bytes) else int(r.outside_bytes),
            "top": r.top_category, "top_bytes": None if pd.isna(r.top_category_bytes) else int(r.top_category_bytes),
            "top_inferred": at_peak.get(r.top_category, 0),
            "difference": int(r.difference_bytes), "outlier": bool(r.outlier),
            "median": rank == comparison.median_rank and device == comparison.median_device,
            "phase": phase_at(view, device, int(r.event_index)) if view is not None else None,
            "anchor": _instant_anchor(view, device, int(r.event_index)) if view is not None else None})
    outliers, verdict = [], []
    diffs = comparison.differences
    for r in table[table["outlier"]].itertuples(index=False):
        rank, device = int(r.rank), int(r.device)
        mine = diffs[(diffs["rank"] == rank) & (diffs["device"] == device)]
        cats = [{"category": d.category, "bytes": int(d.bytes), "median": int(d.median_bytes),
                 "difference": int(d.difference_bytes), "share": float(d.share_of_difference)}
                for d in mine.itertuples(index=False)]
        name = f"rank {rank}" + (f", device {device}" if multi else "")
        side = "above" if r.difference_bytes > 0 else "below"
        outliers.append({"name": name, "difference": int(r.difference_bytes), "side": side, "categories": cats})
        view = views.get(rank)
        phase = phase_at(view, device, int(r.event_index)) if view is not None else None
        named = _join([f"{c['category']} {_signed(c['difference'])}" for c in cats[:4]]
                      + ([f"{len(cats) - 4} more"] if len(cats) > 4 else []))
        verdict.append(f"{_capital(name)} peaked {fmt_bytes(abs(int(r.difference_bytes)))} {side} the median rank "
                       f"(rank {comparison.median_rank}){', ' + phase if phase else ''}"
                       + (f": {named}." if named else "."))
    if not outliers:
        verdict.append(f"No rank stands out: every rank's peak lies within 2% (at least 256 MiB) of the median "
                       f"rank's (rank {comparison.median_rank}, {fmt_bytes(int(table['active_bytes'].median()))}).")
    order = [name for name, _ in sorted(report.rules.categories.items(), key=lambda kv: (-kv[1].precedence, kv[0]))]
    figure = FigureSpec("fig-ranks", plots.ranks_figure(table, comparison.categories, order))
    body = render("sections/ranks.html.j2", rows=rows, outliers=outliers, fig_id=figure.id, multi=multi,
                  median=comparison.median_rank, omitted=list(report.run.omitted))
    return Section(id="ranks", title="Ranks compared", body=body, figures=(figure,), verdict=tuple(verdict),
                   order=ORDER["ranks"])
