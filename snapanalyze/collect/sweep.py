"""Run a workload at a list of batch shapes inside one recording: the run directory `capacity` and `budget` read.

Contract: `sweep(run, shapes, step, phase_name="prefill", between=None, **record_options)` records this rank
into ``run/rank=N/`` (`record` with `record_options`) and, for each shape in order, calls ``step(**shape)``
inside ``phase(phase_name, **shape)``, then ``between()`` when given (free the step's outputs, sync, let the
engine settle). The recording stops after the last shape (``snapshot-final.pickle``, ``markers.parquet``,
``meta.json``) and the rank directory is returned; each shaped phase is one point of
``snapanalyze capacity RUN --shape-from markers`` and ``snapanalyze budget RUN --shape-from markers
--engine-log LOG``. A shape maps `batch_shape.SHAPE_KEYS` (tokens, batch, chunk, images) to positive integers;
anything else is a CollectorError before anything is recorded. An exception in `step` stops the recording
(an OOM leaves its ``oom-<n>`` snapshot) and propagates.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..batch_shape import SHAPE_KEYS
from ..errors import CollectorError
from .markers import phase
from .recorder import record


def _checked(shapes: Iterable[Mapping[str, Any]]) -> list[dict[str, int]]:
    out = []
    for i, shape in enumerate(shapes):
        if not isinstance(shape, Mapping) or not shape:
            raise CollectorError(f"sweep: shape {i} must be a non-empty mapping such as {{'tokens': 8192}}")
        unknown = sorted(set(shape) - set(SHAPE_KEYS))
        if unknown:
            raise CollectorError(f"sweep: shape {i} has {', '.join(map(str, unknown))}: a shape names "
                                 f"{', '.join(SHAPE_KEYS)}")
        bad = [k for k, v in shape.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
        if bad:
            raise CollectorError(f"sweep: shape {i}: {', '.join(bad)} must be positive integers")
        out.append(dict(shape))
    if not out:
        raise CollectorError("sweep: give at least one shape")
    return out


def sweep(run: str | os.PathLike[str], shapes: Iterable[Mapping[str, Any]], step: Callable[..., Any], *,
          phase_name: str = "prefill", between: Callable[[], Any] | None = None, **record_options: Any) -> Path:
    """Record `step` at each of `shapes` into `run` (module docstring); the rank directory written."""
    checked = _checked(shapes)
    with record(run, **record_options) as rec:
        for shape in checked:
            with phase(phase_name, **shape):
                step(**shape)
            if between is not None:
                between()
    assert rec.rank_dir is not None
    return rec.rank_dir
