"""The signals stage of attribution: block-level evidence over the frames' decision, strongest first.

- a private pool (named by the alloc entry's `pool_id` from torch 2.12, else by the end state) →
  `graph_capture` (unless frames prove a MemPool user: weights or KV cache in a pool);
- made by the autograd engine's device thread (no frames where the trace records frames, or the engine's C++
  frames: `backward`) and still live after that backward ended, with a live parameter's size → `gradients`;
- the request of the alloc entry (`user_metadata`, else a run's request marker span covering it: see
  `requests`) naming another request than the instant's → `concurrent_request`. The instant's request is
  the one whose allocation reached it (at an OOM, whose allocation failed), else the marker span running
  then, else, as a stated last resort, the one holding the most live bytes;
- size relations, only where the stack is consistent with them (never in a module the source says owns the
  block, in a backward pass or an optimizer step): an autocast copy of a live weight, tokens × vocab logits
  (`shapes`), a gate/up output twice a live MLP output, PyTorch's default cuBLAS workspace size, B·H·L²
  attention scores under user attention code; then a backward's temporary (the device thread's, freed before the
  backward ended) with exactly the size of live activations of one category → that category.
Each is a named heuristic (`rules.HEURISTICS`) a rules file may disable, and flagged inferred where it rests
on a size or a time. `stage(blocks, code)` decides once per distinct key of what the signals read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...model import ALLOC
from ...sites import Site, words
from ..backward import kept_past
from ..state import CUBLAS_DEFAULT_WORKSPACE
from .blocks import Blocks
from .decisions import Decisions, distinct, user_attention
from .frames import shown_site
from .result import Decision
from .shapes import lookup_logits, shape_logits, shape_scores, vocab_hints

GATE_UP_GAP = 16   # trace entries between a gate/up output and the activation made from it (read right after)


@dataclass(frozen=True)
class Context:
    """What the block-level signals know about the whole set of blocks being labelled."""

    request: str | None            # the instant's request (see `instant.instant_request`)
    request_why: str               # how it was chosen, for the reason text
    vocab: frozenset[tuple[int, int]]  # (vocabulary, hidden) of the live embedding weight, if proven
    allocated: Callable[[], AbstractSet[int]]  # sizes the device's trace allocated, but a live weight's (on first use)
    scores_floor: int              # half the largest block under a user-code attention function
    mlp_outputs: dict[int, tuple[int, ...]]   # size → alloc indices of live MLP activation outputs (≥ 1 MiB)
    weight_sizes: dict[int, int]   # size → live weights of that size (for autocast copies of them)
    lookups: frozenset[int]        # sizes of the embedding lookups (F.embedding) the device's trace made
    copy_sizes: dict[int, int]     # size → live blocks made by an autocast cast, of that size
    in_backward: bool              # the allocation that reached the instant ran in a backward pass
    enabled: Callable[[str], bool]  # `RuleSet.enabled`: the heuristics a rules file kept
    persistent: frozenset[str]     # `RuleSet.persistent`: categories no block-level signal overrides




# The first matmul on a stream allocates the cuBLAS workspace inside whatever code ran it (a vision tower's
# projection, an attention's): a never-freed block of its size made under any activation's frames is that.
ACTIVATION_CATEGORIES = ("other", "attention", "mlp", "logits", "vision_encoder", "fallback_kernel")
LOOKUP_LOGITS_MIN = 1 << 20   # three sizes agreeing (logits, vocabulary matrix, lookup) from a MiB of logits on


def signals(d: Decision, size: int, pool: str, request: str, request_by_time: bool, origin: str,
             has_stack: bool, persistent: bool, alloc: int, survived: int, backward: bool, ctx: Context) -> Decision:
    """Block-level signals over the frames' decision, strongest first (see the module docstring)."""
    if pool != "0,0" and d.category in ("weights", "kv_cache") and not d.inferred:
        # A MemPool user (e.g. vLLM's sleep-mode allocator) rather than a graph capture: the frames prove
        # the lifecycle, so they decide, and the pool is kept as a tag.
        return Decision(d.category, d.rule, words(*d.reason, f" (in private memory pool {pool})"), d.frame,
                        (*d.tags, "private_pool"))
    if pool != "0,0":
        return Decision("graph_capture", "signal.private_pool",
                        (f"allocated in private memory pool ({pool}): a CUDA graph capture or MemPool",), d.frame,
                        tuple(x for x in (d.category, *d.tags) if x not in ("other", "graph_capture")))
    # A workspace its frames prove (a backward thread's cuBLAS handle caches one) is never a .grad; nor is a
    # block no parameter has the size of, where the parameters are known.
    on = ctx.enabled
    if survived != -1 and d.category not in (*ctx.persistent, "workspace") and on("lifetime.survived_backward") \
            and (not ctx.weight_sizes or size in ctx.weight_sizes) \
            and not (size == CUBLAS_DEFAULT_WORKSPACE and persistent):   # the device thread's cuBLAS handle's
        of_a = " with the size of a live parameter" if ctx.weight_sizes else ""
        stack = "is the engine's" if has_stack else "has no frames: that thread runs no Python"
        after = f"the program allocated again at event {survived:,}" if survived >= 0 else \
            "a backward before the window began, kept since"
        return Decision("gradients", "lifetime.survived_backward",
                        (f"allocated by the autograd engine's device thread in a backward pass (its stack {stack}) "
                         f"and still live after that backward ended ({after}){of_a}: a parameter's .grad (the engine "
                         "hands a gradient buffer to .grad)",),
                        d.frame, tuple(x for x in (d.category, *d.tags) if x != "other"), inferred=True,
                        context=d.context)
    if d.category not in ctx.persistent and ctx.request and request and request != ctx.request:
        how = "by time: its alloc fell inside that request's marker span" if request_by_time else ""
        return Decision("concurrent_request", "signal.request_marker" if request_by_time else "signal.user_metadata",
                        (f"allocated by {request!r}{f' ({how})' if how else ''}; {ctx.request_why} is "
                         f"{ctx.request!r}",), d.frame,
                        tuple(x for x in (request, d.category, *d.tags) if x != "other"), inferred=request_by_time)
    if d.category not in ctx.persistent and "autocast" in d.context and size * 2 in ctx.weight_sizes \
            and ctx.copy_sizes.get(size, 0) <= ctx.weight_sizes[size * 2] and on("shape.autocast_weight_copy"):
        n, m = ctx.weight_sizes[size * 2], ctx.copy_sizes.get(size, 0)
        return Decision("weights", "shape.autocast_weight_copy",
                        (f"made by an autocast cast and exactly half the size of a live weight ({size * 2:,} B): a "
                         f"16-bit copy of a parameter (autocast keeps one per weight; {m} such copies, {n} weights "
                         "of that size — inferred from the size)",), d.frame,
                        tuple(x for x in (d.category, *d.tags) if x != "other"), inferred=True)
    # Size coincidences only where the stack is consistent with them: never in a module the source says owns
    # the block, in a backward pass or under an optimizer step.
    guessed = d.category == "other" or (d.inferred and d.category in ("attention", "mlp"))
    forward = guessed and origin == "trace" and not backward and not set(d.context) & {"autograd", "optimizer"}
    if forward and not d.owner:
        logits = shape_logits(size, ctx.vocab, ctx.allocated) if on("shape.tokens_x_vocab") else None
        if logits:
            return Decision("logits", "shape.tokens_x_vocab",
                            (f"size = {logits[0]:,} tokens × {logits[1]:,} vocab × {logits[2]} bytes, a "
                             "vocabulary whose weight is live (inferred from the size)",), d.frame,
                            tuple(x for x in (d.category,) if x != "other"), inferred=True)
    # The three sizes agreeing hold in a module the source names too (a model's own forward, whose line applies
    # its output head; an MLM head's decoder after its MLP-like transform), where nothing but the call tree
    # decided (`guessed`).
    if forward:
        # a language model's vocabulary matrix is its largest weight, one of a size or two (an untied embedding and
        # output head): more weights of its size (an MLP's, where the vocabulary is 4 × hidden) leave it open
        top = max(ctx.weight_sizes, default=0)
        vocab = {w for w, n in ctx.weight_sizes.items() if n <= 2 and w >= top // 2}
        looked = lookup_logits(size, vocab, ctx.lookups) if on("shape.tokens_x_vocab") else None
        if looked:
            return Decision("logits", "shape.tokens_x_vocab",
                            (f"size = {looked[0]:,} tokens × {looked[1]:,} vocab × {looked[2]} bytes: a live weight is "
                             f"a {looked[1]:,}-row vocabulary matrix and an embedding lookup made those {looked[0]:,} "
                             "tokens' hidden states (the three sizes agree; inferred from the sizes)",), d.frame,
                            tuple(x for x in (d.category,) if x != "other"), inferred=True)
    if d.category == "other" and origin == "trace" and not d.owner and not set(d.context) & {"autograd",
                                                                                                "optimizer"}:
        if size % 2 == 0 and on("shape.gate_up_of_mlp") and any(
                0 < j - alloc <= GATE_UP_GAP for j in ctx.mlp_outputs.get(size // 2, ())):
            return Decision("mlp", "shape.gate_up_of_mlp",
                            (f"size = 2 × a live MLP activation output ({size // 2:,} bytes) allocated right after "
                             "it: the fused gate/up projection that feeds it (inferred from the size and order)",),
                            d.frame, inferred=True)
    if size == CUBLAS_DEFAULT_WORKSPACE and persistent and d.category in ACTIVATION_CATEGORIES \
            and on("shape.cublas_workspace"):
        return Decision("workspace", "shape.cublas_workspace",
                        (f"never freed, and its size is PyTorch's default cuBLAS workspace ({size:,} B), which the "
                         "first matmul on a stream allocates (inferred from the size)",), d.frame,
                        tuple(x for x in (d.category,) if x != "other"), inferred=True)
    if user_attention(d) and size >= max(ctx.scores_floor, 8 << 20) and on("shape.attention_scores"):
        scores = shape_scores(size)
        if scores:
            return Decision("fallback_kernel", "shape.attention_scores",
                            (f"size fits batch·heads × L² × {scores[2]} bytes (e.g. {scores[0]} × {scores[1]}²) "
                             "under an attention function: materialised attention scores (B·H·L·L), which "
                             "fused kernels avoid (inferred from the size)",), d.frame, ("attention",), inferred=True)
    return d


def paired(d: Decision, size: int, category: str, site: Site | None) -> Decision:
    """A backward's block, made by the engine's device thread and freed before that backward ended, with exactly
    the size of live activations of one category: most likely the gradient of one of them."""
    return Decision(category, "shape.backward_pairing", words(
        "made by the autograd engine's device thread in a backward pass and freed before it ended, with exactly "
        f"the size of live {category} activations ({size:,} B, made at ", site, "): most likely the gradient of "
        "one of them (inferred from the size)"), d.frame, tuple(x for x in d.tags if x != category),
        inferred=True, context=d.context)


def signals_by_key(table: Decisions, code: np.ndarray, sizes: np.ndarray, pools: np.ndarray,
                    metadata: np.ndarray, by_time: np.ndarray, origin: np.ndarray, stack: np.ndarray,
                    free_index: np.ndarray, alloc_index: np.ndarray, survived: np.ndarray, backward: np.ndarray,
                    ctx: Context) -> np.ndarray:
    """`signals` of every block, made once per distinct key of what it reads: the frame decision, the pool,
    the request and whether it was named by time (only where it is another request than the instant's),
    whether the block came from the trace, whether it is a never-freed block of the default cuBLAS workspace
    size, the size (only where a size relation could hold: half a live weight's, a logits or a gate/up size,
    attention scores, a gradient's), the alloc index (only where a gate/up relation could hold) and, for what
    the device thread made and kept past its backward, where that backward ended. The codes after."""
    of = table.columns()
    from_trace = origin == "trace"
    plain = of["plain_other"][code] & from_trace
    gate_up = plain & (sizes % 2 == 0) & np.isin(sizes // 2, np.array(list(ctx.mlp_outputs), dtype=np.int64))
    by_size = ((~of["lifecycle"][code] & of["autocast"][code]
                & np.isin(sizes * 2, np.array(list(ctx.weight_sizes), dtype=np.int64)))
               | gate_up | (plain & (bool(ctx.vocab) or bool(ctx.lookups)) & (sizes >= 16 << 20))
               | ((of["inferred"][code] | (of["category"][code] == "other")) & bool(ctx.lookups)
                  & (sizes >= LOOKUP_LOGITS_MIN))
               | (of["user_attention"][code] & (sizes >= max(ctx.scores_floor, 8 << 20)))
               | (survived >= 0))
    other_request = (metadata != "") & (metadata != ctx.request) if ctx.request else np.zeros(len(code), dtype=bool)
    keys = np.stack([
        code, pd.factorize(pools)[0],
        np.where(other_request, pd.factorize(metadata)[0], -1), by_time & other_request, from_trace,
        (sizes == CUBLAS_DEFAULT_WORKSPACE) & (free_index < 0),
        np.where(by_size, sizes, -1), np.where(gate_up, alloc_index, -2), survived, backward], axis=1
    ).astype(np.int64)
    if not len(keys):
        return code.copy()
    first, inverse = distinct(keys)
    return table.codes([signals(table.items[int(code[i])], int(sizes[i]), pools[i], metadata[i], bool(by_time[i]),
                                 origin[i], stack[i] >= 0, free_index[i] < 0, int(alloc_index[i]),
                                 int(survived[i]), bool(backward[i]), ctx)
                        for i in first.tolist()])[inverse]


def _indices_by_size(sizes: np.ndarray, alloc_index: np.ndarray, mask: np.ndarray) -> dict[int, tuple[int, ...]]:
    out: dict[int, list[int]] = {}
    for size, index in zip(sizes[mask].tolist(), alloc_index[mask].tolist()):
        out.setdefault(size, []).append(index)
    return {size: tuple(found) for size, found in out.items()}


def _counts(sizes: np.ndarray) -> dict[int, int]:
    values, counts = np.unique(sizes, return_counts=True)
    return dict(zip(values.tolist(), counts.tolist()))


def stage(b: Blocks, code: np.ndarray) -> np.ndarray:
    """The signals over every block's decision, then the device thread's backward blocks paired by size."""
    table, sizes, alloc_index = b.table, b.sizes, b.alloc_index
    trace = b.snapshot.trace(b.device)
    passes = b.decider.passes(b.snapshot, b.device)
    of = table.columns()
    categories = of["category"][code]
    weights = categories == "weights"
    autocast = of["autocast"][code]
    attention = of["user_attention"][code]
    # What the autograd engine's device thread made (no frames, or the engine's), the pass it ran in, and where
    # that pass ended for those it kept past it (−1: made elsewhere, freed inside its backward, or the trace does
    # not see that backward end; −2: made by a backward before the window began, as the engine's frames show).
    engine = np.isin(b.stack, b.decider.engine_stacks())
    device_thread = b.from_trace & ((b.stack < 0) | engine)
    ended, kept = kept_past(passes, alloc_index, b.free_index, device_thread)
    device_thread &= ended >= 0
    before = ~b.from_trace & engine & (b.stack >= 0) & (b.origin != "trace") & (not passes.opens_window)
    survived = np.where(kept, ended, np.where(before, -2, -1))
    ctx = Context(
        request=b.request, request_why=b.request_why,
        vocab=vocab_hints(sizes[weights]),
        allocated=functools.cache(lambda: set(np.unique(trace.size[trace.action == ALLOC]).tolist())
                                  - set(sizes[weights].tolist())),
        scores_floor=(int(sizes[attention].max()) if attention.any() else 0) // 2,
        mlp_outputs=_indices_by_size(sizes, alloc_index, (categories == "mlp") & (sizes >= (1 << 20))),
        weight_sizes=_counts(sizes[weights & ~autocast]), copy_sizes=_counts(sizes[autocast]),
        lookups=b.decider.lookups(b.snapshot, b.device),
        in_backward=b.event >= 0 and bool(passes.of(np.array([b.event]))[0] >= 0), enabled=b.decider.rules.enabled,
        persistent=b.decider.rules.persistent,
    )
    code = signals_by_key(table, code, sizes, b.pools, b.metadata, b.by_time, b.origin, b.stack, b.free_index,
                          alloc_index, survived, device_thread, ctx)
    temporary = device_thread & ~kept
    if b.decider.rules.enabled("shape.backward_pairing") and temporary.any():
        code = _pair_backward(b, code, temporary)
    return code


# A backward's first allocations are the loss's gradients over the logits (NllLoss, LogSoftmax backward): the
# logits pair only with those; materialised attention scores' gradients are of a size nothing else has (B·H·L²).
# Other activations share sizes too often (a checkpointed block's MLP output is the logits' size) to pair.
PAIRED = ("logits", "fallback_kernel")
LOSS_FIRST = 4              # the allocations that open a backward: the loss's gradients
PAIR_MIN = 1 << 20          # smaller sizes coincide too often to speak for a gradient of one activation


def _pair_backward(b: Blocks, code: np.ndarray, temporary: np.ndarray) -> np.ndarray:
    """Temporaries of a backward still `other` that have exactly the size of live activations of one category
    made outside the device thread (the forward's) take it (`paired`)."""
    table = b.table
    of = table.columns()
    categories = of["category"][code]
    forward = ~temporary & np.isin(categories, PAIRED) & (b.sizes >= PAIR_MIN)
    if not forward.any():
        return code
    by_size: dict[int, set[str]] = {}
    site: dict[int, int] = {}
    for size, cat, stack in zip(b.sizes[forward].tolist(), categories[forward].tolist(), b.stack[forward].tolist()):
        by_size.setdefault(size, set()).add(cat)
        site.setdefault(size, stack)
    one = {size: next(iter(cats)) for size, cats in by_size.items() if len(cats) == 1}
    passes = b.decider.passes(b.snapshot, b.device)
    trace = b.snapshot.trace(b.device)
    allocs = np.flatnonzero(trace.action == ALLOC)
    # how many allocations of its pass came before each block's (the loss's gradients open a backward)
    opened = np.searchsorted(allocs, b.alloc_index) - np.searchsorted(allocs, passes.first[np.maximum(
        passes.of(b.alloc_index), 0)]) if len(passes) else np.zeros(len(b.alloc_index), dtype=np.int64)
    scores = np.array([size for size, cat in one.items() if cat == "fallback_kernel"], dtype=np.int64)
    logits = np.array([size for size, cat in one.items() if cat == "logits"], dtype=np.int64)
    pairable = np.isin(b.sizes, scores) | (np.isin(b.sizes, logits) & (opened < LOSS_FIRST))
    hit = np.flatnonzero(temporary & (categories == "other") & pairable)
    if not len(hit):
        return code
    code = code.copy()
    pairs = np.stack([code[hit], b.sizes[hit]], axis=1)
    first, inverse = distinct(pairs)
    code[hit] = table.codes([
        paired(table.items[int(pairs[k, 0])], int(pairs[k, 1]), one[int(pairs[k, 1])],
               shown_site(b.decider, site[int(pairs[k, 1])])) for k in first.tolist()])[inverse]
    return code
