"""The distinct decisions of a snapshot's labellings, each with a code: blocks hold codes, so a decision made once
per distinct input is broadcast to every block that shares it (`Decisions`); `distinct` finds the distinct rows of
the inputs a stage reads, the key it decides once per.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ...sites import words_text
from .result import Decision


class Decisions:
    """Distinct decisions, each with a code (its index): blocks hold codes, so a decision made once per
    distinct input is broadcast to every block with that input. One table per `Decider` (a snapshot and its
    rules), so a code means the same decision in every labelling of the snapshot. `columns()`: per-code arrays
    of the fields (and predicates) the block-level steps test and the table shows, to index by the blocks'
    codes (made for each decision once)."""

    def __init__(self, persistent: frozenset[str]) -> None:
        self.persistent = persistent           # `RuleSet.persistent`, for the `lifecycle` predicate
        self.items: list[Decision] = []
        self._code: dict[Decision, int] = {}
        self._columns: dict[str, np.ndarray] = {}     # per field, room for at least the items made
        self._made = 0

    def add(self, d: Decision) -> int:
        found = self._code.get(d)
        if found is None:
            found = self._code[d] = len(self.items)
            self.items.append(d)
        return found

    def codes(self, decisions: Sequence[Decision]) -> np.ndarray:
        return np.array([self.add(d) for d in decisions], dtype=np.int64)

    def columns(self) -> dict[str, np.ndarray]:
        n, made = len(self.items), self._made
        if made < n:
            new = self._make(self.items[made:])
            room = len(next(iter(self._columns.values()))) if self._columns else 0
            if n > room:                       # grown by doubling: each decision's fields are copied O(1) times
                grown = {k: np.empty(max(n, 2 * room), dtype=v.dtype) for k, v in new.items()}
                for k, v in self._columns.items():
                    grown[k][:made] = v[:made]
                self._columns = grown
            for k, v in new.items():
                self._columns[k][made:n] = v
            self._made = n
        return {k: v[:n] for k, v in self._columns.items()}

    def _make(self, items: Sequence[Decision]) -> dict[str, np.ndarray]:
        return {
            "category": np.array([d.category for d in items], dtype=object),
            "tags": np.array([",".join(d.tags) for d in items], dtype=object),
            "rule": np.array([d.rule for d in items], dtype=object),
            "reason": np.array([words_text(d.reason) for d in items], dtype=object),
            "inferred": np.array([d.inferred for d in items], dtype=bool),
            "autocast": np.array(["autocast" in d.context for d in items], dtype=bool),
            "user_attention": np.array([user_attention(d) for d in items], dtype=bool),
            "lifecycle": np.array([d.category in self.persistent for d in items], dtype=bool),
            "plain_other": np.array([d.category == "other" and not d.owner
                                     and not set(d.context) & {"autograd", "optimizer"} for d in items], dtype=bool),
        }


def distinct(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For the rows of an integer matrix: the index of the first row of each distinct row, and each row's
    index into those."""
    inverse = np.zeros(len(keys), dtype=np.int64)
    if not len(keys):
        return inverse, inverse
    for column in keys.T:                                # hashed, a column at a time (sorting rows is slower)
        if column[0] == column.min() == column.max():    # one value throughout: it splits nothing
            continue
        codes, values = pd.factorize(column)
        inverse = pd.factorize(inverse * len(values) + codes)[0]
    seen = np.maximum.accumulate(inverse)                # codes are numbered in order of first appearance
    return np.flatnonzero(np.r_[True, seen[1:] > seen[:-1]]), inverse


def user_attention(d: Decision) -> bool:
    """Decided `attention` by a name heuristic on user code (not a library's fused kernel)."""
    return d.category == "attention" and d.rule.startswith("generic.")
