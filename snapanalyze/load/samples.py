"""Read what the collector wrote next to the snapshots of a run: NVML samples, markers and meta.json, all ranks.

Contract: `read_run(path)` takes a run directory (``RUN/rank=N/…``, see `layout`) or one ``rank=N``
directory and returns a `RunSamples` holding, across every rank, the NVML series (`nvml`), the phase and
request spans (`markers`) and the meta.json documents (`meta`), plus `problems`: one line per expected file
that is missing (a rank without NVML parts, without markers or meta, ranks that meta.json's world size
promises but the directory lacks) and per name `load.runs.scan` skipped. Missing files are reported, never
fatal; a file that is present but is not what the collector writes raises one BadInputError naming it and
the problem: only regular files are read (a FIFO or a link to a device is refused before it can block), a
meta.json past `jsonfile.MAX_JSON_BYTES` or that does not parse, a Parquet file that does not read, lacks a
column, has a column of another type, a null where the collector never writes one or a negative time, byte
count or device. Of meta.json the fields readers use are checked, each a clear error naming the field when
damaged: ``world_size`` (an integer from 1 to `layout.MAX_WORLD_SIZE`), ``devices`` (a list of objects:
``index`` and ``total_memory_bytes`` non-negative integers), ``nvml`` (an object: ``interval_ms`` a positive
number, ``reason`` a string). `pick_snapshots(path, tag, rank)` says which snapshot of each rank an analysis
reads (``final`` unless told otherwise; an OOM snapshot, ``oom-<n>`` or torchtitan's ``iteration_<N>_exit``,
first when asked) and reports each rank left without one; `markers_for(path, rank, tag)` gives the markers of
the rank whose snapshot `load(path, rank, tag)` reads.

DataFrame columns (units in the names: µs since the Unix epoch, bytes):
- `nvml`: rank, device, time_us, used_bytes, free_bytes, total_bytes, process_used_bytes,
  other_processes_used_bytes, torch_allocated_bytes, torch_reserved_bytes (the last four nullable Int64:
  null = unknown), sorted by rank, device, time_us.
- `markers`: rank, session, kind ("phase" | "request" | "module"), name, start_time_us, end_time_us (nullable: still
  open when written), attrs (dict, parsed from the JSON column), thread_id, depth; in start order per rank.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .. import layout
from ..confine import open_confined, reopenable
from ..errors import BadInputError
from ..model import RunSamples, world_size
from ..schema import MARKERS_SCHEMA, NVML_SCHEMA
from . import runs
from .jsonfile import expect, read_json
from .parquet_bounds import check_decoded, check_table
from .runs import RunEntry
from .safe_pickle import regular_file

NVML_COLUMNS = ["rank", *NVML_SCHEMA.names]
MARKER_COLUMNS = ["rank", "session", "kind", "name", "start_time_us", "end_time_us", "attrs", "thread_id", "depth"]
_NULLABLE = ("process_used_bytes", "other_processes_used_bytes", "torch_allocated_bytes", "torch_reserved_bytes")
# Columns that are never negative: a negative value is damage, not a measurement.
_NON_NEGATIVE = {"nvml": NVML_SCHEMA.names, "markers": ["start_time_us", "end_time_us", "depth"]}
_INT64_END = 1 << 63
_LISTED_MISSING = 8          # more ranks missing from the world than this are reported in one line


def empty_nvml() -> pd.DataFrame:
    return _nvml_frame(pa.Table.from_pylist([], schema=NVML_SCHEMA), 0).iloc[0:0]


def empty_markers() -> pd.DataFrame:
    return _markers_frame(pa.Table.from_pylist([], schema=MARKERS_SCHEMA), 0, 0).iloc[0:0]


def _read_parquet(path: Path, schema: pa.Schema, what: str) -> pa.Table:
    regular_file(path)
    try:
        strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
        # Strings stay dictionary-encoded until their expanded size is known to be within the cap (check_table).
        with open_confined(path) as f, pq.ParquetFile(reopenable(f), read_dictionary=strings) as reader:
            check_decoded(reader, path)
            table = reader.read()
        check_table(table, path)
    except (OSError, pa.ArrowException, ValueError, MemoryError) as exc:
        raise BadInputError(path, f"not a readable Parquet file ({str(exc)[:200]})") from None
    missing = [n for n in schema.names if n not in table.column_names]
    if missing:
        raise BadInputError(path, f"not {what} as the collector writes it: missing column(s) {', '.join(missing)}")
    try:
        table = table.select(schema.names).cast(pa.schema([schema.field(n).with_nullable(True) for n in schema.names]))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise BadInputError(path, f"{what}: column types differ from the collector's schema ({exc})") from None
    nulls = [f"{f.name} ({table.column(f.name).null_count:,})" for f in schema
             if not f.nullable and table.column(f.name).null_count]
    if nulls:
        raise BadInputError(path, f"{what}: null values where the collector always writes one: {', '.join(nulls)}")
    return table


def _check_non_negative(df: pd.DataFrame, columns: list[str], path: Path, what: str) -> None:
    negative = [c for c in columns if (df[c] < 0).any()]
    if negative:
        raise BadInputError(path, f"{what}: negative values in {', '.join(negative)} (times, bytes and devices "
                            "never are)")


def _check_consistent(df: pd.DataFrame, path: Path) -> None:
    """An NVML sample says used ≤ total and total > 0 (the device's memory, as nvmlDeviceGetMemoryInfo reports it);
    one that does not is damage, named here, never turned into a negative headroom or outside figure."""
    bad = (df["total_bytes"] <= 0) | (df["used_bytes"] > df["total_bytes"])
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise BadInputError(path, f"an NVML part: inconsistent sample (row {i:,}: used {int(df['used_bytes'].iat[i]):,}"
                            f" B of total {int(df['total_bytes'].iat[i]):,} B; NVML reports used ≤ total, total > 0)")


def _int_column(column: pa.ChunkedArray, nullable: bool) -> Any:
    """An integer column as int64 numpy (nullable: a pandas Int64 array, null = unknown), without a Python loop."""
    values = column.fill_null(0).to_numpy().astype(np.int64, copy=False)
    return pd.arrays.IntegerArray(values, column.is_null().to_numpy(zero_copy_only=False)) if nullable else values


def _nvml_frame(table: pa.Table, rank: int) -> pd.DataFrame:
    df = pd.DataFrame({name: _int_column(table.column(name), name in _NULLABLE) for name in NVML_SCHEMA.names})
    df.insert(0, "rank", np.full(len(df), rank, dtype=np.int64))
    return df


def _attrs(text: str | None) -> dict[str, Any]:
    try:
        value = json.loads(text) if text else {}
    except (ValueError, RecursionError):
        value = {"_raw": text}
    return value if isinstance(value, dict) else {"_value": value}


def _markers_frame(table: pa.Table, rank: int, session: int) -> pd.DataFrame:
    n = table.num_rows
    return pd.DataFrame({
        "rank": pd.Series(np.full(n, rank, dtype=np.int64)),
        "session": pd.Series(np.full(n, session, dtype=np.int64)),
        "kind": pd.Series(table.column("kind").to_pylist(), dtype=object),
        "name": pd.Series(table.column("name").to_pylist(), dtype=object),
        "start_time_us": pd.Series(_int_column(table.column("start_time_us"), False)),
        "end_time_us": pd.Series(_int_column(table.column("end_time_us"), True)),
        "attrs": pd.Series([_attrs(t) for t in table.column("attrs").to_pylist()], dtype=object),
        "thread_id": pd.Series(_int_column(table.column("thread_id"), False)),
        "depth": pd.Series(_int_column(table.column("depth"), False)),
    })


def read_nvml(rank_path: str | Path, rank: int) -> pd.DataFrame:
    """Every NVML part of one rank directory as one DataFrame (columns in the module docstring)."""
    parts = []
    for path in layout.nvml_parts(rank_path):
        part = _nvml_frame(_read_parquet(path, NVML_SCHEMA, "an NVML part"), rank)
        _check_non_negative(part, _NON_NEGATIVE["nvml"], path, "an NVML part")
        _check_consistent(part, path)
        parts.append(part)
    if not parts:
        return empty_nvml()
    df = pd.concat(parts, ignore_index=True)
    return df.sort_values(["device", "time_us"], kind="stable", ignore_index=True)


def read_markers(rank_path: str | Path, rank: int) -> pd.DataFrame:
    """Every markers file (all sessions) of one rank directory, in start order."""
    frames = []
    for path in layout.session_files(rank_path, "markers"):
        session = int(path.stem.partition("-")[2] or 0)
        marks = _markers_frame(_read_parquet(path, MARKERS_SCHEMA, "a markers file"), rank, session)
        _check_non_negative(marks, _NON_NEGATIVE["markers"], path, "a markers file")
        frames.append(marks)
    if not frames:
        return empty_markers()
    df = pd.concat(frames, ignore_index=True)
    return df.sort_values(["start_time_us", "session"], kind="stable", ignore_index=True)


def read_meta(rank_path: str | Path) -> list[dict[str, Any]]:
    """The meta.json documents of one rank directory, by session, each checked (`check_meta`)."""
    return [check_meta(read_json(path, "meta.json", max_bytes=4 << 20), path)
            for path in layout.session_files(rank_path, "meta")]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_meta(doc: Any, path: Path) -> dict[str, Any]:
    """`doc` if the meta.json fields readers use have the types and ranges the collector writes (see the
    module docstring); BadInputError naming the field otherwise. Fields no reader uses are not looked at."""
    if not isinstance(doc, dict):
        raise BadInputError(path, "not a meta.json document (expected a JSON object)")
    world = doc.get("world_size")
    expect(world is None or _is_int(world) and 1 <= world <= layout.MAX_WORLD_SIZE, path, "world_size",
           f"an integer from 1 to {layout.MAX_WORLD_SIZE:,}", world)
    devices = doc.get("devices")
    expect(devices is None or isinstance(devices, list), path, "devices", "a list of device objects", devices)
    for i, device in enumerate(devices or []):
        expect(isinstance(device, dict), path, f"devices[{i}]", "an object", device)
        for key in ("index", "total_memory_bytes"):
            value = device.get(key)
            expect(value is None or _is_int(value) and 0 <= value < _INT64_END, path, f"devices[{i}].{key}",
                   "a non-negative integer", value)
    nvml = doc.get("nvml")
    expect(nvml is None or isinstance(nvml, dict), path, "nvml", "an object", nvml)
    if nvml:
        interval = nvml.get("interval_ms")
        expect(interval is None or isinstance(interval, (int, float)) and not isinstance(interval, bool)
               and math.isfinite(interval) and interval > 0, path, "nvml.interval_ms", "a positive number", interval)
        reason = nvml.get("reason")
        expect(reason is None or isinstance(reason, str), path, "nvml.reason", "a string", reason)
    return doc


def rank_directories(path: str | Path) -> dict[int, Path]:
    """The rank=N directories of a run, or {N: path} when `path` is itself one rank directory."""
    root = Path(path)
    if not root.is_dir():
        raise BadInputError(root, "not a run directory")
    problem = layout.rank_name_problem(root)
    if problem:
        raise BadInputError(root, problem)
    own = layout.parse_rank_dir(root)
    if own is not None:
        return {own: root}
    return layout.rank_dirs(root)


def rank_of(path: str | Path) -> int | None:
    """The rank whose directory holds `path` (a rank=N directory or anything below it), or None."""
    found = layout.rank_dir_of(path)
    return None if found is None else layout.parse_rank_dir(found)


def read_run(path: str | Path) -> RunSamples:
    """NVML samples, markers and meta of every rank of a run (see the module docstring)."""
    dirs = rank_directories(path)
    root = Path(path)
    if layout.parse_rank_dir(root) is not None:
        root = root.parent
    nvml: list[pd.DataFrame] = []
    markers: list[pd.DataFrame] = []
    meta: dict[int, list[dict[str, Any]]] = {}
    problems: list[str] = []
    nvml_ranks: list[int] = []
    for rank, rdir in dirs.items():
        docs = read_meta(rdir)
        meta[rank] = docs
        if not docs:
            problems.append(f"rank {rank}: no meta.json in {rdir} (device capacity and options unknown)")
        samples = read_nvml(rdir, rank)
        if len(samples):
            nvml.append(samples)
            nvml_ranks.append(rank)
        else:
            reason = next((d.get("nvml", {}).get("reason") for d in reversed(docs)
                           if isinstance(d.get("nvml"), dict) and d["nvml"].get("reason")), None)
            problems.append(f"rank {rank}: no nvml-part-*.parquet in {rdir}"
                            + (f" (the collector said: {reason})" if reason else "")
                            + ": NVML used and memory outside the allocator are unknown for this rank")
        marks = read_markers(rdir, rank)
        if len(marks):
            markers.append(marks)
        elif not layout.session_files(rdir, "markers"):
            problems.append(f"rank {rank}: no markers.parquet in {rdir} (no collector phases or requests)")
    world = world_size(meta)
    if world is not None and layout.parse_rank_dir(Path(path)) is None:
        problems += _world_problems(world, dirs)
    problems += runs.scan(path).problems
    return RunSamples(
        run=root, ranks=tuple(dirs),
        nvml=pd.concat(nvml, ignore_index=True) if nvml else empty_nvml(),
        markers=pd.concat(markers, ignore_index=True) if markers else empty_markers(),
        meta=meta, problems=tuple(problems), nvml_ranks=tuple(nvml_ranks))


def _world_problems(world: int, dirs: dict[int, Path]) -> list[str]:
    """The ranks meta.json's world size promises that have no directory, and ranks past it that do."""
    missing = np.setdiff1d(np.arange(world), np.fromiter(dirs, dtype=np.int64, count=len(dirs)))
    if len(missing) <= _LISTED_MISSING:
        lines = [f"rank {r}: no rank={r} directory although meta.json says world_size {world}" for r in missing]
    else:
        lines = [f"{len(missing):,} ranks of {world:,} (rank {missing[0]} to {missing[-1]}) have no rank=N "
                 f"directory although meta.json says world_size {world}"]
    beyond = [r for r in dirs if r >= world]
    if beyond:
        names = ", ".join(f"rank={r}" for r in beyond[:3]) + (", …" if len(beyond) > 3 else "")
        lines.append(f"{names}: past the world_size {world} that meta.json states")
    return lines


def pick_snapshots(path: str | Path, tag: str | None = None, rank: int | None = None,
                   prefer_oom: bool = False) -> tuple[list[RunEntry], list[str]]:
    """Which snapshot(s) of each rank an analysis reads, and a problem line for each rank left without one
    (`choose_snapshots` over the run's entries and rank directories)."""
    return choose_snapshots(runs.entries(path), rank_directories(path), path, tag, rank, prefer_oom)


def choose_snapshots(found: list[RunEntry], dirs: dict[int, Path], path: str | Path, tag: str | None = None,
                     rank: int | None = None, prefer_oom: bool = False) -> tuple[list[RunEntry], list[str]]:
    """The choice itself, rank by rank (`runs.pick`: `tag`; else with `prefer_oom` every OOM snapshot; else
    ``final``; else a rank's only one), and a problem naming each rank left without one (choose with --tag)."""
    wanted = sorted(set(dirs) | {e.rank for e in found}) if rank is None else [rank]
    chosen: list[RunEntry] = []
    problems: list[str] = []
    for r in wanted:
        mine = [e for e in found if e.rank == r]
        tags = ", ".join(e.tag for e in mine)
        picked = runs.pick(mine, tag, prefer_oom)
        if picked is None:
            problems.append(f"rank {r}: several snapshots ({tags}) and none tagged 'final'; choose one with --tag")
        elif not picked and tag is not None:
            problems.append(f"rank {r}: no snapshot tagged {tag!r}" + (f" (has: {tags})" if mine else ""))
        elif not picked:
            problems.append(f"rank {r}: no snapshot in {dirs.get(r, Path(path) / f'rank={r}')}")
        chosen.extend(picked or [])
    return chosen, problems


def _rank_dir(path: str | Path, rank: int | None, tag: str | None) -> tuple[Path, int] | None:
    """The rank directory (and its rank) of the snapshot `load(path, rank, tag)` reads; None outside a run."""
    p = Path(path)
    found = layout.rank_dir_of(runs.resolve(p, rank, tag) if p.is_dir() else p)
    if found is None:
        return None
    owner = layout.parse_rank_dir(found)
    assert owner is not None
    return found, owner


def nvml_for(path: str | Path, rank: int | None = None, tag: str | None = None) -> pd.DataFrame:
    """The NVML samples of the rank whose snapshot `load(path, rank, tag)` reads (empty for a file outside a
    run)."""
    found = _rank_dir(path, rank, tag)
    return read_nvml(*found) if found is not None else empty_nvml()


def markers_for(path: str | Path, rank: int | None = None, tag: str | None = None) -> pd.DataFrame:
    """The markers of the rank whose snapshot `load(path, rank, tag)` reads (empty for a file outside a run)."""
    found = _rank_dir(path, rank, tag)
    return read_markers(*found) if found is not None else empty_markers()
