"""The capacity sweep as a plotly Figure: measured transients, fitted curves, jumps and the budget.

Contract: `capacity_figure(capacity, contract=None, top=5)` returns a `plotly.graph_objects.Figure` and never
shows, writes or prints it. x is the sweep's driver (per-sequence tokens, chunk, images); y is bytes. It
draws the total transient (markers) with its fitted curve per regime over the measured shapes (solid), and
past the last measured shape up to the contract's largest answer — never beyond 2× the largest measured
shape — dashed, in a shaded band labelled extrapolated; the `top` categories / families by their largest
transient (markers and fitted curves); no curve for a regime without a model (too few shapes: the legend
says "insufficient data to fit"); a vertical dotted line at each jump labelled with the category, and —
given a contract — the transient budget as a horizontal line. Curves use the largest
measured concurrency at each x. Deterministic for the same input (no random colours, no timestamps).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from .analyze.capacity import Capacity, Contract, Fit, trusted_bound

_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22")


def _curve(fit: Fit, lo: float, hi: float, multiplier: float) -> tuple[np.ndarray, np.ndarray]:
    xs = np.linspace(lo, hi, 64)
    return xs, fit.predict(multiplier * xs, multiplier * xs * xs)


def capacity_figure(cap: Capacity, contract: Contract | None = None, top: int = 5) -> go.Figure:
    """Transient bytes against the driver, with fits, jumps and the budget (see the module docstring)."""
    pts = cap.points
    fig = go.Figure()
    multiplier = float(pts["multiplier"].max())
    x_max = float(pts["x"].max())
    reach = x_max
    if contract:                                  # the contract's answers are bounded at 2× the measured shapes
        found = [lim.max_x for lim in contract.limits if lim.max_x]
        reach = min(max([x_max, *found]), trusted_bound(cap, multiplier))
    others = [t for t in cap.fits["target"] if t != "total"]
    ranked = sorted(others, key=lambda t: (-float(pts[t].max()), t))[:top]
    for n, target in enumerate(["total", *ranked]):
        color = _PALETTE[n % len(_PALETTE)]
        kind = "total" if target == "total" else str(cap.fits.loc[cap.fits["target"] == target, "kind"].iloc[0])
        name = "total transient" if target == "total" else target + (" (family)" if kind == "family" else "")
        fig.add_trace(go.Scatter(x=pts["x"], y=pts[target], mode="markers", name=name, legendgroup=target,
                                 marker={"color": color, "size": 9 if target == "total" else 7},
                                 customdata=pts["label"], hovertemplate="%{customdata}<br>%{y:,} bytes<extra>"
                                 + name + "</extra>"))
        regimes = cap.regimes[target]
        for r, (lo, last, fit) in enumerate(regimes):
            if not fit.usable:                   # too few shapes (or none) to fit: the markers only
                continue
            final = r == len(regimes) - 1
            xs, ys = _curve(fit, lo, max(last, lo), multiplier)
            label = f"{name}: {fit.model} fit" + (f" from {lo:g}" if len(regimes) > 1 else "")
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=label, legendgroup=target,
                                     line={"color": color, "width": 2 if target == "total" else 1, "dash": "solid"},
                                     hoverinfo="skip"))
            if final and target == "total" and reach > last:
                xs, ys = _curve(fit, last, reach, multiplier)
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="total: extrapolated (not measured)",
                                         legendgroup=target, line={"color": color, "dash": "dash"},
                                         hoverinfo="skip"))
        if not regimes[-1][2].usable:
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"{name}: insufficient data to fit",
                                     legendgroup=target, marker={"color": color, "symbol": "x"}, hoverinfo="skip"))
    for j in cap.jumps.itertuples():
        fig.add_vline(x=(j.from_x + j.to_x) / 2, line_dash="dot", line_color="#444",
                      annotation_text=f"jump: {j.category} {j.how}", annotation_position="top left")
    if reach > x_max:
        fig.add_vrect(x0=x_max, x1=reach, fillcolor="#888", opacity=0.08, line_width=0,
                      annotation_text="extrapolated: beyond the measured shapes", annotation_position="top right")
    if contract:
        fig.add_hline(y=contract.transient_budget_bytes, line_dash="dash", line_color="#d62728",
                      annotation_text="transient budget", annotation_position="bottom right")
    fig.update_layout(title=f"Transient bytes against {cap.driver}", template="plotly_white",
                      xaxis_title=f"{cap.driver} per sequence", yaxis_title="bytes (requested, at the peak)",
                      legend_title_text="target", hovermode="closest")
    return fig
