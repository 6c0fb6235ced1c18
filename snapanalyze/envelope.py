"""Curves too long to draw point by point, kept to the points that hold their shape.

Contract: `envelope_indices(values, buckets)` → ascending indices into `values`, at most 2 × `buckets` + 2: every
index of a short series, else the minimum and the maximum of each of `buckets` equal runs and both ends, so a
step chart drawn through them reaches every spike and dip at its exact value. Pure numpy; shared by the
analyses that downsample (`analyze.over_time`) and the plots.
"""

from __future__ import annotations

import numpy as np


def envelope_indices(values: np.ndarray, buckets: int) -> np.ndarray:
    """Indices that keep the shape of `values` with at most 2 × `buckets` points, ascending.

    All indices when the series is short; else the position of the minimum and of the maximum of each of
    `buckets` equal runs of indices, so every spike and dip reaches the plot at its exact value."""
    n = len(values)
    if buckets < 1:
        raise ValueError("buckets must be at least 1")
    if n <= 2 * buckets:
        return np.arange(n, dtype=np.int64)
    width = -(-n // buckets)
    padded = np.concatenate([values, np.full(width * buckets - n, values[-1], dtype=values.dtype)])
    rows = padded.reshape(buckets, width)
    starts = np.arange(buckets, dtype=np.int64) * width
    picks = np.concatenate([starts + rows.argmin(axis=1), starts + rows.argmax(axis=1), [0, n - 1]])
    return np.unique(np.minimum(picks, n - 1))
