"""Collect allocator snapshots, NVML samples and phase/request markers on a GPU node, per rank.

Usage (on the GPU node, with ``pip install 'snapanalyze[collect]'``)::

    from snapanalyze import collect

    with collect.record("runs/prefill-32k", max_entries=1_000_000, stacks="python", nvml_interval_ms=20):
        with collect.phase("prefill", tokens=32768, batch=4):
            with collect.request("req-17"):
                ...
        collect.dump("after-prefill")

writes ``runs/prefill-32k/rank=N/`` with ``snapshot-<tag>.pickle`` (``after-prefill``, ``final``, ``oom-<n>``),
``nvml-part-NNNNN.parquet``, ``markers.parquet`` and ``meta.json`` (see `layout`). Importing this package
never imports torch or pynvml: `record()` imports them and raises `CollectorError` with what to do when
they, CUDA or a GPU are missing. `phase`/`request` are no-ops outside a recording.

`sweep(run, shapes, step)` runs a workload at each batch shape inside one recording, one shaped phase each:
the run directory ``snapanalyze capacity`` and ``snapanalyze budget`` read with ``--shape-from markers``.

Modules: `recorder` (record/dump/Recording), `markers` (phase/request), `sweep`, `modules` (module-span hooks:
``record(..., modules=model)`` or ``with collect.modules(model): …``), `nvml` (NvmlBackend, NvmlSampler),
`cuda` (the torch side), `rank`, `meta`, `schemas` (Arrow schemas), `layout` (paths, SCHEMA_VERSION),
`atomic` (atomic writes) and `testing` (fakes for tests, imported on demand).
"""

from __future__ import annotations

from ..errors import CollectorError
from ..layout import SCHEMA_VERSION, rank_dir
from ._common import CollectorWarning
from .markers import phase, request
from .modules import ModuleHooks, modules
from .nvml import NvmlBackend, NvmlSampler, open_nvml
from .recorder import Recording, RecordOptions, active, dump, record
from .sweep import sweep

__all__ = [
    "record", "dump", "phase", "request", "modules", "active", "sweep", "ModuleHooks",
    "Recording", "RecordOptions", "NvmlBackend", "NvmlSampler", "open_nvml",
    "rank_dir", "SCHEMA_VERSION", "CollectorError", "CollectorWarning",
]
