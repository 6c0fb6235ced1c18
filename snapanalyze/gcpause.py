"""Pausing the cyclic garbage collector while millions of objects are built.

Contract: `gc_paused()` is a context manager (and decorator) during which the collector does not run; on the
way out, what was built moves straight to the oldest generation, so the allocations after it do not walk
millions of young objects through the younger generations. Used where a loader or a simulation builds
millions of long-lived objects that make no garbage cycles while it runs (a pause lets cycles made meanwhile
wait for the next full collection, nothing more).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building large structures. On the way out, what was built
    moves straight to the oldest generation (`gc.freeze` then `gc.unfreeze`, two list splices)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.freeze()
            gc.unfreeze()
            gc.enable()
