"""Plain-text rendering for terminals: byte units, aligned tables. Pure functions returning strings.

Contract: `fmt_bytes` formats binary units (B, KiB, MiB, GiB, TiB) with two decimals; `table` renders rows
of already-formatted cells with right-aligned numeric columns. Nothing here prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "–"
    value = float(n)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in _UNITS:
        if value < 1024 or unit == _UNITS[-1]:
            return f"{sign}{int(value)} {unit}" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_time_us(t: int | None) -> str:
    if t is None:
        return "–"
    return datetime.fromtimestamp(t / 1e6, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def fmt_duration_us(d: int | None) -> str:
    if d is None:
        return "–"
    if d < 1000:
        return f"{d} µs"
    if d < 1_000_000:
        return f"{d / 1000:.2f} ms"
    return f"{d / 1e6:.3f} s"


def fmt_share(x: float) -> str:
    return f"{100 * x:.1f}%"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    """Aligned columns; `right[i]` right-aligns column i (defaults: right-align cells that look numeric)."""
    if right is None:
        right = [all(_numeric(r[i]) for r in rows) and bool(rows) for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if right[i] else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(headers), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in rows)
    return "\n".join(s.rstrip() for s in out)


def _numeric(cell: str) -> bool:
    head = cell.split(" ")[0].replace(",", "").replace(".", "").replace("-", "").replace("%", "")
    return head.isdigit() or cell == "–"
