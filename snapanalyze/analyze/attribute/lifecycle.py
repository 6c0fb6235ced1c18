"""The before-window stage of attribution: blocks live before the trace window whose allocation carries no
stack. Persistent state (`state`: cuBLAS workspace, activations of a size the window shows the program
keeping — `kept_activations`, a retained graph — in a training program the parameters and their gradients /
optimizer moments as copies of them (which copy is which by what the window shows of the .grad:
`gradients_seen`), weights where the sizes repeat as a model's layers do, else unknown), or
state an optimizer step freed (it replaced it), or unknown, said plainly with how to record it
(`before_window`). `stage(blocks, code)` applies it to the blocks' codes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ...model import OOM, Snapshot
from ...sites import Site, words
from ..backward import kept_past
from ..moves import apply_frame
from ..state import ADVICE, Retained, StateGuess, persistent_state
from .blocks import Blocks
from .frames import Decider, shown_site
from .result import Decision

TRAINING = ("gradients", "optimizer_state")
ACTIVATIONS = ("attention", "mlp", "logits", "fallback_kernel", "vision_encoder")
RETAINED_MIN_SIZE = 1 << 20       # smaller sizes coincide too often to speak for a kept activation
RETAINED_MIN_BLOCKS = 2           # one kept output is a result the program holds, not a retained graph


def kept_activations(snapshot: Snapshot, device: int, lifetimes: pd.DataFrame, decider: Decider
                     ) -> dict[int, Retained]:
    """Sizes of the activations the window shows the program keeping: blocks of ≥ 1 MiB made in the window
    by attention, MLP, logits or vision code (their frames decide), never freed, at call sites none of whose
    allocations the window frees, at least two of a size. None where the trace ends at an OOM (the failing
    step's activations are live there) or has no events. Where several categories share a size, the one with
    the most such blocks."""
    trace = snapshot.trace(device)
    if not len(trace) or bool((trace.action == OOM).any()):
        return {}
    alloc = lifetimes["alloc_index"].to_numpy()
    free = lifetimes["free_index"].to_numpy()
    sizes = lifetimes["size"].to_numpy()
    mine = np.flatnonzero(alloc >= 0)
    stacks = snapshot.event_stack_ids(device, alloc[mine])
    freed_at = np.unique(stacks[free[mine] >= 0])
    keep = (free[mine] < 0) & (sizes[mine] >= RETAINED_MIN_SIZE) & (stacks >= 0) & ~np.isin(stacks, freed_at)
    if not keep.any():
        return {}
    pairs, counts = np.unique(np.stack([stacks[keep], sizes[mine][keep]], axis=1), axis=0, return_counts=True)
    best: dict[int, dict[str, list[Any]]] = {}      # size -> category -> [blocks, site of the largest share, n]
    for (sid, size), n in zip(pairs.tolist(), counts.tolist()):
        d = decider.decide(sid)
        if d.category not in ACTIVATIONS:
            continue
        hit = best.setdefault(size, {}).setdefault(d.category, [0, None, 0])
        hit[0] += n
        if n > hit[2]:
            hit[1], hit[2] = shown_site(decider, sid, d.frame), n
    out = {}
    for size, cats in best.items():
        cat, (n, site, _) = max(cats.items(), key=lambda kv: kv[1][0])
        if n >= RETAINED_MIN_BLOCKS:
            out[size] = Retained(cat, n, site)
    return out


def replaced_state(snapshot: Snapshot, device: int, lifetimes: pd.DataFrame, decider: Decider
                   ) -> dict[int, Retained]:
    """Sizes of the state an optimizer keeps replacing: in the window its own code (frames that decide
    optimizer_state) makes blocks of the size that outlive the window, and its step frees frame-less blocks of
    the size from before the window — LBFGS's history of flattened steps and gradient differences, pushed and
    popped, its previous flat gradient cloned anew each iteration — of a size no parameter has (the window's
    backward shows the parameters' sizes by the gradients it makes). An optimizer that makes its state once
    (Adam's first step) frees none of it; one that replaces it out of place replaces state of its parameters'
    sizes; neither reads this way, nor do the .grad that a zero_grad frees."""
    if not len(lifetimes):
        return {}
    alloc = lifetimes["alloc_index"].to_numpy()
    free = lifetimes["free_index"].to_numpy()
    sizes = lifetimes["size"].to_numpy()
    made = np.flatnonzero((alloc >= 0) & (free < 0))
    dropped = np.flatnonzero((alloc < 0) & (free >= 0))
    if not len(made) or not len(dropped):
        return {}

    def by_optimizer(sids: np.ndarray, freeing: bool) -> np.ndarray:
        ids, inverse = np.unique(sids, return_inverse=True)
        ok = np.array([sid >= 0 and ((d := decider.decide(int(sid))).category == "optimizer_state"
                                     or (freeing and "optimizer" in d.context))
                       and not (freeing and "zero_grad" in d.context) for sid in ids.tolist()], dtype=bool)
        return ok[inverse.reshape(-1)] if len(ids) else np.zeros(0, dtype=bool)
    made_stacks = snapshot.event_stack_ids(device, alloc[made])
    mine = by_optimizer(made_stacks, False)
    if not mine.any():
        return {}
    freed = dropped[by_optimizer(snapshot.event_stack_ids(device, free[dropped]), True)]
    candidates = np.intersect1d(sizes[made[mine]], sizes[freed])
    if not len(candidates):
        return {}
    # The parameters' sizes, from the gradients the window's backward makes: an optimizer that replaces its
    # moments out of place (a hand-written AdamW's `m = beta1 * m + …`) replaces state of exactly those sizes,
    # and then the blocks left of such a size are the parameters and their .grad, not more state. Where no
    # backward shows them, nothing is said.
    parameters = window_gradients(snapshot, device, lifetimes, decider)
    if not len(parameters):
        return {}
    out = {}
    for size in np.setdiff1d(candidates, parameters).tolist():
        at = mine & (sizes[made] == size)
        sid = int(made_stacks[at][0])
        out[int(size)] = Retained("optimizer_state", int(at.sum()), shown_site(decider, sid, decider.decide(sid).frame))
    return out


def retained(decider: Decider, snapshot: Snapshot, device: int, lifetimes: pd.DataFrame | None
             ) -> dict[int, Retained]:
    """What the device's window shows the program keeping, by size: activations (`kept_activations`) and state
    an optimizer keeps replacing (`replaced_state`), kept on the decider: a window is the same at every instant
    of a device."""
    if lifetimes is None:
        return {}
    hit = decider.retained_cache.get(device)
    if hit is None or hit[0] is not lifetimes:
        kept = {**replaced_state(snapshot, device, lifetimes, decider),
                **kept_activations(snapshot, device, lifetimes, decider)}
        hit = decider.retained_cache[device] = (lifetimes, kept)
    return hit[1]


def persistent(decider: Decider, device: int, sizes: np.ndarray, addresses: np.ndarray, training: bool,
               kept: dict[int, Retained], grads: str, parameters: np.ndarray) -> list[StateGuess]:
    """`state.persistent_state` of these blocks, kept on the decider: blocks live throughout the window are the
    same at every instant of a device."""
    key = (device, training, sizes.tobytes() + addresses.tobytes(), tuple(sorted(kept.items())), grads,
           parameters.tobytes())
    found = decider.state_cache.get(key)
    if found is None:
        found = decider.state_cache[key] = persistent_state(sizes, addresses, training, kept,
                                                            decider.rules.enabled, grads, parameters)
    return found


def state_made(b: Blocks) -> np.ndarray:
    """The sizes of the optimizer state the whole window shows made in it, at any instant (its frames make blocks
    that outlive the window: Adam's moments at its first step, made after a peak in the backward), where it
    replaced none from before the window. Then the
    optimizer's state is not among the frame-less blocks from before the window: those of its sizes are the
    parameters (with their .grad, where the window's backward does not make them), not copies of state."""
    window = b.window
    if window is None or not len(window):
        return np.zeros(0, dtype=np.int64)
    alloc = window["alloc_index"].to_numpy()
    kept = np.flatnonzero((alloc >= 0) & (window["free_index"].to_numpy() < 0))
    stacks = b.snapshot.event_stack_ids(b.device, alloc[kept])
    ids, inverse = np.unique(stacks, return_inverse=True)
    optimizer = np.array([sid >= 0 and b.decider.decide(int(sid)).category == "optimizer_state"
                          for sid in ids.tolist()], dtype=bool)
    mine = kept[optimizer[inverse.reshape(-1)]] if len(ids) else kept[:0]
    # ... made afresh, not in place of state from before the window that the step frees (a hand-written AdamW's
    # out-of-place `m = beta1 * m + …`: then the blocks left of the size are the parameters and their .grad)
    dropped = np.flatnonzero((alloc < 0) & (window["free_index"].to_numpy() >= 0))
    freers, by = np.unique(b.snapshot.event_stack_ids(b.device, window["free_index"].to_numpy()[dropped]),
                           return_inverse=True)
    replaced = np.array([sid >= 0 and ((d := b.decider.decide(int(sid))).category == "optimizer_state"
                                       or "optimizer" in d.context) and "zero_grad" not in d.context
                         for sid in freers.tolist()], dtype=bool)
    sizes = window["size"].to_numpy()
    return np.setdiff1d(sizes[mine], sizes[dropped[replaced[by.reshape(-1)]]] if len(freers) else [])


def window_gradients(snapshot: Snapshot, device: int, lifetimes: pd.DataFrame, decider: Decider) -> np.ndarray:
    """The sizes of the gradients one backward of the window makes, one per trained parameter (a size as often
    as parameters have it): the autograd device thread's allocations kept past their backward, in the pass that
    made the most bytes of them; kept on the decider per device."""
    hit = decider.gradients_cache.get(device)
    if hit is not None and hit[0] is lifetimes:
        return hit[1]
    alloc = lifetimes["alloc_index"].to_numpy()
    traced = alloc >= 0
    stacks = np.full(len(lifetimes), -1, dtype=np.int64)
    stacks[traced] = snapshot.event_stack_ids(device, alloc[traced])
    device_thread = traced & ((stacks < 0) | np.isin(stacks, decider.engine_stacks()))
    passes = decider.passes(snapshot, device)
    _, kept = kept_past(passes, alloc, lifetimes["free_index"].to_numpy(), device_thread)
    sizes = lifetimes["size"].to_numpy()
    # one gradient per trained parameter: those of the backward that made the most bytes of them (a window with
    # two steps makes each .grad twice)
    of = passes.of(alloc[kept])
    best = int(np.bincount(of[of >= 0], weights=sizes[kept][of >= 0]).argmax()) if (of >= 0).any() else -1
    found = np.sort(sizes[kept][of == best]) if best >= 0 else np.zeros(0, dtype=np.int64)
    decider.gradients_cache[device] = (lifetimes, found)
    return found


def gradient_sizes(b: Blocks) -> np.ndarray:
    """`window_gradients` of the blocks' device (none without the window)."""
    if b.window is None or not len(b.window):
        return np.zeros(0, dtype=np.int64)
    return window_gradients(b.snapshot, b.device, b.window, b.decider)


def gradients_seen(b: Blocks, sizes: np.ndarray) -> str:
    """What the window shows of the parameters' .grad (`state._copies`): "fresh" where its own backward makes
    gradients of those sizes afresh (the autograd device thread's allocations kept past their backward), or
    zero_grad frees gradients of those sizes made before the window; "before" where a backward runs in it and
    makes none of those sizes to keep (it accumulates into .grad kept from before); "" without a backward."""
    window = b.window
    passes = b.decider.passes(b.snapshot, b.device)
    if window is None or not len(sizes):
        return ""
    alloc = window["alloc_index"].to_numpy()
    traced = alloc >= 0
    free = window["free_index"].to_numpy()
    fresh = np.isin(gradient_sizes(b), sizes)
    # ... or where zero_grad frees, inside the window, frame-less gradients of those sizes made before it.
    dropped = np.flatnonzero(~traced & (free >= 0) & np.isin(window["size"].to_numpy(), sizes))
    if len(dropped):
        by = np.unique(b.snapshot.event_stack_ids(b.device, free[dropped]))
        if any("zero_grad" in b.decider.decide(int(sid)).context for sid in by.tolist()):
            return "fresh"
    return "fresh" if fresh.any() else "before" if len(passes) else ""


def before_window(guess: StateGuess | None, freed_by: Decision | None, free_site: Site | None,
                  moved: bool = False) -> Decision:
    """A block live before the window whose allocation carries no stack: persistent state (`state`), a .grad
    (freed by zero_grad), the optimizer's state (freed by its code: replaced by its step, or moved off the
    device), a module's tensor (freed when `Module._apply` moved the module: `moved`), or unknown, said plainly
    with the fix."""
    if guess is not None:
        return Decision(guess.category, guess.rule, guess.reason, -1, inferred=True)
    if freed_by is not None and "zero_grad" in freed_by.context:
        return Decision("gradients", "state.freed_by_zero_grad",
                        words("no frames, live before the window, freed by zero_grad (", free_site,
                              "), which sets each parameter's .grad to None: a parameter's .grad"), -1, inferred=True)
    if freed_by is not None and (freed_by.category == "optimizer_state" or "optimizer" in freed_by.context):
        return Decision("optimizer_state", "state.freed_by_optimizer",
                        words("no frames, live before the window, freed by the optimizer's code (", free_site,
                              "): its state, which the step replaced (an out-of-place update of a moment) or "
                              "which was moved off the device"), -1, inferred=True)
    if moved:
        return Decision("weights", "state.freed_by_module_move",
                        words("no frames, live before the window, freed when Module._apply moved its module (",
                              free_site, "; model.cpu(), .to()): a parameter or buffer of that module (or a "
                              "parameter's .grad, which _apply moves right after it)"), -1, inferred=True)
    return Decision("other", "unknown.before_window",
                    words("allocated before the trace window began and no stack was recorded for it",
                          *(("; freed at ", free_site) if free_site is not None else ()), f"; {ADVICE}"), -1)


def stage(b: Blocks, code: np.ndarray) -> np.ndarray:
    """Decide the frame-less blocks from before the window: persistent state, or by the stack of their free."""
    table, decider, device = b.table, b.decider, b.device
    code = code.copy()
    frameless_pre = (b.stack < 0) & (b.origin != "trace")
    kept = frameless_pre & (b.free_index < 0) & (b.pools == "0,0")
    freed_pre = np.flatnonzero(frameless_pre & (b.free_index >= 0))
    free_stacks = b.snapshot.event_stack_ids(device, b.free_index[freed_pre]) if len(freed_pre) else \
        np.zeros(0, dtype=np.int64)
    freers, by_freer = np.unique(free_stacks, return_inverse=True)
    freed_by = [decider.decide(int(sid)) for sid in freers.tolist()]
    frames, stacks = decider.interner.frames, decider.interner.stacks
    moved = [sid >= 0 and apply_frame(frames, stacks[sid]) >= 0 and decider.rules.enabled("state.freed_by_module_move")
             for sid in freers.tolist()]
    training = any(d.category in TRAINING or set(d.context) & {"autograd", "optimizer", "backward"}
                   for d in (*table.items, *freed_by)) or b.snapshot.frameless_allocations(device)
    code[frameless_pre] = table.add(before_window(None, None, None))
    code[freed_pre] = table.codes([before_window(None, by, shown_site(decider, int(sid), by.frame), move)
                                   for sid, by, move in zip(freers.tolist(), freed_by, moved)])[by_freer.reshape(-1)]
    # Gradients and optimizer state that frames prove, of the sizes of these blocks, mean the copies are not
    # among them: they are the parameters (and buffers) those copies belong to.
    of = table.columns()
    framed_state = np.isin(of["category"][code], TRAINING) & (b.stack >= 0)
    twins = np.isin(b.sizes[kept], np.union1d(b.sizes[framed_state], state_made(b)))
    training_here = training and not (kept.any() and b.sizes[kept][twins].sum() >= 0.5 * b.sizes[kept].sum())
    guesses = persistent(decider, device, b.sizes[kept], b.addr[kept], training_here,
                         retained(decider, b.snapshot, device, b.window),
                         gradients_seen(b, b.sizes[kept]) if training_here else "", gradient_sizes(b))
    if guesses:                                          # a few distinct guesses, shared by many blocks
        _, first, inverse = np.unique(np.fromiter(map(id, guesses), dtype=np.uint64, count=len(guesses)),
                                      return_index=True, return_inverse=True)
        code[kept] = table.codes([before_window(guesses[k], None, None) for k in first.tolist()])[inverse]
    return code
