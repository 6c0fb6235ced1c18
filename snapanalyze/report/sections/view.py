"""What the sections read from a `RankView`, shared by several of them: the attribution summary of an instant
as template rows (`category_rows`), a device's window, a phase's name and a detail instant's anchor, the
segment map laid out at an instant
(`segment_rows`) and a table row as plain values (`_plain_row`). No wording here (see `phrases`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ... import plots
from ...sites import site_codes
from ..context import RankView
from .section import FigureSpec


def category_rows(view: RankView, device: int, event_index: int) -> list[dict[str, Any]]:
    """The attribution summary of one instant as template rows (sites redacted when the report redacts)."""
    attribution = view.attribution(device, event_index)
    blocks = attribution.blocks[attribution.blocks["device"] == device]
    # Each category's largest owner: the code that made most of its bytes (named where the category is `other`
    # or inferred, so that a reader knows whose bytes they are).
    owned = blocks[blocks["owner_id"] >= 0]
    codes, sites = site_codes(owned["owner_id"].to_numpy(), attribution.site)
    by_owner = pd.DataFrame({"category": owned["category"].to_numpy(), "owner": codes,
                             "size": owned["size"].to_numpy()}).groupby(["category", "owner"], sort=False)["size"].sum()
    top_owner = by_owner.sort_values(ascending=False, kind="stable").groupby(level=0, sort=False).head(1)
    owners = {cat: (sites[int(owner)], int(n)) for (cat, owner), n in top_owner.items()}
    # What rose into the instant: each category's bytes allocated inside the trace window (the rest was live when
    # it began: resident across iterations, not what made this peak).
    rose = blocks[blocks["alloc_index"] >= 0].groupby("category", observed=True)["size"].sum().to_dict()
    site = view.redactor.site
    known = list(view.rules.categories)
    return [{"category": c.category, "bytes": c.bytes, "share": c.share, "blocks": c.blocks,
             "inferred": c.inferred_bytes, "color": plots.category_color(c.category, known),
             "sites": [(site(s), n) for s, n in zip(c.top_frames, c.top_frame_bytes)],
             "owner": site(owners[c.category][0]) if c.category in owners else "",
             "owner_bytes": owners[c.category][1] if c.category in owners else 0,
             "rose": int(rose.get(c.category, 0))}
            for c in attribution.shares(device)]


def _window(view: RankView, device: int) -> tuple[int | None, int]:
    """(window length in µs or None, number of events) of a device."""
    dt = view.timeline[device]
    first, last = dt.time_at(0), dt.time_at(len(dt) - 1)
    return ((last - first) if first is not None and last is not None else None), len(dt)


def _phase_label(rows: pd.DataFrame, row: Any) -> str:
    """The phase's name as `snapanalyze phases` prints it and --phase accepts it: 'prefill#2' when the name
    is repeated, else 'prefill' (`analyze.phases.phase_label`)."""
    return str(row.label)


def _instant_anchor(view: RankView, device: int, index: int) -> str | None:
    """The anchor of the detail instant at `index` of `device`, if it is one."""
    for instant in view.details.get(device, []):
        if instant.event_index == index:
            return f"instant-{view.key(device)}-{instant.slug}"
    return None


def segment_rows(view: RankView, device: int, index: int, fig_id: str) -> dict[str, Any] | None:
    """The segment map laid out at (device, index) (`RankView.segment_maps`): its figure (`spec`) and the
    numbers its template states, or None when none was laid out there."""
    smap = view.segment_maps.get((device, index))
    if smap is None or not len(smap.segments):
        return None
    free = smap.pieces[smap.pieces["state"] == "inactive"]
    largest = smap.largest_free
    figure = plots.segment_map_figure(smap)
    return {"spec": FigureSpec(fig_id, figure), "figure": fig_id, "height": int(figure.layout.height or 380),
            "segments": len(smap.segments), "reserved": smap.reserved_bytes,
            "free": smap.free_bytes, "free_pieces": len(free), "largest": largest.size if largest is not None else None,
            "largest_any": smap.largest_free_any_bytes, "request": smap.request_bytes,
            "pending": int(smap.segments["pending_free_bytes"].sum()), "exact": smap.exact, "source": smap.source,
            "shown": len({y for trace in figure.data for y in trace.y if not str(y).startswith("failed request")})}


def _plain_row(row: pd.Series) -> dict[str, Any]:
    return {k: (None if v is None or v is pd.NA or (isinstance(v, float) and v != v) else v) for k, v in row.items()}
