"""Backward passes in a trace (`analyze.backward`): runs of the autograd device thread's allocations, ended by the
program's next allocation."""

from __future__ import annotations

import numpy as np

from snapanalyze.analyze.backward import backward_passes


def test_a_pass_is_a_run_of_the_device_threads_allocations_ended_by_the_programs_next() -> None:
    # trace indices of allocations and their stacks: 7 is the engine's C++ stack, −1 no frames (python stacks)
    allocations = np.array([0, 2, 3, 5, 8, 9, 11, 12, 14])
    stacks = np.array([1, 1, -1, 7, -1, 2, -1, -1, 3])
    passes = backward_passes(allocations, stacks, lambda s: s == 7)
    assert passes.first.tolist() == [3, 11] and passes.last.tolist() == [8, 12] and passes.ends.tolist() == [9, 14]
    assert passes.of(np.array([2, 3, 6, 8, 9, 11, 13, 14])).tolist() == [-1, 0, 0, 0, -1, 1, 1, -1]
    assert passes.ended(np.array([4, 12])).tolist() == [9, 14] and not passes.opens_window


def test_a_trace_that_ends_or_begins_inside_a_backward_says_so() -> None:
    passes = backward_passes(np.array([0, 1, 4, 6]), np.array([-1, -1, 5, -1]), lambda s: False)
    assert passes.opens_window and passes.ends.tolist() == [4, -1]
    assert passes.of(np.array([100])).tolist() == [1]                # the last one never ends in the trace


def test_a_trace_without_frames_or_without_the_engine_has_no_pass() -> None:
    assert len(backward_passes(np.array([0, 1]), np.array([-1, -1]), lambda s: True)) == 0   # nothing recorded
    assert len(backward_passes(np.array([0, 1]), np.array([3, 4]), lambda s: False)) == 0
