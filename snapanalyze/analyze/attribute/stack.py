"""What attribution says about one stack on its own — an allocation that never became a block, such as the
request an `oom` entry records: its decision, the frame that decided, its owner and the frames a reader needs.

Contract: `explain_stack(snapshot, stack_id, rules)` returns a `StackView`: the frames' decision
(`Decider.decide`, the frames stage alone: no block-level signal applies to an allocation that failed), the
deciding frame and the owner as Sites (named `Class.method` where the source named the function), and up to
`MAX_FRAMES` frames of Python code, innermost first, plumbing left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...model import Snapshot
from ...sites import Site, Words
from ...stacks import is_python_frame
from ..rules import RuleSet
from .frames import Decider, shown_site

MAX_FRAMES = 12            # frames of a stack shown: enough to reach the program's own code in a deep stack


@dataclass(frozen=True)
class StackView:
    stack_id: int
    category: str
    rule: str
    reason: Words
    inferred: bool
    frame: Site | None          # the deciding frame, else the innermost meaningful one
    owner: Site | None          # the innermost frame of the program's or a model library's code
    frames: tuple[Site, ...]    # Python frames, innermost first, plumbing left out (at most MAX_FRAMES)
    more_frames: int            # Python frames left out past MAX_FRAMES


def explain_stack(snapshot: Snapshot, stack_id: int, rules: RuleSet) -> StackView:
    decider = Decider.for_snapshot(snapshot, rules)
    d = decider.decide(stack_id)
    frames = snapshot.interner.frames
    shown = [fid for fid in (snapshot.interner.stacks[stack_id] if stack_id >= 0 else ())
             if is_python_frame(frames[fid][0]) and not decider.facts(frames[fid]).plumbing]
    return StackView(stack_id=stack_id, category=d.category, rule=d.rule, reason=d.reason, inferred=d.inferred,
                     frame=shown_site(decider, stack_id, d.frame) if stack_id >= 0 else None,
                     owner=decider.site(decider.owner_frame(stack_id)) if stack_id >= 0 else None,
                     frames=tuple(s for fid in shown[:MAX_FRAMES] if (s := decider.site(fid)) is not None),
                     more_frames=max(0, len(shown) - MAX_FRAMES))
