"""Terminal rendering of the comparison documents (the dicts of `compare_documents`) as plain text.

Contract: `render_diff`, `render_capacity` and `render_check` take a JSON-ready document and return the text
a person reads in a terminal; nothing here analyses, prints or reads files.
"""

from __future__ import annotations

from typing import Any

from .. import units
from . import text

TOP_CATEGORIES = 6          # columns of the per-category transient table


def _signed(n: int | float) -> str:
    return ("+" if n > 0 else "") + units.fmt_bytes(n) if n else "0"


def render_diff(doc: dict[str, Any], top: int = 15) -> str:
    out = [f"A: {doc['a']}", f"B: {doc['b']}", f"compared at the {doc['instant']} of each"]
    rows = []
    for p in doc["peaks"]:
        rows.append([str(p["device"]), p["phase"] or "(global)", units.fmt_bytes(p["a"]["active_bytes"]),
                     units.fmt_bytes(p["b"]["active_bytes"]), _signed(p["delta"]["active_bytes"]),
                     _signed(p["delta"]["baseline_bytes"]), _signed(p["delta"]["transient_bytes"]),
                     _signed(p["delta"]["reserved_bytes"])])
    out.append("\npeaks (B − A):")
    out.append(text.table(["device", "phase", "peak A", "peak B", "Δ peak", "Δ baseline", "Δ transient",
                           "Δ reserved"], rows, right=[True, False] + [True] * 6))
    if doc["identical"]:
        out.append("\nno difference: every category and every stack holds the same bytes at the peak")
    else:
        if doc["categories"]:
            out.append("\ncategories that changed at the peak (baseline = allocated before the window):")
            out.append(text.table(
                ["device", "category", "A", "B", "Δ", "Δ baseline", "Δ transient"],
                [[str(c["device"]), c["category"], units.fmt_bytes(c["a_bytes"]), units.fmt_bytes(c["b_bytes"]),
                  _signed(c["delta_bytes"]), _signed(c["b_baseline_bytes"] - c["a_baseline_bytes"]),
                  _signed(c["b_transient_bytes"] - c["a_transient_bytes"])] for c in doc["categories"]],
                right=[True, False] + [True] * 5))
        counts = doc["counts"]
        out.append(f"\nstacks at the peak: {counts['new']} new, {counts['vanished']} vanished, {counts['grew']} grew, "
                   f"{counts['shrank']} shrank, {counts['same']} unchanged (frames compared without line numbers)")
        shown = doc["stacks"][:top]
        if shown:
            out.append(text.table(
                ["status", "Δ", "A", "B", "category", "site"],
                [[s["status"], _signed(s["delta_bytes"]), units.fmt_bytes(s["a_bytes"]), units.fmt_bytes(s["b_bytes"]),
                  s["category_b"] or s["category_a"] or "", s["site"]] for s in shown],
                right=[False, True, True, True, False, False]))
            if len(doc["stacks"]) > top:
                out.append(f"… {len(doc['stacks']) - top} more (--top, or --format json)")
    for note in doc["notes"]:
        out.append(f"note: {note}")
    return "\n".join(out)


def _per(unit: str, value: float) -> str:
    return f"{units.fmt_bytes(value)}/{unit}" if value else "0"


def render_capacity(doc: dict[str, Any]) -> str:
    driver = doc["driver"]
    out = [f"sweep of {len(doc['points'])} shapes; the transient follows {driver} (x = {driver} per sequence)"]
    keys = [k for k in ("tokens", "batch", "chunk", "images") if any(k in p["shape"] for p in doc["points"])]
    rows = [[p["label"], *[str(p["shape"].get(k, "–")) for k in keys], units.fmt_bytes(p["baseline_bytes"]),
             units.fmt_bytes(p["peak_bytes"]), units.fmt_bytes(p["transient_bytes"]),
             units.fmt_bytes(p["reserved_bytes"])] for p in doc["points"]]
    out.append(text.table(["shape", *keys, "baseline", "peak", "transient", "reserved"], rows,
                          right=[False] + [True] * (len(keys) + 4)))
    cats = sorted({c for p in doc["points"] for c, v in p["categories"].items() if v["transient_bytes"]},
                  key=lambda c: (-max(p["categories"].get(c, {}).get("transient_bytes", 0) for p in doc["points"]), c))
    hidden = cats[TOP_CATEGORIES:]
    cats = cats[:TOP_CATEGORIES]
    if cats:
        out.append("\ntransient per category (high-water of bytes allocated in the window; families marked *):")
        rows = [[p["label"], *[units.fmt_bytes(p["categories"][c]["transient_bytes"]) if c in p["categories"] else "–"
                               for c in cats]] for p in doc["points"]]
        heads = [c + ("*" if any(p["categories"].get(c, {}).get("kind") == "family" for p in doc["points"]) else "")
                 for c in cats]
        out.append(text.table(["shape", *heads], rows, right=[False] + [True] * len(cats)))
        if hidden:
            out.append(f"… and {', '.join(hidden)} (--format json has every category)")
    out.append(f"\nfits ({doc['model']}):")
    rows = [[f["target"], f["model"], units.fmt_bytes(f["intercept_bytes"]), _per(driver, f["linear_bytes"]),
             _per(f"{driver}²", f["quadratic_bytes"]), f"{100 * f['max_rel_residual']:.1f}%", str(f["points"]),
             f"{f['from_x']:g}–{f['to_x']:g}"] for f in doc["fits"]]
    out.append(text.table(["target", "model", "intercept", "linear", "quadratic", "max rel. residual", "points",
                           f"{driver} range"], rows, right=[False, False, True, True, True, True, True, False]))
    if doc["jumps"]:
        out.append("\njumps (a shape crossed a threshold: more than the shapes before predict):")
        for j in doc["jumps"]:
            out.append(f"  {driver} {j['from_x']:g} → {j['to_x']:g}: {j['category']} {j['how']} "
                       f"({units.fmt_bytes(j['bytes_before'])} → {units.fmt_bytes(j['bytes_after'])}, predicted "
                       f"{units.fmt_bytes(j['predicted_bytes'])}); total transient "
                       f"{units.fmt_bytes(j['total_before'])} → "
                       f"{units.fmt_bytes(j['total_after'])}")
    else:
        out.append("\nno jumps: every category grows as the shapes before it predict")
    c = doc["contract"]
    if c:
        budget = (f"budget {units.fmt_bytes(c['budget_bytes'])}" if c["budget_bytes"] is not None
                  else "a transient budget")
        out.append(f"\ncontract for {budget}: baseline (weights, KV, buffers) {units.fmt_bytes(c['baseline_bytes'])}, "
                   f"transient may use {units.fmt_bytes(c['transient_budget_bytes'])} "
                   f"(models get a {100 * c['margin']:.1f}% margin)")
        rows = []
        for lim in c["limits"]:
            value = ("unbounded" if lim["unbounded"] else "none fits" if lim["max_x"] is None else
                     f"{lim['max_x']:,}" + (" (extrapolated)" if lim["extrapolated"] else ""))
            total = f"{lim['max_total']:,}" if lim["max_total"] is not None else "–"
            rows.append([str(lim["concurrency"]), value, total, units.fmt_bytes(lim["predicted_bytes"])])
        if rows:
            out.append(text.table(["concurrency", f"max {driver}", f"{driver} × concurrency", "modelled transient"],
                                  rows, right=[True, True, True, True]))
        r = c["reserve"]
        out.append(f"  hold back {units.fmt_bytes(r['reserve_bytes'])} of workspace beside the baseline for {driver} "
                   f"{r['x']:g}" + ("" if r["multiplier"] == 1 else f" × {r['multiplier']:g}")
                   + (f": fits, {units.fmt_bytes(r['headroom_bytes'])} to spare" if r["fits"] else
                      f": does NOT fit, short by {units.fmt_bytes(-r['headroom_bytes'])}"))
        for note in c["notes"]:
            out.append(f"  note: {note}")
    for note in doc["notes"]:
        out.append(f"note: {note}")
    return "\n".join(out)


def render_check(doc: dict[str, Any]) -> str:
    out = [doc["source"]]
    rows = [["ok" if r["ok"] else "OVER", str(r["device"]), r["check"], r["subject"],
             units.fmt_bytes(r["actual_bytes"]), units.fmt_bytes(r["limit_bytes"]), _signed(r["headroom_bytes"])]
            for r in doc["checks"]]
    out.append(text.table(["", "device", "check", "subject", "actual", "limit", "headroom"], rows,
                          right=[False, True, False, False, True, True, True]))
    out.append("passed" if doc["passed"] else f"FAILED: {len(doc['failures'])} limit(s) exceeded")
    return "\n".join(out)
