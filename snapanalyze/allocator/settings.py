"""The caching allocator's settings and its size arithmetic, as PyTorch's CUDA allocator computes them.

Contract: `AllocatorSettings` is one frozen set of the settings that change the allocator's decisions;
`of_snapshot(settings_dict)` reads the ones a snapshot's `allocator_settings` records (a missing one keeps
its default), `with_changes(base, ["key:value", …])` applies changes written as in PYTORCH_ALLOC_CONF
(UsageError naming the bad one). `round_size` and `allocation_size` are the allocator's block and segment
sizes for a request.

Read from c10/cuda/CUDACachingAllocator.cpp (the 4,506-line file of late 2025, mirrored in
rbarfinezhadfeli0/pytorch:docs/c10/cuda/CUDACachingAllocator.cpp_docs.md; pytorch@001074d2, mid 2024) and
c10/core/AllocatorConfig.cpp (@0ac71663): `round_size`, `roundup_power2_next_division`,
`get_allocation_size`, `parseRoundUpPower2Divisions`, `parseMaxSplitSize`, `parseMaxNonSplitRoundingSize`,
`parseGarbageCollectionThreshold`. The constants have held since torch 1.10; `max_non_split_rounding_mb`
appeared in 2.5 (before, kLargeBuffer — its default — was fixed), the list syntax of
`roundup_power2_divisions` in 2.1, expandable segments in 2.1.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

MiB = 1 << 20
MIN_BLOCK = 512                 # kMinBlockSize: every size is a multiple of it
SMALL_SIZE = MiB                # kSmallSize: requests up to it go to the small pool
SMALL_BUFFER = 2 * MiB          # kSmallBuffer: a small-pool segment
MIN_LARGE_ALLOC = 10 * MiB      # kMinLargeAlloc: below it a large request gets a kLargeBuffer segment
LARGE_BUFFER = 20 * MiB         # kLargeBuffer
ROUND_LARGE = 2 * MiB           # kRoundLarge: larger segments are rounded up to it
SIZE_MAX = (1 << 64) - 1        # max_split_size unset: every block may be split
INTERVALS = 16                  # roundup_power2_divisions: one interval per power of two from 1 MiB to 32 GiB+

# The torch release a setting (or its syntax) first appeared in, as the module docstring says; the other
# settings predate torch 2.0. A what-if of a file written by an older torch holds for the same program on
# this release or later (`requirements`).
SINCE = {"expandable_segments": (2, 1), "max_non_split_rounding_mb": (2, 5), "roundup_power2_divisions list": (2, 1)}

# `--set` keys (as PYTORCH_ALLOC_CONF spells them) → the field they set
KEYS = ("expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb", "roundup_power2_divisions",
        "garbage_collection_threshold", "per_process_memory_fraction")


@dataclass(frozen=True)
class AllocatorSettings:
    """The settings the allocator's decisions depend on (bytes; SIZE_MAX: max_split_size unset)."""

    max_split_size: int = SIZE_MAX
    max_non_split_rounding_size: int = LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = (0,) * INTERVALS
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    memory_fraction: float | None = None       # torch.cuda.set_per_process_memory_fraction (GC acts only with it)

    def round_size(self, size: int) -> int:
        """The block size a request of `size` bytes gets (`round_size`)."""
        if size < MIN_BLOCK:
            return MIN_BLOCK
        divisions = self.roundup_power2_divisions[_interval(size)]
        if divisions > 1 and size > MIN_BLOCK * divisions:
            return _next_division(size, divisions)
        return -(-size // MIN_BLOCK) * MIN_BLOCK

    @staticmethod
    def allocation_size(size: int) -> int:
        """The segment a block of `size` bytes (rounded) gets when no cached block fits (`get_allocation_size`)."""
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return LARGE_BUFFER
        return -(-size // ROUND_LARGE) * ROUND_LARGE

    @property
    def split_limited(self) -> bool:
        return self.max_split_size != SIZE_MAX

    def conf(self) -> str:
        """These settings as a PYTORCH_ALLOC_CONF string (the defaults left out; "" for all defaults)."""
        default = AllocatorSettings()
        parts = []
        if self.expandable_segments != default.expandable_segments:
            parts.append(f"expandable_segments:{self.expandable_segments}")
        if self.max_split_size != default.max_split_size:
            parts.append(f"max_split_size_mb:{self.max_split_size // MiB}")
        if self.max_non_split_rounding_size != default.max_non_split_rounding_size:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_size // MiB}")
        if self.roundup_power2_divisions != default.roundup_power2_divisions:
            parts.append(f"roundup_power2_divisions:{_divisions_text(self.roundup_power2_divisions)}")
        if self.garbage_collection_threshold != default.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold:g}")
        if self.memory_fraction is not None:
            parts.append(f"per_process_memory_fraction:{self.memory_fraction:g}")
        return ",".join(parts)


def requirements(recorded: AllocatorSettings, changed: AllocatorSettings) -> tuple[tuple[str, tuple[int, int]], ...]:
    """The changes from `recorded` to `changed` that need a torch release newer than 2.0: (the change as
    PYTORCH_ALLOC_CONF writes it, the release it appeared in)."""
    out = []
    if changed.expandable_segments and not recorded.expandable_segments:
        out.append(("expandable_segments:True", SINCE["expandable_segments"]))
    if changed.max_non_split_rounding_size != recorded.max_non_split_rounding_size:
        out.append((f"max_non_split_rounding_mb:{changed.max_non_split_rounding_size // MiB}",
                    SINCE["max_non_split_rounding_mb"]))
    divisions = changed.roundup_power2_divisions
    if divisions != recorded.roundup_power2_divisions and len(set(divisions)) > 1:
        out.append((f"roundup_power2_divisions:{_divisions_text(divisions)}", SINCE["roundup_power2_divisions list"]))
    return tuple(out)


def _interval(size: int) -> int:
    """`roundup_power2_divisions(size)`'s index: floor(log2 size) − 20, clamped to the 16 intervals."""
    return min(max(size.bit_length() - 1 - 20, 0), INTERVALS - 1)


def _next_division(size: int, divisions: int) -> int:
    """`roundup_power2_next_division`: `size` up to the next of `divisions` equal steps between powers of two."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    return -(-size // step) * step


def _divisions_text(divisions: tuple[int, ...]) -> str:
    if len(set(divisions)) == 1:
        return str(divisions[0])
    return "[" + ",".join(f"{1 << i}:{d}" for i, d in enumerate(divisions)) + "]"


def of_snapshot(settings: Mapping[str, Any] | None) -> AllocatorSettings:
    """The settings a snapshot's `allocator_settings` records (what it lacks keeps torch's default)."""
    s = settings or {}
    out = AllocatorSettings()
    split = s.get("max_split_size")
    if isinstance(split, int) and not isinstance(split, bool) and 0 < split < SIZE_MAX:
        out = dataclasses.replace(out, max_split_size=split)
    rounding = s.get("max_non_split_rounding_size")
    if isinstance(rounding, int) and not isinstance(rounding, bool) and rounding > 0:
        out = dataclasses.replace(out, max_non_split_rounding_size=rounding)
    if s.get("expandable_segments") is True:
        out = dataclasses.replace(out, expandable_segments=True)
    gc = s.get("garbage_collection_threshold")
    if isinstance(gc, (int, float)) and not isinstance(gc, bool) and 0.0 < gc < 1.0:
        out = dataclasses.replace(out, garbage_collection_threshold=float(gc))
    fraction = s.get("per_process_memory_fraction")
    if isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0.0 < fraction < 1.0:
        out = dataclasses.replace(out, memory_fraction=float(fraction))
    divisions = s.get("roundup_power2_divisions")
    if isinstance(divisions, Mapping):
        out = dataclasses.replace(out, roundup_power2_divisions=_recorded_divisions(divisions))
    return out


def _recorded_divisions(recorded: Mapping[Any, Any]) -> tuple[int, ...]:
    """The snapshot's {"1": d, "2": d, …, "32768": d} (interval start in MiB → divisions) as 16 values."""
    values = [0] * INTERVALS
    for key, value in recorded.items():
        try:
            mb = int(key)
        except (TypeError, ValueError):
            continue
        if mb > 0 and mb & (mb - 1) == 0 and mb.bit_length() - 1 < INTERVALS and isinstance(value, int) \
                and not isinstance(value, bool) and value >= 0:
            values[mb.bit_length() - 1] = value
    return tuple(values)


_ITEM = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(\[[^\]]*\]|[^,]+?)\s*(?:,|$)")


def with_changes(base: AllocatorSettings, changes: Iterable[str]) -> AllocatorSettings:
    """`base` with each change ("key:value", or several joined by commas as in PYTORCH_ALLOC_CONF) applied."""
    out = base
    for change in changes:
        text = change.strip()
        pos = 0
        while pos < len(text):
            m = _ITEM.match(text, pos)
            if m is None or m.end() == pos:
                raise UsageError(f"--set {change!r}: expected key:value with a key among {', '.join(KEYS)}")
            out = _apply(out, m.group(1), m.group(2).strip(), change)
            pos = m.end()
    return out


def _apply(s: AllocatorSettings, key: str, value: str, change: str) -> AllocatorSettings:
    def bad(why: str) -> UsageError:
        return UsageError(f"--set {change!r}: {key} {why}")

    if key == "expandable_segments":
        if value not in ("True", "False", "true", "false"):
            raise bad("takes True or False")
        return dataclasses.replace(s, expandable_segments=value in ("True", "true"))
    if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
        mb = _number(value, bad)
        if mb != int(mb) or mb < LARGE_BUFFER // MiB:       # parseMaxSplitSize: at least kLargeBuffer in MB
            raise bad(f"takes a whole number of MB, at least {LARGE_BUFFER // MiB}")
        if key == "max_split_size_mb":
            return dataclasses.replace(s, max_split_size=int(mb) * MiB)
        return dataclasses.replace(s, max_non_split_rounding_size=int(mb) * MiB)
    if key == "roundup_power2_divisions":
        return dataclasses.replace(s, roundup_power2_divisions=_parse_divisions(value, bad))
    if key == "garbage_collection_threshold":
        t = _number(value, bad)
        if not 0.0 < t < 1.0:                             # parseGarbageCollectionThreshold: in (0, 1)
            raise bad("takes a fraction between 0 and 1 (exclusive)")
        return dataclasses.replace(s, garbage_collection_threshold=t)
    if key == "per_process_memory_fraction":
        f = _number(value, bad)
        if not 0.0 < f <= 1.0:
            raise bad("takes a fraction of the device in (0, 1]")
        return dataclasses.replace(s, memory_fraction=f)
    raise UsageError(f"--set {change!r}: unknown setting {key!r} (known: {', '.join(KEYS)})")


def _number(value: str, bad: Any) -> float:
    try:
        n = float(value)
    except ValueError:
        raise bad(f"takes a number, not {value!r}") from None
    if not math.isfinite(n):
        raise bad(f"takes a finite number, not {value!r}")
    return n


def _power_of_two(value: str, what: str, bad: Any) -> int:
    try:
        n = int(value)
    except ValueError:
        raise bad(f"takes whole numbers: {value!r} is not one") from None
    if n < 0 or (n > 0 and n & (n - 1)):
        raise bad(f"{what} must be a power of 2, not {n}")
    return n


def _parse_divisions(value: str, bad: Any) -> tuple[int, ...]:
    """One value for every interval, or `[256:1,512:2,>:8]`: interval starts in MB (powers of 2), `>` for the
    rest (parseRoundUpPower2Divisions: the first value also fills the intervals before its own)."""
    if not value.startswith("["):
        return (_power_of_two(value, "the divisions", bad),) * INTERVALS
    values = [0] * INTERVALS
    items = [item.strip() for item in value[1:-1].split(",") if item.strip()]
    if not items:
        raise bad("takes a value or a list like [256:1,512:2,>:8]")
    last = 0
    first = True
    for item in items:
        start, sep, div = item.partition(":")
        if not sep:
            raise bad(f"list items are MB:divisions, not {item!r}")
        d = _power_of_two(div.strip(), "the divisions", bad)
        if start.strip() == ">":
            for i in range(last + 1, INTERVALS):
                values[i] = d
            continue
        mb = _power_of_two(start.strip(), "the interval start in MB", bad)
        if mb == 0:
            raise bad("interval starts are powers of 2 from 1 MB")
        index = min(mb.bit_length() - 1, INTERVALS - 1)
        if first:
            for i in range(index):
                values[i] = d
            first = False
        values[index] = d
        last = index
    return tuple(values)
