"""Memory outside the allocator (a run with NVML samples): NVML used − reserved at each peak of each rank,
this process's part and other processes', the samples around the peak, how uncertain the number is when
the sampler was slower than the peak, and the headroom left to the device's capacity."""

from __future__ import annotations

from typing import Any

from ... import plots
from ...units import fmt_bytes, fmt_duration_us
from ..context import RankView, Report
from ..templating import render
from .phrases import WHAT_OUTSIDE, _join, phase_at
from .section import ORDER, FigureSpec, Section
from .view import _instant_anchor, _plain_row


def _outside_row(view: RankView, o: dict[str, Any]) -> dict[str, Any]:
    device = int(o["device"])
    dt = view.timeline[device]
    index = int(o["event_index"])
    capacity, capacity_source = view.capacity(device)
    used = o["nvml_used_bytes"]
    origin = dt.time_at(0)

    def offset(t: Any) -> str | None:
        if t is None or o["time_us"] is None:
            return None
        d = int(t) - int(o["time_us"])
        return f"{fmt_duration_us(abs(d))} {'before' if d < 0 else 'after'}" if d else "at the peak"

    return {
        "heading": view.heading(device), "peak": o["peak"], "anchor": _instant_anchor(view, device, index),
        "when": (f"{fmt_duration_us(int(o['time_us']) - origin)} into the window"
                 if o["time_us"] is not None and origin is not None else f"event {index:,}"),
        "phase": phase_at(view, device, index),
        "reserved": o["reserved_bytes"], "used": used, "measured": bool(o["nvml_used_measured"]),
        "outside": o["outside_bytes"], "low": o["outside_low_bytes"], "high": o["outside_high_bytes"],
        "own": o["own_outside_bytes"], "others": o["other_processes_bytes"], "basis": o["basis"],
        "samples": int(o["samples_during"] or 0), "before": offset(o["sample_before_us"]),
        "after": offset(o["sample_after_us"]), "interval": o["interval_us"], "held": o["duration_us"],
        "uncertain": bool(o["uncertain"]), "note": o["note"], "capacity": capacity,
        "capacity_source": capacity_source,
        "headroom": capacity - (used if used is not None else o["reserved_bytes"]) if capacity is not None else None}


def outside_section(report: Report) -> Section | None:
    """Memory outside the allocator (NVML used − reserved) at each peak of each rank with NVML samples: this
    process's part and other processes', the samples around the peak, and how uncertain the number is when
    the sampler was slower than the peak."""
    rows, missing, series = [], [], {}
    mains: list[str] = []
    others: list[str] = []
    origins = []
    for view in report.views:
        if view.rank is None:
            continue
        if view.outside is None:
            missing.append(view.rank.rank)
            continue
        for _, row in view.outside.iterrows():
            o = _plain_row(row)
            if int(o["device"]) not in view.devices:
                continue
            item = _outside_row(view, o)
            rows.append(item)
            if o["peak"] == 1 and item["outside"] is not None:
                where = view.where(int(o["device"]))
                if item["uncertain"]:
                    how = (f"an estimate: no NVML sample fell inside its {fmt_duration_us(item['held'])} peak"
                           if item["held"] is not None else "an estimate from the samples around it")
                    if item["interval"]:
                        how += f", sampled every {fmt_duration_us(int(item['interval']))}"
                else:
                    how = f"measured by {item['samples']} sample{'s' if item['samples'] != 1 else ''} during it"
                mains.append(f"{fmt_bytes(item['outside'])} on {where} ({how})")
                if item["others"]:
                    others.append(f"{fmt_bytes(item['others'])} on {where}")
        multi = len(view.joined) > 1
        for device, joined in view.joined.items():
            if len(joined):
                series[f"rank {view.rank.rank}" + (f" · device {device}" if multi else "")] = joined
                t = view.timeline[device].time_at(0)
                if t is not None:
                    origins.append(t)
    if not rows:
        return None
    verdict = []
    if mains:
        sentence = f"Memory outside the allocator at the peak (NVML used − reserved): {_join(mains)}."
        if others:
            sentence += f" Of that, other processes held {_join(others)}."
        verdict.append(sentence)
    figures: tuple[FigureSpec, ...] = ()
    if series and origins:
        figures = (FigureSpec("fig-outside", plots.outside_figure(series, min(origins))),)
    body = render("sections/outside.html.j2", rows=rows, missing=missing,
                  fig_id=figures[0].id if figures else None, what=WHAT_OUTSIDE)
    return Section(id="outside", title="Memory outside the allocator", body=body, figures=figures,
                   verdict=tuple(verdict), order=ORDER["outside"])
