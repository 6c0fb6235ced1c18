"""Backward passes in a trace: which allocations the autograd engine's device thread made, and when each ran.

On a GPU the autograd engine runs a backward's ops on its own device thread, which has no Python frames: with
``stacks="python"`` such an allocation records no frames at all (while the program's own thread always records
some), with ``stacks="all"`` only C++ frames of the engine (`torch::autograd::Engine::thread_main`, a node's
``apply``). The program's thread waits in ``loss.backward()`` meanwhile, so a backward is a run of the device
thread's allocations that no allocation of the program's thread interrupts, and it is over by the program's
next allocation.

Contract: `backward_passes(allocations, stacks, engine)` takes one device's allocation events (trace indices, in
order) with their stack ids, and `engine(stack_id)`: whether a stack is the engine's (its frames' `autograd`
context); a stack id of −1 (no frames) is the device thread's where the trace records frames for other
allocations. It returns `Passes`: per backward its first and last device-thread allocation and the program's
next allocation (`ends`: where the backward was over at the latest; −1 where the trace ends first).
`Passes.of(indices)` names the pass an event ran in (−1: none) and `Passes.ended(indices)` where it was over.
`Passes.opens_window`: whether the trace begins inside a backward (its first allocation is the device thread's).
`kept_past(passes, alloc_index, free_index, device_thread)` says, for blocks, where their backward ended and
whether they outlived it.
Columns only: a pass over the allocations, no Python call per event.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Passes:
    first: np.ndarray          # trace index of each pass's first device-thread allocation
    last: np.ndarray           # and of its last
    ends: np.ndarray           # the program's next allocation after it (−1: none followed, the trace ended first)

    opens_window: bool = False # the trace's first allocation is the device thread's: it began inside a backward

    def __len__(self) -> int:
        return len(self.first)

    def of(self, indices: np.ndarray) -> np.ndarray:
        """The pass each trace index falls in, between its first allocation and its end (−1: none)."""
        indices = np.asarray(indices, dtype=np.int64)
        if not len(self):
            return np.full(len(indices), -1, dtype=np.int64)
        k = np.searchsorted(self.first, indices, side="right") - 1
        end = self.ends[np.maximum(k, 0)]
        inside = (k >= 0) & ((indices < end) | (end < 0))
        return np.where(inside, k, -1)

    def ended(self, indices: np.ndarray) -> np.ndarray:
        """Where the pass of each trace index was over (−1 for an index in no pass, or in one the trace does not
        see end)."""
        k = self.of(indices)
        return np.where(k >= 0, self.ends[np.maximum(k, 0)], -1)


NO_PASSES = Passes(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def backward_passes(allocations: np.ndarray, stacks: np.ndarray, engine: Callable[[int], bool]) -> Passes:
    """See the module docstring."""
    allocations = np.asarray(allocations, dtype=np.int64)
    stacks = np.asarray(stacks, dtype=np.int64)
    if not len(allocations):
        return NO_PASSES
    framed = stacks >= 0
    distinct = np.unique(stacks[framed])
    engine_ids = np.array([s for s in distinct.tolist() if engine(s)], dtype=np.int64)
    device = np.isin(stacks, engine_ids) | (~framed & framed.any())
    if not device.any():
        return NO_PASSES
    # A pass starts at a device-thread allocation that follows one of the program's (or starts the trace) and
    # lasts until the program allocates again.
    starts = np.flatnonzero(device & ~np.r_[False, device[:-1]])
    stops = np.flatnonzero(device & ~np.r_[device[1:], False])
    after = stops + 1
    ends = np.where(after < len(allocations), allocations[np.minimum(after, len(allocations) - 1)], -1)
    return Passes(allocations[starts], allocations[stops], ends.astype(np.int64), bool(device[0]))


def kept_past(passes: Passes, alloc_index: np.ndarray, free_index: np.ndarray, device_thread: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """For blocks (their alloc and free trace indices, −1: none) of which `device_thread` says the autograd
    engine's device thread made them: where the backward each was made in was over (−1: made in none, or the
    trace does not see it end), and whether the block outlived that end (never freed, or freed at or after it)."""
    alloc_index = np.asarray(alloc_index, dtype=np.int64)
    made = np.full(len(alloc_index), -1, dtype=np.int64)
    traced = alloc_index >= 0
    made[traced] = passes.of(alloc_index[traced])
    mine = device_thread & (made >= 0)
    ended = np.where(mine, passes.ends[np.maximum(made, 0)] if len(passes) else -1, -1)
    kept = mine & (ended >= 0) & ((free_index < 0) | (free_index >= ended))
    return ended, kept
