"""Roles of model code from the call tree: what a function calls, over every stack through it, says what it is.

Contract: `CallTree(interner, rules, stacks, facts=None).role(stack_id)` returns the `RoleHit` of the
function of model code that made a stack's allocation (its innermost frame of the program's or a model
library's code), or None; `callee_roles` the roles of what that function calls; `backward` the rule of a
C++-only backward stack's autograd node. `stacks` are the ids the tree is built over (the allocations');
`facts` what the rules say about a frame (the caller may leave an untrusted source out).

The tree: every stack given, walked from its outermost frame in, is a path of *nodes*, one per frame of
model code (Python, not plumbing, not a pass-through layer, not the standard library). A node is a function
under one caller: its file and name and the frame of model code that called it (file, line, function), so the
`forward` of an MLP and of an attention in one file, called from two lines of a block, are two nodes, and the
forty layers of a model, called from one line in a loop, are one. A node's *kinds* (`roles.toml` [[kinds]])
come from the calls it makes: the innermost frame with a kind among the library frames between it and the
next model code below it (torch's Linear, F.softmax, an `at::_ops::silu` C++ frame), the name of a function of
model code it calls (`apply_rotary_pos_emb`, a hand-written `silu`), and what a building block it calls does
(a child with no role whose kinds, with those of the building blocks it calls, are building blocks only, such
as a hand-written Linear; a child that calls nothing that shows anything is `elementwise`). [[roles]] then
give nodes their categories, children first: the first role whose conditions the node's kinds (and its
children's roles) meet. A node whose own calls are at most projections, dropouts and elementwise ops and whose
roled children all agree, with no other composite module beside them (a message-passing `propagate`, diffusers'
FeedForward around its GELU module), takes their role. An allocation is decided by its own node's role, or, where
that node is a building block (it works for its caller) or a helper its caller calls by a name of a kind
(`apply_rotary_pos_emb`), by the role of the nearest caller that has one, at most `_CLIMB` callers up. A
node that shows nothing is no building block: nothing says it works for anyone.

Built once per (snapshot, rules), over the distinct stacks, each distinct frame classified once. Every role is
evidence from what ran, not from a name the node carries: the caller flags it inferred and shows the reason.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import RulesError
from ..sites import Site, Words, words, words_text
from ..stacks import is_python_frame

if TYPE_CHECKING:
    from ..stacks import StackInterner
    from .rules import FrameFacts, RuleSet

CALLEES = "calltree.callees"
_CLIMB = 4                 # callers a building block's allocation looks up for a role
_BLOCK_HEIGHT = 1          # a building block speaks for its caller where it calls at most layers that call nothing
_SAME_FUNCTION_GAP = 30    # lines of one function name under one caller this far apart are two functions
_WRAPPER_KINDS = frozenset({"linear", "matmul", "dropout", "elementwise"})
_STDLIB = re.compile(r"(^|/)lib/python\d[\d.]*/(?!site-packages/|dist-packages/)|^<")


@dataclass(frozen=True)
class Kind:
    """What one frame says about the node above it (see roles.toml)."""

    name: str
    file: re.Pattern[str] | None
    function: re.Pattern[str] | None
    on_code: bool                  # matches a function of model code the node calls (by its name)
    on_call: bool = False          # matches the call of the node's own line, where the source names it

    def matches(self, filename: str, function: str) -> bool:
        return ((self.file is None or self.file.search(filename) is not None)
                and (self.function is None or self.function.search(function) is not None))


@dataclass(frozen=True)
class Role:
    name: str
    category: str
    reason: str
    all: frozenset[str] = frozenset()
    any: frozenset[str] = frozenset()
    none: frozenset[str] = frozenset()
    children: frozenset[str] = frozenset()
    blocks_only: bool = False

    def fits(self, kinds: set[str], child_roles: set[str], blocks_only: bool) -> bool:
        """Whether a node's kinds and its children's roles meet the role. A node that calls sublayers of another
        role (a block of a model's trunk calling its MLP beside nn.MultiheadAttention) is no sublayer of this one,
        unless the role is one of calling those (`children`: a router calling its MLP experts)."""
        return (self.all <= kinds and (not self.any or bool(self.any & kinds)) and not self.none & kinds
                and (bool(self.children & child_roles) if self.children else not child_roles - {self.category})
                and (blocks_only or not self.blocks_only))


@dataclass(frozen=True)
class BackwardRule:
    name: str
    category: str
    reason: str
    node: re.Pattern[str]


@dataclass(frozen=True)
class RoleData:
    """roles.toml, parsed: kinds, roles, backward-node rules and the building-block kinds."""

    kinds: tuple[Kind, ...] = ()
    roles: tuple[Role, ...] = ()
    backward: tuple[BackwardRule, ...] = ()
    building_blocks: frozenset[str] = frozenset()

    def names(self) -> set[str]:
        return {r.name for r in self.roles} | {b.name for b in self.backward}

    def without(self, names: set[str]) -> RoleData:
        return RoleData(self.kinds, tuple(r for r in self.roles if r.name not in names),
                        tuple(b for b in self.backward if b.name not in names), self.building_blocks)


@dataclass(frozen=True)
class RoleHit:
    """A stack's role: the category, the role that gave it, the evidence, and the frame of the node it is of."""

    category: str
    rule: str
    reason: Words
    frame: int


@dataclass
class _Node:
    frame: int                     # a frame of this node (the first seen: its line is one call site)
    parent: int                    # node id of the caller (−1: outermost model code)
    depth: int
    kinds: set[str] = field(default_factory=set)
    children: set[int] = field(default_factory=set)
    examples: dict[str, str | Site] = field(default_factory=dict)   # kind -> the function that showed it
    stacks: int = 0
    role: Role | None = None
    via: Words = ()                # how the role came (for the reason)
    block: bool = False            # a building block: it works for its caller
    shown: set[str] = field(default_factory=set)   # its kinds with those of the building blocks it calls
    height: int = 0                # the longest chain of calls beneath it (0: it calls no model code)
    lines: dict[int, set[str]] = field(default_factory=dict)   # its own calls' kinds, by the line that made them
    line_roles: dict[int, Role] = field(default_factory=dict)  # a composite's sublayers inline, by line


class CallTree:
    """The call tree of model code over an interner's stacks, with each node's role (see the module doc)."""

    def __init__(self, interner: StackInterner, rules: RuleSet, stacks: Sequence[int],
                 facts: Callable[[tuple[str, int, str]], FrameFacts] | None = None,
                 order: Callable[[], np.ndarray] | None = None) -> None:
        self.interner, self.rules, self.data = interner, rules, rules.role_data
        self.facts = facts or rules.facts   # what the rules say about a frame (the caller may leave sources out)
        self.stacks = stacks               # the ids of the stacks it is built over
        self.order = order                 # the allocations' stack ids in the order the trace made them
        self._code: dict[int, bool] = {}
        self._kind: dict[int, str] = {}
        self.nodes: list[_Node] = []
        self._stack_node: dict[int, int] = {}
        self._stack_own: dict[int, tuple[str, int, int]] = {}  # stack -> its own call's kind, its line, that frame
        self._part: dict[tuple[str, str, int], dict[int, int]] = {}
        self._built = False
        self._hits: dict[int, RoleHit | None] = {}

    # -- frames -------------------------------------------------------------------------------------
    def is_code(self, fid: int) -> bool:
        """A frame of model code: Python, not plumbing, not a pass-through layer, not the standard library."""
        hit = self._code.get(fid)
        if hit is None:
            filename, _, function = frame = self.interner.frames[fid]
            if not is_python_frame(filename) or _STDLIB.search(filename) is not None:
                hit = False
            elif self.rules.source is None:          # by file and function alone: no rule matching needed
                hit = not self.rules.is_plumbing(filename, function) and \
                    not self.rules.is_passthrough(filename, function)
            else:
                facts = self.facts(frame)
                hit = not facts.plumbing and not facts.passthrough
            self._code[fid] = hit
        return hit

    def kind(self, fid: int) -> str:
        """The kind one frame shows ("" for none): library kinds for library frames; for frames of model code,
        the code kinds by the function's name — or by its class's name where the source names it (a
        hand-written `NewGELU.forward` is an activation) — else a library kind its file proves (transformers'
        Conv1D in pytorch_utils.py is a linear layer, its activations.py, timm's and diffusers' activation
        modules are activations: library layers that are model code, not torch's pass-through)."""
        hit = self._kind.get(fid)
        if hit is None:
            filename, _, function = frame = self.interner.frames[fid]
            if not self.is_code(fid):
                hit = next((k.name for k in self.data.kinds if not k.on_code and not k.on_call
                            and k.matches(filename, function)), "")
            else:
                names = [function]
                source = self.facts(frame).source if self.rules.source is not None else None
                if source is not None and source.cls:
                    names.append(source.cls)
                hit = next((k.name for k in self.data.kinds if k.on_code
                            and any(k.matches(filename, n) for n in names)), "")
                if not hit:
                    hit = next((k.name for k in self.data.kinds if not k.on_code and not k.on_call
                                and k.file is not None and k.matches(filename, function)), "")
            self._kind[fid] = hit
        return hit

    def call_kind(self, fid: int) -> tuple[str, str]:
        """The kind the call of a frame's line shows ("" for none), where the source names its only call: the
        allocation of a stack whose innermost Python frame is this line was made by that call's C++ code
        (`F.scaled_dot_product_attention`, `x.softmax`, `torch.bmm`), which a stack of stacks="python" shows
        by no frame of its own; and the call's name."""
        if self.rules.source is None:
            return "", ""
        source = self.facts(self.interner.frames[fid]).source
        if source is None or not source.call:
            return "", ""
        return next((k.name for k in self.data.kinds if k.on_call and k.matches("", source.call)), ""), source.call

    # -- building -----------------------------------------------------------------------------------
    def _build(self) -> None:
        if self._built:
            return
        stacks, frames = self.interner.stacks, self.interner.frames
        # Pass 1: each stack's frames of model code, and the lines each function shows under each caller.
        walks: list[tuple[int, list[int]]] = []
        lines: dict[tuple[str, str, int], set[int]] = {}
        for sid in self.stacks:
            stack = stacks[sid]
            code = [i for i, fid in enumerate(stack) if self.is_code(fid)]
            if not code:
                continue
            walks.append((sid, code))
            for j, i in enumerate(code):
                lines.setdefault(self._function(stack[i], stack[code[j + 1]] if j + 1 < len(code) else -1),
                                 set()).add(frames[stack[i]][1])
        # One function name under one caller line can be two functions (`x + self.mlp(self.norm(x))` calls two
        # `forward`s of one file from one line): without the source, lines far apart are told apart.
        self._part = {key: _parts(found) for key, found in lines.items()}
        self.nodes, self._stack_node = [], {}
        index: dict[tuple[tuple[str, str, int], int], int] = {}
        for sid, code in walks:
            self._walk(sid, stacks[sid], code, index)
        self._built = True
        self._assign()
        self._ordered_lines()

    def _function(self, fid: int, caller: int) -> tuple[str, str, int]:
        """A function of model code under its caller: file, name (its qualified name where the source says),
        the caller's frame id."""
        filename, _, function = self.interner.frames[fid]
        source = self.facts(self.interner.frames[fid]).source if self.rules.source is not None else None
        return filename, source.qualname if source is not None else function, caller

    def _walk(self, sid: int, stack: Sequence[int], code: list[int],
              index: dict[tuple[tuple[str, str, int], int], int]) -> None:
        frames = self.interner.frames
        parent = -1
        for j in range(len(code) - 1, -1, -1):
            i = code[j]
            fid = stack[i]
            function = self._function(fid, stack[code[j + 1]] if j + 1 < len(code) else -1)
            key = (function, self._part[function].get(frames[fid][1], 0))
            node_id = index.get(key)
            if node_id is None:
                node_id = index[key] = len(self.nodes)
                self.nodes.append(_Node(fid, parent, self.nodes[parent].depth + 1 if parent >= 0 else 0))
            node = self.nodes[node_id]
            node.stacks += 1
            if parent >= 0:
                self.nodes[parent].children.add(node_id)
            below = code[j - 1] + 1 if j else 0
            found = ""
            for k in range(below, i):                       # innermost first: the first kind is the call's
                found = self.kind(stack[k])
                if found:
                    node.examples.setdefault(found, _name(frames[stack[k]]))
                    break
            else:
                if not j and not any(is_python_frame(frames[stack[k]][0]) for k in range(i)):
                    found, call = self.call_kind(fid)       # C++ code its line calls made the allocation
                    if found:
                        node.examples.setdefault(found, call)
            if found:
                node.kinds.add(found)
                node.lines.setdefault(frames[fid][1], set()).add(found)
            if not j:
                self._stack_own[sid] = (found, frames[fid][1], fid)
            parent = node_id
        self._stack_node[sid] = parent

    def _assign(self) -> None:
        frames = self.interner.frames
        blocks = self.data.building_blocks
        for node in _callees_first(self.nodes):
            kinds = set(node.kinds)
            examples = dict(node.examples)
            child_roles: set[str] = set()
            unroled_calls = False
            for c in node.children:
                child = self.nodes[c]
                name = _site(frames[child.frame])
                # A sublayer with a role of its own speaks by its role, not by its name or file.
                by_name = self.kind(child.frame) if child.role is None else ""
                if by_name:
                    kinds.add(by_name)
                    examples.setdefault(by_name, name)
                elif child.block:
                    # A building block that only multiplies by a matrix is a (hand-written) linear layer.
                    shown = {"linear"} if child.shown == {"matmul"} else child.shown
                    kinds |= shown
                    for k in shown:
                        examples.setdefault(k, child.examples.get(k, name))
                elif not child.children and not child.kinds and child.role is None:
                    kinds.add("elementwise")          # calls nothing that shows: a hand-written elementwise op
                    examples.setdefault("elementwise", name)
                    continue
                if child.role is not None:
                    child_roles.add(child.role.category)
                elif not child.block:
                    unroled_calls = True
            # Building blocks only: a sublayer with a role of its own (an attention, an MLP) is no building block
            # of its caller, even where it calls no model code itself.
            only_blocks = all(self.nodes[c].block or (not self.nodes[c].children and self.nodes[c].role is None)
                              for c in node.children)
            role = next((r for r in self.data.roles if r.fits(kinds, child_roles, only_blocks)), None)
            # Sublayers run inline, each from a line of its own (torch's nn.MultiheadAttention on one line, an
            # nn.Sequential MLP on the next): where the lines' own calls show different roles, the function is a
            # trunk holding them, and each line speaks for what its own calls made.
            lines = {line: r for line, ks in node.lines.items()
                     if (r := next((r for r in self.data.roles if r.fits(ks, set(), True)), None)) is not None}
            if len({r.category for r in lines.values()}) > 1 or role is None:
                node.line_roles = lines
                role = None if len({r.category for r in lines.values()}) > 1 else role
            node.role, node.via, node.shown, node.examples = role, (), kinds, examples
            if role is not None:
                shown_kinds = [k for k in (*sorted(role.all), *sorted(role.any & kinds)) if k in examples]
                plural = "s" if node.stacks != 1 else ""
                # each example once: a brief Site reads the same in every target
                named = list({words_text((examples[k],)): examples[k] for k in shown_kinds}.values())
                node.via = words(f"{role.reason} (beneath it, in {node.stacks:,} stack{plural}: ",
                                 *(part for k, x in enumerate(named) for part in ((", ", x) if k else (x,))), ")")
            elif kinds <= _WRAPPER_KINDS and len(child_roles) == 1 and not unroled_calls and all(
                    self.nodes[c].role is not None or not self.nodes[c].children for c in node.children):
                # Its own calls are at most projections, dropouts and elementwise ops (a Linear after an MLP's
                # first half), and the model code it calls agrees — no other composite module beside it: a
                # wrapper or dispatcher of that role. A node that also normalises, or calls another sublayer, is
                # a block of a model's trunk (norm → sublayer → residual), never the sublayer's own.
                category = next(iter(child_roles))
                node.role = next(r for c in node.children if (r := self.nodes[c].role) is not None
                                 and r.category == category)
                node.via = (f"calls only model code whose role is {category} (and helpers that show nothing)",)
            # A building block works for its caller: no role of its own, and what it and the code it calls
            # show is building blocks only (a hand-written Linear, a norm). One that shows nothing is no block:
            # nothing says it works for anyone; nor is a deep stack of them (a whole ResNet of convolutions and
            # norms): only a layer, and what calls nothing but layers, works for its caller.
            node.block = node.role is None and bool(kinds) and kinds <= blocks and only_blocks \
                and node.height <= _BLOCK_HEIGHT and not node.line_roles

    def _ordered_lines(self) -> None:
        """An MLP is a structure: an activation between linear layers. A line whose own calls show both (an
        nn.Sequential MLP called inline) is one only where the trace shows it so — a projection's allocation, then
        an activation's, then a projection's again (Linear, GELU, Linear); an activation feeding one projection
        (DiT's adaLN modulation, nn.Sequential(SiLU, Linear)) is none. Without the trace's order, nothing says it."""
        lines = [(n, line) for n, node in enumerate(self.nodes) for line, r in node.line_roles.items()
                 if r.category == "mlp"]
        if not lines:
            return
        order = self.order() if self.order is not None else np.zeros(0, dtype=np.int64)
        top = max(max(self._stack_own, default=-1), int(order.max()) if len(order) else -1) + 1
        which = np.full(top, -1, dtype=np.int64)           # stack -> candidate line
        step = np.zeros(top, dtype=np.int8)                # stack -> 1 projection, 2 activation
        index = {key: k for k, key in enumerate(lines)}
        for sid, (kind, line, _) in self._stack_own.items():
            k = index.get((self._stack_node.get(sid, -1), line))
            if k is not None and kind in ("linear", "matmul", "activation"):
                which[sid], step[sid] = k, 2 if kind == "activation" else 1
        order = order[order >= 0]
        at, kind_at = which[order], step[order]
        for k, (n, line) in enumerate(lines):
            mine = at == k
            projections = np.flatnonzero(mine & (kind_at == 1))
            activations = np.flatnonzero(mine & (kind_at == 2))
            if not (len(projections) and ((activations > projections[0]) & (activations < projections[-1])).any()):
                del self.nodes[n].line_roles[line]

    # -- answers ------------------------------------------------------------------------------------
    def role(self, stack_id: int) -> RoleHit | None:
        """The role of the node that made a stack's allocation (see the module docstring), or None."""
        if stack_id in self._hits:
            return self._hits[stack_id]
        self._build()
        node_id = self._stack_node.get(stack_id, -1)
        hit = None
        climbed = 0
        made = self.interner.frames[self.nodes[node_id].frame] if node_id >= 0 else None
        own, line, fid = self._stack_own.get(stack_id, ("", -1, -1))
        if node_id >= 0 and self.nodes[node_id].role is None and line in self.nodes[node_id].line_roles \
                and own and own in self.nodes[node_id].lines.get(line, ()):
            # a composite's line whose own calls show a sublayer (the allocation made by one of those calls)
            node = self.nodes[node_id]
            by = node.line_roles[line]
            hit = RoleHit(by.category, by.name, words(_site(self.interner.frames[fid]), f" {by.reason} (its own "
                                                      f"calls on that line: {', '.join(sorted(node.lines[line]))}; "
                                                      "inferred from the call tree)"), fid)
            self._hits[stack_id] = hit
            return hit
        while node_id >= 0 and climbed <= _CLIMB:
            node = self.nodes[node_id]
            if node.role is not None:
                where = _site(self.interner.frames[node.frame])
                reason = words(where, " ", *node.via) if made is None or not climbed else \
                    words("made in ", _site(made), ", which works for ", where, ", which ", *node.via)
                hit = RoleHit(node.role.category, node.role.name, words(*reason, " (inferred from the call tree)"),
                              node.frame)
                break
            # Up through building blocks, and from a helper its caller calls by a name of a kind (the
            # allocation in `apply_rotary_pos_emb` is its attention caller's).
            if not node.block and not (climbed == 0 and self.kind(node.frame)):
                break
            node_id, climbed = node.parent, climbed + 1
        self._hits[stack_id] = hit
        return hit

    def callee_roles(self, stack_id: int) -> tuple[set[str], int]:
        """The categories of the roles of the model code that the function which made a stack's allocation
        calls, and that function's frame (−1 where the stack has no model code)."""
        self._build()
        node_id = self._stack_node.get(stack_id, -1)
        if node_id < 0:
            return set(), -1
        node = self.nodes[node_id]
        return {r.category for c in node.children if (r := self.nodes[c].role) is not None}, node.frame

    def backward(self, stack_id: int) -> tuple[BackwardRule, int] | None:
        """The backward rule of a stack's innermost autograd node (`…::generated::<Name>::apply`) and that
        frame, or None."""
        if stack_id < 0 or not self.data.backward:
            return None
        frames = self.interner.frames
        for fid in self.interner.stacks[stack_id]:
            m = _AUTOGRAD_NODE.search(frames[fid][2])
            if m:
                found = next((b for b in self.data.backward if b.node.search(m.group(1))), None)
                return (found, fid) if found is not None else None
        return None


def _callees_first(nodes: list[_Node]) -> list[_Node]:
    """The nodes, each after every node it calls. A node can have several callers (one function called from one
    line of a block that runs both in the forward and in a checkpoint's recomputation, whose stacks differ
    above that line): the order is by height, the longest chain of calls beneath a node. A call back into a node
    still being measured (recursion seen through different callers) does not count. Linear in nodes and edges."""
    height = [-1] * len(nodes)
    active = [False] * len(nodes)
    for start in range(len(nodes)):
        if height[start] >= 0:
            continue
        todo = [(start, iter(nodes[start].children))]
        active[start] = True
        while todo:
            i, children = todo[-1]
            for c in children:
                if height[c] < 0 and not active[c]:
                    active[c] = True
                    todo.append((c, iter(nodes[c].children)))
                    break
            else:
                height[i] = 1 + max((height[c] for c in nodes[i].children if height[c] >= 0), default=-1)
                nodes[i].height = height[i]
                active[i] = False
                todo.pop()
    return [nodes[i] for i in sorted(range(len(nodes)), key=height.__getitem__)]


def _parts(lines: set[int]) -> dict[int, int]:
    """Each line's part: lines sorted, a new part wherever the gap to the previous exceeds
    _SAME_FUNCTION_GAP."""
    out, part, last = {}, 0, None
    for line in sorted(lines):
        if last is not None and line - last > _SAME_FUNCTION_GAP:
            part += 1
        out[line], last = part, line
    return out


_AUTOGRAD_NODE = re.compile(r"torch::autograd::generated::(\w+)::apply\b")


def _name(frame: tuple[str, int, str]) -> str:
    return frame[2].split("(", 1)[0]


def _site(frame: tuple[str, int, str]) -> Site:
    """A frame of model code as evidence: `model.py:120:forward`, its file's name alone."""
    return Site(frame[0], frame[1], _name(frame), brief=True)


# -- loading ----------------------------------------------------------------------------------------

def parse_roles(doc: dict[str, Any], where: str, categories: Sequence[str],
                compile_pattern: Any) -> RoleData:
    """roles.toml's document, validated (RulesError names the file and the entry)."""
    unknown = set(doc) - {"building_blocks", "kinds", "roles", "backward"}
    if unknown:
        raise RulesError(f"{where}: unknown top-level key(s) {sorted(unknown)}")
    blocks = doc.get("building_blocks", [])
    if not isinstance(blocks, list) or not all(isinstance(b, str) for b in blocks):
        raise RulesError(f"{where}: building_blocks must be a list of kind names")
    kinds = []
    for item in _tables(doc, "kinds", where):
        here = f"{where}: kind {item.get('name')!r}"
        _keys(item, {"name", "file", "function", "on"}, here)
        if item.get("on", "library") not in ("library", "code", "call") or not isinstance(item.get("name"), str):
            raise RulesError(f"{here}: needs a name, and 'on' must be \"library\", \"code\" or \"call\"")
        if "file" not in item and "function" not in item:
            raise RulesError(f"{here}: give 'file' or 'function'")
        if item.get("on") == "call" and "file" in item:
            raise RulesError(f"{here}: a kind on a line's call matches its dotted name ('function') only")
        kinds.append(Kind(item["name"], compile_pattern(item.get("file"), here, "file"),
                          compile_pattern(item.get("function"), here, "function"), item.get("on") == "code",
                          item.get("on") == "call"))
    known = {k.name for k in kinds} | {"elementwise"}
    roles = []
    for item in _tables(doc, "roles", where):
        here = f"{where}: role {item.get('name')!r}"
        _keys(item, {"name", "category", "reason", "all", "any", "none", "children", "blocks_only"}, here)
        if item.get("category") not in categories or not isinstance(item.get("name"), str) \
                or not isinstance(item.get("reason"), str):
            raise RulesError(f"{here}: needs a name, a reason and a known category")
        sets = {}
        for key in ("all", "any", "none", "children"):
            value = item.get(key, [])
            pool = set(categories) if key == "children" else known
            if not isinstance(value, list) or not set(value) <= pool:
                raise RulesError(f"{here}: '{key}' must list known {'categories' if key == 'children' else 'kinds'}")
            sets[key] = frozenset(value)
        if not isinstance(item.get("blocks_only", False), bool):
            raise RulesError(f"{here}: 'blocks_only' must be true or false")
        roles.append(Role(item["name"], item["category"], item["reason"], **sets,
                          blocks_only=item.get("blocks_only", False)))
    backward = []
    for item in _tables(doc, "backward", where):
        here = f"{where}: backward rule {item.get('name')!r}"
        _keys(item, {"name", "category", "reason", "node"}, here)
        node = compile_pattern(item.get("node"), here, "node")
        if item.get("category") not in categories or node is None or not isinstance(item.get("reason"), str):
            raise RulesError(f"{here}: needs a node pattern, a reason and a known category")
        backward.append(BackwardRule(str(item["name"]), item["category"], item["reason"], node))
    return RoleData(tuple(kinds), tuple(roles), tuple(backward), frozenset(blocks))


def _tables(doc: dict[str, Any], key: str, where: str) -> list[dict[str, Any]]:
    items = doc.get(key, [])
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise RulesError(f"{where}: '{key}' must be an array of tables ([[{key}]])")
    return items


def _keys(item: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(item) - allowed
    if unknown:
        raise RulesError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(allowed)})")
