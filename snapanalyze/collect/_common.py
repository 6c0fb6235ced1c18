"""Small shared pieces of the collector: the clock, the warning category and a logger.

Every timestamp the collector writes is microseconds since the Unix epoch from `now_us()`
(`time.time_ns() // 1000`), the same clock and unit as a snapshot's `time_us`, so markers, NVML samples
and trace entries join without conversion. Problems that must not stop the user's workload (an OOM
snapshot that failed, NVML missing with `nvml="optional"`, a sampler that died) are reported with
`warn()`, which issues a `CollectorWarning` and logs it; nothing here raises.
"""

from __future__ import annotations

import logging
import time
import warnings

log = logging.getLogger("snapanalyze.collect")


class CollectorWarning(UserWarning):
    """The collector kept going without something (NVML, an OOM snapshot, a marker hook)."""


def now_us() -> int:
    """Microseconds since the Unix epoch (the clock of a snapshot's `time_us`)."""
    return time.time_ns() // 1000


def warn(message: str, *, stacklevel: int = 3) -> None:
    """Issue a CollectorWarning and log it; never raises (warnings filters set to "error" excepted)."""
    log.warning(message)
    warnings.warn(message, CollectorWarning, stacklevel=stacklevel)
