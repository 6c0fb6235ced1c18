"""Out of memory: why each allocation failed (fragmentation, live exhaustion or pressure from outside the
allocator, per `explain_oom`), with its numbers, what was live, the segment map at the failure and what
would have helped, led by the allocation that failed (its bytes, the code that asked and its stack); for a
rank whose request an admission limit refused although nothing failed, that statement instead; for a file that
holds the allocator's state but no trace, what that state can and cannot show."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ...units import fmt_bytes, fmt_count, fmt_duration_us
from .. import oom_text
from ..context import Report
from ..templating import render
from .phrases import VERDICT_NAMES, _capital, phase_at, when_in_window
from .section import ORDER, FigureSpec, Section
from .view import _plain_row, category_rows, segment_rows


def _oom_numbers(o: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of an OOM's numbers table, from one `explain_oom` row."""
    est = "" if o["exact"] else " (est.)"
    rows = [
        ("request (rounded)", o["request_bytes"], f"stream {o['stream']}, {o['segment_type']} pool"),
        ("free on the device", o["device_free_bytes"],
         "reported by the driver at the failure" if o["device_free_bytes"] is not None else "not recorded"),
        ("live (active)", o["active_bytes"], "Σ requested bytes of live blocks"),
        ("in blocks" + est, o["allocated_bytes"], "Σ sizes of blocks in use"),
        ("reserved", o["reserved_bytes"], "Σ segment sizes"),
        ("reserved but free" + est, o["reserved_free_bytes"], f"in {fmt_count(o['free_blocks'], 'free block')}"),
        ("largest usable free block" + est, o["largest_free_block_bytes"],
         f"same stream and pool; the largest of any: {fmt_bytes(o['largest_free_block_any_bytes'])}"),
        ("capacity", o["capacity_bytes"], o["capacity_source"] if o["capacity_bytes"] is not None else
         "unknown: no NVML samples or meta.json (report the run directory to know it)"),
        ("outside the allocator", o["outside_bytes"], o["outside_source"] or "unknown without the capacity"),
    ]
    if o["own_outside_bytes"] is not None or o["other_processes_bytes"] is not None:
        rows.append(("of it: this process (NVML)", o["own_outside_bytes"], "CUDA context, NCCL, libraries"))
        rows.append(("of it: other processes (NVML)", o["other_processes_bytes"], "listed by NVML on the device"))
    if o["shortfall_bytes"]:
        rows.append(("short by", o["shortfall_bytes"], "request − (reserved but free + free on the device)"))
    return [{"name": n, "bytes": None if v is None or v is pd.NA else int(v), "note": note} for n, v, note in rows]


def _failed(view: Any, failed: Any) -> dict[str, Any] | None:
    """The allocation that failed, as the template shows it: bytes, who asked (owner, else the deciding frame;
    paths redacted as everywhere in the report), what it is, its request and span, and its stack."""
    if failed is None:
        return None
    redactor, stack = view.redactor, failed.stack
    return {"size": failed.size, "request": failed.request, "span": failed.span,
            "who": redactor.site(stack.owner or stack.frame) if stack is not None else "",
            "what": (f"{stack.category}{' (inferred)' if stack.inferred else ''}, rule {stack.rule}"
                     if stack is not None else ""),
            "frames": [redactor.site(f) for f in stack.frames] if stack is not None else [],
            "more_frames": stack.more_frames if stack is not None else 0}


def oom_section(report: Report) -> Section | None:
    """Why each allocation failed (`explain_oom`: fragmentation, live exhaustion or pressure from outside
    the allocator), with its numbers, what was live and what would have helped — or, for a rank whose
    request was refused although nothing failed, the statement that an admission limit refused it."""
    entries, refusals, states, verdict = [], [], [], []
    figures: list[FigureSpec] = []
    for view in report.views:
        if view.oom is None:
            continue
        for (_, row), oom in zip(view.oom.ooms.iterrows(), view.oom.verdicts):
            o = _plain_row(row)
            device, index = int(o["device"]), int(o["index"])
            why, advice = oom_text.why(oom), oom_text.advice(oom, view.engine.name, view.redactor.site_path)
            if device not in view.devices:
                continue
            when = when_in_window(view, device, index)
            phase = phase_at(view, device, index)
            when += f", {phase}" if phase else ""
            free = o["device_free_bytes"]
            segments = segment_rows(view, device, index, f"fig-segments-{view.key(device)}-oom-e{index}")
            if segments is not None:
                figures.append(segments["spec"])
            failed = _failed(view, oom.failed)
            entries.append({
                "segments": segments, "failed": failed,
                "device": device, "heading": view.heading(device), "when": when, "verdict": o["verdict"],
                "verdict_name": VERDICT_NAMES.get(o["verdict"], o["verdict"]), "why": _capital(why),
                "advice": advice, "numbers": _oom_numbers(o), "exact": bool(o["exact"]),
                "state_source": o["state_source"], "active": view.timeline[device].active_at(index),
                "rows": category_rows(view, device, index), "anchor": f"oom-{view.key(device)}-e{index}"})
            asked = f" from {failed['who']}" if failed and failed["who"] else ""
            sentence = (f"{_capital(view.where(device))} ran out of memory {when}: a {fmt_bytes(o['request_bytes'])} "
                        f"request{asked} failed"
                        + (f" with {fmt_bytes(free)} free on the device" if free is not None else "")
                        + f". {_capital(why)}.")
            if advice:
                sentence += f" What would have helped: {advice[0]}."
            verdict.append(sentence)
        for item in view.oom.no_oom:
            if not item.rejected_requests or item.device not in view.devices:
                continue
            dt = view.timeline[item.device]
            origin = dt.time_at(0)
            rejected = [{"name": r["name"], "reason": r["reason"],
                         "when": (f"{fmt_duration_us(int(r['time_us']) - origin)} into the window"
                                  if origin is not None and int(r["time_us"]) >= origin else "before the window")}
                        for r in item.rejected_requests]
            said = oom_text.no_oom_message(item)
            refusals.append({"heading": view.heading(item.device), "message": _capital(said), "rejected": rejected})
            verdict.append(f"{_capital(view.where(item.device))}: {said}.")
        for state in view.oom.state_only:
            if state.device in view.devices:
                said = oom_text.state_only_message(state)
                states.append({"heading": view.heading(state.device), "message": _capital(said)})
    if not entries and not refusals and not states:
        return None
    body = render("sections/oom.html.j2", entries=entries, refusals=refusals, states=states)
    return Section(id="oom", title="Out of memory", body=body, figures=tuple(figures), verdict=tuple(verdict),
                   order=ORDER["oom"])
