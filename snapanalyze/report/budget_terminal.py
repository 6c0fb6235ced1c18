"""The budget check in a terminal: the engine's budget, each measured shape's verdict, the settings that fit.

Contract: `render_budget(check, explain, width)` renders a `BudgetCheck`; `explain` adds where each figure came
from (the log line, the option, the formula) and the arithmetic behind each setting (`budget_documents.arithmetic`).
`part_value`, `signed` and `setting_change` word a figure, a margin and a setting for every target.
"""

from __future__ import annotations

from ..analyze.budget import BudgetCheck, Part, Setting
from ..units import fmt_bytes
from . import text
from .budget_documents import arithmetic

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}
RATIO_NAMES = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static"}
PART_NAMES = {"total": "device total", "utilization": "gpu_memory_utilization", "weights": "weights",
              "activation": "forward pass (profiled activation peak)", "non_torch": "outside PyTorch (non-torch)",
              "cuda_graph_estimate": "CUDA graphs (estimate)", "cuda_graph": "CUDA graphs", "kv_cache": "KV cache pool",
              "mem_fraction_static": "mem_fraction_static", "free_at_start": "free when serving starts"}
SOURCES = {"log": "as logged", "option": "option", "default": "default", "derived": "derived", "missing": "not known"}
VERDICTS = {"fits": "fits", "exceeds_budget": "exceeds the engine's budget", "exceeds_device": "exceeds the device",
            "unknown": "not known"}
NOTES = {
    "non_torch_in_activation": "the log states no non-torch figure: the derived forward-pass budget includes "
                               "memory outside PyTorch (start vLLM with VLLM_LOGGING_LEVEL=DEBUG to see each part)",
    "graph_actual_unknown": "the CUDA graphs' actual size is not in the log",
    "kv_negative": "the log's KV cache figure is negative: no memory was left for the KV pool at this setting, "
                   "so the engine did not start; nothing is budgeted from it",
    "utilization_contradicted": "the stated gpu_memory_utilization does not fit the log's own figures (weights, "
                                "forward pass, non-torch and KV over the total): check which run the log is from",
    "non_torch_unknown": "the log states no memory outside PyTorch (CUDA context, NCCL): the device check takes "
                         "the whole total for the allocator, so it can prove an OOM but not a fit",
    "fragmentation_not_budgeted": "vLLM budgets allocated bytes; the reserved-but-unallocated bytes at each peak "
                                  "(fragmentation) come out of the memory left outside gpu_memory_utilization",
    "outside_not_budgeted": "NVML saw more memory outside the allocator at a peak than the budget leaves for it "
                            "(NCCL buffers at TP > 1, another process, a library's workspace): the device check "
                            "uses what NVML saw",
}


def part_value(p: Part, ratio: float | None = None, precision: bool = True) -> str:
    """A budget part as shown: a ratio to three places, bytes (with ± the log's precision), or – if unknown."""
    if p.name in ("utilization", "mem_fraction_static"):
        return "–" if ratio is None else f"{ratio:.3f}"
    if p.bytes is None:
        return "–"
    shown = fmt_bytes(p.bytes)
    return shown + (f" ±{fmt_bytes(p.precision)}" if precision and p.precision else "")


def _where(p: Part, explain: bool) -> str:
    source = SOURCES.get(p.source, p.source)
    if not explain or not p.detail:
        return source if p.source != "derived" or not p.detail else f"derived: {p.detail}"
    return f"{source}: {p.detail}"


def signed(n: int | None) -> str:
    """An excess (+) or a margin (−) in bytes; – when not known."""
    return "–" if n is None else ("+" if n > 0 else "−") + fmt_bytes(abs(n))


def setting_change(s: Setting) -> tuple[str, str]:
    """A setting as the change to make (``gpu_memory_utilization 0.950 → 0.907``) and the KV pool it leaves."""
    if s.name == "kv_cache_memory":
        change = f"--kv-cache-memory {int(s.value)} ({fmt_bytes(int(s.value))})"
    elif s.name in RATIO_NAMES.values():
        assert s.current is not None                      # a ratio setting is made from the current ratio
        change = f"{s.name} {s.current:.3f} → {s.value:.3f}"
    else:
        now = "" if s.current is None else f"{int(s.current):,} → "
        change = f"{s.name} {now}{int(s.value):,}"
    kv = "" if s.kv_tokens_after is None else f"KV pool {s.kv_tokens_after:,} tokens"
    if s.kv_bytes_after is not None and s.name != "kv_cache_memory":
        kv += f" ({fmt_bytes(s.kv_bytes_after)})" if kv else f"KV pool {fmt_bytes(s.kv_bytes_after)}"
    return change, kv


def notes_of(check: BudgetCheck) -> list[str]:
    """The check's notes then the budget's, each once, worded."""
    return [NOTES.get(n, n) for n in dict.fromkeys(check.notes + check.budget.notes)]


def render_budget(check: BudgetCheck, explain: bool = False, width: int | None = None) -> str:
    b = check.budget
    name = ENGINE_NAMES.get(b.engine, b.engine)
    version = " ".join(x for x in (b.version, f"({b.generation})" if b.generation else None) if x)
    out = [f"{name} {version}".rstrip() + f" memory budget, from {b.source}"]
    rows = [[PART_NAMES.get(p.name, p.name), part_value(p, b.ratio), _where(p, explain)] for p in b.parts]
    out.append(text.table(["part", "value", "from"], rows, right=[False, True, False], width=width))
    cap = b.capacity
    if b.engine == "vllm":
        out.append(f"\nfor one forward pass vLLM budgets {part_value(b.activation)} (allocated bytes, "
                   f"{_where(b.activation, False)})")
    else:
        out.append(f"\nfor one forward pass SGLang leaves {part_value(b.activation)} free (reserved bytes: "
                   "fragmentation counts)")
    out.append(f"the allocator may reserve {part_value(cap)} on the device ({_where(cap, True)})"
               + ("" if b.capacity_exact or cap.bytes is None else ": at most, so a fit is not proven"))
    if b.missing:
        out.append("not known, so not checked: " + ", ".join(b.missing) + " (give them as options: --total, …)")
    keys = [k for k in ("tokens", "batch", "chunk", "images") if any(k in s.shape for s in check.shapes)]
    rows = []
    for s in check.shapes:
        verdict = VERDICTS[s.verdict]
        if s.verdict == "exceeds_device":
            verdict += f" by {fmt_bytes(s.over_device_bytes)} (OOM)"
        elif s.verdict == "exceeds_budget":
            verdict += f" by {fmt_bytes(s.over_budget_bytes)}"
        elif s.verdict == "fits" and not s.device_known:
            verdict = "fits the budget; the device: not proven"
        if s.uncertain:
            verdict += " (within the log's precision)"
        rows.append([s.label, *[str(s.shape.get(k, "–")) for k in keys], fmt_bytes(s.steady_bytes),
                     fmt_bytes(s.activation_bytes), signed(s.over_budget_bytes), fmt_bytes(s.reserved_bytes),
                     signed(s.over_device_bytes), verdict])
    out.append("\nmeasured at each shape (exact): steady = live before the forward pass and kept (weights, KV pool, "
               "buffers); forward pass = the peak above it; reserved = the allocator's bytes at the peak")
    out.append(text.table(["shape", *keys, "steady", "forward pass", "vs budget", "reserved", "vs device", "verdict"],
                          rows, right=[False] + [True] * (len(keys) + 5) + [False], width=width))
    for s in check.exceeds:
        if s.categories:
            made = ", ".join(f"{c} {fmt_bytes(n)}" for c, n in s.categories[:4])
            out.append(f"  {s.label}: the forward pass is {made}"
                       + (f"; fragmentation {fmt_bytes(s.fragmentation_bytes)}" if s.fragmentation_bytes else ""))
    outside = [s for s in check.shapes if s.outside_bytes is not None]
    if outside:
        total = b.part("total").bytes
        room = None if total is None or cap.bytes is None else total - cap.bytes
        out.append("\noutside the allocator at each peak (NVML): "
                   + ("" if room is None else f"the budget leaves {fmt_bytes(room)} for it (total − the allocator's "
                                              "capacity)"))
        for s in outside:
            how = "measured" if s.outside_measured else "estimated from the samples around the peak"
            over = s.outside_over_bytes
            out.append(f"  {s.label}: {fmt_bytes(s.outside_bytes)} ({how})"
                       + ("" if over is None else f", {signed(over)} against the budget"))
    limit = check.limit
    if limit is not None and check.driver:
        if limit.max_x is not None:
            out.append(f"\nthe forward pass fits up to {check.driver} = {limit.max_x:,} (capacity fit"
                       + (", extrapolated" if limit.extrapolated else "")
                       + (f", {text.bound_label()}" if limit.bounded else "") + ")")
        elif limit.insufficient:
            out.append(f"\nno shape limit: the last regime of {check.driver} has fewer than 3 shapes to fit")
    if check.settings:
        worst = check.settings[0]
        against = "the device" if worst.basis == "device" else "the engine's own budget"
        out.append(f"\nsettings that would fit every measured shape ({against} is exceeded by "
                   f"{fmt_bytes(worst.need_bytes)} at most):")
        for setting in check.settings:
            change, kv = setting_change(setting)
            out.append(f"  {change}" + (f"; {kv}" if kv else ""))
            formula = arithmetic(check, setting) if explain else ""
            if formula:
                out.append(f"      {formula}")
    elif check.shapes and not check.exceeds:
        out.append("\nevery measured shape fits")
    out.extend(f"note: {n}" for n in notes_of(check))
    return "\n".join(out)


def render_engine_check(check: BudgetCheck) -> str:
    """One line per measured input against the engine's budget, FAIL or ok first (`check --engine-log`)."""
    out = []
    b = check.budget
    for s in check.shapes:
        if s.verdict == "exceeds_device":
            out.append(f"FAIL  {s.label}: peak reserved {fmt_bytes(s.reserved_bytes)} > the "
                       f"{fmt_bytes(b.capacity.bytes)} the allocator may hold on the device, by "
                       f"{fmt_bytes(s.over_device_bytes)} (an OOM)")
        elif s.verdict == "exceeds_budget":
            out.append(f"FAIL  {s.label}: forward pass {fmt_bytes(s.activation_bytes)} exceeds the "
                       f"engine's budget by {fmt_bytes(s.over_budget_bytes)}")
        elif s.verdict == "unknown":
            out.append(f"FAIL  {s.label}: not checked: the budget lacks {', '.join(b.missing)}")
        else:
            out.append(f"ok    {s.label}: forward pass {fmt_bytes(s.activation_bytes)} and peak reserved "
                       f"{fmt_bytes(s.reserved_bytes)} fit the {b.engine} budget")
    return "\n".join(out)
