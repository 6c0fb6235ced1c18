"""The budget check as a JSON document, and its arithmetic written out.

Contract: `budget_document(check)` is the `BudgetCheck` as plain data: the engine's budget (`budget.parts`,
each with bytes, source — log, option, default, derived or missing —, the line or formula, and its
precision), the forward pass's budget and the allocator's capacity on the device, every measured shape with
its verdict ("fits" | "exceeds_budget" | "exceeds_device" | "unknown") and the categories of its forward
pass, and each setting that would fit with its `arithmetic` (a formula with the numbers in it). `fits` is
true when no shape exceeds either budget.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..analyze.budget import BudgetCheck, Part, Setting
from ..units import fmt_bytes
from .text import bound_label


def _part(p: Part) -> dict[str, Any]:
    return {"name": p.name, "bytes": p.bytes, "source": p.source, "detail": p.detail, "precision_bytes": p.precision}


def arithmetic(check: BudgetCheck, s: Setting) -> str:
    """The formula behind setting `s`, with its numbers."""
    b = check.budget
    total = b.part("total").bytes
    need = fmt_bytes(s.need_bytes)
    if s.name in ("gpu_memory_utilization", "mem_fraction_static") and total and s.current is not None:
        return (f"{s.current:.3f} − {need} / {fmt_bytes(total)} = {s.current - s.need_bytes / total:.4f}, "
                f"rounded down to {s.value:.3f}")
    if s.name == "kv_cache_memory" and s.current is not None:
        return f"KV pool {fmt_bytes(int(s.current))} − {need}, rounded up to a MiB = {fmt_bytes(int(s.value))}"
    if s.limit is not None and s.limit.max_x is not None:
        how = ("extrapolated" if s.limit.extrapolated else "within the measured shapes") + (
            f", {bound_label()}" if s.limit.bounded else "")
        return (f"the largest {s.driver} whose modelled peak, reserved, fits the allocator's "
                f"{fmt_bytes(b.capacity.bytes or 0)} on the device ({how})")
    return ""


def budget_document(check: BudgetCheck) -> dict[str, Any]:
    b = check.budget
    return {
        "engine": b.engine, "version": b.version, "generation": b.generation, "source": b.source,
        "budget": {"parts": [_part(p) for p in b.parts], "activation": _part(b.activation),
                   "capacity": _part(b.capacity), "capacity_exact": b.capacity_exact,
                   "ratio": b.ratio, "ratio_source": _part(b.utilization), "kv_bytes_per_token": b.kv_bytes_per_token,
                   "settings": dict(b.settings), "missing": list(b.missing), "notes": list(b.notes)},
        "driver": check.driver,
        "limit": None if check.limit is None else dataclasses.asdict(check.limit),
        "shapes": [{**{k: v for k, v in dataclasses.asdict(s).items() if k != "categories"}, "verdict": s.verdict,
                    "categories": [{"category": c, "bytes": n} for c, n in s.categories]} for s in check.shapes],
        "settings": [{**{k: v for k, v in dataclasses.asdict(s).items() if k != "limit"},
                      "limit": None if s.limit is None else dataclasses.asdict(s.limit),
                      "arithmetic": arithmetic(check, s)} for s in check.settings],
        "notes": list(check.notes),
        "fits": not check.exceeds,
    }
