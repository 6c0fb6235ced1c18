"""`blocks_csv`: the per-block attribution table as CSV a spreadsheet opens safely."""

from __future__ import annotations

from typing import Any


def blocks_csv(blocks: Any) -> str:
    """`Attribution.blocks` as CSV that a spreadsheet opens safely: each distinct text cell made inert once
    (`text.csv_cell`: formulas get a leading apostrophe, hidden characters become escapes)."""
    import pandas as pd

    from .text import csv_cell

    safe = blocks.copy(deep=False)
    for column in safe.columns:
        if safe[column].dtype == object:
            codes, uniques = pd.factorize(safe[column], use_na_sentinel=False)
            safe[column] = pd.Series([csv_cell(u) for u in uniques], dtype=object).to_numpy()[codes]
    text: str = safe.to_csv(index=False)
    return text
