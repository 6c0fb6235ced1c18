"""Plain values for documents and tables: `_plain` (a numpy or pandas scalar as a Python one, NA as None) and
`blocks_csv` (the per-block attribution table as CSV a spreadsheet opens safely)."""

from __future__ import annotations

import sys
from typing import Any


def _plain(value: Any) -> Any:
    pandas = sys.modules.get("pandas")    # pd.NA can only come from a pandas that is already loaded
    if value is None or (pandas is not None and value is pandas.NA):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


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
