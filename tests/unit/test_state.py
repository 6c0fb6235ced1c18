"""Persistent state from before the window: the cuBLAS workspace by its size, k copies of the parameters in
a training program, weights where the sizes repeat as a model's layers do, unknown without evidence."""

from __future__ import annotations

import numpy as np

from snapanalyze.analyze.state import CUBLAS_DEFAULT_WORKSPACE, copies, periodic, persistent_state
from snapanalyze.sites import words_text

# A model's parameter sizes: embedding, 2 layers of q/k/v/o and w1/w2/w3, 5 norms (odd: 2 layers × 2 + final)
PARAMS = [40_960_000] + [4 * 2**20] * 8 + [16 * 2**20] * 6 + [4096] * 5


def _layout(*copies_of: int) -> tuple[np.ndarray, np.ndarray]:
    sizes = np.array([s for k in copies_of for s in PARAMS * k], dtype=np.int64)
    return sizes, np.arange(len(sizes), dtype=np.uint64) * np.uint64(2**26)


def test_copies_is_the_gcd_of_the_repeated_counts_and_survives_a_coincidence() -> None:
    assert copies(_layout(1)[0]) == 1
    assert copies(_layout(2)[0]) == 2 and copies(_layout(3)[0]) == 3
    with_inputs = np.concatenate([_layout(2)[0], [65536, 65536, 65536]])   # a buffer and two batches of one size
    assert copies(with_inputs) == 2
    # four copies (Adam's moments and the .grad) and an input of one parameter's size: still four; a model's own
    # layer counts (5, 8, 6 of three sizes) are no copies however some k nearly divides them
    assert copies(np.concatenate([_layout(4)[0], [4 * 2**20]])) == 4 and copies(_layout(1)[0]) == 1


def test_without_training_evidence_layered_sizes_are_weights_but_the_workspace() -> None:
    sizes, addr = _layout(2)
    sizes = np.append(sizes, CUBLAS_DEFAULT_WORKSPACE)
    addr = np.append(addr, np.uint64(2**40))
    guesses = persistent_state(sizes, addr, training=False)
    assert [g.category for g in guesses[:-1]] == ["weights"] * (len(sizes) - 1)
    assert guesses[-1].category == "workspace" and "8,519,680" in words_text(guesses[-1].reason)
    assert guesses[0].rule == "state.layers" and "repeat as a model's layers do" in words_text(guesses[0].reason)


def test_without_evidence_frameless_state_is_unknown_not_weights() -> None:
    """Issue 46, class 3: a state-only dump whose sizes show no layers (a pool of equal buffers, a few odd
    sizes) is unknown — said with how to record who made it — never weights by default."""
    pool = np.array([64 << 20] * 24 + [3 << 20, 5 << 20], dtype=np.int64)
    guesses = persistent_state(pool, np.arange(len(pool), dtype=np.uint64) * np.uint64(2**27), training=False)
    assert {g.category for g in guesses} == {"other"} and {g.rule for g in guesses} == {"state.unknown"}
    assert "record_memory_history before the model is built" in words_text(guesses[0].reason)
    assert periodic(_layout(1)[0]) and not periodic(pool)


def test_in_training_the_copies_become_state_in_address_order() -> None:
    sizes, addr = _layout(2)
    guesses = persistent_state(sizes, addr, training=True)
    first, second = guesses[:len(PARAMS)], guesses[len(PARAMS):]
    assert {g.category for g in first} == {"weights"} and {g.category for g in second} == {"gradients"}
    assert "copy 2 of 2" in words_text(second[0].reason) and "guess" in words_text(second[0].reason)
    four = persistent_state(*_layout(4), training=True)
    assert [four[i * len(PARAMS)].category for i in range(4)] == \
        ["weights", "gradients", "optimizer_state", "optimizer_state"]
    lone = persistent_state(np.array([1230, 1230, 1230, 4560]), np.arange(4, dtype=np.uint64), training=True)
    assert {g.category for g in lone} == {"other"}          # one repeated size says nothing of a multiset


def test_a_second_copy_is_optimizer_state_where_the_window_makes_the_gradients_afresh() -> None:
    """SGD with momentum and zero_grad(set_to_none=True): before the window the program holds the parameters and
    one momentum buffer each; BatchNorm's running statistics (no copies) and step counters (8 B) do not hide it."""
    sizes = np.array([s for s in PARAMS * 2] + [4096] * 6 + [8] * 53, dtype=np.int64)
    assert copies(sizes) == 2
    addr = np.arange(len(sizes), dtype=np.uint64) * np.uint64(2**26)
    momentum = persistent_state(sizes, addr, training=True, grads="fresh")
    second = [g.category for g, size in zip(momentum[len(PARAMS):2 * len(PARAMS)], PARAMS) if size > 4096]
    assert set(second) == {"optimizer_state"}
    assert "momentum" in words_text(momentum[len(PARAMS)].reason)


def test_three_copies_are_the_grad_and_one_state_where_the_backward_accumulates_into_grads_from_before() -> None:
    """SGD with momentum and zero_grad(set_to_none=False): the window's backward keeps none of its gradients (it
    adds them into the .grad from before), so of three copies the second is the .grad and the third the momentum;
    without that (Adam, .grad set to None) they are the two moments."""
    sizes, addr = _layout(3)
    kept = persistent_state(sizes, addr, training=True, grads="before")
    assert [kept[i * len(PARAMS)].category for i in range(3)] == ["weights", "gradients", "optimizer_state"]
    adam = persistent_state(sizes, addr, training=True)
    assert [adam[i * len(PARAMS)].category for i in range(3)] == ["weights", "optimizer_state", "optimizer_state"]
