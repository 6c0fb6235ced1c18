"""What a program said about its own memory: the `annotate` entries of a trace (torch ≥ 2.14,
`torch.cuda.memory._annotate_tensor(t, text)` / `_annotate_memory(ptr, text)`, the text in `user_metadata`).

Contract: `annotations_at(trace, addr, alloc_index, until)` returns, per block (its address and the index of
its alloc entry, −1 for a block from before the window), the text of the last annotate entry at that address
from its alloc up to event `until` (None: the whole trace), "" where there is none. `annotated_category(text,
categories)` is the category an annotation names — the text is a category's name, or `category=NAME` /
`category:NAME` — else None. Vectorised: one sort of the annotate entries, one search per block array.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import numpy as np

from ..model import ANNOTATE, DeviceTrace

_NAMED = re.compile(r"^\s*(?:category\s*[=:]\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*$")


def annotations_at(trace: DeviceTrace, addr: np.ndarray, alloc_index: np.ndarray, until: int | None) -> np.ndarray:
    out = np.full(len(addr), "", dtype=object)
    idx = np.flatnonzero(trace.action == ANNOTATE)
    if until is not None:
        idx = idx[idx <= until]
    if not len(idx) or not len(addr) or trace.user_metadata is None:
        return out
    order = np.lexsort((idx, trace.addr[idx]))
    idx = idx[order]
    keys = trace.addr[idx]
    last = np.searchsorted(keys, addr, side="right") - 1     # the latest annotate at or below each address
    found = last >= 0
    safe = np.maximum(last, 0)
    found &= (keys[safe] == addr) & (idx[safe] >= alloc_index)
    names = np.array(trace.user_metadata_names, dtype=object)
    out[found] = names[trace.user_metadata[idx[safe[found]]]]
    return out


def annotated_category(text: str, categories: Collection[str]) -> str | None:
    m = _NAMED.match(text)
    if m is None:
        return None
    name = m.group(1).lower()
    return name if name in categories else None
