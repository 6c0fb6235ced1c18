"""What a CUDA build would choose where the CPU's choice differs in memory, from PyTorch's documented rules.

Contract: `cuda_defaults()` is a context manager under which torch.optim's optimizers default to the foreach
implementation for the tensors that stand for the device's, as they do for CUDA tensors
(`torch.optim.optimizer._default_to_fused_or_foreach`: foreach where every parameter is a floating-point tensor
on a device with foreach kernels — CUDA — and the program asked neither fused nor foreach; the CPU would loop
parameter by parameter, which never holds one intermediate per parameter at once as foreach does).
`CudaMode` casts the inputs of CUDA autocast's float32 ops up, as CUDA does (the CPU's autocast does not).
`sdpa_backend(query, key, value, attn_mask, dropout_p, enable_gqa)` names the kernel CUDA's dispatcher picks
(`sdp_utils.cpp`, `select_sdp_backend`: flash for fp16/bf16 with a head dim ≤ 256 and no explicit mask, else
memory-efficient for fp32/fp16/bf16 with a head dim a multiple of 8 (or any mask), else the math fallback, in that
order, each only where `torch.backends.cuda` leaves it enabled). `Choices` counts what was modelled, for the
estimate's metadata and its summary.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Choices:
    sdpa: Counter[str] = field(default_factory=Counter)        # CUDA backend → calls
    optimizers: Counter[str] = field(default_factory=Counter)  # "foreach (CUDA's default)" … → optimizer steps
    autocast: Counter[str] = field(default_factory=Counter)    # op → calls run in float32 as CUDA's autocast does

    def lines(self) -> list[str]:
        out = []
        if self.sdpa:
            picked = ", ".join(f"{name} ×{n}" for name, n in self.sdpa.most_common())
            out.append(f"scaled_dot_product_attention: CUDA would run {picked}; modelled by the CPU's fused kernel "
                       "(output + logsumexp; the math fallback materialises the scores)")
        if self.autocast:
            ops = ", ".join(f"{name} ×{n}" for name, n in self.autocast.most_common(6))
            out.append(f"autocast: CUDA's float32 ops run in float32 ({ops})")
        if self.optimizers:
            out.append("optimizer: " + ", ".join(f"{name} ×{n}" for name, n in self.optimizers.most_common()))
        return out


def sdpa_backend(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                 enable_gqa: bool = False) -> str:
    import torch
    flags = torch.backends.cuda
    dtype = query.dtype
    head_dim = int(query.shape[-1])
    same_dims = int(key.shape[-1]) == head_dim == int(value.shape[-1])
    half = dtype in (torch.float16, torch.bfloat16)
    if flags.flash_sdp_enabled() and half and attn_mask is None and head_dim <= 256 and head_dim % 8 == 0 \
            and same_dims:
        return "flash"
    if flags.mem_efficient_sdp_enabled() and dtype in (torch.float32, torch.float16, torch.bfloat16) \
            and head_dim % 8 == 0 and int(value.shape[-1]) % 8 == 0:
        return "efficient"
    return "math"


# CUDA autocast's float32 list (torch.amp's documentation, "CUDA Ops that can autocast to float32"): under
# autocast these run in float32 on CUDA, their half-precision inputs cast up; the CPU's autocast leaves most of them in
# the lower precision (its own float32 list is mostly losses and linear algebra).
CUDA_AUTOCAST_FP32 = frozenset({
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin", "binary_cross_entropy_with_logits", "cosh",
    "cosine_embedding_loss", "cdist", "cosine_similarity", "cross_entropy", "cumprod", "cumsum", "dist", "erfinv",
    "exp", "expm1", "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss", "layer_norm", "log", "log_softmax",
    "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss", "multilabel_margin_loss", "multi_margin_loss",
    "nll_loss", "norm", "normalize", "pdist", "poisson_nll_loss", "pow", "prod", "reciprocal", "rsqrt", "sinh",
    "smooth_l1_loss", "soft_margin_loss", "softmax", "softmin", "softplus", "sum", "renorm", "tan",
    "triplet_margin_loss"})


def CudaMode(choices: Choices) -> Any:
    """A TorchFunctionMode that does what CUDA would where the CPU differs in memory: under autocast (``torch.autocast
    ("cuda")``, which the estimate runs as the CPU's), an op of CUDA's float32 list gets its half-precision inputs
    cast to float32 first, as CUDA's autocast casts them; and per scaled_dot_product_attention call it counts the
    backend CUDA would pick."""
    import torch
    from torch.overrides import TorchFunctionMode
    sdpa = torch.nn.functional.scaled_dot_product_attention
    halves = (torch.float16, torch.bfloat16)

    def up(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dtype in halves:
            return x.to(torch.float32)
        return x

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            kwargs = kwargs or {}
            if func is sdpa:
                given = {**dict(zip(("query", "key", "value", "attn_mask", "dropout_p"), args)), **kwargs}
                choices.sdpa[sdpa_backend(given["query"], given["key"], given["value"], given.get("attn_mask"),
                                          given.get("dropout_p", 0.0))] += 1
            elif getattr(func, "__name__", "") in CUDA_AUTOCAST_FP32 and torch.is_autocast_enabled("cpu") \
                    and any(isinstance(x, torch.Tensor) and x.dtype in halves for x in args):
                choices.autocast[func.__name__] += 1
                args = tuple(up(x) for x in args)
                kwargs = {k: up(v) for k, v in kwargs.items()}
            return func(*args, **kwargs)
    return Mode()


@contextlib.contextmanager
def cuda_defaults(choices: Choices) -> Iterator[None]:
    import torch.optim  # noqa: F401  (its submodules, so that each one's imported name is patched)
    from torch.optim import optimizer as optimizer_mod

    original = optimizer_mod._default_to_fused_or_foreach

    def as_on_cuda(params: Any, differentiable: bool, use_fused: bool = False) -> tuple[bool, bool]:
        if differentiable or use_fused:
            fused, foreach = original(params, differentiable, use_fused)
        else:
            import torch
            fused, foreach = False, all(p is None or torch.is_floating_point(p) for p in params)
        choices.optimizers["fused" if fused else "foreach (CUDA's default)" if foreach else "for-loop"] += 1
        return fused, foreach

    patched = [m for name, m in list(sys.modules.items())
               if name.startswith("torch.optim") and getattr(m, "_default_to_fused_or_foreach", None) is original]
    for m in patched:
        m._default_to_fused_or_foreach = as_on_cuda  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for m in patched:
            m._default_to_fused_or_foreach = original  # type: ignore[attr-defined]
