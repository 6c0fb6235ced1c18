"""The zoo's fast subset (``fixtures/zoo``, written by ``python -m zoo.fixtures`` from a full ``make zoo``): one
program per family, captured on the CPU with the truth of every block. `attribute` is graded against that truth
block by block, and no program's grades may fall below those checked in beside it (``grades.json``): lifecycle
and category agreement, and the share of the peak named wrongly without the `inferred` flag. Neither torch nor
the model libraries are needed: the captures and their truth are files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "zoo"
sys.path.insert(0, str(ROOT))

from zoo import FAMILIES  # noqa: E402
from zoo.fixtures import SUBSET, stems  # noqa: E402
from zoo.grade import grade_stem  # noqa: E402

EXPECTED = json.loads((FIXTURES / "grades.json").read_text())
SLACK = 0.005          # rounding of the checked-in grades


def test_every_family_has_its_program_checked_in() -> None:
    assert set(SUBSET) == set(FAMILIES)
    assert sorted(EXPECTED) == sorted(stems())
    for stem in stems():
        assert (FIXTURES / f"{stem}.pickle").is_file() and (FIXTURES / "labels" / f"blocks-{stem}.csv").is_file()


@pytest.mark.parametrize("stem", stems())
def test_no_grade_falls(stem: str) -> None:
    g, want = grade_stem(FIXTURES, stem, source=False), EXPECTED[stem]
    assert g.lifecycle >= want["lifecycle"] - SLACK, (stem, "lifecycle", g.lifecycle, want)
    assert g.category >= want["category"] - SLACK, (stem, "category", g.category, want)
    assert g.unflagged <= want["unflagged"] + SLACK, (stem, "not flagged", g.unflagged, want)
    assert g.unflagged <= g.wrong + 1e-9 and g.total > 0
