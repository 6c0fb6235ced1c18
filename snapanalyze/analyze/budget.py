"""Check a serving engine's memory budget against the peaks measured at real batch shapes.

Contract: `engine_budget(config)` decomposes what the engine budgeted (`Budget`): weights, the forward
pass's share, memory outside the allocator, CUDA graphs, the KV pool, the device total; each `Part` says
whether the log stated it, an option gave it, a default or a derivation did (and from what). Two figures
decide:
- `activation`, what the engine set aside for one forward pass. vLLM budgets *allocated* bytes: its profiled
  activation peak (torch's peak allocated bytes over a dummy batch of max_num_batched_tokens, above what was
  allocated before it; V0 worker.py and V1 gpu_worker.py `determine_available_memory` with
  `utils.memory_profiling`, 0.6.4–0.21+). Where the log does not print it (V1 prints it at DEBUG only) it is
  derived from total × gpu_memory_utilization = weights + activation + non-torch + KV (+ the CUDA graph
  estimate from 0.21), and then includes non-torch memory unless that is stated. SGLang budgets no forward
  pass: it leaves the memory beyond mem_fraction_static free, so its `activation` is the free memory its log
  reports when serving starts (after CUDA graphs; `model_runner.py`), in reserved bytes.
- `capacity`, the bytes PyTorch's allocator may reserve on the device before it fails: the total less the
  memory outside the allocator. vLLM: total − non-torch (without a non-torch figure, the total: an upper
  bound, `capacity_exact` False); SGLang: weights + KV + CUDA graphs + the free memory at start (each as
  logged: what the allocator held or could still get).
`check_budget(budget, sweep, capacity_fit)` measures each shape of the sweep exactly. Its steady state is what was
live before the forward pass began and stays: the bytes live when the window began, or at least the
`weights`, `kv_cache` and `graph_capture` bytes live at the peak (a recording that began before start-up).
The forward pass is the peak above it (allocated bytes), split by category. Per shape: against the engine's
own budget (vLLM: the forward pass's allocated bytes against its activation peak; SGLang: the reserved
bytes against its capacity, which is its budget), against the device (reserved bytes at the peak against
`capacity`), by how much, and whether within the log's precision. Where the input is a run with NVML
samples, the memory outside the allocator at each peak is measured (NVML used − reserved: CUDA context, NCCL,
libraries, other processes) and set against what the budget leaves outside the allocator (total − capacity:
vLLM's non-torch figure): the excess (`outside_over_bytes`; NCCL at TP > 1, another process, a library's
workspace) is what the engine did not budget, and the device check then uses what NVML saw (reserved +
outside against the total; proven when a sample fell inside the peak). `Setting`s are what would make every
measured shape fit: for vLLM gpu_memory_utilization, kv_cache_memory (the KV pool given directly) and
max_num_batched_tokens; for SGLang mem_fraction_static and chunked_prefill_size; each with the KV pool and
tokens it leaves (from the log's pool size per token) and, for a shape limit, the capacity fit's answer
(bounded and labelled extrapolated as `capacity` is). Missing figures are named, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..batch_shape import SHAPE_KEYS
from ..display import HtmlDisplay
from ..engine_config import EngineConfig, Figure
from .capacity import Capacity, DriverLimit, max_driver_value
from .sweep import Sweep

STEADY = ("weights", "kv_cache", "graph_capture")
VLLM_DEFAULT_UTILIZATION = 0.9          # vllm/config/cache.py CacheConfig.gpu_memory_utilization
VLLM_GRAPH_ESTIMATE_DEFAULT_FROM = (0, 21)   # 0.21.0: the CUDA graph estimate is subtracted by default
MiB = 1 << 20


@dataclass(frozen=True)
class Part:
    """One figure of the budget: bytes (None: not known), where it came from and its precision in bytes."""

    name: str
    bytes: int | None
    source: str            # "log" | "option" | "default" | "derived" | "missing"
    detail: str
    precision: int = 0


@dataclass(frozen=True)
class Budget:
    """An engine's memory budget (module docstring); `parts` in the order a reader adds them up."""

    engine: str
    version: str | None
    generation: str | None
    source: str
    parts: tuple[Part, ...]
    activation: Part
    capacity: Part                      # bytes the allocator may reserve on the device
    capacity_exact: bool                # False: an upper bound (memory outside the allocator not known)
    utilization: Part                   # where vLLM's gpu_memory_utilization / SGLang's mem_fraction_static came from
    ratio: float | None                 # its value
    kv_bytes_per_token: float | None
    settings: dict[str, float]          # the scheduling limits the log states (max_num_batched_tokens, …)
    missing: tuple[str, ...]            # figures a full check needs that neither the log nor an option gave
    notes: tuple[str, ...] = ()         # codes: non_torch_in_activation, graph_actual_unknown

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)


@dataclass(frozen=True)
class ShapeCheck:
    """One measured shape against the budget (module docstring)."""

    label: str
    shape: dict[str, int]
    peak_bytes: int
    reserved_bytes: int
    steady_bytes: int
    activation_bytes: int               # peak − steady (allocated, exact)
    fragmentation_bytes: int            # reserved − allocated at the peak
    over_budget_bytes: int | None       # > 0: by how much the engine's own budget is exceeded
    over_device_bytes: int | None       # > 0: by how much the device is exceeded (an OOM)
    device_known: bool                  # False: capacity is an upper bound, so "fits" is not proven
    uncertain: bool                     # the verdict is within the log's precision
    categories: tuple[tuple[str, int], ...]   # the forward pass's categories at the peak, largest first
    outside_bytes: int | None = None    # memory outside the allocator at the peak, from the rank's NVML samples
    outside_measured: bool = False      # an NVML sample fell while the peak held (else the nearest samples)
    outside_over_bytes: int | None = None   # outside − what the budget leaves outside the allocator (> 0: missed)

    @property
    def verdict(self) -> str:
        if self.over_device_bytes is not None and self.over_device_bytes > 0:
            return "exceeds_device"
        if self.over_budget_bytes is not None and self.over_budget_bytes > 0:
            return "exceeds_budget"
        if self.over_budget_bytes is None and (self.over_device_bytes is None or not self.device_known):
            return "unknown"
        return "fits"


@dataclass(frozen=True)
class Setting:
    """A setting that makes every measured shape fit (module docstring). `current` None: not known."""

    name: str
    current: float | None
    value: float
    need_bytes: int                     # what had to be freed for the forward pass
    basis: str                          # "device" | "budget": what the need was measured against
    kv_bytes_after: int | None
    kv_tokens_after: int | None
    limit: DriverLimit | None = None    # for a shape limit: the fit's answer
    driver: str | None = None


@dataclass(frozen=True)
class BudgetCheck(HtmlDisplay):
    """The budget against each measured shape (module docstring); in Jupyter it shows as the report does."""

    budget: Budget
    shapes: tuple[ShapeCheck, ...]
    settings: tuple[Setting, ...]
    limit: DriverLimit | None           # the largest driver value whose peak fits the device (or budget)
    driver: str | None
    notes: tuple[str, ...]

    @property
    def exceeds(self) -> tuple[ShapeCheck, ...]:
        return tuple(s for s in self.shapes if s.verdict in ("exceeds_device", "exceeds_budget"))


# ---------------------------------------------------------------------------------------------------------
# The budget
# ---------------------------------------------------------------------------------------------------------

def _part(name: str, figure: Figure | None, missing: str = "") -> Part:
    if figure is None:
        return Part(name, None, "missing", missing)
    return Part(name, int(round(figure.value)), figure.source, figure.detail, int(math.ceil(figure.precision)))


def _ratio(name: str, figure: Figure) -> Part:
    """A share of the device (gpu_memory_utilization, mem_fraction_static): no bytes of its own; its value is
    `Budget.ratio`, the part says where it came from."""
    return Part(name, None, figure.source, figure.detail)


def _derived(name: str, value: float, formula: str, precision: float) -> Part:
    return Part(name, int(round(value)), "derived", formula, int(math.ceil(precision)))


def _version(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


UTILIZATION_TOLERANCE = 0.02     # a stated gpu_memory_utilization further than this from the figures' is contradicted


def _implied_utilization(f: Mapping[str, Figure], total: Part, weights: Part, kv: Part,
                         non_torch: Part) -> tuple[float, str] | None:
    """The gpu_memory_utilization the log's own figures imply — (non-KV + KV) / total, or (weights + activation
    peak + non-torch + KV) / total — and how it was worked out; None where they do not say."""
    if not total.bytes or kv.bytes is None:
        return None
    gib = 1 << 30
    if "non_kv_bytes" in f:
        used = f["non_kv_bytes"].value + kv.bytes
        how = (f"(non-KV {f['non_kv_bytes'].value / gib:.2f} + KV {kv.bytes / gib:.2f} GiB) / total "
               f"{total.bytes / gib:.2f} GiB")
    elif "activation_peak_bytes" in f and weights.bytes is not None and non_torch.bytes is not None:
        used = weights.bytes + f["activation_peak_bytes"].value + non_torch.bytes + kv.bytes
        how = (f"(weights + activation peak + non-torch + KV = {used / gib:.2f} GiB) / total "
               f"{total.bytes / gib:.2f} GiB")
    else:
        return None
    share = used / total.bytes
    return (share, how) if 0 < share <= 1 else None


def _vllm(config: EngineConfig) -> Budget:
    f = config.figures
    total = _part("total", f.get("total_bytes"), "give --total")
    weights, kv = _part("weights", f.get("weights_bytes")), _part("kv_cache", f.get("kv_cache_bytes"))
    non_torch = _part("non_torch", f.get("non_torch_bytes"))
    estimate = _part("cuda_graph_estimate", f.get("cuda_graph_estimate_bytes"))
    actual = _part("cuda_graph", f.get("cuda_graph_bytes"))
    notes = ["graph_actual_unknown"] if actual.bytes is None and estimate.bytes else []
    if kv.bytes is not None and kv.bytes < 0:
        # vLLM logs a negative KV figure when nothing is left for the pool (and then refuses to start): a figure
        # that says the budget failed, never bytes to budget with
        kv = Part("kv_cache", None, "log", f"{kv.detail} — negative: the engine found no room for a KV pool "
                  "(vLLM stops there: 'No available memory for the cache blocks')")
        notes.append("kv_negative")
    util_fig = f.get("utilization")
    implied = _implied_utilization(f, total, weights, kv, non_torch)
    if util_fig is not None:
        util, util_part = util_fig.value, _ratio("utilization", util_fig)
        if implied is not None and abs(implied[0] - util_fig.value) > UTILIZATION_TOLERANCE:
            notes.append("utilization_contradicted")
    elif implied is not None:
        # vLLM sizes the KV pool as total × gpu_memory_utilization − the rest: the log's figures say what it was.
        util = round(implied[0], 3)
        util_part = Part("utilization", None, "derived", f"{implied[1]} = {util:.3f} (the log does not print "
                         "gpu_memory_utilization; its own figures imply it)")
    else:
        util = VLLM_DEFAULT_UTILIZATION
        util_part = Part("utilization", None, "default", f"vLLM's default gpu_memory_utilization "
                         f"{VLLM_DEFAULT_UTILIZATION}, assumed: the log neither prints it nor states the figures "
                         "that imply it")
    applied_fig = f.get("cuda_graph_estimate_applied")
    version = _version(config.version)
    applied = bool(applied_fig.value) if applied_fig else bool(
        version is not None and version >= VLLM_GRAPH_ESTIMATE_DEFAULT_FROM and estimate.bytes)
    graph_budget = (estimate.bytes or 0) if applied else 0
    missing: list[str] = []
    precision = sum(p.precision for p in (total, weights, kv, non_torch))
    # the forward pass's budget
    if "activation_peak_bytes" in f:
        activation = _part("activation", f["activation_peak_bytes"])
    elif "torch_peak_bytes" in f and weights.bytes is not None:
        tp = f["torch_peak_bytes"]
        activation = _derived("activation", tp.value - weights.bytes, "torch peak − weights",
                              tp.precision + weights.precision)
    elif "non_kv_bytes" in f and weights.bytes is not None and non_torch.bytes is not None:
        nk = f["non_kv_bytes"]
        activation = _derived("activation", nk.value - weights.bytes - non_torch.bytes, "non-KV − weights − non-torch",
                              nk.precision + weights.precision + non_torch.precision)
    elif None not in (total.bytes, weights.bytes, kv.bytes):
        assert total.bytes is not None and weights.bytes is not None and kv.bytes is not None
        value = total.bytes * util - weights.bytes - kv.bytes - (non_torch.bytes or 0) - graph_budget
        formula = "total × gpu_memory_utilization − weights − KV" + (" − non-torch" if non_torch.bytes is not None
                                                                     else " (non-torch memory included)")
        activation = _derived("activation", value, formula + (" − CUDA graph estimate" if graph_budget else ""),
                              precision)
        if non_torch.bytes is None:
            notes.append("non_torch_in_activation")
    else:
        activation = Part("activation", None, "missing", "the log states no activation peak, and total, weights "
                          "and KV pool are needed to derive it")
        missing += [p.name for p in (total, weights, kv) if p.bytes is None]
    # what the allocator may hold on the device
    if total.bytes is not None and non_torch.bytes is not None:
        capacity = _derived("capacity", total.bytes - non_torch.bytes, "total − non-torch",
                            total.precision + non_torch.precision)
    elif total.bytes is not None:
        capacity = _derived("capacity", total.bytes, "total (memory outside the allocator not known: an upper "
                            "bound)", total.precision)
        notes.append("non_torch_unknown")
    else:
        capacity = Part("capacity", None, "missing", "needs the device total (--total)")
        missing.append("total")
    tokens = f.get("kv_cache_tokens")
    per_token = kv.bytes / tokens.value if tokens and tokens.value > 0 and kv.bytes else None
    parts = (total, util_part, weights, activation, non_torch, estimate, actual, kv)
    settings = {k: f[k].value for k in ("max_num_batched_tokens", "max_num_seqs", "max_model_len") if k in f}
    return Budget("vllm", config.version, config.generation, config.source, parts, activation, capacity,
                  non_torch.bytes is not None, util_part, util, per_token, settings, tuple(dict.fromkeys(missing)),
                  tuple(notes))


def _sglang(config: EngineConfig) -> Budget:
    f = config.figures
    total = _part("total", f.get("total_bytes"), "give --total")
    weights, kv = _part("weights", f.get("weights_bytes")), _part("kv_cache", f.get("kv_cache_bytes"))
    graphs = _part("cuda_graph", f.get("cuda_graph_bytes"))
    missing: list[str] = []
    if "free_after_startup_bytes" in f:
        free = _part("free_at_start", f["free_after_startup_bytes"])
    elif "free_after_pool_bytes" in f:
        pool = f["free_after_pool_bytes"]
        free = _derived("free_at_start", pool.value - (graphs.bytes or 0),
                        "free after the KV pool" + (" − CUDA graphs" if graphs.bytes else ""),
                        pool.precision + graphs.precision)
    else:
        free = Part("free_at_start", None, "missing", "the log states no free memory after start-up ('Memory pool "
                    "end', 'Capture cuda graph end')")
        missing.append("free_at_start")
    outside = Part("non_torch", None, "missing", "not stated by SGLang")
    if None not in (total.bytes, weights.bytes, kv.bytes, free.bytes):
        assert total.bytes is not None and weights.bytes is not None and kv.bytes is not None and free.bytes is not None
        outside = _derived("non_torch", total.bytes - weights.bytes - kv.bytes - (graphs.bytes or 0) - free.bytes,
                           "total − weights − KV − CUDA graphs − free (CUDA context, NCCL, library workspaces)",
                           total.precision + weights.precision + kv.precision + graphs.precision + free.precision)
    mfs_fig = f.get("mem_fraction_static")
    mfs = _ratio("mem_fraction_static", mfs_fig) if mfs_fig else Part(
        "mem_fraction_static", None, "missing", "the log's server_args line states it")
    tokens = f.get("kv_cache_tokens")
    per_token = kv.bytes / tokens.value if tokens and tokens.value > 0 and kv.bytes else None
    activation = Part("activation", free.bytes, free.source, "SGLang leaves the memory beyond mem_fraction_static "
                      "free for the forward pass: " + free.detail, free.precision)
    held = [weights, kv, free]
    if None in (p.bytes for p in held):
        capacity = Part("capacity", None, "missing", "needs the weights, KV pool and free memory the log states")
    else:
        capacity = _derived("capacity", sum(p.bytes or 0 for p in (*held, graphs)),
                            "weights + KV + CUDA graphs + free at start", sum(p.precision for p in (*held, graphs)))
    settings = {k: f[k].value for k in ("chunked_prefill_size", "max_running_requests", "max_model_len") if k in f}
    return Budget("sglang", config.version, config.generation, config.source,
                  (total, mfs, weights, kv, graphs, outside, free), activation, capacity, True, mfs,
                  mfs_fig.value if mfs_fig else None, per_token, settings, tuple(missing))


def engine_budget(config: EngineConfig) -> Budget:
    """The engine's budget decomposed (module docstring)."""
    return _vllm(config) if config.engine == "vllm" else _sglang(config)


# ---------------------------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------------------------

def _shape(row: dict[str, Any]) -> dict[str, int]:
    return {k: int(row[k]) for k in SHAPE_KEYS if k in row and pd.notna(row[k])}


def _shape_checks(budget: Budget, sweep: Sweep) -> list[ShapeCheck]:
    cats = sweep.categories[sweep.categories["kind"] == "category"]
    out = []
    vllm = budget.engine == "vllm"
    allowed, capacity = budget.activation.bytes, budget.capacity.bytes
    total = budget.part("total").bytes
    precision = max(budget.activation.precision, budget.capacity.precision)
    for row in sweep.shapes.to_dict("records"):
        mine = cats[cats["label"] == row["label"]]
        at_peak = dict(zip(mine["target"], mine["peak_bytes"].astype(np.int64).tolist()))
        at_start = dict(zip(mine["target"], mine["baseline_bytes"].astype(np.int64).tolist()))
        peak, reserved = int(row["peak_bytes"]), int(row["reserved_bytes"])
        baseline = int(row["baseline_bytes"])
        persistent = int(sum(at_peak.get(c, 0) for c in STEADY))
        if baseline >= persistent:            # the window began after start-up: its start is the steady state
            steady, parts = baseline, {c: b - at_start.get(c, 0) for c, b in at_peak.items()}
        else:
            steady, parts = persistent, {c: b for c, b in at_peak.items() if c not in STEADY}
        activation = peak - steady
        over_device = None if capacity is None else reserved - capacity
        if vllm:
            over_budget = None if allowed is None else activation - allowed
        else:
            over_budget = over_device                       # SGLang's budget is the allocator's capacity
        outside = None if pd.isna(row.get("outside_bytes", pd.NA)) else int(row["outside_bytes"])
        outside_over = None if outside is None or capacity is None or total is None else outside - (total - capacity)
        device_known = budget.capacity_exact
        if outside is not None and total is not None:       # the device as NVML saw it, not as budgeted
            over_device = reserved + outside - total
            device_known = device_known or bool(row.get("outside_measured", False))
        uncertain = any(v is not None and abs(v) <= precision for v in (over_budget, over_device))
        forward = sorted(((c, b) for c, b in parts.items() if b > 0), key=lambda cb: (-cb[1], cb[0]))
        out.append(ShapeCheck(str(row["label"]), _shape(row), peak, reserved, steady, activation, reserved - peak,
                              over_budget, over_device, device_known, uncertain, tuple(forward), outside,
                              bool(row.get("outside_measured", False)), outside_over))
    return out


def _offset(cap: Capacity) -> float:
    """Reserved bytes at the peak beyond the window's transient, at most over the shapes: the transient a
    capacity allows is that capacity less this."""
    shapes = cap.sweep.shapes
    return float((shapes["reserved_bytes"] - shapes["transient_bytes"]).max())


def _kv_after(budget: Budget, freed: float) -> tuple[int | None, int | None]:
    kv = budget.part("kv_cache").bytes
    if kv is None:
        return None, None
    after = int(kv - freed)
    tokens = None if budget.kv_bytes_per_token is None else max(int(after // budget.kv_bytes_per_token), 0)
    return after, tokens


def _settings(budget: Budget, cap: Capacity | None, shapes: list[ShapeCheck], limit: DriverLimit | None
              ) -> list[Setting]:
    device = [s.over_device_bytes for s in shapes if s.over_device_bytes is not None]
    own = [s.over_budget_bytes for s in shapes if s.over_budget_bytes is not None]
    if device and max(device) > 0:
        need, basis = max(device), "device"
    elif own and max(own) > 0:
        need, basis = max(own), "budget"
    else:
        return []
    out = []
    total = budget.part("total").bytes
    ratio = budget.ratio
    name = "gpu_memory_utilization" if budget.engine == "vllm" else "mem_fraction_static"
    if total and ratio is not None:
        value = math.floor((ratio - need / total) * 1000) / 1000
        kv_after, tokens_after = _kv_after(budget, (ratio - value) * total)
        out.append(Setting(name, ratio, value, int(need), basis, kv_after, tokens_after))
    kv = budget.part("kv_cache").bytes
    if budget.engine == "vllm" and kv is not None:
        freed = math.ceil(need / MiB) * MiB
        kv_after, tokens_after = _kv_after(budget, freed)
        out.append(Setting("kv_cache_memory", float(kv), float(kv - freed), int(need), basis, kv_after, tokens_after))
    if cap is not None and limit is not None and limit.max_x is not None and cap.driver in ("tokens", "chunk") \
            and basis == "device":
        knob = "max_num_batched_tokens" if budget.engine == "vllm" else "chunked_prefill_size"
        current = budget.settings.get(knob)
        kv_after, tokens_after = _kv_after(budget, 0)
        out.append(Setting(knob, current, float(limit.max_x), int(need), basis, kv_after, tokens_after, limit,
                           cap.driver))
    # A setting that would leave no KV pool (or a share at or below zero) fits nothing: it is not advised.
    return [s for s in out if s.value > 0 and (s.kv_bytes_after is None or s.kv_bytes_after > 0)]


def check_budget(budget: Budget, sweep: Sweep, cap: Capacity | None = None) -> BudgetCheck:
    """Each measured shape of `sweep` against `budget`; with its capacity fit `cap`, the shape limit and the
    shape setting too (module docstring)."""
    shapes = _shape_checks(budget, sweep)
    notes = list(budget.notes)
    limit = None
    if cap is not None and budget.capacity.bytes is not None and shapes:
        limit = max_driver_value(cap, float(budget.capacity.bytes) - _offset(cap))
    if budget.engine == "vllm" and any(s.fragmentation_bytes > 0 for s in shapes):
        notes.append("fragmentation_not_budgeted")
    if any(s.outside_over_bytes is not None and s.outside_over_bytes > 0 for s in shapes):
        notes.append("outside_not_budgeted")
    return BudgetCheck(budget, tuple(shapes), tuple(_settings(budget, cap, shapes, limit)), limit,
                       None if cap is None else cap.driver, tuple(notes))
