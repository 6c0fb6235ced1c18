"""report.text: byte units, times, durations, shares and aligned tables, as a terminal user reads them."""

from __future__ import annotations

import pytest

from snapanalyze.report.text import table
from snapanalyze.units import fmt_bytes, fmt_count, fmt_duration_us, fmt_share, fmt_signed_bytes, fmt_time_us

MiB = 1 << 20


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"),
    (1, "1 B"),
    (999, "999 B"),
    (1000, "0.98 KiB"),                     # never four digits before the point: the next unit up
    (1023, "1.00 KiB"),
    (1024, "1.00 KiB"),
    (1536, "1.50 KiB"),
    (1024**2, "1.00 MiB"),
    (13_923_997_700, "12.97 GiB"),
    (int(1018.85 * MiB), "0.99 GiB"),
    (int(999.996 * 1024), "0.98 MiB"),     # rounds to 1000.00 KiB, so it reads in MiB
    (999 * MiB, "999.00 MiB"),
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


def test_fmt_signed_bytes_always_has_a_unit() -> None:
    assert fmt_signed_bytes(0) == "0 B"
    assert fmt_signed_bytes(1536) == "+1.50 KiB"
    assert fmt_signed_bytes(-12 * MiB) == "-12.00 MiB"


def test_fmt_count_says_one_in_the_singular() -> None:
    assert fmt_count(1, "event") == "1 event"
    assert fmt_count(0, "event") == "0 events"
    assert fmt_count(2048, "event") == "2,048 events"
    assert fmt_count(1, "category", "categories") == "1 category"
    assert fmt_count(3, "category", "categories") == "3 categories"


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


def test_table_fits_a_width_wrapping_text_and_keeping_numbers_whole() -> None:
    rows = [["weights", "1.00 GiB", "model.py:12:forward (1.00 GiB); /srv/app/very/long/module/path.py:1234:load"],
            ["activations", "512.00 MiB", "–"]]
    plain = table(["name", "bytes", "sites"], rows)
    assert table(["name", "bytes", "sites"], rows, width=200) == plain          # it fits: the same text
    fitted = table(["name", "bytes", "sites"], rows, width=50).splitlines()
    assert max(map(len, fitted)) <= 50
    assert fitted[:2] == ["name              bytes  sites", "-----------  ----------  " + "-" * 25]
    assert fitted[2].startswith("weights        1.00 GiB  model.py:12:forward")
    assert "512.00 MiB" in fitted[-1]
    assert "".join(line[25:] for line in fitted[2:-1]).replace(" ", "") == rows[0][2].replace(" ", "")


def test_a_table_too_wide_for_its_names_and_numbers_becomes_records() -> None:
    headers = ["phase", "before", "peak", "after", "top categories"]
    rows = [["initialize_kv_cache", "8.35 GiB", "55.34 GiB", "55.34 GiB", "kv_cache 47.00 GiB"],
            ["req-0", "55.34 GiB", "55.34 GiB", "55.34 GiB", ""]]
    assert table(headers, rows, width=200) == table(headers, rows)        # it fits: a table
    records = table(headers, rows, width=40).splitlines()
    assert records == ["phase: initialize_kv_cache",
                       "  before: 8.35 GiB  peak: 55.34 GiB",
                       "  after: 55.34 GiB",
                       "  top categories: kv_cache 47.00 GiB",
                       "",
                       "phase: req-0  before: 55.34 GiB",
                       "  peak: 55.34 GiB  after: 55.34 GiB"]        # an empty cell is left out
    assert max(map(len, records)) <= 40
