"""Which cached free blocks the allocator could hand a request, over columns of blocks.

Contract: `usable_mask(size, stream, pool, segment_type, request, on_stream, in_pool, max_split)` says, per free
block (its size and its segment's stream, pool and type), whether `get_free_block` could serve `request` bytes
(rounded) on `on_stream` in `in_pool` from it: the same stream and pool, the small pool up to 1 MiB else the
large one; with max_split_size set (> 0), no oversize block for a smaller request and none of request +
kLargeBuffer or more for a larger one (`state.Allocator._candidate` is the same rule on one block).
"""

from __future__ import annotations

import numpy as np

from .settings import LARGE_BUFFER, SMALL_SIZE


def usable_mask(size: np.ndarray, stream: np.ndarray, pool: np.ndarray, segment_type: np.ndarray, request: int,
                on_stream: int, in_pool: str, max_split: int) -> np.ndarray:
    """See the module docstring."""
    kind = "small" if request <= SMALL_SIZE else "large"
    ok = (np.asarray(stream) == on_stream) & (np.asarray(pool) == in_pool) & (np.asarray(segment_type) == kind)
    if max_split > 0:
        size = np.asarray(size, dtype=np.int64)
        ok &= ~((request < max_split) & (size >= max_split))
        ok &= ~((request >= max_split) & (size >= request + LARGE_BUFFER))
    return np.asarray(ok, dtype=bool)
