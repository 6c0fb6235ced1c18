"""Persistent state from before the trace window: what blocks with no frames most likely are, and why.

Contract: `persistent_state(sizes, addresses, training, retained, enabled, grads)` takes the blocks that were live
before the window began, are never freed in it and carry no stack (allocated before `_record_memory_history`
started, or after it stopped), and returns one `StateGuess` per block (category, rule, reason; every one is
inferred). The evidence, strongest first:
- a block of exactly PyTorch's default cuBLAS workspace size (``:4096:2:16:8`` = 8,519,680 bytes, what
  `CublasHandlePool.cpp` allocates per handle and stream before Hopper) is that `workspace`;
- a block of a size that the window shows the program keeping as an activation (`retained`: in-window blocks
  of that size, made by attention, MLP, logits or vision code, never freed, at call sites none of whose
  allocations the window frees) is one of those activations, held since an earlier step (a retained graph,
  outputs kept with their grad_fn); one of a size the window shows an optimizer keeping and replacing (its
  code makes blocks of the size that outlive the window, its step frees older ones: `retained` with the
  category optimizer_state) is more of that state;
- in a training program (`training`: a backward or an optimizer seen in the snapshot), one copy per parameter
  of each per-parameter state beside the parameters: the copies repeat the parameters' size multiset k times
  (`copies`): 2 → weights + gradients, or weights + one optimizer state (SGD's momentum) where the window
  makes the gradients afresh (`grads`), 3 → weights + two optimizer moments (Adam's exp_avg / exp_avg_sq,
  gradients set to None), or weights + gradients + one state where the window's backward accumulates into
  .grad kept from before, 4 → weights + gradients + two moments. Within one size, which block is the
  parameter is not recorded: the copies are assigned in address order (the parameters were allocated
  first), a guess the reason states. Sizes that occur once, or a number of times k does not divide, are
  taken as weights (buffers have no state);
- without such copies, sizes that repeat as a model's layers do (`periodic`: three sizes or more repeat, a number
  of layers dividing the counts of two or more) are the model's parameters and buffers;
- else a block of the size of a gradient the window's backward makes (`parameters`) is a parameter;
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
_ROLES = (2, 3, 4)               # copies of the parameters' sizes that say what the copies are (`_copies`)
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

    Where no k divides them all, the largest k ≤ 4 for which the blocks beyond whole copies (at most three of a
    size: a buffer or an input batch that happens to share it) are an exception: in at most a quarter of the
    repeated sizes, with at most 10 % of the repeated bytes."""
    sizes = np.asarray(sizes)
    sizes = sizes[sizes > SCALAR]
    if not len(sizes):
        return 1
    values, counts = np.unique(sizes, return_counts=True)
    repeated = counts > 1
    if repeated.sum() < 2:
        return 1
    k = math.gcd(*counts[repeated].tolist())
    if k > 1:
        return k
    total = (values[repeated] * counts[repeated]).sum()
    for k in (4, 3, 2):                  # the most copies first: a multiple of 4 is one of 2
        extra = np.where(repeated, counts % k, 0)      # blocks beyond the copies: a buffer or input of the size
        if ((counts >= k) & repeated).sum() >= 2 and not (extra > 3).any() and (values * extra).sum() <= 0.1 * total \
                and 4 * (extra > 0).sum() <= repeated.sum():
            return k
    return 1


def _copies(k: int, grads: str) -> tuple[tuple[str, ...], str]:
    """What k copies of the parameters' sizes are, in the order they were made, and in words. `grads`: what the
    window shows of the .grad — "fresh" (its backward makes them anew, or zero_grad frees them: not among the
    copies), "before" (its backward makes none of their sizes to keep: it accumulates into .grad kept from
    before), "" (no backward in the window)."""
    if k == 2:
        return (("weights", "optimizer_state"), "the parameters and one optimizer state each (SGD's momentum; the "
                "window makes the gradients afresh)") if grads == "fresh" else \
            (("weights", "gradients"), "the parameters and their .grad")
    if k == 3:
        return (("weights", "gradients", "optimizer_state"), "the parameters, their .grad (the window's backward "
                "accumulates into them) and one optimizer state each (SGD's momentum)") if grads == "before" else \
            (("weights", "optimizer_state", "optimizer_state"), "the parameters and two optimizer moments (Adam's "
             "exp_avg/exp_avg_sq; .grad set to None)")
    return ("weights", "gradients", "optimizer_state", "optimizer_state"), \
        "the parameters, their .grad and two optimizer moments"


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
                     enabled: Callable[[str], bool] = lambda name: True, grads: str = "",
                     parameters: np.ndarray | None = None) -> list[StateGuess]:
    """One guess per block (see the module docstring); `sizes` and `addresses` are parallel arrays;
    `enabled(name)`: whether the heuristic of that name (`state.cublas_workspace`, `state.retained_activation`,
    `state.replaced_optimizer_state`, `state.copies`, `state.layers`, `state.gradient_sizes`) may decide;
    `grads`: what the window shows of the .grad (`_copies`); `parameters`: the sizes of the gradients the
    window's backward makes. Blocks with the same guess share one StateGuess (a few distinct ones however many
    blocks)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    addresses = np.asarray(addresses, dtype=np.uint64)
    workspace = (sizes == CUBLAS_DEFAULT_WORKSPACE) & enabled("state.cublas_workspace")
    retained = {size: r for size, r in (retained or {}).items() if enabled(
        "state.replaced_optimizer_state" if r.category == "optimizer_state" else "state.retained_activation")}
    kept = np.isin(sizes, list(retained)) & ~workspace if retained else np.zeros(len(sizes), dtype=bool)
    rest = np.flatnonzero(~workspace & ~kept)
    params = np.asarray(parameters if parameters is not None else [], dtype=np.int64)
    # The window's backward made each trained parameter's .grad: its sizes, as often as parameters have them,
    # count the copies of each size exactly (layers repeat a size in the parameters and their .grad alike; a
    # frozen parameter or a buffer has no gradient).
    per_gradient = training and grads == "fresh" and len(params) > 0 and enabled("state.copies")
    k = copies(sizes[rest]) if training and enabled("state.copies") and not per_gradient else 1
    k = k if k in _ROLES else 1
    layered = k == 1 and enabled("state.layers") and periodic(sizes[rest])
    if k > 1 or layered or per_gradient:
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
    if plain.category == "other" and len(params) and enabled("state.gradient_sizes"):
        # no copies, no layer pattern, but the window's backward makes gradients of exactly these sizes
        # (what a parameter's .grad is): one copy of the parameters, made before the window
        mine = np.zeros(len(sizes), dtype=bool)
        mine[rest] = np.isin(sizes[rest], params)
        out[mine] = StateGuess("weights", "state.gradient_sizes", (
            "no frames, live before the window and never freed, of the size of a gradient the window's backward "
            f"makes (the autograd engine keeps one per parameter): a parameter; {ADVICE}",))
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
                f"inferred from the size; {ADVICE}")) if r.category != "optimizer_state" else StateGuess(
            r.category, "state.replaced_optimizer_state", words(
                "no frames, live before the window and never freed; the window shows the optimizer keeping state "
                f"of exactly this size ({size:,} B) and replacing it: its step frees blocks of the size from before "
                f"the window, and {r.blocks} it makes at ", r.site, " outlive the window (a history it pushes and "
                f"pops, as LBFGS's). So this is most likely more of that state — inferred from the size; {ADVICE}"))
    order = rest[np.lexsort((addresses[rest], sizes[rest]))]         # by size, then address
    by_size = sizes[order]
    starts = np.flatnonzero(np.r_[True, by_size[1:] != by_size[:-1]]) if len(order) else order
    grad_sizes, grad_counts = np.unique(params, return_counts=True)
    for start, count in zip(starts.tolist(), np.diff(np.r_[starts, len(order)]).tolist()):
        size = int(by_size[start])
        if per_gradient:
            at = np.searchsorted(grad_sizes, size)
            n = int(grad_counts[at]) if at < len(grad_sizes) and grad_sizes[at] == size else 0
            copies_of, per = (count // n, n) if n else (1, count)
            if not n or copies_of > 3:
                continue                        # no gradient (a buffer, a frozen parameter), or no copies it makes
            roles = ("weights", *["optimizer_state"] * (copies_of - 1))
            describe = (f"the window's backward makes {n} gradient(s) of this size (one per trained parameter) and "
                        f"{count} blocks of it predate the window: " + (
                            f"each parameter and {copies_of - 1} optimizer state(s) (the gradients are made afresh)"
                            if copies_of > 1 else "the parameters"))
            rule = "state.copies_per_gradient"
        else:
            if k == 1 or count % k:                                  # k does not divide it: weights
                continue
            roles, describe = _copies(k, grads)
            per, rule = count // k, f"state.copies_{k}"
            describe = (f"in a training program the persistent sizes repeat {k}× (the sizes holding most bytes occur "
                        f"a multiple of {k} times, a size of its own exactly {k} times): {describe}")
        for copy in range(len(roles)):
            out[order[start + copy * per:start + (copy + 1) * per]] = StateGuess(
                roles[copy], rule,
                (f"no frames, live before the window and never freed; {describe}. This is copy {copy + 1} of "
                 f"{len(roles)} of {size:,} B in address order, which tells which copy is which only as a guess; "
                 f"{ADVICE}",))
    return list(out)
