"""What a serving engine said about its memory budget at start-up, each figure with where it came from.

Contract: `EngineConfig` holds the engine ("vllm" | "sglang"), its version and generation ("v0" | "v1" for
vLLM) when the log names them, and `figures`: name → `Figure`. A figure's `source` is "log" (`detail` the
line number and the line), "option" (`detail` the option) or "derived" (`detail` the formula); `precision`
is half the last digit the log printed (a figure logged as 1.23 GiB is known to ±0.005 GiB), 0 when exact.
The names, bytes unless the name says otherwise, are `FIGURES`. The loader makes it from a log
(`load.engine_log`), the CLI from options; the analyses read it as data (`analyze.budget`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

ENGINES = ("vllm", "sglang")

# name → what it is (the unit is in the name: _bytes, _tokens, a ratio, or a count)
FIGURES: dict[str, str] = {
    "total_bytes": "the device's memory",
    "utilization": "vLLM gpu_memory_utilization: the share of the device vLLM budgets",
    "mem_fraction_static": "SGLang mem_fraction_static: the share of the device for weights and the KV pool",
    "weights_bytes": "the model's weights",
    "activation_peak_bytes": "vLLM's profiled activation peak: torch's peak allocated bytes over its dummy "
                             "forward, above what was allocated before it",
    "torch_peak_bytes": "vLLM 0.6.4's absolute torch peak in profiling (weights included)",
    "non_torch_bytes": "memory outside PyTorch's allocator the engine measured (CUDA context, NCCL, cuBLAS)",
    "non_kv_bytes": "vLLM's total non-KV memory: weights + activation peak + non-torch",
    "cuda_graph_estimate_bytes": "vLLM's estimate of its CUDA graph pools, made before capture",
    "cuda_graph_estimate_applied": "1 when vLLM subtracted its CUDA graph estimate from the KV budget (0.21+)",
    "cuda_graph_bytes": "memory CUDA graph capture took (measured by the engine as free memory before − after)",
    "kv_cache_bytes": "the KV cache pool",
    "kv_cache_tokens": "tokens the KV cache pool holds",
    "free_before_weights_bytes": "SGLang: device memory free before loading weights",
    "free_after_pool_bytes": "SGLang: device memory free once the KV pool is allocated",
    "free_after_startup_bytes": "SGLang: device memory free when serving starts (after CUDA graphs)",
    "max_model_len": "the longest sequence the engine admits (tokens)",
    "max_num_batched_tokens": "vLLM: tokens one forward step may schedule",
    "max_num_seqs": "vLLM: sequences one step may schedule",
    "chunked_prefill_size": "SGLang: tokens of one prefill chunk",
    "max_running_requests": "SGLang: requests running at once",
    "tensor_parallel_size": "GPUs one model is split over",
}


@dataclass(frozen=True)
class Figure:
    """One figure of an engine's budget and where it came from (module docstring)."""

    value: float
    source: str                # "log" | "option" | "derived"
    detail: str
    precision: float = 0.0     # ± this much: half the last printed digit of a logged figure

    @property
    def exact(self) -> bool:
        return self.precision == 0


@dataclass(frozen=True)
class EngineConfig:
    """An engine's budget figures (module docstring)."""

    engine: str
    version: str | None = None
    generation: str | None = None
    figures: Mapping[str, Figure] = field(default_factory=dict)
    source: str = ""           # the log file, or "options"

    def get(self, name: str) -> float | None:
        figure = self.figures.get(name)
        return None if figure is None else figure.value
