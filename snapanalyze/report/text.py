"""Plain-text rendering for terminals: aligned tables (the unit formatters are `units`').

Contract: `table` renders rows of already-formatted cells with right-aligned numeric columns. Given a
`width` (the terminal's columns) a table wider than that is laid out again to fit it: text columns wrap
(a path with no spaces folds), numbers stay whole on one line; one whose columns cannot fit even so is
printed as records, a row's `header: value` pairs to a paragraph, never a name or number folded; a table
that fits, or one rendered without a width (piped output), comes out the same either way. `wrap` folds the
other lines of a text (sentences, notes) that are longer than the width at spaces, continuing indented.
`inferred_share` and INFERRED_LEGEND are how every table flags inferred bytes. `visible(text)` is text as a
terminal must show it when it may hold a stranger's characters (frame and file names, metadata): every
control character but newline and tab (ESC/CSI/OSC sequences, BEL, backspace, carriage return, C1, NUL),
bidi overrides and isolates, and zero-width characters become visible escapes (``\x1b``, ``\u202e``), so
nothing can move the cursor, clear the screen, write the clipboard or reorder what is read. `csv_cell`
makes a CSV cell safe to open in a spreadsheet: text that begins like a formula (= + - @, tab, CR) gets a
leading apostrophe. Nothing here prints.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence

from ..units import fmt_bytes

# Characters a terminal acts on or hides: C0 controls but \t and \n, DEL and C1, bidi embeddings, overrides
# and isolates, zero-width spaces and joiners, the word joiner and the byte-order mark.
# Unicode's control (Cc), format (Cf: bidi overrides and isolates, U+061C, zero-width and tag characters), line (Zl)
# and paragraph (Zp) separators, as of Unicode 15; newline and tab are text's own.
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e"
                     "\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
                     "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]")
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def visible(text: str) -> str:
    """`text` with every character a terminal would act on or hide written as a visible escape."""
    return _HIDDEN.sub(_escape, text)


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


def one_line(text: str) -> str:
    """`visible(text)` with its newlines and tabs escaped too: an error or a warning is one line, whatever a file
    name holds (a name with a newline cannot forge a second "snapanalyze: error:" line)."""
    return visible(text).replace("\n", "\\n").replace("\t", "\\t")


def csv_cell(value: object) -> object:
    """A text cell that a spreadsheet would read as a formula, made inert with a leading apostrophe; its
    carriage returns and other hidden characters made visible. Numbers and other values pass unchanged."""
    if not isinstance(value, str):
        return value
    value = visible(value.replace("\r", "\\r"))
    return "'" + value if value.startswith(_FORMULA) else value


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None,
          width: int | None = None) -> str:
    """Aligned columns; `right[i]` right-aligns column i (defaults: right-align cells that look numeric);
    `width`: fit the table into that many columns (see the module docstring)."""
    if right is None:
        right = [all(_numeric(r[i]) for r in rows) and bool(rows) for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    if width is not None and sum(widths) + 2 * (len(widths) - 1) > width:
        return _fitted(headers, rows, right, width)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if right[i] else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(headers), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in rows)
    return "\n".join(s.rstrip() for s in out)


MIN_TEXT_WIDTH = 20        # a text column shrinks to its longest word up to this (a longer word, a path, folds)
_KEEP = "\x00"             # stands for a space textwrap must not break at


def _fitted(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool], width: int) -> str:
    """The same table within `width` columns. Columns shrink, the widest first, in two stages: text columns
    down to their longest word (at most MIN_TEXT_WIDTH: a longer word, such as a path, folds), wrapping at
    spaces; then numeric columns' headers wrap at their spaces, their cells staying whole. A table that still
    does not fit is printed as records (`_records`) rather than fold names and numbers within a word.
    (Wrapped with `textwrap`, cell by cell: rich's tables take ~2 ms a row, too slow for the thousands of
    requests a serving run's phases list.)"""
    def longest_word(cells: Sequence[str]) -> int:
        return max((len(w) for c in cells for w in c.split()), default=0)

    n = len(headers)
    natural = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    cells = [[r[i] for r in rows] for i in range(n)]
    words = [min(natural[i], max(longest_word([headers[i]]), min(longest_word(cells[i]), MIN_TEXT_WIDTH), 1))
             for i in range(n)]
    whole = [max([longest_word([headers[i]])] + [len(c) for c in cells[i]]) for i in range(n)]
    widths = list(natural)
    excess = sum(widths) + 2 * (n - 1) - width
    for numeric, bound in ((False, words), (True, whole)):
        while excess > 0:
            shrinkable = [i for i in range(n) if right[i] == numeric and widths[i] > bound[i]]
            if not shrinkable:
                break
            widths[max(shrinkable, key=lambda k: widths[k])] -= 1
            excess -= 1
    if excess > 0:
        return _records(headers, rows, width)

    def wrapped(cell: str, w: int) -> list[str]:
        if len(cell) <= w:
            return [cell]
        return textwrap.wrap(cell, w, break_long_words=True, break_on_hyphens=False) or [""]

    def lines(row: Sequence[str], top: bool) -> list[str]:
        parts = [wrapped(c, w) for c, w in zip(row, widths)]
        height = max(len(p) for p in parts)
        parts = [([""] * (height - len(p)) + p) if not top else p + [""] * (height - len(p)) for p in parts]
        return ["  ".join(p[k].rjust(w) if right[i] else p[k].ljust(w)
                          for i, (p, w) in enumerate(zip(parts, widths))).rstrip() for k in range(height)]

    out = lines(headers, top=False)                      # a wrapped header sits on its rule
    out.append("  ".join("-" * w for w in widths))
    for row in rows:
        out.extend(lines(row, top=True))
    return "\n".join(out)


def _records(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> str:
    """Each row as a record: its `header: value` pairs (empty cells left out) packed into lines of `width`,
    a pair never split across lines unless it alone is wider, continuing indented two; a blank line between
    rows. What a table becomes when its columns cannot fit without folding names and numbers."""
    out: list[str] = []
    for row in rows:
        pairs = [f"{h}: {c}" if h else c for h, c in zip(headers, row) if c]
        kept = [p.replace(" ", _KEEP) if len(p) <= width - 2 else p for p in pairs]
        text = textwrap.wrap("  ".join(kept), width, subsequent_indent="  ", break_long_words=False,
                             break_on_hyphens=False) or [""]
        out.extend(line.replace(_KEEP, " ") for line in text)
        out.append("")
    return "\n".join(out[:-1])


ESTIMATED = "an estimate: fake tensors on a CPU, not a GPU measurement"
INFERRED_LEGEND = ("inferred = bytes decided by sizes, lifetimes, layout, time, the call tree or a name rather "
                   "than proven by a frame, pool or metadata")


def inferred_share(inferred: int, total: int) -> str:
    """How much of `total` bytes was inferred, as a cell: "" for none, "all", else the inferred bytes."""
    if not inferred:
        return ""
    return "all" if inferred >= total else fmt_bytes(inferred)


def _numeric(cell: str) -> bool:
    head = cell.split(" ")[0].replace(",", "").replace(".", "").replace("-", "").replace("%", "")
    return head.isdigit() or cell == "–"


def wrap(text: str, width: int | None) -> str:
    """`text` with each line longer than `width` wrapped at spaces (a word longer than the width stays whole),
    its continuation indented two past the line's own indent; the text itself when `width` is None."""
    if width is None:
        return text
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * min(len(line) - len(line.lstrip(" ")) + 2, width // 2)
        out.extend(textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False,
                                 break_on_hyphens=False) or [line])
    return "\n".join(out)


def bound_label() -> str:
    """How an answer capped at the largest shape a fit may speak for is labelled, in every output: "bound: 2×
    measured" (`analyze.capacity.EXTRAPOLATION_LIMIT`; imported here only when a capacity answer is shown)."""
    from ..analyze.capacity import EXTRAPOLATION_LIMIT
    return f"bound: {EXTRAPOLATION_LIMIT:g}× measured"
