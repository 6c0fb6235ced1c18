"""The truth about every block a capture made: what it is, from the objects, at any instant of its snapshot.

Contract: `facts(capture, index)` returns one `BlockFacts` per block live right after the snapshot trace's
entry `index` (−1: before the first; the instant an analysis names by the same index), in allocation order.
`lifecycle(facts)` is what the block is across steps: weights (a parameter or buffer, or autocast's copy of
one), gradients (a parameter's ``.grad``), optimizer_state (an optimizer's state, or made by its step's own
code: not by a closure the step calls), kv_cache (held by a KV cache object), inputs (copied from the host, or an
argument of the outermost module made outside every module, backward and step), workspace (cuBLAS), else
activations — a role seen at any time of the block's life counts from its allocation. `rows(capture, index,
labeller)` are the rows of the labels table (`COLUMNS`, the labelled-set layout's ``blocks-STEM.csv`` with
lifecycle, module and class columns): `labeller(facts)` names the fine category and why (the zoo's mapping of
module classes and ops; `lifecycle_label` without one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .snapshot import trace_start

if TYPE_CHECKING:
    from .frames import Frame
    from .tracker import Context, CpuCapture

COLUMNS = ("device", "address", "size", "label", "lifecycle", "module", "class", "phase", "op", "node", "roles",
           "why")
LIFECYCLES = ("weights", "gradients", "optimizer_state", "kv_cache", "inputs", "workspace", "logits", "activations")
# role → lifecycle, strongest first
_ROLES = (("workspace", "workspace"), ("parameter", "weights"), ("buffer", "weights"), ("grad", "gradients"),
          ("optimizer_state", "optimizer_state"), ("kv_cache", "kv_cache"), ("input", "inputs"),
          ("autocast_copy", "weights"))


@dataclass(frozen=True)
class BlockFacts:
    """What the capture knows of one live block."""

    address: int
    size: int                          # requested bytes
    roles: Mapping[str, str]           # role → detail, every role seen in its life
    context: Context                   # where it was allocated
    forward: Context | None            # a backward block's: the forward call that made its autograd node
    code: tuple[Frame, ...]            # the program's full Python stack at the allocation (innermost first)
    forward_code: tuple[Frame, ...]    # that of the forward call (backward blocks)
    recorded: bool                     # its allocation lies in the trace window
    shape: tuple[int, ...] = ()        # of the first tensor made on it
    dtype: str = ""
    scores: bool = False               # its trailing two dims and element count are those of a softmax output of a
                                       # module call it was made in (attention scores / probabilities, materialised)

    @property
    def module(self) -> str:
        """The module whose forward ran, or whose forward made the node whose backward ran."""
        if self.context.module or self.forward is None:
            return self.context.module
        return self.forward.module

    @property
    def classes(self) -> tuple[str, ...]:
        if self.context.classes or self.forward is None:
            return self.context.classes
        return self.forward.classes


Labeller = Callable[[BlockFacts], tuple[str, str]]


def lifecycle(f: BlockFacts) -> str:
    """See the module docstring (without the fine categories a labeller adds: activations stay activations)."""
    for role, life in _ROLES:
        if role in f.roles:
            return life
    if f.context.phase == "optimizer":          # the step's own code, not a closure it calls
        return "optimizer_state"
    return "activations"


def lifecycle_label(f: BlockFacts) -> tuple[str, str]:
    """The label without a mapping of modules to categories: the lifecycle, activations as activations_other."""
    life = lifecycle(f)
    return ("activations_other" if life == "activations" else life), _why(f)


def _why(f: BlockFacts) -> str:
    roles = ", ".join(f"{k} ({v})" if v else k for k, v in f.roles.items())
    where = f.module or "outside any module"
    return f"{f.context.phase} in {where}" + (f"; {roles}" if roles else "")


def facts(cap: CpuCapture, index: int) -> list[BlockFacts]:
    """See the module docstring."""
    cap._drain()
    j = trace_start(cap) + index
    start = trace_start(cap)
    out = []
    for b in cap.blocks:
        if b.alloc > j or (0 <= b.free <= j):
            continue
        ctx = cap.contexts[b.context]
        fwd = cap.contexts[ctx.forward] if ctx.forward >= 0 else None
        calls = ctx.calls or (fwd.calls if fwd is not None else ())
        scores = len(b.shape) >= 2 and any((*b.shape[-2:], math.prod(b.shape)) in cap.softmax_shapes.get(c, ())
                                           for c in calls)
        out.append(BlockFacts(b.addr, b.size, dict(b.roles), ctx, fwd, _stack(cap, ctx.code),
                              _stack(cap, fwd.code) if fwd is not None else (), b.alloc >= start, b.shape, b.dtype,
                              scores))
    return out


def _stack(cap: CpuCapture, stack_id: int) -> tuple[Frame, ...]:
    return cap.stacks[stack_id] if stack_id >= 0 else ()


def rows(cap: CpuCapture, index: int, labeller: Labeller = lifecycle_label) -> list[dict[str, object]]:
    """The labels table's rows at the instant after trace entry `index` (see the module docstring)."""
    out = []
    for f in facts(cap, index):
        label, why = labeller(f)
        ctx = f.context
        out.append({"device": 0, "address": f.address, "size": f.size, "label": label,
                    "lifecycle": "logits" if label == "logits" and lifecycle(f) == "activations" else lifecycle(f),
                    "module": f.module, "class": f.classes[-1].rsplit(".", 1)[-1] if f.classes else "",
                    "phase": ctx.phase, "op": ctx.op, "node": ctx.node, "roles": " ".join(sorted(f.roles)),
                    "why": why})
    return out
