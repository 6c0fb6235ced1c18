"""Attribute every live byte at an instant to one category, naming the rule and frame that decided it.

Contract: `attribute(snapshot, at="peak", rules=None)` picks an instant per device (`peak`,
`peak:N`, `event:I`, `time:T` with T a UTC date-time as the outputs print it or in ISO 8601, an offset
into the device's trace window such as +2.38ms, or µs since the epoch: `time_us_of`), takes the blocks live
right after it from the replay, and labels each with a primary category plus tags. First the frames decide
(`_Decider`: rules by category precedence, lifecycle categories by their outermost frame, op categories by
their innermost one inside the owning module; where the snapshot carries its frames' source
(`Snapshot.sources`, from `load(path, source=...)`), rules also see each frame's class, qualified
name and code; a category's `not_across` boundaries keep an optimizer step from owning the model its closure
runs). Where no rule decides, or only a guess from a file's name: the autograd node of a C++-only backward
stack, else the role of the model code that made the allocation in the trace's call tree (`calltree`), both
flagged inferred with their evidence. A `Module._apply` copy that the trace's order shows to be a
parameter's .grad (`moves`) is gradients, not weights. Every heuristic is named in `rules.HEURISTICS` and a
rules file may disable it. Then block-level evidence, strongest first:
- a module span of the collector (`collect.modules`) around the allocation names the module (`modules`),
  above what frames only guess from names;
- no stack and from before the window: persistent state (`state`: cuBLAS workspace, activations of a size
  the window shows the program keeping (`kept_activations`: a retained graph), weights, and in a training
  program gradients / optimizer moments as copies of the parameters), or state an optimizer step freed (it
  replaced it), or unknown, said plainly with how to record it;
- a private pool (named by the alloc entry's `pool_id` from torch 2.12, else by the end state) →
  `graph_capture` (unless frames prove a MemPool user: weights or KV cache in a pool);
- made by the autograd engine and still live after that backward ended → `gradients`;
- the request of the alloc entry (`user_metadata`, else a run's request marker span covering it: see
  `requests`) naming another request than the instant's → `concurrent_request`. The instant's request is
  the one whose allocation reached it (at an OOM, whose allocation failed), else the marker span running
  then, else, as a stated last resort, the one holding the most live bytes;
- an annotation the program made on the block (`annotations`: torch ≥ 2.14's `_annotate_tensor`) naming a
  category decides it outright (the program said so); any other annotation text is kept in `annotation`;
- size relations, only where the stack is consistent with them (never in a module the source says owns the
  block, in a backward pass or an optimizer step): an autocast copy of a live weight, tokens × vocab logits,
  a gate/up output twice a live MLP output, PyTorch's default cuBLAS workspace size, B·H·L² attention
  scores under user attention code and their gradients in the backward.
Everything not proven by a frame, pool or metadata is flagged `inferred`, with the arithmetic in `reason`.
Only the stacks of live blocks (and the frees of pre-window ones) are resolved, each distinct frame once;
every decision is made once per distinct combination of what it reads (stack, pool, request, and the size or
alloc index only where a size relation could hold) and broadcast to the blocks that share it.
The bytes of the per-block table sum exactly to the instant's active bytes.

`Attribution.blocks` columns: device, address, size (requested bytes), allocated_est, category, tags
(comma-separated), rule, reason, frame (deciding or innermost meaningful frame, "file:line:function", the
function as Class.method where the source was found), owner (the innermost frame of the program's or a
model library's code that made the block, as `frame` shows it; "" where the stack has none), inferred,
stack_id, user_metadata, pool, stream, origin, alloc_index, annotation (the program's own text for the block,
"" for none), span (the innermost `record_function` span open when the block was allocated, e.g.
"Optimizer.step#AdamW.step" or a program's "prefill" range; "" for none or a block from before the window);
its text columns are of object dtype, each distinct text one shared string (a
quarter of a million blocks would otherwise copy ~200 MB of text into Arrow strings).
`Attribution.summary` columns: device, category, bytes, share, blocks, top_frames (list of str, largest
first), top_frame_bytes (their live bytes), inferred_bytes (of `bytes`, those flagged inferred).
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from ..display import HtmlDisplay
from ..errors import UsageError
from ..model import ALLOC, OOM, Snapshot
from ..replay import ORIGINS, Timeline, replay
from ..stacks import StackInterner, frame_site, is_python_frame
from ..units import fmt_count, fmt_time_us
from .annotations import annotated_category, annotations_at
from .calltree import CALLEES, CallTree
from .modules import ModuleDecision, ModuleIndex
from .moves import apply_frame, grad_copy_frames
from .peaks import find_peaks, global_peak_index
from .requests import RequestIndex, event_requests, request_at
from .rules import Category, FrameFacts, RuleSet, load_rules
from .spans import open_spans
from .state import ADVICE, CUBLAS_DEFAULT_WORKSPACE, Retained, StateGuess, persistent_state

BLOCK_COLUMNS = ["device", "address", "size", "allocated_est", "category", "tags", "rule", "reason", "frame",
                 "owner", "inferred", "stack_id", "user_metadata", "pool", "stream", "origin", "alloc_index",
                 "annotation", "span"]
APPLY_GRAD = "order.apply_grad"
GATE_UP_GAP = 16   # trace entries between a gate/up output and the activation made from it (read right after)
SUMMARY_COLUMNS = ["device", "category", "bytes", "share", "blocks", "top_frames", "top_frame_bytes",
                   "inferred_bytes"]
# Vocabulary sizes of common LLM families, for the tokens × vocab logits heuristic.
KNOWN_VOCABS = (32000, 32001, 32064, 32256, 32768, 49152, 50257, 50272, 50280, 51200, 64000, 65024, 65536,
                92544, 100352, 102400, 128000, 128256, 129280, 151646, 151936, 152064, 163840, 200064,
                201088, 256000, 262144, 262208)


@dataclass(frozen=True)
class Decision:
    category: str
    rule: str
    reason: str
    frame: int          # deciding frame id (−1: none)
    tags: tuple[str, ...] = ()
    inferred: bool = False
    context: tuple[str, ...] = ()   # tags of the plumbing the stack passed through (autograd, autocast, …)
    owner: str = ""                 # the module (Class.method) that owns the allocation, when the source says


@dataclass(frozen=True)
class Instant:
    device: int
    event_index: int
    label: str
    time_us: int | None
    active_bytes: int
    reserved_bytes: int
    baseline_active_bytes: int
    request: str | None = None


@dataclass(frozen=True, eq=False)
class Attribution(HtmlDisplay):
    """Per-block attribution at one instant per device, and its summary by category."""

    snapshot: Snapshot
    timeline: Timeline
    instants: dict[int, Instant]
    blocks: pd.DataFrame
    rules: RuleSet = field(repr=False)
    notes: tuple[str, ...] = ()

    @cached_property
    def summary(self) -> pd.DataFrame:
        """`summarize_blocks(blocks)`: by device and category (made on first use)."""
        return summarize_blocks(self.blocks)


class _Decider:
    """Decides a stack's category from its frames; cached per stack id. The last one made for a snapshot is
    kept (`for_snapshot`), so that the many attributions of one snapshot with one rule set (phases, reports)
    decide each stack once.

    Frames are walked innermost first. Plumbing is skipped (its tags mark the stack's context); every other
    frame is matched against the rules. Outermost-owner categories (lifecycle) take their outermost match;
    innermost-owner categories (ops) their innermost, but only inside the owning module: the first frame
    of a class that the source names, that is no pass-through layer and that matches no op rule owns the
    allocation (a residual add in `TransformerBlock.forward` is the block's own, not the attention's that
    encloses nothing), so op matches further out no longer count. `confirm` rules count only when another
    frame proves the same category; `where = "allocating"` rules only on the allocating line."""

    _kept: weakref.WeakKeyDictionary[Snapshot, _Decider] = weakref.WeakKeyDictionary()

    @classmethod
    def for_snapshot(cls, snapshot: Snapshot, rules: RuleSet) -> _Decider:
        rules = rules.with_source(snapshot.sources)        # the source the snapshot carries (`load(source=)`)
        decider = cls._kept.get(snapshot)
        if decider is None or decider.rules is not rules:
            decider = cls._kept[snapshot] = cls(snapshot.interner, rules, allocation_stacks(snapshot),
                                                grad_copies(snapshot))
        return decider

    def __init__(self, interner: StackInterner, rules: RuleSet, tree_stacks: np.ndarray,
                 grad_frames: dict[int, str]) -> None:
        self.interner, self.rules = interner, rules        # not the snapshot: it keys `_kept` weakly
        self.bare = rules.with_source(None)                # the same rules without the source
        self.tree_stacks = tree_stacks                     # the stacks the call tree is built over
        # `Module._apply` lines that copy a .grad (`moves`), where the order heuristic is enabled
        self.grad_frames = grad_frames if rules.enabled(APPLY_GRAD) else {}
        self.cache: dict[int, Decision] = {-1: Decision("other", "no_frames",
                                                         "the allocation carries no stack frames", -1)}
        self.display_cache: dict[int, int] = {-1: -1}
        self.owner_cache: dict[int, int] = {-1: -1}
        self.files_cache: dict[int, tuple[tuple[str, bool], ...]] = {}
        self.state_cache: dict[tuple[Any, ...], list[StateGuess]] = {}
        self.retained_cache: dict[int, tuple[pd.DataFrame, dict[int, Retained]]] = {}

    def persistent(self, device: int, sizes: np.ndarray, addresses: np.ndarray, training: bool,
                   retained: dict[int, Retained]) -> list[StateGuess]:
        """`state.persistent_state` of these blocks, kept: blocks live throughout the window are the same at
        every instant of a device."""
        key = (device, training, sizes.tobytes() + addresses.tobytes(), tuple(sorted(retained.items())))
        found = self.state_cache.get(key)
        if found is None:
            found = self.state_cache[key] = persistent_state(sizes, addresses, training, retained,
                                                             self.rules.enabled)
        return found

    def retained(self, snapshot: Snapshot, device: int, lifetimes: pd.DataFrame | None) -> dict[int, Retained]:
        """Activations the device's window shows the program keeping, by size (`kept_activations`), kept."""
        if lifetimes is None:
            return {}
        hit = self.retained_cache.get(device)
        if hit is None or hit[0] is not lifetimes:
            hit = self.retained_cache[device] = (lifetimes, kept_activations(snapshot, device, lifetimes, self))
        return hit[1]

    def program_files(self, stack_id: int) -> tuple[tuple[str, bool], ...]:
        """The program's own files in a stack (Python files outside installed packages and the standard
        library, not plumbing) and whether their source was found."""
        found = self.files_cache.get(stack_id)
        if found is None:
            seen: dict[str, bool] = {}
            frames = self.interner.frames
            for fid in self.interner.stacks[stack_id] if stack_id >= 0 else ():
                filename = frames[fid][0]
                if filename in seen or not filename.endswith(".py") or _INSTALLED.search(filename):
                    continue
                facts = self.rules.facts(frames[fid])
                if not facts.plumbing:
                    seen[filename] = facts.source is not None
            found = self.files_cache[stack_id] = tuple(seen.items())
        return found

    @cached_property
    def untrusted(self) -> dict[str, list[int]]:
        """Source files that differ from the code that ran, each with the frames that show it: a file found for
        the trace's frames decides only if every frame the trace's allocations record in it fits (its line lies
        inside a function of its name there); one frame outside makes every line of that copy suspect."""
        if self.rules.source is None:
            return {}
        frames, stacks = self.interner.frames, self.interner.stacks
        seen: set[int] = set()
        out: dict[str, list[int]] = {}
        for sid in self.tree_stacks.tolist():
            for fid in stacks[sid]:
                if fid in seen:
                    continue
                seen.add(fid)
                source = self.rules.facts(frames[fid]).source
                if source is not None and source.drifted:
                    out.setdefault(source.path, []).append(fid)
        return out

    def facts(self, frame: tuple[str, int, str]) -> FrameFacts:
        """What the rules say about a frame, its source left out where its file is `untrusted`."""
        facts = self.rules.facts(frame)
        if facts.source is not None and self.untrusted and facts.source.path in self.untrusted:
            return self.bare.facts(frame)
        return facts

    def qualname(self, frame: tuple[str, int, str] | None) -> str:
        """The frame's qualified name where its source was found ("" otherwise)."""
        if frame is None:
            return ""
        source = self.facts(frame).source
        return source.qualname if source is not None and source.qualname != "<module>" else ""

    def display_frame(self, stack_id: int) -> int:
        """Innermost meaningful frame: the first Python frame that is neither plumbing nor a pass-through
        layer, else the first non-plumbing Python frame, else the first non-plumbing frame, else the first
        plumbing frame that marks a context (a backward's autograd node, `MmBackward0::apply`) — never one
        past the thread's entry point (`thread_entry`), where libc starts the thread."""
        hit = self.display_cache.get(stack_id)
        if hit is not None:
            return hit
        frames = self.interner.frames
        ids = self.interner.stacks[stack_id]
        python = other = chosen = marked = -1
        for fid in ids:
            facts = self.facts(frames[fid])
            if "thread_entry" in facts.context:
                break
            if facts.plumbing:
                if marked < 0 and facts.context:
                    marked = fid
                continue
            if is_python_frame(frames[fid][0]):
                if not facts.passthrough:
                    chosen = fid
                    break
                python = fid if python < 0 else python
            elif other < 0:
                other = fid
        for candidate in (chosen, python, other, marked, ids[0] if ids else -1):
            if candidate >= 0:
                break
        self.display_cache[stack_id] = candidate
        self.owner_cache[stack_id] = chosen
        return candidate

    def owner_frame(self, stack_id: int) -> int:
        """The owner of a stack's allocation: its innermost frame of the program's or a model library's code
        (Python, neither plumbing nor a pass-through layer), −1 where it has none (a C++-only backward)."""
        if stack_id not in self.owner_cache:
            self.display_frame(stack_id)
        return self.owner_cache[stack_id]

    def decide(self, stack_id: int) -> Decision:
        hit = self.cache.get(stack_id)
        if hit is not None:
            return hit
        frames = self.interner.frames
        rules, cats = self.rules.rules, self.rules.categories
        scoped = self.rules.scoped_tags                  # context tag -> the tags that end its scope
        found: dict[str, tuple[int, int, int]] = {}      # category -> (depth, rule index, frame id)
        proven: set[str] = set()                         # categories a non-confirm rule matched
        context: list[str] = []
        crossed: set[str] = set()                        # context tags of the frames walked so far
        code_frames: list[tuple[str, frozenset[str]]] = []   # model code walked so far: file, categories matched
        owner = ""
        allocating = True                                # the next meaningful Python frame allocated
        stack = self.interner.stacks[stack_id]
        for depth, fid in enumerate(stack):
            facts = self.facts(frames[fid])
            if facts.plumbing:
                context.extend(t for t in facts.context if not scoped.get(t, frozenset()) & crossed)
                crossed.update(facts.context)
                continue
            filename = frames[fid][0]
            python = is_python_frame(filename)
            here = allocating and python and not facts.passthrough
            op_match = False
            matched: set[str] = set()
            for ri in facts.matched:
                rule = rules[ri]
                if rule.allocating and not here:
                    continue
                if rule.caller is not None and not rule.called_by(_caller(frames, stack, depth)):
                    continue
                cat = rule.category
                c = cats[cat]
                if c.not_across and _crosses(c, crossed, code_frames, filename):
                    continue
                matched.add(cat)
                if c.owner == "innermost":
                    if owner:
                        continue
                    op_match = True
                if not rule.confirm:
                    proven.add(cat)
                prev = found.get(cat)
                if prev is None or (c.owner == "outermost" and depth > prev[0]):
                    found[cat] = (depth, ri, fid)
            if python and not facts.passthrough:
                code_frames.append((filename, frozenset(matched)))
            if here:
                allocating = False
            source = facts.source
            if not owner and not op_match and source is not None and source.cls and not facts.passthrough:
                owner = source.qualname
        found = {cat: hit for cat, hit in found.items() if not rules[hit[1]].confirm or cat in proven}
        ctx = tuple(dict.fromkeys(context))
        if not found or (len(found) == 1 and rules[next(iter(found.values()))[1]].weak):
            decision = self._from_tree(stack_id, found, ctx, owner)
        else:
            def key(item: tuple[str, tuple[int, int, int]]) -> tuple[int, int]:
                cat, (depth, _, _) = item
                c = cats[cat]
                return (c.precedence, depth if c.owner == "outermost" else -depth)
            cat, (depth, ri, fid) = max(found.items(), key=key)
            rule = rules[ri]
            tags = tuple(dict.fromkeys([*rule.tags, *(c for c in found if c != cat)]))
            decision = Decision(cat, rule.name, rule.reason, fid, tuple(t for t in tags if t != cat),
                                context=ctx, owner=owner)
        if decision.category == "weights" and self.grad_frames:
            moved = apply_frame(frames, self.interner.stacks[stack_id])
            if moved in self.grad_frames:
                decision = Decision("gradients", APPLY_GRAD, self.grad_frames[moved], moved, inferred=True,
                                    context=ctx, owner=owner)
        self.cache[stack_id] = decision
        return decision

    def _from_tree(self, stack_id: int, found: dict[str, tuple[int, int, int]], ctx: tuple[str, ...],
                   owner: str) -> Decision:
        """Where no rule decided (or only a guess from a file name did): the backward node that made the
        allocation, else the role of the model code that made it (`calltree`), flagged inferred; else the
        file-name guess, else other."""
        weak = next(iter(found.items()), None)
        if "autograd" in ctx and not weak:
            backward = self.tree.backward(stack_id)
            if backward is not None:
                node_rule, node_frame = backward
                return Decision(node_rule.category, node_rule.name, f"{node_rule.reason}, in a backward pass "
                                "(inferred from the node's name)", node_frame, inferred=True, context=ctx, owner=owner)
        hit = self.tree.role(stack_id)
        if hit is not None:
            return Decision(hit.category, hit.rule, hit.reason, hit.frame,
                            tuple(t for t in ([weak[0]] if weak else []) if t != hit.category),
                            inferred=True, context=ctx, owner=owner)
        if weak is not None:
            cat, (_, ri, fid) = weak
            rule = self.rules.rules[ri]
            callees, node = self.tree.callee_roles(stack_id)
            if self.rules.enabled(CALLEES) and len(callees) == 1 and cat not in callees:
                # The file's name says one thing, the code the function calls another (diffusers keeps
                # FeedForward in attention.py): what ran decides.
                role = next(iter(callees))
                where = frame_site(self.interner.frames[node])
                return Decision(role, CALLEES, f"{where} calls model code whose role is {role} and "
                                f"none whose role is {cat}, which only its file's name suggests (inferred from the "
                                "call tree)", node, (cat,), inferred=True, context=ctx, owner=owner)
            return Decision(cat, rule.name, f"{rule.reason} (a guess from its file's name: inferred)", fid,
                            tuple(t for t in rule.tags if t != cat), inferred=True, context=ctx, owner=owner)
        return Decision("other", "unmatched", "no rule matched any frame of this stack"
                        + (f" inside {owner}, which owns it" if owner else ""), -1, context=ctx, owner=owner)

    @cached_property
    def tree(self) -> CallTree:
        return CallTree(self.interner, self.rules, self.tree_stacks.tolist(), self.facts)


def allocation_stacks(snapshot: Snapshot) -> np.ndarray:
    """The distinct stacks of what allocated: every allocation of every device's trace and every block of
    the end state. Whether a file's other stacks (frees) were kept (`load(frames=...)`) changes none of them,
    so the call tree built over them, and every role, is the same either way."""
    found = [snapshot.block_stack_ids(np.arange(len(snapshot.block_columns.get("address", ()))))]
    for device in snapshot.devices:
        found.append(snapshot.event_stack_ids(device, np.flatnonzero(snapshot.trace(device).action == ALLOC)))
    ids = np.unique(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64)
    return ids[ids >= 0]


ACTIVATIONS = ("attention", "mlp", "logits", "fallback_kernel", "vision_encoder")
RETAINED_MIN_SIZE = 1 << 20       # smaller sizes coincide too often to speak for a kept activation
RETAINED_MIN_BLOCKS = 2           # one kept output is a result the program holds, not a retained graph


def kept_activations(snapshot: Snapshot, device: int, lifetimes: pd.DataFrame, decider: _Decider
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
    best: dict[int, dict[str, list[Any]]] = {}      # size -> category -> [blocks, site of the largest share]
    for (sid, size), n in zip(pairs.tolist(), counts.tolist()):
        d = decider.decide(sid)
        if d.category not in ACTIVATIONS:
            continue
        hit = best.setdefault(size, {}).setdefault(d.category, [0, "", 0])
        hit[0] += n
        if n > hit[2]:
            hit[1], hit[2] = frame_site(*_display(decider, sid, d.frame)), n
    out = {}
    for size, cats in best.items():
        cat, (n, site, _) = max(cats.items(), key=lambda kv: kv[1][0])
        if n >= RETAINED_MIN_BLOCKS:
            out[size] = Retained(cat, n, site)
    return out


def _caller(frames: list[tuple[str, int, str]], stack: tuple[int, ...], depth: int) -> tuple[str, int, str] | None:
    """The Python frame that called the one at `depth` (the interpreter's own C frames between them skipped)."""
    for fid in stack[depth + 1:]:
        if is_python_frame(frames[fid][0]):
            return frames[fid]
    return None


def grad_copies(snapshot: Snapshot) -> dict[int, str]:
    """`moves.grad_copy_frames` over every device's allocations, in trace order."""
    allocations = []
    for device in snapshot.devices:
        trace = snapshot.trace(device)
        at = np.flatnonzero(trace.action == ALLOC)
        allocations.append((snapshot.event_stack_ids(device, at), trace.size[at]))
    return grad_copy_frames(snapshot.interner.frames, snapshot.interner.stacks, allocations)


def _crosses(category: Category, crossed: set[str], code_frames: list[tuple[str, frozenset[str]]],
             filename: str) -> bool:
    """Whether a match of `category` on a frame of `filename` lies across one of its `not_across` boundaries
    from the allocation: a context tag walked before it, or (``model_code``) a frame of model code in another
    file that matched no rule of the category (a closure the optimizer step called)."""
    if crossed.intersection(category.not_across):
        return True
    return "model_code" in category.not_across and any(
        f != filename and category.name not in cats for f, cats in code_frames)


def _instant(timeline: Timeline, device: int, at: str) -> tuple[int, str]:
    dt = timeline[device]
    kind, _, arg = at.partition(":")
    try:
        if kind == "peak" and not arg:
            return global_peak_index(dt), "global peak"
        if kind == "peak":
            n = int(arg)
            peaks = find_peaks(timeline, top=max(n, 1), device=device)
            if n < 1 or n > len(peaks):
                raise UsageError(f"--at {at}: device {device} has {len(peaks)} peak(s)")
            return int(peaks.iloc[n - 1]["event_index"]), f"peak {n}"
        if kind == "event":
            i = int(arg)
            if not -1 <= i < len(dt):
                raise UsageError(f"--at {at}: device {device} has events 0…{len(dt) - 1} (−1 = start)")
            return i, f"event {i}"
        if kind == "time":
            if dt.time_us is None or len(dt) == 0:
                raise UsageError(f"--at {at}: device {device}'s trace has no timestamps")
            t = time_us_of(arg, int(dt.time_us[0]))
            return int(np.searchsorted(dt.time_us, t, side="right")) - 1, f"time {fmt_time_us(t)}"
    except ValueError:
        raise UsageError(f"--at {at}: {_AT_FORMS}") from None
    raise UsageError(f"--at {at}: {_AT_FORMS}")


_AT_FORMS = ("expected peak, peak:N, event:I or time:T (T: a UTC date-time as printed, e.g. 2026-04-18 "
             "02:34:01.223438 UTC or 2026-04-18T02:34:01.223438Z; an offset into the trace window, e.g. +2.38ms, "
             "+1.5s, +120us; or µs since the epoch)")
_OFFSET = re.compile(r"^\+\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(us|µs|ms|s)$")
_OFFSET_US = {"us": 1, "µs": 1, "ms": 1000, "s": 1_000_000}


def time_us_of(text: str, window_start_us: int) -> int:
    """µs since the epoch of a `time:` instant: digits (already µs since the epoch), ``+<n><us|ms|s>`` (that
    long after `window_start_us`, the trace's first event; a fraction of a µs rounds down), or a date-time —
    ``2026-04-18 02:34:01.223438 UTC`` as the outputs print it, or ISO 8601 (no zone: UTC). Raises
    ValueError for anything else."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    m = _OFFSET.match(text)
    if m:
        return window_start_us + int(Decimal(m.group(1)) * _OFFSET_US[m.group(2)])
    if text.endswith(" UTC"):
        text = text[:-4].rstrip() + "+00:00"
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _pools(snapshot: Snapshot, device: int, addr: np.ndarray, block_row: np.ndarray,
           alloc_index: np.ndarray) -> np.ndarray:
    """Pool id text of each block: the pool its alloc entry names (torch ≥ 2.12), else its end-state block's,
    else the segment's that holds it at the end."""
    blocks, segs = snapshot.block_columns, snapshot.segment_columns
    out = np.full(len(addr), "0,0", dtype=object)
    known = block_row >= 0
    if known.any():
        out[known] = blocks["pool_id"][block_row[known]]
    mine = segs["device"] == device
    if (~known).any() and mine.any():
        start = segs["address"][mine]
        order = np.argsort(start)
        start = start[order]
        end = start + segs["total_size"][mine][order].astype(np.uint64)
        pools = segs["pool_id"][mine][order]
        pos = np.searchsorted(start, addr[~known], side="right") - 1
        ok = (pos >= 0) & (addr[~known] < end[np.maximum(pos, 0)])
        sub = np.full(len(pos), "0,0", dtype=object)
        sub[ok] = pools[pos[ok]]
        out[~known] = sub
    from_trace = alloc_index >= 0
    named = snapshot.trace(device).pools_of(alloc_index[from_trace]) if from_trace.any() else None
    if named is not None:
        out[from_trace] = named
    return out


def _main_request(metadata: np.ndarray, sizes: np.ndarray) -> str | None:
    """The request holding the most live bytes allocated in the window (the last resort for the instant's)."""
    named = np.flatnonzero(metadata != "")
    if not len(named):
        return None
    codes, requests = pd.factorize(metadata[named])
    totals = np.zeros(len(requests), dtype=np.int64)
    np.add.at(totals, codes, sizes[named].astype(np.int64))
    return str(max(zip(totals.tolist(), requests.tolist()))[1])


def _shape_scores(size: int) -> tuple[int, int, int] | None:
    """(k, L, bytes per element) with size = k·L²·b, L ≥ 128 a multiple of 64, 8 ≤ k ≤ 4096 — or None.

    k stands for batch × heads; several (k, L) usually fit, so the largest L is only an example."""
    for b in (4, 2):
        if size % b:
            continue
        x = size // b
        for L in range(int(np.sqrt(x / 8)) // 64 * 64, 127, -64):
            if x % (L * L) == 0 and 8 <= x // (L * L) <= 4096:
                return x // (L * L), L, b
    return None


def _shape_logits(size: int, hints: frozenset[tuple[int, int]], allocated: Callable[[], AbstractSet[int]]
                  ) -> tuple[int, int, int] | None:
    """(tokens, vocab, bytes per element) for a ≥ 16 MiB size = T·V·b — or None.

    V must be the vocabulary of a live embedding or lm_head weight (`vocab_hints`: V with the hidden sizes
    its norm weights prove), and the trace must also have allocated those T tokens' hidden states, a block
    of T × hidden × 2 or 4 bytes (`allocated()`: the sizes the trace allocated, but those of live weights):
    sizes factor over many vocabularies, and an activation T'·F·b (an MLP's 1000 × 5632 × 4 B is 176 ×
    32000 × 4 B) fits a vocabulary by coincidence, where nothing made 176 tokens' hidden states. Where both
    element widths fit, 4 bytes wins (logits are upcast). Powers of two are refused as too ambiguous."""
    if size < (16 << 20) or size & (size - 1) == 0:
        return None
    found = [(tokens, v, b) for v, hidden in hints for b in (4, 2)
             if size % (v * b) == 0 and (tokens := size // (v * b)) >= 16
             and any(tokens * hidden * h in allocated() for h in (2, 4))]
    return max(found, key=lambda f: (f[1], f[2])) if found else None


def vocab_hints(sizes: np.ndarray) -> frozenset[tuple[int, int]]:
    """The vocabulary of the live embedding / lm_head weight and its hidden sizes, (V, hidden) pairs, if the
    weight sizes prove one V.

    The largest weight block of a language model is its vocabulary matrix, V × hidden × b bytes (b = 2 or 4,
    hidden a multiple of 256), and its norm weights (and biases) are blocks of exactly hidden × b bytes. A
    known V counts only when such a block corroborates its hidden size: one product fits many vocabularies
    (Llama-2's 32000 × 4096 × 2 B is also 64000 × 2048, 128000 × 1024 and 256000 × 512 × 2 B), and a model
    whose vocabulary is not its largest weight (a small vocabulary under wide MLPs) fits one by coincidence.
    Empty unless exactly one V is corroborated (with each hidden size that fits it: 32000 × 4096 × 2 B and
    32000 × 2048 × 4 B are one product). Power-of-two vocabularies are left out (every power-of-two weight
    would fit them)."""
    if len(sizes) == 0:
        return frozenset()
    largest = int(np.max(sizes))
    present = set(sizes.tolist())
    fits = {(v, hidden) for v in KNOWN_VOCABS if v & (v - 1) for b in (2, 4)
            if largest % (v * b) == 0 and 512 <= (hidden := largest // (v * b)) <= 32768 and hidden % 256 == 0
            and hidden * b in present}
    return frozenset(fits) if len({v for v, _ in fits}) == 1 else frozenset()


@dataclass(frozen=True)
class _Context:
    """What the block-level signals know about the whole set of blocks being labelled."""

    request: str | None            # the instant's request (see `_instant_request`)
    request_why: str               # how it was chosen, for the reason text
    vocab: frozenset[tuple[int, int]]  # (vocabulary, hidden) of the live embedding weight, if proven
    allocated: Callable[[], AbstractSet[int]]  # sizes the device's trace allocated, but a live weight's (on first use)
    scores_floor: int              # half the largest block under a user-code attention function
    mlp_outputs: dict[int, tuple[int, ...]]   # size → alloc indices of live MLP activation outputs (≥ 1 MiB)
    weight_sizes: dict[int, int]   # size → live weights of that size (for autocast copies of them)
    copy_sizes: dict[int, int]     # size → live blocks made by an autocast cast, of that size
    in_backward: bool              # the allocation that reached the instant ran in a backward pass
    enabled: Callable[[str], bool]  # `RuleSet.enabled`: the heuristics a rules file kept


# State that lives across steps (the rest of a peak rises on top of it); frame decisions in these categories
# are never overridden by request identity or shape heuristics.
PERSISTENT_CATEGORIES = ("weights", "kv_cache", "graph_capture", "gradients", "optimizer_state")
_LIFECYCLE = PERSISTENT_CATEGORIES
_TRAINING = ("gradients", "optimizer_state")


def _before_window(guess: StateGuess | None, freed_by: Decision | None, free_site: str) -> Decision:
    """A block live before the window whose allocation carries no stack: persistent state (`state`), state an
    optimizer replaced (freed inside its step), or unknown, said plainly with the fix."""
    if guess is not None:
        return Decision(guess.category, guess.rule, guess.reason, -1, inferred=True)
    if freed_by is not None and (freed_by.category == "optimizer_state" or "optimizer" in freed_by.context):
        return Decision("optimizer_state", "state.freed_by_optimizer",
                        f"no frames, live before the window, freed inside the optimizer step ({free_site}): "
                        "state that the step replaced (an out-of-place update of a moment)", -1, inferred=True)
    return Decision("other", "unknown.before_window",
                    "allocated before the trace window began and no stack was recorded for it"
                    + (f"; freed at {free_site}" if free_site else "") + f"; {ADVICE}", -1)


def _signals(d: Decision, size: int, pool: str, request: str, request_by_time: bool, origin: str,
             has_stack: bool, persistent: bool, alloc: int, ctx: _Context) -> Decision:
    """Block-level signals over the frames' decision, strongest first (see the module docstring)."""
    if pool != "0,0" and d.category in ("weights", "kv_cache") and not d.inferred:
        # A MemPool user (e.g. vLLM's sleep-mode allocator) rather than a graph capture: the frames prove
        # the lifecycle, so they decide, and the pool is kept as a tag.
        return Decision(d.category, d.rule, d.reason + f" (in private memory pool {pool})", d.frame,
                        (*d.tags, "private_pool"))
    if pool != "0,0":
        return Decision("graph_capture", "signal.private_pool",
                        f"allocated in private memory pool ({pool}): a CUDA graph capture or MemPool", d.frame,
                        tuple(x for x in (d.category, *d.tags) if x not in ("other", "graph_capture")))
    # A workspace its frames prove (a backward thread's cuBLAS handle caches one) is never a .grad.
    on = ctx.enabled
    if d.category not in (*_LIFECYCLE, "workspace") and "autograd" in d.context and not ctx.in_backward \
            and on("lifetime.survived_backward"):
        return Decision("gradients", "lifetime.survived_backward",
                        "allocated by the autograd engine in a backward pass and still live after that backward "
                        "ended: a parameter's .grad (the engine hands a gradient buffer to .grad)", d.frame,
                        tuple(x for x in (d.category, *d.tags) if x != "other"), inferred=True)
    if d.category not in _LIFECYCLE and ctx.request and request and request != ctx.request:
        how = "by time: its alloc fell inside that request's marker span" if request_by_time else ""
        return Decision("concurrent_request", "signal.request_marker" if request_by_time else "signal.user_metadata",
                        f"allocated by {request!r}{f' ({how})' if how else ''}; {ctx.request_why} is "
                        f"{ctx.request!r}", d.frame,
                        tuple(x for x in (request, d.category, *d.tags) if x != "other"), inferred=request_by_time)
    if d.category not in _LIFECYCLE and "autocast" in d.context and size * 2 in ctx.weight_sizes \
            and ctx.copy_sizes.get(size, 0) <= ctx.weight_sizes[size * 2] and on("shape.autocast_weight_copy"):
        n, m = ctx.weight_sizes[size * 2], ctx.copy_sizes.get(size, 0)
        return Decision("weights", "shape.autocast_weight_copy",
                        f"made by an autocast cast and exactly half the size of a live weight ({size * 2:,} B): a "
                        f"16-bit copy of a parameter (autocast keeps one per weight; {m} such copies, {n} weights "
                        "of that size — inferred from the size)", d.frame,
                        tuple(x for x in (d.category, *d.tags) if x != "other"), inferred=True)
    # Size coincidences only where the stack is consistent with them: never in a module the source says owns
    # the block, in a backward pass or under an optimizer step.
    if d.category == "other" and origin == "trace" and not d.owner and not set(d.context) & {"autograd",
                                                                                                "optimizer"}:
        logits = _shape_logits(size, ctx.vocab, ctx.allocated) if on("shape.tokens_x_vocab") else None
        if logits:
            return Decision("logits", "shape.tokens_x_vocab",
                            f"size = {logits[0]:,} tokens × {logits[1]:,} vocab × {logits[2]} bytes, a "
                            "vocabulary whose weight is live (inferred from the size)", d.frame, inferred=True)
        if size % 2 == 0 and on("shape.gate_up_of_mlp") and any(
                0 < j - alloc <= GATE_UP_GAP for j in ctx.mlp_outputs.get(size // 2, ())):
            return Decision("mlp", "shape.gate_up_of_mlp",
                            f"size = 2 × a live MLP activation output ({size // 2:,} bytes) allocated right after "
                            "it: the fused gate/up projection that feeds it (inferred from the size and order)",
                            d.frame, inferred=True)
    if size == CUBLAS_DEFAULT_WORKSPACE and persistent and d.category in ("other", "attention", "mlp", "logits") \
            and on("shape.cublas_workspace"):
        return Decision("workspace", "shape.cublas_workspace",
                        f"never freed, and its size is PyTorch's default cuBLAS workspace ({size:,} B), which the "
                        "first matmul on a stream allocates (inferred from the size)", d.frame,
                        tuple(x for x in (d.category,) if x != "other"), inferred=True)
    if _user_attention(d) and size >= max(ctx.scores_floor, 8 << 20) and on("shape.attention_scores"):
        scores = _shape_scores(size)
        if scores:
            return Decision("fallback_kernel", "shape.attention_scores",
                            f"size fits batch·heads × L² × {scores[2]} bytes (e.g. {scores[0]} × {scores[1]}²) "
                            "under an attention function: materialised attention scores (B·H·L·L), which "
                            "fused kernels avoid (inferred from the size)", d.frame, ("attention",), inferred=True)
    return d


def _scores_backward(d: Decision, size: int, scores: frozenset[int]) -> Decision:
    """A backward-pass block with the size of live materialised attention scores is a gradient of them."""
    if "autograd" not in d.context or d.category != "other" or size not in scores:
        return d
    return Decision("fallback_kernel", "shape.scores_backward",
                    f"made in a backward pass with the size of live materialised attention scores ({size:,} B): a "
                    "gradient of those scores (inferred from the size)", d.frame, ("attention",), inferred=True,
                    context=d.context)


def _user_attention(d: Decision) -> bool:
    """Decided `attention` by a name heuristic on user code (not a library's fused kernel)."""
    return d.category == "attention" and d.rule.startswith("generic.")


def _instant_event(trace: Any, index: int) -> int:
    """The event whose allocation reached the instant: the oom entry at it, else the last alloc at or before
    it (−1: none)."""
    if index < 0 or not len(trace):
        return -1
    if trace.action[index] == OOM:
        return index
    lo = index + 1
    while lo > 0:                      # look back in growing windows: the alloc is nearly always close
        lo, hi = max(0, lo - 1024 * (index + 1 - lo + 1)), lo
        allocs = np.flatnonzero(trace.action[lo:hi] == ALLOC)
        if len(allocs):
            return lo + int(allocs[-1])
    return -1


def _instant_request(snapshot: Snapshot, device: int, event: int, markers: pd.DataFrame | None,
                     at_time: int | None, metadata: np.ndarray, sizes: np.ndarray) -> tuple[str | None, str]:
    """The instant's request and how it was chosen: the request of the allocation that reached it (at an OOM,
    the one whose allocation failed), else the request marker span running then, else — a stated last
    resort — the request holding most of the live transient bytes."""
    if event >= 0:
        own = event_requests(snapshot.trace(device), np.array([event]), markers)
        if own.names[0]:
            return str(own.names[0]), "the request whose allocation reached this instant"
    running = request_at(markers, at_time)
    if running:
        return running, "the request whose marker span was running at this instant"
    most = _main_request(metadata, sizes)
    return most, ("for want of a better sign, the request holding most of the live transient bytes at this "
                  "instant" if most else "")


def _label(snapshot: Snapshot, device: int, live: pd.DataFrame, decider: _Decider,
           markers: pd.DataFrame | None = None, at_time: int | None = None,
           at_index: int | None = None, by_size: bool = False, window: pd.DataFrame | None = None
           ) -> tuple[pd.DataFrame, str | None, int]:
    """Label the given block lifetimes (rows of `DeviceTimeline.lifetimes`), in their order (`by_size`: by
    size, largest first, then address); `at_index` / `at_time`: the instant they are live at, if one (its
    allocation names the instant's request); `window`: every lifetime of the device (what the program kept)."""
    alloc_index = live["alloc_index"].to_numpy()
    block_row = live["block_row"].to_numpy()
    free_index = live["free_index"].to_numpy()
    stack = np.full(len(live), -1, dtype=np.int64)
    from_trace = alloc_index >= 0
    stack[from_trace] = snapshot.event_stack_ids(device, alloc_index[from_trace])
    from_blocks = ~from_trace & (block_row >= 0)
    stack[from_blocks] = snapshot.block_stack_ids(block_row[from_blocks])
    addr = live["addr"].to_numpy()
    pools = _pools(snapshot, device, addr, block_row, alloc_index)
    metadata = np.full(len(live), "", dtype=object)
    by_time = np.zeros(len(live), dtype=bool)
    trace = snapshot.trace(device)
    requests = event_requests(trace, alloc_index[from_trace], markers)
    metadata[from_trace], by_time[from_trace] = requests.names, requests.inferred
    sizes = live["size"].to_numpy()
    origin = np.array(ORIGINS, dtype=object)[live["origin"].cat.codes.to_numpy()]
    allocated_est = live["allocated_est"].to_numpy()
    streams = live["stream"].to_numpy()

    # Every decision below depends on a few inputs per block; each is made once per distinct combination of
    # them and broadcast back: `table` holds the distinct decisions, `code` each block's index into it.
    table = _Decisions()
    stacks, by_stack = np.unique(stack, return_inverse=True)
    code = table.codes([decider.decide(int(s)) for s in stacks.tolist()])[by_stack.reshape(-1)]
    # Blocks from before the window without a stack: persistent state, or decided by the stack of their free.
    frameless_pre = (stack < 0) & (origin != "trace")
    persistent = frameless_pre & (free_index < 0) & (pools == "0,0")
    freed_pre = np.flatnonzero(frameless_pre & (free_index >= 0))
    free_stacks = snapshot.event_stack_ids(device, free_index[freed_pre]) if len(freed_pre) else \
        np.zeros(0, dtype=np.int64)
    freers, by_freer = np.unique(free_stacks, return_inverse=True)
    freed_by = [decider.decide(int(sid)) for sid in freers.tolist()]
    training = any(d.category in _TRAINING or set(d.context) & {"autograd", "optimizer", "backward"}
                   for d in (*table.items, *freed_by)) or snapshot.frameless_allocations(device)
    code[frameless_pre] = table.add(_before_window(None, None, ""))
    code[freed_pre] = table.codes([_before_window(None, by, frame_site(*_display(decider, int(sid), by.frame)))
                                   for sid, by in zip(freers.tolist(), freed_by)])[by_freer.reshape(-1)]
    guesses = decider.persistent(device, sizes[persistent], addr[persistent], training,
                                 decider.retained(snapshot, device, window))
    if guesses:                                          # a few distinct guesses, shared by many blocks
        _, first, inverse = np.unique(np.fromiter(map(id, guesses), dtype=np.uint64, count=len(guesses)),
                                      return_index=True, return_inverse=True)
        code[persistent] = table.codes([_before_window(guesses[k], None, "") for k in first.tolist()])[inverse]
    modules = ModuleIndex.of(markers)
    if len(modules) and trace.time_us is not None and from_trace.any():
        where = np.flatnonzero(from_trace)
        spans = modules.decide(trace.time_us[alloc_index[where]], decider.rules)
        named = list({id(m): m for m in spans if m is not None}.values())
        which = {id(m): k for k, m in enumerate(named)}
        span = np.array([which[id(m)] if m is not None else -1 for m in spans], dtype=np.int64)
        where, span = where[span >= 0], span[span >= 0]
        if len(where):
            def by_module(m: ModuleDecision, d: Decision) -> Decision:
                if not _module_may_decide(d, decider.rules):
                    return d
                return Decision(m.category, "signal.module_span", m.reason, d.frame,
                                tuple(dict.fromkeys(t for t in (*m.tags, d.category, *d.tags)
                                                    if t not in ("other", m.category))),
                                inferred=True, context=d.context, owner=d.owner)
            pairs = np.stack([span, code[where]], axis=1)
            first, inverse = _distinct(pairs)
            code[where] = table.codes([by_module(named[int(pairs[k, 0])], table.items[int(pairs[k, 1])])
                                       for k in first.tolist()])[inverse]

    of = table.columns()
    categories = of["category"][code]
    event = _instant_event(trace, at_index) if at_index is not None else -1
    request, request_why = _instant_request(snapshot, device, event, markers, at_time, metadata, sizes)
    instant_stack = int(snapshot.event_stack_ids(device, np.array([event]))[0]) if event >= 0 else -1
    weights = categories == "weights"
    autocast = of["autocast"][code]
    attention = of["user_attention"][code]
    ctx = _Context(
        request=request, request_why=request_why,
        vocab=vocab_hints(sizes[weights]),
        allocated=functools.cache(lambda: set(np.unique(trace.size[trace.action == ALLOC]).tolist())
                                  - set(sizes[weights].tolist())),
        scores_floor=(int(sizes[attention].max()) if attention.any() else 0) // 2,
        mlp_outputs=_indices_by_size(sizes, alloc_index, (categories == "mlp") & (sizes >= (1 << 20))),
        weight_sizes=_counts(sizes[weights & ~autocast]), copy_sizes=_counts(sizes[autocast]),
        in_backward="autograd" in decider.decide(instant_stack).context, enabled=decider.rules.enabled,
    )
    code_after = _signals_by_key(table, code, sizes, pools, metadata, by_time, origin, stack, free_index,
                                 alloc_index, ctx)
    of = table.columns()
    final_cat = of["category"][code_after]
    scores = frozenset(sizes[(final_cat == "fallback_kernel") & (sizes >= 8 << 20)].tolist())
    if scores and decider.rules.enabled("shape.scores_backward"):
        hit = np.flatnonzero(of["backward_other"][code_after] & np.isin(sizes, list(scores)))
        if len(hit):
            pairs = np.stack([code_after[hit], sizes[hit]], axis=1)
            first, inverse = _distinct(pairs)
            code_after[hit] = table.codes([_scores_backward(table.items[int(pairs[k, 0])], int(pairs[k, 1]), scores)
                                           for k in first.tolist()])[inverse]
    notes = annotations_at(trace, addr, alloc_index, event if event >= 0 else None)
    for i in np.flatnonzero(notes != "").tolist():
        named_cat = annotated_category(notes[i], decider.rules.categories)
        if named_cat is not None:
            d = table.items[int(code_after[i])]
            code_after[i] = table.add(Decision(
                named_cat, "signal.annotation", f"the program annotated this block {notes[i]!r} "
                "(torch.cuda.memory._annotate_tensor)", d.frame,
                tuple(t for t in (d.category, *d.tags) if t not in ("other", named_cat))))
    if not len(live):
        df = pd.DataFrame([], columns=BLOCK_COLUMNS)
        df["address"] = df["address"].astype(np.uint64)
        return df, ctx.request, requests.ambiguous
    # The frame shown: the frame decision's deciding frame, else the stack's innermost meaningful one.
    pairs = np.stack([code, stack], axis=1)
    first, inverse = _distinct(pairs)
    frames = snapshot.interner.frames
    sites = []
    for k in first.tolist():
        d, sid = table.items[int(pairs[k, 0])], int(pairs[k, 1])
        frame_id = d.frame if d.frame >= 0 else decider.display_frame(sid)
        frame = frames[frame_id] if frame_id >= 0 else None
        sites.append(frame_site(frame, decider.qualname(frame)))
    # The owner shown: each distinct stack's innermost frame of model code.
    owners = []
    for sid in stacks.tolist():
        fid = decider.owner_frame(int(sid))
        frame = frames[fid] if fid >= 0 else None
        owners.append(frame_site(frame, decider.qualname(frame)))
    span = np.full(len(live), "", dtype=object)          # the record_function span the allocation ran in
    if trace.time_us is not None and from_trace.any():
        span[from_trace] = open_spans(snapshot, device, trace.time_us[alloc_index[from_trace]])
    of = table.columns()
    rows = np.lexsort((addr, -sizes.astype(np.int64))) if by_size else np.arange(len(live))
    code_after, inverse = code_after[rows], inverse[rows]

    def texts(values: np.ndarray) -> pd.Series:
        # Object dtype: each distinct text stays one shared Python string. pandas >= 3 would copy every row's
        # text into an Arrow string column (for 250k blocks: a tenth of a second and ~200 MB that its memory
        # pool keeps).
        return pd.Series(values, dtype=object, copy=False)

    def decided(field: str) -> pd.Series:
        return texts(np.asarray(of[field], dtype=object)[code_after])
    df = pd.DataFrame({
        "device": np.full(len(live), device, dtype=np.int64), "address": addr[rows].astype(np.uint64),
        "size": sizes[rows].astype(np.int64), "allocated_est": allocated_est[rows].astype(np.int64),
        "category": decided("category"), "tags": decided("tags"), "rule": decided("rule"),
        "reason": decided("reason"), "frame": texts(np.asarray(sites, dtype=object)[inverse]),
        "owner": texts(np.asarray(owners, dtype=object)[by_stack.reshape(-1)[rows]]),
        "inferred": of["inferred"][code_after], "stack_id": stack[rows],
        "user_metadata": texts(metadata[rows]), "pool": texts(pools[rows]), "stream": streams[rows].astype(np.int64),
        "origin": texts(origin[rows]), "alloc_index": alloc_index[rows].astype(np.int64),
        "annotation": texts(notes[rows]), "span": texts(span[rows])},
        columns=BLOCK_COLUMNS)
    return df, ctx.request, requests.ambiguous


class _Decisions:
    """Distinct decisions, each with a code (its index): blocks hold codes, so a decision made once per
    distinct input is broadcast to every block with that input. `columns()`: per-code arrays of the fields
    (and predicates) the block-level steps test, to index by the blocks' codes."""

    def __init__(self) -> None:
        self.items: list[Decision] = []
        self._code: dict[Decision, int] = {}

    def add(self, d: Decision) -> int:
        found = self._code.get(d)
        if found is None:
            found = self._code[d] = len(self.items)
            self.items.append(d)
        return found

    def codes(self, decisions: Sequence[Decision]) -> np.ndarray:
        return np.array([self.add(d) for d in decisions], dtype=np.int64)

    def columns(self) -> dict[str, np.ndarray]:
        items = self.items
        return {
            "category": np.array([d.category for d in items], dtype=object),
            "tags": np.array([",".join(d.tags) for d in items], dtype=object),
            "rule": np.array([d.rule for d in items], dtype=object),
            "reason": np.array([d.reason for d in items], dtype=object),
            "inferred": np.array([d.inferred for d in items], dtype=bool),
            "autocast": np.array(["autocast" in d.context for d in items], dtype=bool),
            "user_attention": np.array([_user_attention(d) for d in items], dtype=bool),
            "lifecycle": np.array([d.category in _LIFECYCLE for d in items], dtype=bool),
            "plain_other": np.array([d.category == "other" and not d.owner
                                     and not set(d.context) & {"autograd", "optimizer"} for d in items], dtype=bool),
            "backward_other": np.array(["autograd" in d.context and d.category == "other" for d in items],
                                       dtype=bool),
        }


def _distinct(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the rows of an integer matrix: the index of the first row of each distinct row, and each row's
    index into those."""
    inverse = np.zeros(len(keys), dtype=np.int64)
    if not len(keys):
        return inverse, inverse
    for column in keys.T:                                # hashed, a column at a time (sorting rows is slower)
        if column[0] == column.min() == column.max():    # one value throughout: it splits nothing
            continue
        codes, distinct = pd.factorize(column)
        inverse = pd.factorize(inverse * len(distinct) + codes)[0]
    seen = np.maximum.accumulate(inverse)                # codes are numbered in order of first appearance
    return np.flatnonzero(np.r_[True, seen[1:] > seen[:-1]]), inverse


def _signals_by_key(table: _Decisions, code: np.ndarray, sizes: np.ndarray, pools: np.ndarray,
                    metadata: np.ndarray, by_time: np.ndarray, origin: np.ndarray, stack: np.ndarray,
                    free_index: np.ndarray, alloc_index: np.ndarray, ctx: _Context) -> np.ndarray:
    """`_signals` of every block, made once per distinct key of what it reads: the frame decision, the pool,
    the request and whether it was named by time (only where it is another request than the instant's),
    whether the block came from the trace, whether it is a never-freed block of the default cuBLAS workspace
    size, the size (only where a size relation could hold: half a live weight's, a logits or a gate/up size,
    attention scores') and the alloc index (only where a gate/up relation could hold). The codes after."""
    of = table.columns()
    from_trace = origin == "trace"
    plain = of["plain_other"][code] & from_trace
    gate_up = plain & (sizes % 2 == 0) & np.isin(sizes // 2, np.array(list(ctx.mlp_outputs), dtype=np.int64))
    by_size = ((~of["lifecycle"][code] & of["autocast"][code]
                & np.isin(sizes * 2, np.array(list(ctx.weight_sizes), dtype=np.int64)))
               | gate_up | (plain & bool(ctx.vocab) & (sizes >= 16 << 20))
               | (of["user_attention"][code] & (sizes >= max(ctx.scores_floor, 8 << 20))))
    other_request = (metadata != "") & (metadata != ctx.request) if ctx.request else np.zeros(len(code), dtype=bool)
    keys = np.stack([
        code, pd.factorize(pools)[0],
        np.where(other_request, pd.factorize(metadata)[0], -1), by_time & other_request, from_trace,
        (sizes == CUBLAS_DEFAULT_WORKSPACE) & (free_index < 0),
        np.where(by_size, sizes, -1), np.where(gate_up, alloc_index, -2)], axis=1).astype(np.int64)
    if not len(keys):
        return code.copy()
    first, inverse = _distinct(keys)
    return table.codes([_signals(table.items[int(code[i])], int(sizes[i]), pools[i], metadata[i], bool(by_time[i]),
                                 origin[i], stack[i] >= 0, free_index[i] < 0, int(alloc_index[i]), ctx)
                        for i in first.tolist()])[inverse]


def _module_may_decide(d: Decision, rules: RuleSet) -> bool:
    """A module span outranks what frames guess from names (user-code heuristics, or nothing), never what a
    library rule or a lifecycle proves."""
    if d.category == "other":
        return True
    return d.rule.startswith("generic.") and rules.categories[d.category].owner == "innermost"


def _indices_by_size(sizes: np.ndarray, alloc_index: np.ndarray, mask: np.ndarray) -> dict[int, tuple[int, ...]]:
    out: dict[int, list[int]] = {}
    for size, index in zip(sizes[mask].tolist(), alloc_index[mask].tolist()):
        out.setdefault(size, []).append(index)
    return {size: tuple(found) for size, found in out.items()}


def _counts(sizes: np.ndarray) -> dict[int, int]:
    values, counts = np.unique(sizes, return_counts=True)
    return dict(zip(values.tolist(), counts.tolist()))


def _display(decider: _Decider, stack_id: int, deciding: int = -1) -> tuple[tuple[str, int, str] | None, str]:
    """The deciding frame (else the display frame) of a stack and its qualified name (for reason texts)."""
    fid = deciding if deciding >= 0 else decider.display_frame(stack_id)
    frame = decider.interner.frames[fid] if fid >= 0 else None
    return frame, decider.qualname(frame)


def summarize_blocks(blocks: pd.DataFrame, top: int = 3) -> pd.DataFrame:
    """By device and category: bytes, share of the device's total, blocks, top frames by bytes, inferred bytes."""
    rows = []
    for device, dev in blocks.groupby("device", sort=True):
        total = int(dev["size"].sum())
        for category, part in dev.groupby("category", sort=False):
            sites = part.groupby("frame", sort=False)["size"].sum().sort_values(ascending=False, kind="stable")
            rows.append({"device": int(device), "category": str(category), "bytes": int(part["size"].sum()),
                         "share": (float(part["size"].sum()) / total) if total else 0.0,
                         "blocks": len(part),
                         "top_frames": [s or "(no frames)" for s in list(sites.index[:top])],
                         "top_frame_bytes": [int(b) for b in sites.to_numpy()[:top]],
                         "inferred_bytes": int(part.loc[part["inferred"].astype(bool), "size"].sum())})
    df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    return df.sort_values(["device", "bytes", "category"], ascending=[True, False, True], kind="stable",
                          ignore_index=True)


def attribute(snapshot: Snapshot, at: str = "peak", rules: RuleSet | None = None,
              device: int | None = None, timeline: Timeline | None = None,
              markers: pd.DataFrame | None = None) -> Attribution:
    """Attribute the live bytes at `at` on each device (or one); see the module docstring. `markers` (a
    run's, `load.samples.markers_for`) lets request marker spans name requests the metadata does not; the
    source the snapshot carries (`load(path, source=...)`) resolves frames to their classes."""
    rules = rules or load_rules()
    timeline = timeline or replay(snapshot)
    devices = [device] if device is not None else sorted(timeline.devices)
    for d in devices:
        if d not in timeline.devices:
            raise UsageError(f"{snapshot.source}: no device {d} (devices: {sorted(timeline.devices)})")
    decider = _Decider.for_snapshot(snapshot, rules)
    has_markers = len(RequestIndex.of(markers)) > 0
    parts, instants, notes = [], {}, []
    for d in devices:
        dt = timeline[d]
        index, label = _instant(timeline, d, at)
        blocks, request, ambiguous = _label(snapshot, d, dt.live_at(index), decider, markers, dt.time_at(index),
                                            index, by_size=True, window=dt.lifetimes)
        parts.append(blocks)
        instants[d] = Instant(d, index, label, dt.time_at(index), dt.active_at(index), dt.reserved_at(index),
                              dt.baseline_active, request)
        if int(blocks["size"].sum()) != dt.active_at(index):  # pragma: no cover - a replay bug
            raise AssertionError("attributed bytes differ from the replayed active bytes")
        t = snapshot.trace(d)
        if (t.user_metadata is None or not any(t.user_metadata_names)) and not has_markers:
            notes.append(f"device {d}: no request identity recorded (user_metadata empty, no request markers), "
                         "so bytes of other requests batched into the same forward cannot be told apart")
        if ambiguous:
            notes.append(f"device {d}: {fmt_count(ambiguous, 'live block')} {'was' if ambiguous == 1 else 'were'} "
                         "allocated while requests of different "
                         "threads were running; the trace does not say which thread allocated them, so they "
                         "keep their frame categories")
    blocks = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=BLOCK_COLUMNS)
    notes.extend(_source_note(decider, blocks["stack_id"].unique().tolist()))
    notes.extend(_installed_note(decider, blocks))
    return Attribution(snapshot=snapshot, timeline=timeline, instants=instants, blocks=blocks, rules=rules,
                       notes=tuple(notes))


_INSTALLED = re.compile(r"(^|/)(site-packages|dist-packages|lib/python\d[\d.]*)/|^<")
_PACKAGE = re.compile(r"(^|/)(?:site|dist)-packages/(([^/]+)/.+)$")     # a package's file: its relative path, name


def _source_note(decider: _Decider, stack_ids: list[int]) -> list[str]:
    """What source resolution did, or would do: the program's own files among the live blocks' frames
    (Python files outside installed packages and the standard library)."""
    rules = decider.rules
    files = {f: found for sid in stack_ids for f, found in decider.program_files(int(sid))}
    if not files:
        return []
    # No paths in the notes: reports redact paths, and notes are free text.
    if rules.source is None:
        return [f"{fmt_count(len(files), 'file')} of the program's own code "
                f"{'appears' if len(files) == 1 else 'appear'} in the live stacks; --source DIR (the "
                "program's checkout) would resolve their frames to Class.method and the code at each line, which "
                "tells an MLP's Linear from an attention one"]
    notes = []
    missing = sum(1 for found in files.values() if not found)
    if missing:
        notes.append(f"{missing} of {len(files)} file(s) of the program's own code in the live stacks were not "
                     "found under --source: their frames decide by file and function name only")
    frames = decider.interner.frames
    for _, fids in sorted(decider.untrusted.items()):
        named = frames[fids[0]][0]
        installed = _PACKAGE.search(named)
        one = len(fids) == 1
        shown = ", ".join(f"{frames[f][0].rsplit('/', 1)[-1]}:{frames[f][1]}:{frames[f][2]}"
                          for f in fids[:3]) + (f" and {len(fids) - 3} more" if len(fids) > 3 else "")
        where = installed.group(2) if installed else named.rsplit("/", 1)[-1]
        fix = (f"install the {installed.group(3)} that ran (--env-source reads this environment's), or pass its "
               "site-packages with --source" if installed else "pass the checkout of the code that ran with --source")
        notes.append(f"{fmt_count(len(fids), 'frame')} the trace records in {where} {'lies' if one else 'lie'} "
                     f"outside {'its function' if one else 'their functions'} in the copy found ({shown}): it "
                     f"differs from the code that ran, so nothing from that file decides; {fix}")
    return notes


INSTALLED_NOTE_SHARE = 0.10     # an installed file holding less of a device's live bytes is not worth a note


def _installed_note(decider: _Decider, blocks: pd.DataFrame) -> list[str]:
    """Per device, each installed package's file (a model library: transformers, timm, …) whose source was
    not read and that made — as the owner of their allocation — at least a tenth of the live bytes in
    `other` or an inferred category: reading that file could decide them. Named package-relative (no paths
    in notes), with what to pass."""
    if not len(blocks):
        return []
    frames = decider.interner.frames
    files: dict[int, str] = {}
    for sid in blocks["stack_id"].unique().tolist():
        fid = decider.owner_frame(int(sid)) if sid >= 0 else -1
        # a copy that was found but differs from the run has its own note (`_source_note`)
        if fid >= 0 and decider.rules.facts(frames[fid]).source is None \
                and (hit := _PACKAGE.search(frames[fid][0])):
            files[int(sid)] = hit.group(2)
    if not files:
        return []
    unsure = (blocks["category"] == "other").to_numpy() | blocks["inferred"].to_numpy(dtype=bool)
    table = pd.DataFrame({"device": blocks["device"], "file": blocks["stack_id"].map(files),
                          "size": blocks["size"], "unsure": np.where(unsure, blocks["size"], 0)})
    totals = table.groupby("device")["size"].sum()
    source = decider.rules.source
    notes = []
    for (device, name), part in table.dropna(subset=["file"]).groupby(["device", "file"], sort=True):
        share = int(part["unsure"].sum()) / max(int(totals[device]), 1)
        if share < INSTALLED_NOTE_SHARE:
            continue
        package = str(name).split("/", 1)[0]
        how = (f"this environment has no copy of it: install the {package} that ran"
               if source is not None and source.environment else
               f"--env-source reads it from this environment when it has the {package} that ran")
        notes.append(f"device {device}: {share:.0%} of live bytes, made in {name}, are other or inferred, and its "
                     f"source is not read here; {how}, or pass that site-packages with --source")
    return notes


def label_lifetimes(snapshot: Snapshot, device: int, lifetimes: pd.DataFrame,
                    rules: RuleSet | None = None, markers: pd.DataFrame | None = None) -> pd.DataFrame:
    """Label any set of block lifetimes of `device` (rows of `DeviceTimeline.lifetimes`, e.g. every block
    of a window) with the same rules, signals and heuristics as `attribute`, one row each in their order
    (columns as `Attribution.blocks`). Context signals (the main request, size hints) are taken over the
    given set together, so a label can differ from `attribute` at one instant in rare cases."""
    return _label(snapshot, device, lifetimes, _Decider.for_snapshot(snapshot, rules or load_rules()), markers,
                  window=lifetimes)[0]


def top_sites(attribution: Attribution, by: str = "frame", category: str | None = None,
              device: int | None = None, top: int = 20) -> pd.DataFrame:
    """Live bytes aggregated by allocation site: `by="frame"` (deciding/innermost frame) or `by="stack"`.

    Columns: device, site (frame label or stack id), category, bytes, blocks, share (of the device total).
    """
    if by not in ("frame", "stack"):
        raise UsageError("top_sites: by must be 'frame' or 'stack'")
    b = attribution.blocks
    totals = b.groupby("device")["size"].sum()
    if category is not None:
        b = b[b["category"] == category]
    if device is not None:
        b = b[b["device"] == device]
    key = "frame" if by == "frame" else "stack_id"
    g = b.groupby(["device", key, "category"], sort=False, observed=True).agg(
        bytes=("size", "sum"), blocks=("size", "size")).reset_index().rename(columns={key: "site"})
    g["share"] = g["bytes"] / g["device"].map(totals)
    g = g.sort_values(["device", "bytes"], ascending=[True, False], kind="stable")
    return g.groupby("device", sort=True).head(top).reset_index(drop=True)
