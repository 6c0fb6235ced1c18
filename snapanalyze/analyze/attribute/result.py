"""What an attribution is: a decision per block (`Decision`), the instant per device (`Instant`), the per-block
table and its summary (`Attribution`); and the views users take of the table (`summarize_blocks`, `top_sites`).

`Attribution.blocks` columns: device, address, size (requested bytes), allocated_est, category, tags
(comma-separated), rule, reason, frame (deciding or innermost meaningful frame, "file:line:function", the
function as Class.method where the source was found), owner (the innermost frame of the program's or a
model library's code that made the block, as `frame` shows it; "" where the stack has none), inferred,
stack_id, user_metadata, pool, stream, origin, alloc_index, annotation (the program's own text for the block,
"" for none), span (the innermost `record_function` span open when the block was allocated, e.g.
"Optimizer.step#AdamW.step" or a program's "prefill" range; "" for none or a block from before the window);
its text columns are of object dtype, each distinct text one shared string (a
quarter of a million blocks would otherwise copy ~200 MB of text into Arrow strings).
`Attribution.summary` columns: device, category, bytes, share, blocks, top_frames (list of str, largest
first), top_frame_bytes (their live bytes), inferred_bytes (of `bytes`, those flagged inferred).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import pandas as pd

from ...display import HtmlDisplay
from ...errors import UsageError
from ...model import Snapshot
from ...replay import Timeline
from ..rules import RuleSet

BLOCK_COLUMNS = ["device", "address", "size", "allocated_est", "category", "tags", "rule", "reason", "frame",
                 "owner", "inferred", "stack_id", "user_metadata", "pool", "stream", "origin", "alloc_index",
                 "annotation", "span"]
SUMMARY_COLUMNS = ["device", "category", "bytes", "share", "blocks", "top_frames", "top_frame_bytes",
                   "inferred_bytes"]


@dataclass(frozen=True)
class Decision:
    category: str
    rule: str
    reason: str
    frame: int          # deciding frame id (−1: none)
    tags: tuple[str, ...] = ()
    inferred: bool = False
    context: tuple[str, ...] = ()   # tags of the plumbing the stack passed through (autograd, autocast, …)
    owner: str = ""                 # the module (Class.method) that owns the allocation, when the source says


@dataclass(frozen=True)
class Instant:
    device: int
    event_index: int
    label: str
    time_us: int | None
    active_bytes: int
    reserved_bytes: int
    baseline_active_bytes: int
    request: str | None = None
    baseline: str = "the window start"     # what `baseline_active_bytes` is the active bytes at; transient = over it


@dataclass(frozen=True, eq=False)
class Attribution(HtmlDisplay):
    """Per-block attribution at one instant per device, and its summary by category."""

    snapshot: Snapshot
    timeline: Timeline
    instants: dict[int, Instant]
    blocks: pd.DataFrame
    rules: RuleSet = field(repr=False)
    notes: tuple[str, ...] = ()

    @cached_property
    def summary(self) -> pd.DataFrame:
        """`summarize_blocks(blocks)`: by device and category (made on first use)."""
        return summarize_blocks(self.blocks)



AttributionAt = Callable[[int, int], Attribution]     # (device, event index) → its attribution, kept by a caller

SUMMARY_TOP = 3     # allocation sites per category in `Attribution.summary`


def summarize_blocks(blocks: pd.DataFrame, top: int = SUMMARY_TOP) -> pd.DataFrame:
    """By device and category: bytes, share of the device's total, blocks, top frames by bytes, inferred bytes."""
    rows = []
    for device, dev in blocks.groupby("device", sort=True):
        total = int(dev["size"].sum())
        for category, part in dev.groupby("category", sort=False):
            sites = part.groupby("frame", sort=False)["size"].sum().sort_values(ascending=False, kind="stable")
            rows.append({"device": int(device), "category": str(category), "bytes": int(part["size"].sum()),
                         "share": (float(part["size"].sum()) / total) if total else 0.0,
                         "blocks": len(part),
                         "top_frames": [s or "(no frames)" for s in list(sites.index[:top])],
                         "top_frame_bytes": [int(b) for b in sites.to_numpy()[:top]],
                         "inferred_bytes": int(part.loc[part["inferred"].astype(bool), "size"].sum())})
    df = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    return df.sort_values(["device", "bytes", "category"], ascending=[True, False, True], kind="stable",
                          ignore_index=True)


def top_sites(attribution: Attribution, by: str = "frame", category: str | None = None,
              device: int | None = None, top: int = 20) -> pd.DataFrame:
    """Live bytes aggregated by allocation site: `by="frame"` (deciding/innermost frame) or `by="stack"`.

    Columns: device, site (frame label or stack id), category, bytes, blocks, share (of the device total).
    """
    if by not in ("frame", "stack"):
        raise UsageError("top_sites: by must be 'frame' or 'stack'")
    b = attribution.blocks
    totals = b.groupby("device")["size"].sum()
    if category is not None:
        b = b[b["category"] == category]
    if device is not None:
        b = b[b["device"] == device]
    key = "frame" if by == "frame" else "stack_id"
    g = b.groupby(["device", key, "category"], sort=False, observed=True).agg(
        bytes=("size", "sum"), blocks=("size", "size")).reset_index().rename(columns={key: "site"})
    g["share"] = g["bytes"] / g["device"].map(totals)
    g = g.sort_values(["device", "bytes"], ascending=[True, False], kind="stable")
    return g.groupby("device", sort=True).head(top).reset_index(drop=True)
