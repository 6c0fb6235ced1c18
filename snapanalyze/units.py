"""Units for people: bytes in binary units, µs timestamps and durations, shares — and sizes parsed back.

Contract: pure functions used by analyses (in the sentences they write) and renderers alike, so neither
layer imports the other for them. `fmt_bytes` uses binary units with two decimals, in the largest unit
that keeps the number below 1000 (1018.85 MiB reads 0.99 GiB, so a column never holds four-digit sizes);
None becomes `none`. `fmt_signed_bytes` prefixes a "+" on growth and writes zero as "0 B", never a bare 0.
`fmt_count(n, noun)` is a count with its noun in the right number ("1 event", "2,048 events").
`parse_bytes` reads sizes as people write them ("70GiB", "1.5GB", "512 MiB", plain bytes).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from .errors import UsageError

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_untrusted_int(value: int) -> str:
    """An integer read from an input, with thousands separators when it has at most 30 digits, else only its length
    ("an integer of about 5,000 digits"): Python refuses to print an integer of more than 4,300 digits, and no
    figure of a snapshot or a log needs more than 20."""
    bits = abs(int(value)).bit_length()
    if bits <= 99:
        return f"{int(value):,}"
    return f"{'a negative' if value < 0 else 'an'} integer of about {int(bits * 0.30103) + 1:,} digits"


def fmt_bytes(n: int | float | None, none: str = "–") -> str:
    if n is None:
        return none
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in _UNITS:
        shown = int(value) if unit == "B" else round(value, 2)
        if shown < 1000 or unit == _UNITS[-1]:
            return f"{sign}{shown} {unit}" if unit == "B" else f"{sign}{shown:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_signed_bytes(n: int | float) -> str:
    """A change in bytes: "+1.50 GiB", "-12.00 MiB", and "0 B" for no change."""
    return ("+" if n > 0 else "") + fmt_bytes(n) if n else "0 B"


def fmt_count(n: int, noun: str, plural: str | None = None) -> str:
    """"1 event", "0 events", "2,048 events"; `plural` for a noun that does not just take an "s"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def fmt_time_us(t: int | None) -> str:
    if t is None:
        return "–"
    try:
        return datetime.fromtimestamp(t / 1e6, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    except (ValueError, OverflowError, OSError):       # outside the calendar datetime knows (years 1–9999)
        return f"{t:,} µs since 1970 UTC"


def fmt_duration_us(d: int | None) -> str:
    if d is None:
        return "–"
    if d < 1000:
        return f"{d} µs"
    if d < 1_000_000:
        return f"{d / 1000:.2f} ms"
    return f"{d / 1e6:.3f} s"


def fmt_share(x: float) -> str:
    """A share as a percentage to one decimal; a share above zero that rounds to it is "<0.1%" (never "0.0%" for
    something that is there), one short of the whole that rounds to it ">99.9%"."""
    if 0 < x < 0.0005:
        return "<0.1%"
    if 0.9995 <= x < 1:
        return ">99.9%"
    return f"{100 * x:.1f}%"


_SIZE_UNITS = {"": 1, "b": 1,
          "k": 1024, "kb": 1000, "kib": 1024, "m": 1024 ** 2, "mb": 1000 ** 2, "mib": 1024 ** 2,
          "g": 1024 ** 3, "gb": 1000 ** 3, "gib": 1024 ** 3, "t": 1024 ** 4, "tb": 1000 ** 4, "tib": 1024 ** 4,
          "pb": 1000 ** 5, "pib": 1024 ** 5}
_SIZE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]+)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str | int) -> int:
    """Bytes from "70GiB", "512 MiB", "1.5GB", "4096", "64k" (k/M/G/T alone are binary). Raises UsageError."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise UsageError(f"a size must be ≥ 0, got {text}")
        return text
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _SIZE_UNITS:
        raise UsageError(f"not a size: {text!r} (expected e.g. 70GiB, 512MiB, 1.5GB or a number of bytes)")
    value = float(m.group(1).replace("_", "")) * _SIZE_UNITS[unit]
    if not math.isfinite(value):
        raise UsageError(f"not a size: {text!r}")
    return int(round(value))
