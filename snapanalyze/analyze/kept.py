"""Forward-pass tensors kept across a training step: what a retained graph, or outputs held on to, cost.

Contract: `kept_across_step(attribution, device, index, per_forward)` (the attribution of the blocks live at
`index`) returns a `KeptAcrossStep`, or None.
A training step is a run of events whose stacks pass through an optimizer's `step` or a `zero_grad`
(`training.toml` [[steps]]); a run ends at the next allocation made elsewhere. A forward pass's tensors (the
`per_forward` categories of categories.toml, and blocks no rule claimed — `other` — made under a module's
forward call, `training.toml` [[forward]]) die with its backward, or with the forward itself under no_grad.
So a block of one that is live at `index`, was allocated in the window before the last step began, and whose
allocating code (the same Python stack) has allocated again after that step, was kept: the forward ran again
while its earlier outputs stayed alive. What keeps them is the program's (a loss or output summed or stored
without `.item()` / `.detach()`, `backward(retain_graph=True)`, outputs stored for logging); the bytes are
exact, each a live block with its allocation event, and a lower bound (only code that has run again counts).
Requiring the code to have run again spares tensors that legitimately wait across another optimizer's step (a
GAN generator's output while the discriminator steps). A loop variable that still holds the previous
iteration's tensor while the next forward runs is found too (PyTorch's FAQ: `del` what you no longer need):
it outlived one step. None when no step precedes `index` inside the span of those blocks, or what was kept is
below `MIN_SHARE` of the bytes live at `index` (a previous loss scalar is not worth a word). The cost is
bounded by the events since the oldest live forward-pass block (their stack ids are looked up as columns;
each distinct stack and frame is matched once).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .. import tomldata
from ..errors import RulesError
from ..model import ALLOC, Snapshot
from ..sites import Site, site_codes, site_text

if TYPE_CHECKING:
    from .attribute.result import Attribution


@dataclass(frozen=True)
class KeptAcrossStep:
    """Forward-pass blocks live at an instant that outlived a training step while their code ran again."""

    step_index: int                              # the first event of the last step before the instant
    bytes: int
    blocks: int
    categories: tuple[tuple[str, int], ...]      # (category, bytes), most bytes first
    steps: int                                   # the most steps one of them outlived
    site: Site | None                            # the code that made most of their bytes (its owner or frame)
    site_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"step_index": self.step_index, "bytes": self.bytes, "blocks": self.blocks,
                "categories": [list(c) for c in self.categories], "steps": self.steps,
                "site": site_text(self.site), "site_bytes": self.site_bytes}


Frames = tuple[tuple[str, str], ...]          # (path fragment, function)
OTHER = "other"                              # the category of a block no rule claimed
MIN_SHARE = 0.01                             # kept bytes worth reporting, as a share of the bytes live


@functools.cache
def training_frames() -> dict[str, Frames]:
    """The frames of `training.toml` by part ("steps", "forward"), each checked."""
    doc = tomldata.read_shipped("snapanalyze.analyze", "training.toml")
    tomldata.keys(doc, ["steps", "forward"], "training.toml")
    out = {}
    for part in ("steps", "forward"):
        items, at = doc.get(part), f"training.toml: {part}"
        if not isinstance(items, list) or not items:
            raise RulesError(f"{at}: needs [[{part}]] tables")
        for item in items:
            tomldata.keys(tomldata.table(item, at), ["path", "function"], at)
        out[part] = tuple((tomldata.text(i.get("path"), f"{at}: path"),
                           tomldata.text(i.get("function"), f"{at}: function")) for i in items)
    return out


def _through(snapshot: Snapshot, stack_ids: np.ndarray, marks: Frames) -> np.ndarray:
    """Of the distinct `stack_ids`, those whose stack passes through one of `marks` (a Python call per distinct
    stack and frame, never per event)."""
    interner = snapshot.interner

    @functools.cache
    def marks_frame(fid: int) -> bool:
        file, _, name = interner.frames[fid]
        path = "/" + str(file).replace("\\", "/")
        return any(name == function and fragment in path for fragment, function in marks)

    hits = [sid for sid in np.unique(stack_ids).tolist() if 0 <= sid < len(interner.stacks)
            and any(marks_frame(f) for f in interner.stacks[sid])]
    return np.array(hits, dtype=np.int64)


def kept_across_step(attribution: Attribution, device: int, index: int,
                     per_forward: Collection[str]) -> KeptAcrossStep | None:
    """See the module docstring."""
    snapshot, blocks = attribution.snapshot, attribution.blocks
    frames = training_frames()
    mine = blocks[(blocks["device"] == device) & (blocks["alloc_index"] >= 0) & (blocks["alloc_index"] < index)]
    other = (mine["category"] == OTHER).to_numpy()
    stacks = mine["stack_id"].to_numpy()
    forward = mine["category"].isin(list(per_forward)).to_numpy() | (
        other & np.isin(stacks, _through(snapshot, stacks[other], frames["forward"])))
    mine = mine[forward]
    if not len(mine):
        return None
    at = np.arange(int(mine["alloc_index"].min()), index, dtype=np.int64)
    ids = snapshot.event_stack_ids(device, at)
    boundary = np.isin(ids, _through(snapshot, ids[ids >= 0], frames["steps"]))
    if not boundary.any():
        return None
    allocs = snapshot.trace(device).action[at] == ALLOC
    elsewhere = allocs & (ids >= 0) & ~boundary            # allocations made outside any step
    made = np.cumsum(elsewhere)
    pos = np.flatnonzero(boundary)
    new_run = np.ones(len(pos), dtype=bool)
    new_run[1:] = made[pos[1:]] > made[pos[:-1]]            # an allocation elsewhere lies between them
    starts, last = at[pos[new_run]], int(at[pos[-1]])
    again = np.unique(ids[elsewhere & (at > last)])       # code that allocated after the last step
    kept = mine[(mine["alloc_index"].to_numpy() < starts[-1]) & np.isin(mine["stack_id"].to_numpy(), again)]
    if not len(kept) or kept["size"].sum() < MIN_SHARE * blocks.loc[blocks["device"] == device, "size"].sum():
        return None
    outlived = len(starts) - np.searchsorted(starts, kept["alloc_index"].to_numpy(), side="right")
    by_category = kept.groupby("category", observed=True)["size"].sum().sort_values(ascending=False, kind="stable")
    maker, maker_bytes = _site(kept, attribution.site)
    return KeptAcrossStep(step_index=int(starts[-1]), bytes=int(kept["size"].sum()), blocks=len(kept),
                          categories=tuple((str(c), int(n)) for c, n in by_category.items() if n > 0),
                          steps=int(outlived.max()), site=maker, site_bytes=maker_bytes)


def _site(kept: pd.DataFrame, site: Callable[[int], Site | None]) -> tuple[Site | None, int]:
    """The code that made most of the kept bytes (ties: by label): its owner where attribution named one, else
    its frame."""
    owner, frame = kept["owner_id"].to_numpy(), kept["frame_id"].to_numpy()
    codes, sites = site_codes(np.where(owner >= 0, owner, frame), site)
    sizes = np.zeros(len(sites), dtype=np.int64)
    np.add.at(sizes, codes, kept["size"].to_numpy().astype(np.int64))
    best = min(range(len(sites)), key=lambda k: (-int(sizes[k]), site_text(sites[k])), default=None)
    if best is None or sites[best] is None:
        return None, 0
    return sites[best], int(sizes[best])
