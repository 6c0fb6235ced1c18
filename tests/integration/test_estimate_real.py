"""The estimate against real GPU snapshots (`tools/estimate_check.py`, `make estimate-check`): the cs336 programs of
`fixtures/real` estimated at their own shapes, with fake tensors, give their real peak active and reserved bytes
within ±5 % and `attribute`'s bytes per category at the peak within ±10 % (a miss named in KNOWN is asserted to
be still one, so that a fix is seen and the exception removed).
Needs the programs' imports (einops, einx, jaxtyping: CI installs them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
for name in ("einops", "einx", "jaxtyping"):
    pytest.importorskip(name)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import estimate_check  # noqa: E402

pytestmark = pytest.mark.slow

# Known misses, each with its cause (none now: an autocast cast of an activation is recorded under
# at::autocast::cached_cast as on CUDA, so the training step's 8 MiB casts read as the GPU file's do).
KNOWN: set[tuple[str, str]] = set()


@pytest.mark.parametrize("case", estimate_check.CASES, ids=[c[0] for c in estimate_check.CASES])
def test_the_estimate_gives_the_real_peak(case: tuple[str, int, str], tmp_path: Path) -> None:
    rows = estimate_check.check(*case, tmp_path)
    assert {r.what for r in rows} >= {"peak active", "peak reserved"}
    for r in rows:
        if (r.stem, r.what) in KNOWN:
            assert not r.ok, f"{r.stem} {r.what} is within tolerance now: drop it from KNOWN"
        else:
            assert r.ok, f"{r.stem} {r.what}: real {r.real:,} B, estimated {r.estimated:,} B ({r.error:+.1%})"
