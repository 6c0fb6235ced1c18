"""Plain-text rendering for terminals: aligned tables (the unit formatters are `units`').

Contract: `table` renders rows of already-formatted cells with right-aligned numeric columns. Nothing here
prints.
"""

from __future__ import annotations

from collections.abc import Sequence


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
