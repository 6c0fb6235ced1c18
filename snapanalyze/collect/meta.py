"""``meta.json``: what a reader needs to interpret one rank's files without asking the node.

`RunMeta` is a frozen record of the host, process, rank, devices, versions and recording options, fixed when
the recording starts; `meta_document` adds what changes while it runs (end time, snapshots written, OOMs
seen, NVML parts and rows, warnings) and `write_meta` writes the JSON atomically (replacing this recording's
previous version, never another recording's file). All times are µs since the Unix epoch; sizes are bytes;
the document carries ``schema_version`` (`layout.SCHEMA_VERSION`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import BinaryIO

from ..atomic import write_atomic, write_new
from ..layout import SCHEMA_VERSION
from .cuda import DeviceInfo
from .rank import RankInfo


def snapanalyze_version() -> str | None:
    try:
        return importlib_metadata.version("snapanalyze")
    except importlib_metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class RunMeta:
    """Facts fixed at the start of a recording."""

    host: str
    pid: int
    rank: RankInfo
    devices: tuple[DeviceInfo, ...]
    nvml_devices: tuple[str, ...]            # NVML device names, in CUDA order ("" unknown); empty without NVML
    versions: Mapping[str, str | None]       # torch, cuda_runtime, python, driver (NVML), snapanalyze
    options: Mapping[str, object]            # the RecordOptions, as passed
    history_args: Mapping[str, object]       # the arguments given to _record_memory_history
    start_time_us: int
    session: int                             # 0 for meta.json, n for meta-n.json


def meta_document(
    meta: RunMeta,
    *,
    end_time_us: int | None,
    snapshots: Sequence[str],
    ooms: Sequence[Mapping[str, object]],
    nvml: Mapping[str, object],
    oom_observer: bool,
    warnings: Sequence[str],
) -> dict[str, object]:
    """The JSON document: RunMeta's facts plus the recording's progress."""
    return {
        "schema_version": SCHEMA_VERSION,
        "host": meta.host,
        "pid": meta.pid,
        "rank": meta.rank.rank,
        "world_size": meta.rank.world_size,
        "local_rank": meta.rank.local_rank,
        "rank_source": meta.rank.source,
        "devices": [
            {**asdict(d), "nvml_name": meta.nvml_devices[d.index] if d.index < len(meta.nvml_devices) else None}
            for d in meta.devices
        ],
        "versions": dict(meta.versions),
        "options": dict(meta.options),
        "history_args": dict(meta.history_args),
        "session": meta.session,
        "start_time_us": meta.start_time_us,
        "end_time_us": end_time_us,
        "snapshots": list(snapshots),
        "ooms": [dict(o) for o in ooms],
        "oom_observer": oom_observer,
        "nvml": dict(nvml),
        "warnings": list(warnings),
    }


def _writer(document: Mapping[str, object]) -> Callable[[BinaryIO], None]:
    data = (json.dumps(document, indent=2, default=str) + "\n").encode()

    def write(f: BinaryIO) -> None:
        f.write(data)

    return write


def write_meta(path: str | os.PathLike[str], document: Mapping[str, object]) -> Path:
    """Write `document` as indented JSON to `path`, atomically, replacing this recording's previous version."""
    return write_atomic(path, _writer(document))


def write_new_meta(name_for: Callable[[int], str | os.PathLike[str]], document: Mapping[str, object]) -> Path:
    """Write `document` atomically to the first free name of `name_for(0)`, `name_for(1)`, …; never overwrites."""
    return write_new(name_for, _writer(document))
