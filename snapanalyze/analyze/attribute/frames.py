"""The frames stage of attribution: a stack's category from its frames (`Decider`), made once per stack.

Contract: `Decider.for_snapshot(snapshot, rules)` binds the rules to the source the snapshot carries
(`Snapshot.sources`, stage `stage.source`) and keeps one decider per snapshot and rule set. `decide(stack_id)`
walks the frames innermost first: frame rules (stage `stage.rules`) by category precedence, lifecycle
categories by their outermost match, op categories by their innermost one inside the owning module, a
category's `not_across` boundaries respected; where no rule decides, or only a guess from a file's name, the
autograd node of a C++-only backward stack, else the role of the model code in the trace's call tree (stage
`stage.calltree`), flagged inferred. A `Module._apply` copy that the trace's order shows to be a parameter's
.grad (`moves`) is gradients, not weights. A source file decides only if every frame the trace records in it
fits (`untrusted`). `display_frame` and `owner_frame` name the frame a table shows and the owner; `site`
makes a frame the Site results carry.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable
from functools import cached_property
from itertools import islice
from typing import Any

import numpy as np
import pandas as pd

from ...model import ALLOC, Snapshot
from ...sites import Site, Words, site_of, words
from ...stacks import StackInterner, is_python_frame
from ..backward import Passes, backward_passes
from ..calltree import CALLEES, CallTree
from ..moves import apply_frame, grad_copy_frames
from ..rules import Category, FrameFacts, RuleSet
from ..state import Retained, StateGuess
from .decisions import Decisions
from .result import Decision

APPLY_GRAD = "order.apply_grad"
# The stages the decider runs, in order (names as in `rules.STAGES`; a rules file's `disable` accepts each).
SOURCE, RULES, CALLTREE = "stage.source", "stage.rules", "stage.calltree"
FRAME_STAGES = (SOURCE, RULES, CALLTREE)
# The program's own files are Python files outside installed packages and the standard library.
INSTALLED = re.compile(r"(^|/)(site-packages|dist-packages|lib/python\d[\d.]*)/|^<")
# Python the autograd engine's device thread runs (its outermost frame there): a custom Function's backward, a
# checkpoint's recomputation.
_EMBEDDING = re.compile(r"(^|/)torch/nn/(functional\.py:embedding|modules/sparse\.py:forward)$")
_ENGINE_PYTHON = re.compile(r"(^|/)torch/(autograd/|utils/checkpoint\.py$)")


class Decider:
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

    _kept: weakref.WeakKeyDictionary[Snapshot, Decider] = weakref.WeakKeyDictionary()

    @classmethod
    def for_snapshot(cls, snapshot: Snapshot, rules: RuleSet) -> Decider:
        # the source the snapshot carries (`load(source=)`), unless a rules file disabled that stage
        rules = rules.with_source(snapshot.sources if rules.enabled(SOURCE) else None)
        decider = cls._kept.get(snapshot)
        if decider is None or decider.rules is not rules:
            held = weakref.ref(snapshot)                      # the decider must not keep its snapshot alive

            def order() -> np.ndarray:
                found = held()
                return found.allocation_order() if found is not None else np.zeros(0, dtype=np.int64)
            decider = cls._kept[snapshot] = cls(snapshot.interner, rules, snapshot.allocation_stack_ids(),
                                                grad_copies(snapshot), order)
        return decider

    def __init__(self, interner: StackInterner, rules: RuleSet, tree_stacks: np.ndarray,
                 grad_frames: dict[int, Words], order: Callable[[], np.ndarray] | None = None) -> None:
        self.interner, self.rules = interner, rules        # not the snapshot: it keys `_kept` weakly
        self.order = order                                 # the allocations' stack ids in trace order (the tree's)
        self.bare = rules.with_source(None)                # the same rules without the source
        self.tree_stacks = tree_stacks                     # the stacks the call tree is built over
        # `Module._apply` lines that copy a .grad (`moves`), where the order heuristic is enabled
        self.grad_frames = grad_frames if rules.enabled(APPLY_GRAD) else {}
        self.use_rules, self.use_tree = rules.enabled(RULES), rules.enabled(CALLTREE)
        self.cache: dict[int, Decision] = {-1: Decision("other", "no_frames",
                                                         ("the allocation carries no stack frames",), -1)}
        self.site_cache: dict[int, Site | None] = {-1: None}
        self.decisions = Decisions(rules.persistent)       # every labelling's decisions, by code
        self.display_cache: dict[int, int] = {-1: -1}
        self.owner_cache: dict[int, int] = {-1: -1}
        self.files_cache: dict[int, tuple[tuple[str, bool], ...]] = {}
        self.state_cache: dict[tuple[Any, ...], list[StateGuess]] = {}
        self.retained_cache: dict[int, tuple[pd.DataFrame, dict[int, Retained]]] = {}
        self.gradients_cache: dict[int, tuple[pd.DataFrame, np.ndarray]] = {}   # device -> its window's .grad sizes
        self.passes_cache: dict[int, Passes] = {}           # device -> its backward passes (`backward`)
        self.lookups_cache: dict[int, frozenset[int]] = {}  # device -> its embedding lookups' sizes
        self._lookup_stacks: np.ndarray | None = None
        self._engine: np.ndarray | None = None
        # labelled instants (`attribute._labelled`): (device, index, markers key) -> (blocks, request, ambiguous)
        self.labelled: dict[tuple[Any, ...], tuple[pd.DataFrame, str | None, int]] = {}
        self.last_markers: tuple[pd.DataFrame | None, tuple[int, int] | None] | None = None

    def engine_stacks(self) -> np.ndarray:
        """The allocation stacks of the autograd engine's device thread: the engine's C++ frames (an `autograd`
        context), or Python that only the engine calls into on that thread — a custom Function's backward
        (torch/autograd/function.py), a checkpoint's recomputation (torch/utils/checkpoint.py) — at the stack's
        outermost Python frame."""
        if self._engine is None:
            frames, stacks = self.interner.frames, self.interner.stacks
            found = []
            for sid in self.tree_stacks.tolist():
                if "autograd" in self.decide(sid).context:
                    found.append(sid)
                    continue
                outer = next((frames[f][0] for f in reversed(stacks[sid]) if is_python_frame(frames[f][0])), "")
                if _ENGINE_PYTHON.search(outer):
                    found.append(sid)
            self._engine = np.array(found, dtype=np.int64)
        return self._engine

    def lookups(self, snapshot: Snapshot, device: int) -> frozenset[int]:
        """Sizes of the embedding lookups a device's trace made (an allocation in torch's F.embedding or
        nn.Embedding.forward): the tokens' hidden states, T × H × b."""
        found = self.lookups_cache.get(device)
        if found is None:
            if self._lookup_stacks is None:
                frames, stacks = self.interner.frames, self.interner.stacks
                # the innermost Python frames (a stack of stacks="all" opens with C++ ones)
                self._lookup_stacks = np.array([sid for sid in self.tree_stacks.tolist() if any(
                    _EMBEDDING.search(f"{frames[f][0]}:{frames[f][2]}") for f in
                    islice((f for f in stacks[sid] if is_python_frame(frames[f][0])), 4))], dtype=np.int64)
            trace = snapshot.trace(device)
            at = np.flatnonzero(trace.action == ALLOC)
            made = np.isin(snapshot.event_stack_ids(device, at), self._lookup_stacks)
            found = self.lookups_cache[device] = frozenset(np.unique(trace.size[at[made]]).tolist())
        return found

    def passes(self, snapshot: Snapshot, device: int) -> Passes:
        """The backward passes of a device's trace (`backward.backward_passes`), found once."""
        found = self.passes_cache.get(device)
        if found is None:
            trace = snapshot.trace(device)
            at = np.flatnonzero(trace.action == ALLOC)
            engine = set(self.engine_stacks().tolist())
            found = self.passes_cache[device] = backward_passes(at, snapshot.event_stack_ids(device, at),
                                                                engine.__contains__)
        return found

    def program_files(self, stack_id: int) -> tuple[tuple[str, bool], ...]:
        """The program's own files in a stack (Python files outside installed packages and the standard
        library, not plumbing) and whether their source was found."""
        found = self.files_cache.get(stack_id)
        if found is None:
            seen: dict[str, bool] = {}
            frames = self.interner.frames
            for fid in self.interner.stacks[stack_id] if stack_id >= 0 else ():
                filename = frames[fid][0]
                if filename in seen or not filename.endswith(".py") or INSTALLED.search(filename):
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

    def site(self, frame_id: int) -> Site | None:
        """The Site of a frame, named by its qualified name where the source named it (None for −1)."""
        if frame_id not in self.site_cache:
            frame = self.interner.frames[frame_id]
            self.site_cache[frame_id] = site_of(frame, self.qualname(frame))
        return self.site_cache[frame_id]

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
            for ri in facts.matched if self.use_rules else ():
                rule = rules[ri]
                if (rule.allocating and not here) or (rule.inside and here):
                    continue
                if rule.caller is not None and not rule.called_by(_caller(frames, stack, depth)):
                    continue
                cat = rule.category
                c = cats[cat]
                if c.not_across and crosses(c, crossed, code_frames, filename):
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
        if any(not rules[hit[1]].weak for hit in found.values()):
            # A guess from a file's name never outranks what a rule proves: it counts only where it is alone.
            found = {cat: hit for cat, hit in found.items() if not rules[hit[1]].weak}
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
            decision = Decision(cat, rule.name, (rule.reason,), fid, tuple(t for t in tags if t != cat),
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
        if self.use_tree:
            tree = self._tree_decision(stack_id, weak, ctx, owner)
            if tree is not None:
                return tree
        if weak is not None:
            cat, (_, ri, fid) = weak
            rule = self.rules.rules[ri]
            return Decision(cat, rule.name, (f"{rule.reason} (a guess from its file's name: inferred)",), fid,
                            tuple(t for t in rule.tags if t != cat), inferred=True, context=ctx, owner=owner)
        return Decision("other", "unmatched", ("no rule matched any frame of this stack"
                                               + (f" inside {owner}, which owns it" if owner else ""),), -1,
                        context=ctx, owner=owner)

    def _tree_decision(self, stack_id: int, weak: tuple[str, tuple[int, int, int]] | None, ctx: tuple[str, ...],
                       owner: str) -> Decision | None:
        """The call tree's answer (`calltree`), flagged inferred: the backward node that made the allocation
        (where no rule guessed), else the role of the model code that made it, else, where only a file's name
        guessed, the one role of the code the guessing function calls; None where it has none."""
        if "autograd" in ctx and not weak:
            backward = self.tree.backward(stack_id)
            if backward is not None:
                node_rule, node_frame = backward
                return Decision(node_rule.category, node_rule.name, (f"{node_rule.reason}, in a backward pass "
                                "(inferred from the node's name)",), node_frame, inferred=True, context=ctx,
                                owner=owner)
        hit = self.tree.role(stack_id)
        if hit is not None:
            return Decision(hit.category, hit.rule, hit.reason, hit.frame,
                            tuple(t for t in ([weak[0]] if weak else []) if t != hit.category),
                            inferred=True, context=ctx, owner=owner)
        if weak is not None:
            cat = weak[0]
            callees, node = self.tree.callee_roles(stack_id)
            if self.rules.enabled(CALLEES) and len(callees) == 1 and cat not in callees:
                # The file's name says one thing, the code the function calls another (diffusers keeps
                # FeedForward in attention.py): what ran decides.
                role = next(iter(callees))
                return Decision(role, CALLEES, words(
                    Site.of(self.interner.frames[node]), f" calls model code whose role is {role} and none whose "
                    f"role is {cat}, which only its file's name suggests (inferred from the call tree)"),
                    node, (cat,), inferred=True, context=ctx, owner=owner)
        return None

    @cached_property
    def tree(self) -> CallTree:
        return CallTree(self.interner, self.rules, self.tree_stacks.tolist(), self.facts, self.order)


def _caller(frames: list[tuple[str, int, str]], stack: tuple[int, ...], depth: int) -> tuple[str, int, str] | None:
    """The Python frame that called the one at `depth` (the interpreter's own C frames between them skipped)."""
    for fid in stack[depth + 1:]:
        if is_python_frame(frames[fid][0]):
            return frames[fid]
    return None


def grad_copies(snapshot: Snapshot) -> dict[int, Words]:
    """`moves.grad_copy_frames` over every device's allocations, in trace order."""
    allocations = []
    for device in snapshot.devices:
        trace = snapshot.trace(device)
        at = np.flatnonzero(trace.action == ALLOC)
        allocations.append((snapshot.event_stack_ids(device, at), trace.size[at]))
    return grad_copy_frames(snapshot.interner.frames, snapshot.interner.stacks, allocations)


def crosses(category: Category, crossed: set[str], code_frames: list[tuple[str, frozenset[str]]],
             filename: str) -> bool:
    """Whether a match of `category` on a frame of `filename` lies across one of its `not_across` boundaries
    from the allocation: a context tag walked before it, or (``model_code``) a frame of model code in another
    file that matched no rule of the category (a closure the optimizer step called)."""
    if crossed.intersection(category.not_across):
        return True
    return "model_code" in category.not_across and any(
        f != filename and category.name not in cats for f, cats in code_frames)


def shown_site(decider: Decider, stack_id: int, deciding: int = -1) -> Site | None:
    """The Site a table shows for a stack: its deciding frame, else its display frame."""
    return decider.site(deciding if deciding >= 0 else decider.display_frame(stack_id))
