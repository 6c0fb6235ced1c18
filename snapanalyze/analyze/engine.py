"""Which program made the memory: vLLM, SGLang, PyTorch training, transformers — or plain PyTorch — from the
frames of the live blocks.

Contract: `detect_engine(snapshot, blocks)` looks at the stacks of `blocks` (any table with `stack_id`, −1
for none, and optionally `category`: e.g. `Attribution.blocks` at the instants a verdict speaks about) and
returns an `Engine`. `engine_from_tables(frames, stacks, blocks)` is the same on plain tables (`frames`:
frame_id, filename, line, name; `stacks`: stack_id, depth, frame_id — long format, as `Snapshot.frames_table()` /
`stacks_table()`), vectorised over them. The engines are data (`engines.toml`): the first, in file order,
with a matching frame in any block's stack — or with live bytes of one of its `categories` — wins.
`Engine.evidence` names what decided: the matching frame (a `sites.Site`: "vllm/v1/worker/gpu_worker.py:10:
load_model") that the most blocks share (the innermost of those, so the most specific), or the categories found
live ("live kv_cache"); `evidence_text(path)` shows it;
`blocks`, `framed` and `share` say in how many of the blocks with frames an engine frame appears. No match
gives plain PyTorch (`PYTORCH`'s name and label, no evidence). `detect_program(snapshot, blocks)` is what the
verdicts use: the blocks first, then, where they prove nothing, every stack the file allocated with. Nothing
here reads files beyond the package's own TOML.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .. import tomldata
from ..errors import RulesError
from ..model import Snapshot
from ..sites import PathText, Site
from ..stacks import short_path


@dataclass(frozen=True)
class Engine:
    """The program the verdict speaks for: `name` keys the advice, `label` is what a reader is shown."""

    name: str
    label: str
    evidence: Site | str | None = None   # the deciding frame, or the categories found live
    blocks: int = 0                  # blocks with frames whose stack holds a frame of the engine
    framed: int = 0                  # blocks with frames
    share: float = 0.0               # blocks / framed

    def evidence_text(self, path: PathText = short_path) -> str | None:
        """What decided, as text (a frame's file shown by `path`); None for none."""
        return self.evidence.label(path) if isinstance(self.evidence, Site) else self.evidence


PYTORCH = Engine("pytorch", "PyTorch")
SERVING_ENGINES = ("vllm", "sglang")   # engines that batch requests, and admit them against a memory budget


@functools.cache
def engine_specs() -> tuple[dict[str, Any], ...]:
    """The engines of `engines.toml`, in precedence order."""
    return check_engines(tomldata.read_shipped("snapanalyze.analyze", "engines.toml"), "engines.toml")


def check_engines(doc: dict[str, Any], where: str) -> tuple[dict[str, Any], ...]:
    """The [[engines]] of a document, each checked: `name`, `label`, `frames` ({path, function?}) and
    `categories` (names), nothing else."""
    tomldata.keys(doc, ["engines"], where)
    engines = doc.get("engines")
    if not isinstance(engines, list) or not engines:
        raise RulesError(f"{where}: needs [[engines]] tables")
    for spec in engines:
        at = f"{where}: engine {spec.get('name', '?')!r}" if isinstance(spec, dict) else where
        tomldata.keys(tomldata.table(spec, at), ["name", "label", "frames", "categories"], at)
        tomldata.text(spec.get("name"), f"{at}: name")
        tomldata.text(spec.get("label"), f"{at}: label")
        tomldata.texts(spec.get("categories", []), f"{at}: categories")
        frames = spec.get("frames", [])
        if not isinstance(frames, list):
            raise RulesError(f"{at}: frames must be a list of {{path, function}} tables")
        for match in frames:
            tomldata.keys(tomldata.table(match, f"{at}: frames"), ["path", "function"], f"{at}: frames")
            tomldata.text(match.get("path"), f"{at}: frames: path")
            if "function" in match:
                tomldata.text(match["function"], f"{at}: frames: function")
    return tuple(engines)


def _matching_frames(frames: pd.DataFrame, spec: dict[str, Any]) -> np.ndarray:
    """Ids of the frames that `spec` matches (file name fragment, optionally the function)."""
    files = "/" + frames["filename"].astype(str).str.replace("\\", "/", regex=False)
    names = frames["name"].astype(str)
    hit = np.zeros(len(frames), dtype=bool)
    for match in spec.get("frames", []):
        one = files.str.contains(match["path"], regex=False).to_numpy()
        if "function" in match:
            one = one & (names == match["function"]).to_numpy()
        hit |= one
    return frames["frame_id"].to_numpy()[hit]


def engine_from_tables(frames: pd.DataFrame, stacks: pd.DataFrame, blocks: pd.DataFrame) -> Engine:
    """The engine of `blocks` given the frame and stack tables (see the module docstring)."""
    stack_ids = blocks["stack_id"].to_numpy()
    framed = stack_ids[stack_ids >= 0]
    counts = pd.Series(framed).value_counts()
    live = set()
    if "category" in blocks.columns and "size" in blocks.columns:
        sizes = blocks.groupby("category", observed=True)["size"].sum()
        live = {str(c) for c, n in sizes.items() if n > 0}
    elif "category" in blocks.columns:
        live = {str(c) for c in blocks["category"].unique()}
    for spec in engine_specs():
        ids = _matching_frames(frames, spec) if len(framed) else np.zeros(0, dtype=np.int64)
        pairs = stacks[stacks["frame_id"].isin(ids) & stacks["stack_id"].isin(counts.index)]
        if len(pairs):
            hit = int(counts[pd.unique(pairs["stack_id"])].sum())
            per_frame = (pairs.drop_duplicates(["stack_id", "frame_id"])
                         .assign(n=lambda t: t["stack_id"].map(counts))
                         .groupby("frame_id").agg(n=("n", "sum"), depth=("depth", "min")).reset_index()
                         .sort_values(["n", "depth", "frame_id"], ascending=[False, True, True], kind="stable"))
            best = frames.set_index("frame_id").loc[int(per_frame["frame_id"].iloc[0])]
            site = Site.of((str(best["filename"]), int(best["line"]), str(best["name"])))
            return Engine(spec["name"], spec["label"], site, hit, len(framed), hit / len(framed))
        found = [c for c in spec.get("categories", []) if c in live]
        if found:
            return Engine(spec["name"], spec["label"], "live " + " and ".join(found), framed=len(framed))
    return Engine(PYTORCH.name, PYTORCH.label, framed=len(framed))


def detect_program(snapshot: Snapshot, blocks: pd.DataFrame) -> Engine:
    """`detect_engine` over `blocks`; where their stacks and categories prove no engine, over the stacks of
    everything the file allocated (an optimizer step or an engine's frame anywhere in the trace still names
    the program: a training loop whose optimizer keeps no state is training all the same)."""
    found = detect_engine(snapshot, blocks)
    if found.name != PYTORCH.name:
        return found
    wider = detect_engine(snapshot, pd.DataFrame({"stack_id": snapshot.allocation_stack_ids()}))
    return wider if wider.name != PYTORCH.name else found


def detect_engine(snapshot: Snapshot, blocks: pd.DataFrame) -> Engine:
    """The engine of `blocks` of `snapshot`: only the stacks those blocks name are looked at."""
    interner = snapshot.interner
    wanted = pd.unique(blocks["stack_id"].to_numpy())
    wanted = wanted[(wanted >= 0) & (wanted < len(interner.stacks))]
    keys = [interner.stacks[int(s)] for s in wanted]
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    frame_ids = np.fromiter((f for key in keys for f in key), dtype=np.int64, count=int(lengths.sum()))
    stacks = pd.DataFrame({"stack_id": np.repeat(wanted.astype(np.int64), lengths),
                           "depth": np.concatenate([np.arange(n) for n in lengths]) if len(keys) else frame_ids,
                           "frame_id": frame_ids})
    used = np.unique(frame_ids)
    frames = pd.DataFrame({"frame_id": used,
                           "filename": [interner.frames[f][0] for f in used],
                           "line": [interner.frames[f][1] for f in used],
                           "name": [interner.frames[f][2] for f in used]})
    return engine_from_tables(frames, stacks, blocks)
