"""The blocks one labelling decides, as columns, with what every stage may read (`Blocks`).

Contract: `Blocks.of(snapshot, device, live, decider, markers, at_time, at_index)` reads the given block
lifetimes (rows of `DeviceTimeline.lifetimes`): each block's stack (its alloc entry's, else its end-state
block's), pool, request (`user_metadata`, else a request marker span covering its allocation), origin and
annotation, the distinct stacks, and the instant's allocation and request where the blocks are live at one.
Stages read it and never change it; the decisions they make go to its `table`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...model import Snapshot
from ...replay import ORIGINS
from ..annotations import annotations_at
from ..requests import event_requests
from .decisions import Decisions
from .frames import Decider
from .instant import instant_event, instant_request


@dataclass(frozen=True, eq=False)
class Blocks:
    snapshot: Snapshot
    device: int
    decider: Decider
    markers: pd.DataFrame | None
    window: pd.DataFrame | None       # every lifetime of the device (what the program kept), if known
    table: Decisions                  # the decider's distinct decisions; the stages add theirs
    stack: np.ndarray                 # per block: stack id (−1: none)
    stacks: np.ndarray                # the distinct stack ids
    by_stack: np.ndarray              # per block: its index into `stacks`
    addr: np.ndarray
    sizes: np.ndarray
    block_row: np.ndarray
    alloc_index: np.ndarray
    free_index: np.ndarray
    from_trace: np.ndarray            # allocated inside the trace window
    pools: np.ndarray                 # pool id text ("0,0": the default pool)
    metadata: np.ndarray              # request name ("" for none)
    by_time: np.ndarray               # the request was named by a marker span's time, not by metadata
    origin: np.ndarray
    annotations: np.ndarray           # the program's own text for the block ("" for none)
    event: int                        # the allocation that reached the instant (−1: none)
    request: str | None               # the instant's request (`instant_request`)
    request_why: str
    ambiguous: int                    # blocks allocated while requests of different threads ran

    @classmethod
    def of(cls, snapshot: Snapshot, device: int, live: pd.DataFrame, decider: Decider,
           markers: pd.DataFrame | None = None, at_time: int | None = None, at_index: int | None = None,
           window: pd.DataFrame | None = None) -> Blocks:
        alloc_index = live["alloc_index"].to_numpy()
        block_row = live["block_row"].to_numpy()
        stack = np.full(len(live), -1, dtype=np.int64)
        from_trace = alloc_index >= 0
        stack[from_trace] = snapshot.event_stack_ids(device, alloc_index[from_trace])
        from_blocks = ~from_trace & (block_row >= 0)
        stack[from_blocks] = snapshot.block_stack_ids(block_row[from_blocks])
        stacks, by_stack = np.unique(stack, return_inverse=True)
        addr = live["addr"].to_numpy()
        sizes = live["size"].to_numpy()
        trace = snapshot.trace(device)
        metadata = np.full(len(live), "", dtype=object)
        by_time = np.zeros(len(live), dtype=bool)
        requests = event_requests(trace, alloc_index[from_trace], markers)
        metadata[from_trace], by_time[from_trace] = requests.names, requests.inferred
        event = instant_event(trace, at_index) if at_index is not None else -1
        request, request_why = instant_request(snapshot, device, event, markers, at_time, metadata, sizes)
        return cls(
            snapshot=snapshot, device=device, decider=decider, markers=markers, window=window,
            table=decider.decisions,
            stack=stack, stacks=stacks, by_stack=by_stack.reshape(-1), addr=addr, sizes=sizes, block_row=block_row,
            alloc_index=alloc_index, free_index=live["free_index"].to_numpy(), from_trace=from_trace,
            pools=pools_of(snapshot, device, addr, block_row, alloc_index), metadata=metadata, by_time=by_time,
            origin=np.array(ORIGINS, dtype=object)[live["origin"].cat.codes.to_numpy()],
            annotations=annotations_at(trace, addr, alloc_index, event if event >= 0 else None),
            event=event, request=request, request_why=request_why, ambiguous=requests.ambiguous)


def pools_of(snapshot: Snapshot, device: int, addr: np.ndarray, block_row: np.ndarray,
           alloc_index: np.ndarray) -> np.ndarray:
    """Pool id text of each block: the pool its alloc entry names (torch ≥ 2.12), else its end-state block's,
    else the segment's that holds it at the end."""
    blocks, segs = snapshot.block_columns, snapshot.segment_columns
    out = np.full(len(addr), "0,0", dtype=object)
    known = block_row >= 0
    if known.any():
        out[known] = blocks["pool_id"][block_row[known]]
    mine = segs["device"] == device
    if (~known).any() and mine.any():
        start = segs["address"][mine]
        order = np.argsort(start)
        start = start[order]
        end = start + segs["total_size"][mine][order].astype(np.uint64)
        pools = segs["pool_id"][mine][order]
        pos = np.searchsorted(start, addr[~known], side="right") - 1
        ok = (pos >= 0) & (addr[~known] < end[np.maximum(pos, 0)])
        sub = np.full(len(pos), "0,0", dtype=object)
        sub[ok] = pools[pos[ok]]
        out[~known] = sub
    from_trace = alloc_index >= 0
    named = snapshot.trace(device).pools_of(alloc_index[from_trace]) if from_trace.any() else None
    if named is not None:
        out[from_trace] = named
    return out
