"""Which copies `Module._apply` makes are a parameter's `.grad`: the lines of `_apply` that move gradients.

Contract: `grad_copy_frames(frames, stacks, allocations)` takes the interner's frame and stack tables and,
per device, the stack id and requested size of each allocation in trace order, and returns {frame id:
evidence (`sites.Words`)} for the frames of torch's `Module._apply` (torch/nn/modules/module.py) at which
every allocation is a copy of a parameter's gradient.

What torch does (read in torch 2.13's nn/modules/module.py, and in older releases' `_apply` found with the
search tool, which write `fn(param.grad)`): `Module.to()` / `.cuda()` /
`.half()` call `_apply(fn)`, which recurses into the children, then for each parameter runs
`param_applied = fn(param)` and, if the parameter has a gradient, `grad_applied = fn(param.grad)` (2.13:
`fn(param_grad)`) right after it, then `fn(buf)` for each buffer. So a gradient's copy is the allocation
made right after its parameter's, of the same size, at a later line of the same function. A line of
`_apply` moves gradients when at least two allocations were made there and every one of them directly
follows (among that device's `_apply` allocations) one of the same size at an earlier line of `_apply`.
The buffer line fails it (a module's buffers follow one another at one line), as does the parameter line.
Cost: one pass over the distinct frames and stacks, then over the allocations in columns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

from ..sites import Site, Words, words
from ..stacks import Frame

_MODULE_FILE = re.compile(r"(^|/)torch/nn/modules/module\.py$")
MIN_COPIES = 2


def is_apply(frame: Frame) -> bool:
    """Whether a frame is torch's `Module._apply`."""
    return frame[2] == "_apply" and _MODULE_FILE.search(frame[0]) is not None


def apply_frame(frames: Sequence[Frame], stack: Sequence[int]) -> int:
    """The innermost `Module._apply` frame of a stack (the module whose tensors it copies), −1 if none."""
    return next((fid for fid in stack if is_apply(frames[fid])), -1)


def grad_copy_frames(frames: Sequence[Frame], stacks: Sequence[Sequence[int]],
                     allocations: Iterable[tuple[np.ndarray, np.ndarray]]) -> dict[int, Words]:
    """{frame id of an `_apply` line that copies gradients: evidence} (see the module docstring)."""
    apply_fids = {fid for fid, frame in enumerate(frames) if is_apply(frame)}
    if not apply_fids:
        return {}
    of_stack = np.array([apply_frame(frames, s) if apply_fids.intersection(s) else -1 for s in stacks]
                        if len(stacks) else [], dtype=np.int64)
    line_of = np.array([frame[1] for frame in frames], dtype=np.int64)      # per frame id
    good: dict[int, int] = {}          # frame id -> allocations that follow a same-size earlier-line one
    seen: dict[int, int] = {}          # frame id -> allocations made there
    for stack_ids, sizes in allocations:
        stack_ids = np.asarray(stack_ids, dtype=np.int64)
        ok = stack_ids >= 0
        fid = np.full(len(stack_ids), -1, dtype=np.int64)
        fid[ok] = of_stack[stack_ids[ok]]
        where = np.flatnonzero(fid >= 0)
        if not len(where):
            continue
        fid, size = fid[where], np.asarray(sizes)[where]
        line = line_of[fid]
        follows = np.zeros(len(fid), dtype=bool)
        follows[1:] = (size[1:] == size[:-1]) & (line[1:] > line[:-1])
        uniq, inverse, counts = np.unique(fid, return_inverse=True, return_counts=True)
        hits = np.bincount(inverse.reshape(-1), weights=follows, minlength=len(uniq))
        for f, n, k in zip(uniq.tolist(), counts.tolist(), hits.tolist()):
            seen[f] = seen.get(f, 0) + n
            good[f] = good.get(f, 0) + int(k)
    out = {}
    for f, n in seen.items():
        if n >= MIN_COPIES and good[f] == n:
            out[f] = words("Module._apply copies each parameter, then its .grad right after it (fn(param.grad)): "
                           f"each of the {n:,} allocations at ", Site.of(frames[f]), " follows one of the same size "
                           "at an earlier line of _apply (inferred from their order)")
    return out
