"""report.text: byte units, times, durations, shares and aligned tables, as a terminal user reads them."""

from __future__ import annotations

import pytest

from snapanalyze.report.text import table
from snapanalyze.units import fmt_bytes, fmt_duration_us, fmt_share, fmt_time_us


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"),
    (1, "1 B"),
    (1023, "1023 B"),
    (1024, "1.00 KiB"),
    (1536, "1.50 KiB"),
    (1024**2, "1.00 MiB"),
    (13_923_997_700, "12.97 GiB"),
    (3 * 1024**4, "3.00 TiB"),
    (5 * 1024**5, "5.00 PiB"),
    (2048 * 1024**5, "2048.00 PiB"),  # no unit past PiB
    (-1536, "-1.50 KiB"),
    (-5, "-5 B"),
    (2**60 + 1, "1024.00 PiB"),
    (1.5, "1 B"),
])
def test_fmt_bytes(n: int, text: str) -> None:
    assert fmt_bytes(n) == text


def test_fmt_bytes_none() -> None:
    assert fmt_bytes(None) == "–"


def test_fmt_time_us_is_utc_with_microseconds() -> None:
    assert fmt_time_us(0) == "1970-01-01 00:00:00.000000 UTC"
    assert fmt_time_us(1_776_479_641_223_438) == "2026-04-18 02:34:01.223438 UTC"
    assert fmt_time_us(None) == "–"


@pytest.mark.parametrize(("d", "text"), [
    (0, "0 µs"), (999, "999 µs"), (1000, "1.00 ms"), (248_181, "248.18 ms"),
    (1_000_000, "1.000 s"), (61_500_000, "61.500 s"), (None, "–"),
])
def test_fmt_duration_us(d: int | None, text: str) -> None:
    assert fmt_duration_us(d) == text


def test_fmt_share() -> None:
    assert fmt_share(0.0) == "0.0%"
    assert fmt_share(0.1234) == "12.3%"
    assert fmt_share(1.0) == "100.0%"


def test_table_aligns_columns_and_right_aligns_numbers() -> None:
    out = table(["name", "bytes", "share"],
                [["weights", "1.00 GiB", "50.0%"], ["activations", "512.00 MiB", "5.0%"]])
    lines = out.splitlines()
    assert lines == [
        "name              bytes  share",
        "-----------  ----------  -----",
        "weights        1.00 GiB  50.0%",
        "activations  512.00 MiB   5.0%",
    ]
    # Every line is as wide as the header's columns allow (no trailing spaces).
    assert all(line == line.rstrip() for line in lines)


def test_table_explicit_alignment_and_dash_cells() -> None:
    out = table(["a", "b"], [["1", "x"], ["22", "–"]], right=[False, True])
    assert out.splitlines() == ["a   b", "--  -", "1   x", "22  –"]


def test_table_numeric_detection() -> None:
    out = table(["n", "t"], [["1,234", "abc"], ["5", "–"]])
    assert out.splitlines()[2:] == ["1,234  abc", "    5  –"]


def test_table_without_rows() -> None:
    assert table(["peak", "event"], []).splitlines() == ["peak  event", "----  -----"]
