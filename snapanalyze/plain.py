"""Plain Python values from the numpy and pandas values analyses compute with.

Contract: `plain(value, nan_as_none=False)` returns a numpy scalar as the Python scalar it holds (`.item()`),
pandas' NA (and, with `nan_as_none`, a float NaN) as None, and anything else unchanged — what a JSON document
or a frozen result holds. Pandas is never imported here: NA can only come from a pandas already loaded.
"""

from __future__ import annotations

import sys
from typing import Any


def plain(value: Any, nan_as_none: bool = False) -> Any:
    pandas = sys.modules.get("pandas")
    if value is None or (pandas is not None and value is pandas.NA):
        return None
    if nan_as_none and isinstance(value, float) and value != value:
        return None
    if hasattr(value, "item"):
        return value.item()
    return value
