"""Persistent state from before the trace window: what blocks with no frames most likely are, and why.

Contract: `persistent_state(sizes, addresses, training, retained, enabled, second)` takes the blocks that were live
before the window began, are never freed in it and carry no stack (allocated before `_record_memory_history`
started, or after it stopped), and returns one `StateGuess` per block (category, rule, reason; every one is
inferred). The evidence, strongest first:
- a block of exactly PyTorch's default cuBLAS workspace size (``:4096:2:16:8`` = 8,519,680 bytes, what
  `CublasHandlePool.cpp` allocates per handle and stream before Hopper) is that `workspace`;
- a block of a size that the window shows the program keeping as an activation (`retained`: in-window blocks
  of that size, made by attention, MLP, logits or vision code, never freed, at call sites none of whose
  allocations the window frees) is one of those activations, held since an earlier step (a retained graph,
  outputs kept with their grad_fn);
- in a training program (`training`: a backward or an optimizer seen in the snapshot), one copy per parameter
  of each per-parameter state beside the parameters: the copies repeat the parameters' size multiset k times
  (`copies`): 2 → weights + gradients, or weights + one optimizer state (SGD's momentum) where the window
  makes the gradients afresh (`second`), 3 → weights + two optimizer moments (Adam's exp_avg / exp_avg_sq,
  gradients set to None), 4 → weights + gradients + two moments. Within one size, which block is the
  parameter is not recorded: the copies are assigned in address order (the parameters were allocated
  first), a guess the reason states. Sizes that occur once, or a number of times k does not divide, are
  taken as weights (buffers have no state);
- without such copies, sizes that repeat as a model's layers do (`periodic`: three sizes or more repeat, a number
  of layers dividing the counts of two or more) are the model's parameters and buffers;
- the rest is unknown (`other`): nothing the snapshot holds says what it is, and the reason says how to
  record who made it.
The caller flags all of it `inferred`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..sites import Site, Words, words

# PyTorch's default cuBLAS workspace per (handle, stream) before Hopper: 4096 KiB × 2 + 16 KiB × 8.
CUBLAS_DEFAULT_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8
_ROLES = {2: ("weights", "gradients"), 3: ("weights", "optimizer_state", "optimizer_state"),
          4: ("weights", "gradients", "optimizer_state", "optimizer_state")}
_ROLE_WORDS = {2: "the parameters and their .grad", 3: "the parameters and two optimizer moments (Adam's "
               "exp_avg/exp_avg_sq; .grad set to None)", 4: "the parameters, their .grad and two optimizer moments"}
SCALAR = 512                     # a block's minimum: what fits in it is a scalar or a counter, not a parameter
ADVICE = "start torch.cuda.memory._record_memory_history before the model is built to record who allocated it"


@dataclass(frozen=True)
class StateGuess:
    category: str
    rule: str
    reason: Words


def copies(sizes: np.ndarray) -> int:
    """k: the greatest common divisor of the counts of the sizes that occur more than once (1 if none, or if
    only one size repeats: one size says nothing about a multiset). Sizes of one allocator block or less (512 B:
    step counters, scalars, BatchNorm's num_batches_tracked) are left out: buffers that share no copy.

    A size that occurs two or three times and breaks the pattern (a buffer or an input batch that happens to
    share a size) is left out, as long as the sizes that keep it hold 90 % of the repeated bytes."""
    sizes = np.asarray(sizes)
    sizes = sizes[sizes > SCALAR]
    if not len(sizes):
        return 1
    values, counts = np.unique(sizes, return_counts=True)
    repeated = counts > 1
    if repeated.sum() < 2:
        return 1
    k = math.gcd(*counts[repeated].tolist())
    if k == 1 and (counts > 3).sum() >= 2:
        k = math.gcd(*counts[counts > 3].tolist())
        breaks = repeated & (counts % k != 0)
        total = (values[repeated] * counts[repeated]).sum()
        if k == 1 or (counts[breaks] > 3).any() or (values[breaks] * counts[breaks]).sum() > 0.1 * total:
            k = 1
    return k


def periodic(sizes: np.ndarray) -> bool:
    """Whether the sizes look like a model's parameters: at least three distinct sizes repeat (one repeated size is
    a pool of equal buffers — a KV cache's layers — not a model), and its L ≥ 2 layers divide the counts of two of
    them or more (a final norm may add one to another's). Scalars and counters (one allocator block or less) say
    nothing."""
    sizes = np.asarray(sizes)
    sizes = sizes[sizes > SCALAR]
    if not len(sizes):
        return False
    _, counts = np.unique(sizes, return_counts=True)
    counts = counts[counts > 1]
    return len(counts) >= 3 and any(int((counts % layers == 0).sum()) >= 2
                                    for layers in range(2, int(counts.max()) + 1))


@dataclass(frozen=True)
class Retained:
    """Activations of one size the window shows the program keeping: their category and the evidence."""
    category: str
    blocks: int                    # in-window blocks of the size, never freed
    site: Site | None              # where the trace shows them made


def persistent_state(sizes: np.ndarray, addresses: np.ndarray, training: bool,
                     retained: dict[int, Retained] | None = None,
                     enabled: Callable[[str], bool] = lambda name: True, second: str = "gradients"
                     ) -> list[StateGuess]:
    """One guess per block (see the module docstring); `sizes` and `addresses` are parallel arrays;
    `enabled(name)`: whether the heuristic of that name (`state.cublas_workspace`, `state.retained_activation`,
    `state.copies`, `state.layers`) may decide; `second`: what a second copy of the parameters is (gradients, or
    optimizer_state where the window shows the gradients made afresh). Blocks with the same guess share one
    StateGuess (a few distinct ones however many blocks)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    addresses = np.asarray(addresses, dtype=np.uint64)
    workspace = (sizes == CUBLAS_DEFAULT_WORKSPACE) & enabled("state.cublas_workspace")
    retained = (retained or {}) if enabled("state.retained_activation") else {}
    kept = np.isin(sizes, list(retained)) & ~workspace if retained else np.zeros(len(sizes), dtype=bool)
    rest = np.flatnonzero(~workspace & ~kept)
    k = copies(sizes[rest]) if training and enabled("state.copies") else 1
    k = k if k in _ROLES else 1
    layered = k == 1 and enabled("state.layers") and periodic(sizes[rest])
    if k > 1 or layered:
        why = ("no frames, live before the window and never freed, and the sizes repeat as a model's layers do "
               "(several sizes occur many times): persistent state, taken as the model's parameters and buffers"
               if layered else "no frames, live before the window and never freed: persistent state, taken as "
               "the model's parameters and buffers")
        plain = StateGuess("weights", "state.layers" if layered else "state.persistent", (f"{why}; {ADVICE}",))
    else:
        plain = StateGuess("other", "state.unknown",
                           ("no frames, live before the window and never freed: allocated before recording started, "
                            "and nothing the snapshot holds says what it is (its sizes show no model's repeating "
                            "layers" + (", nor copies of them that a training program keeps" if training else "")
                            + ")" + f"; {ADVICE}",))
    out = np.full(len(sizes), plain, dtype=object)
    if workspace.any():
        out[workspace] = StateGuess("workspace", "state.cublas_workspace",
                                    (f"no frames, live before the window and never freed; its size is PyTorch's "
                                     f"default cuBLAS workspace ({CUBLAS_DEFAULT_WORKSPACE:,} B = 4096 KiB × 2 + "
                                     "16 KiB × 8)",))
    for size in np.unique(sizes[kept]).tolist():
        r = retained[size]
        out[kept & (sizes == size)] = StateGuess(
            r.category, "state.retained_activation", words(
                "no frames, live before the window and never freed; the window shows this program keeping "
                f"{r.category} activations of exactly this size ({size:,} B): {r.blocks} made at ", r.site,
                " are never freed, nor is any other allocation there. So this is most likely one of them from an "
                "earlier step, still held (a retained autograd graph, or outputs kept with their grad_fn) — "
                f"inferred from the size; {ADVICE}"))
    if k > 1:
        roles = (_ROLES[k][0], second, *_ROLES[k][2:]) if k == 2 else _ROLES[k]
        describe = _ROLE_WORDS[k] if k != 2 or second == "gradients" else \
            "the parameters and one optimizer state each (SGD's momentum; the window makes the gradients afresh)"
        order = rest[np.lexsort((addresses[rest], sizes[rest]))]     # by size, then address
        by_size = sizes[order]
        starts = np.flatnonzero(np.r_[True, by_size[1:] != by_size[:-1]]) if len(order) else order
        for start, count in zip(starts.tolist(), np.diff(np.r_[starts, len(order)]).tolist()):
            if count % k:                                            # k does not divide it: weights
                continue
            size, per = int(by_size[start]), count // k
            for copy in range(k):
                out[order[start + copy * per:start + (copy + 1) * per]] = StateGuess(
                    roles[copy], f"state.copies_{k}",
                    (f"no frames, live before the window and never freed; in a training program the persistent "
                     f"sizes repeat {k}× (the sizes holding most bytes occur a multiple of {k} times, a size of its "
                     f"own exactly {k} times): {describe}. This is copy {copy + 1} of {k} of {size:,} B in address "
                     f"order, which tells which copy is which only as a guess; {ADVICE}",))
    return list(out)
