"""Estimates as files: `snapanalyze estimate` runs a program with fake tensors (`collect.estimate`) and writes the
snapshot where the user asked; this is where those paths are checked, written and read back.

Contract: `estimate_file(program, shape, output, …)` runs `program` (its command line, ``{NAME}`` replaced by the
shape's values, ``SNAPANALYZE_SHAPE_NAME`` set) and writes its estimate atomically at `output` (an existing file
only with `force`), returning an `EstimateSummary` with `attribute`'s categories at the estimate's peak;
`estimate_sweep(program, points, folder, …)` writes one estimate per shape into `folder`, each made in a fresh
interpreter (`python -m snapanalyze estimate`), named by its shape (`batch=8.pickle`: what `capacity` reads);
`chunked_prefill_files(...)` writes the chunked-prefill check's estimates into a folder (``tokens=N-chunk=C``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError

if TYPE_CHECKING:
    from ..collect.estimate.prefill import ChunkedPrefill


@dataclass(frozen=True)
class EstimateSummary:
    estimate: str                         # the file written
    program: tuple[str, ...]
    shapes: Mapping[str, int]
    capacity: int | None
    peak_allocated: int
    peak_reserved: int
    fits: bool | None
    oom: bool
    oom_at: str
    choices: tuple[str, ...]
    categories: tuple[Mapping[str, Any], ...] = field(default=())   # category, bytes, inferred_bytes; largest first

    def to_json(self) -> dict[str, Any]:
        return {"estimate": self.estimate, "program": list(self.program), "shapes": dict(self.shapes),
                "capacity": self.capacity, "peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
                "fits": self.fits, "oom": self.oom, "oom_at": self.oom_at, "choices": list(self.choices),
                "categories": [dict(c) for c in self.categories]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> EstimateSummary:
        return cls(doc["estimate"], tuple(doc["program"]), dict(doc["shapes"]), doc["capacity"],
                   int(doc["peak_allocated"]), int(doc["peak_reserved"]), doc["fits"], bool(doc["oom"]),
                   str(doc["oom_at"]), tuple(doc["choices"]), tuple(doc["categories"]))


def with_shape(program: Sequence[str], shape: Mapping[str, int]) -> list[str]:
    """The command line with each ``{NAME}`` replaced by the shape's value."""
    out = []
    for arg in program:
        for name, value in shape.items():
            arg = arg.replace("{" + name + "}", str(value))
        out.append(arg)
    return out


@contextlib.contextmanager
def _shape_environment(shape: Mapping[str, int]) -> Iterator[None]:
    keys = {f"SNAPANALYZE_SHAPE_{n.upper()}": str(v) for n, v in shape.items()}
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(keys)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _dump(snapshot: dict[str, Any], f: Any) -> None:
    pickle.dump(snapshot, f, protocol=4)


def estimate_file(program: Sequence[str], shape: Mapping[str, int], output: str | Path, *, capacity: int | None,
                  settings: str, torch_layout: str, force: bool) -> EstimateSummary:
    from ..atomic import write_atomic
    from ..collect.estimate import run_script

    path = Path(output)
    if path.is_dir():
        raise UsageError(f"{path}: is a folder; give the estimate's file name")
    if os.path.lexists(path) and not force:
        raise UsageError(f"{path}: exists (--force replaces it)")
    with _shape_environment(shape), contextlib.redirect_stdout(sys.stderr):   # the program's prints: not ours
        result = run_script(with_shape(program, shape), capacity=capacity, settings=settings,
                            torch_version=torch_layout, shapes=dict(shape))
    write_atomic(path, functools.partial(_dump, result.snapshot))
    return EstimateSummary(str(path), tuple(program), dict(shape), capacity, result.peak_allocated,
                           result.peak_reserved, result.fits, result.oom, result.oom_at, result.choices,
                           _categories(path))


def _categories(path: Path) -> tuple[dict[str, Any], ...]:
    """What holds the estimate's peak: `attribute`'s categories at its global peak."""
    from ..analyze.attribute import attribute
    from ..analyze.attribute.compact import attribution_result
    from ..load import load
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        snapshot = load(path, frames="allocations")
    result = attribution_result(attribute(snapshot))
    if not result.devices:
        return ()
    return tuple({"category": c.category, "bytes": c.bytes, "inferred_bytes": c.inferred_bytes}
                 for c in result.devices[0].categories)


def estimate_sweep(program: Sequence[str], points: Sequence[Mapping[str, int]], folder: str | Path, *,
                   capacity: int | None, changes: Sequence[str], torch_layout: str,
                   force: bool) -> list[EstimateSummary]:
    folder = Path(folder)
    if os.path.lexists(folder) and not folder.is_dir():
        raise UsageError(f"{folder}: exists and is not a folder (a sweep writes one estimate per shape into one)")
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for shape in points:
        name = "-".join(f"{k}={v}" for k, v in shape.items()) + ".pickle"
        cmd = [sys.executable, "-m", "snapanalyze", "estimate", "-o", str(folder / name), "--format", "json",
               "--torch-layout", torch_layout]
        cmd += [a for k, v in shape.items() for a in ("--shape", f"{k}={v}")]
        cmd += [a for c in changes for a in ("--set", c)]
        if capacity is not None:
            cmd += ["--capacity", f"{capacity}B"]
        if force:
            cmd.append("--force")
        done = subprocess.run([*cmd, "--", *program], capture_output=True, text=True)
        if done.returncode not in (0, 1) or not done.stdout.strip():
            error = (done.stderr.strip().splitlines() or ["failed"])[-1].removeprefix("snapanalyze: error: ")
            raise UsageError(f"estimate at {name.removesuffix('.pickle')}: {error}")
        out.append(EstimateSummary.from_json(json.loads(done.stdout)))
    return out


def chunked_prefill_files(model: str, chunks: str, prompt_tokens: int, folder: str | Path, *, check_tokens: int,
                          capacity: int | None, settings: str, force: bool) -> ChunkedPrefill:
    """The chunked-prefill check (`collect.estimate.prefill`) with each chunk size's estimate written into
    `folder`; returns its `ChunkedPrefill`."""
    from ..atomic import write_atomic
    from ..collect.estimate.prefill import chunked_prefill, model_factory, parse_chunks

    folder = Path(folder)
    if os.path.lexists(folder) and (not folder.is_dir() or any(folder.iterdir())) and not force:
        raise UsageError(f"{folder}: exists (--force replaces the estimates in it)")
    result = chunked_prefill(model_factory(model), parse_chunks(chunks), prompt_tokens, capacity=capacity,
                             settings=settings, check_tokens=check_tokens)
    folder.mkdir(parents=True, exist_ok=True)
    for row, snapshot in zip(result.rows, result.snapshots):
        name = f"tokens={prompt_tokens}" + (f"-chunk={row.chunk}" if row.chunk else "") + ".pickle"
        write_atomic(folder / name, functools.partial(_dump, snapshot))
    return result
