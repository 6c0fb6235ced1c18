"""What an attribution is: a decision per block (`Decision`), the instant per device (`Instant`), the per-block
table and its summary (`Attribution`); and the views users take of the table (`category_shares`,
`summarize_blocks`, `top_sites`).

`Attribution.blocks` columns: device, address, size (requested bytes), allocated_est, category, tags
(comma-separated), rule, reason, frame (deciding or innermost meaningful frame, "file:line:function", the
function as Class.method where the source was found), owner (the innermost frame of the program's or a
model library's code that made the block, as `frame` shows it; "" where the stack has none), inferred,
stack_id, user_metadata, pool, stream, origin, alloc_index, annotation (the program's own text for the block,
"" for none), span (the innermost `record_function` span open when the block was allocated, e.g.
"Optimizer.step#AdamW.step" or a program's "prefill" range; "" for none or a block from before the window),
lifecycle (what the block is across steps, `rules.LIFECYCLES`: its category's, and for `other` "activations"
where it was made and freed inside the window, else "unknown");
then the ids the text columns are made from (`ID_COLUMNS`): frame_id and owner_id (the frames `frame` and
`owner` show, indexes into `snapshot.interner.frames`; −1 for none: `Attribution.site` makes one a Site) and
decision (the block's decision, `Attribution.decision`). Analyses read the ids; the text is what a table
shows. Its text columns are of object dtype, each distinct text one shared string (a quarter of a million
blocks would otherwise copy ~200 MB of text into Arrow strings).
`Attribution.summary` columns: device, category, bytes, share, blocks, top_frames (list of str, largest
first), top_frame_bytes (their live bytes), inferred_bytes (of `bytes`, those flagged inferred): the labels of
`category_shares`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import pandas as pd

from ...display import HtmlDisplay
from ...errors import UsageError
from ...model import Snapshot
from ...replay import Timeline
from ...sites import NO_FRAMES, Site, Words, site_codes, site_text
from ..rules import RuleSet

if TYPE_CHECKING:
    from .frames import Decider

BLOCK_COLUMNS = ["device", "address", "size", "allocated_est", "category", "tags", "rule", "reason", "frame",
                 "owner", "inferred", "stack_id", "user_metadata", "pool", "stream", "origin", "alloc_index",
                 "annotation", "span", "lifecycle"]
ID_COLUMNS = ["frame_id", "owner_id", "decision"]
SUMMARY_COLUMNS = ["device", "category", "bytes", "share", "blocks", "top_frames", "top_frame_bytes",
                   "inferred_bytes"]


@dataclass(frozen=True)
class Decision:
    category: str
    rule: str
    reason: Words       # why, naming frames as Sites (a renderer labels them: `sites.words_text`)
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


SUMMARY_TOP = 3     # allocation sites per category in `Attribution.summary`


@dataclass(frozen=True)
class CategoryShare:
    """One category's live bytes at an instant: its share of the device's active bytes, its blocks, the
    allocation sites that hold the most (None: no frames) and how much of it is inferred."""

    category: str
    bytes: int
    share: float
    blocks: int
    top_frames: tuple[Site | None, ...]   # allocation sites, most bytes first
    top_frame_bytes: tuple[int, ...]
    inferred_bytes: int                   # of `bytes`, those decided by inference

    def to_json(self) -> dict[str, object]:
        return {"category": self.category, "bytes": self.bytes, "share": self.share, "blocks": self.blocks,
                "top_frames": [site_text(s, none=NO_FRAMES) for s in self.top_frames],
                "top_frame_bytes": list(self.top_frame_bytes), "inferred_bytes": self.inferred_bytes}


@dataclass(frozen=True, eq=False)
class Attribution(HtmlDisplay):
    """Per-block attribution at one instant per device, and its summary by category. `decider` made its
    decisions and knows its frames: `site` and `decision` read the blocks' ids through it."""

    snapshot: Snapshot
    timeline: Timeline
    instants: dict[int, Instant]
    blocks: pd.DataFrame
    rules: RuleSet = field(repr=False)
    decider: Decider = field(repr=False)
    notes: tuple[str, ...] = ()

    def site(self, frame_id: int) -> Site | None:
        """The Site of a frame id of the blocks (`frame_id`, `owner_id`)."""
        return self.decider.site(int(frame_id))

    def decision(self, code: int) -> Decision:
        """The decision of a block's `decision` code."""
        return self.decider.decisions.items[int(code)]

    def shares(self, device: int, top: int = SUMMARY_TOP) -> tuple[CategoryShare, ...]:
        """`category_shares` of one device's blocks, most bytes first."""
        return category_shares(self.blocks[self.blocks["device"] == device], self.site, top)

    @cached_property
    def summary(self) -> pd.DataFrame:
        """`summarize_blocks` of every device's blocks (made on first use)."""
        return summarize_blocks(self.blocks, self.site)


AttributionAt = Callable[[int, int], Attribution]     # (device, event index) → its attribution, kept by a caller


def category_shares(blocks: pd.DataFrame, site: Callable[[int], Site | None],
                    top: int = SUMMARY_TOP) -> tuple[CategoryShare, ...]:
    """One device's blocks by category, most bytes first (then by name): bytes, share of their total, blocks,
    the `top` sites (`frame_id`, made Sites by `site`) by bytes and the inferred bytes."""
    if not len(blocks):
        return ()
    total = int(blocks["size"].sum())
    codes, sites = site_codes(blocks["frame_id"].to_numpy(), site)
    sized = pd.DataFrame({"category": blocks["category"].to_numpy(), "site": codes,
                          "size": blocks["size"].to_numpy(), "inferred": blocks["inferred"].to_numpy(dtype=bool)})
    out = []
    for category, part in sized.groupby("category", sort=False):
        by_site = part.groupby("site", sort=False)["size"].sum().sort_values(ascending=False, kind="stable")
        size = int(part["size"].sum())
        out.append(CategoryShare(str(category), size, (float(size) / total) if total else 0.0, len(part),
                                 tuple(sites[int(k)] for k in by_site.index[:top]),
                                 tuple(int(n) for n in by_site.to_numpy()[:top]),
                                 int(part.loc[part["inferred"], "size"].sum())))
    return tuple(sorted(out, key=lambda c: (-c.bytes, c.category)))


def summarize_blocks(blocks: pd.DataFrame, site: Callable[[int], Site | None],
                     top: int = SUMMARY_TOP) -> pd.DataFrame:
    """`Attribution.summary` of any blocks of one attribution (`site`: its `Attribution.site`)."""
    rows = [{"device": int(device), **c.to_json()}
            for device, part in blocks.groupby("device", sort=True) for c in category_shares(part, site, top)]
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


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
    codes, sites = site_codes(b["frame_id"].to_numpy(), attribution.site)
    keyed = b[["device", "category", "size", "stack_id"]].assign(frame=codes)
    key = "frame" if by == "frame" else "stack_id"
    g = keyed.groupby(["device", key, "category"], sort=False, observed=True).agg(
        bytes=("size", "sum"), blocks=("size", "size")).reset_index().rename(columns={key: "site"})
    if by == "frame":                                   # the sites' labels, as the table's `frame` shows them
        g["site"] = pd.Series([site_text(s) for s in sites], dtype=object).to_numpy()[g["site"].to_numpy()]
    g["share"] = g["bytes"] / g["device"].map(totals)
    g = g.sort_values(["device", "bytes"], ascending=[True, False], kind="stable")
    return g.groupby("device", sort=True).head(top).reset_index(drop=True)
