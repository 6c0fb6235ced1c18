"""The estimate against real GPU snapshots (`tools/estimate_check.py`, `make estimate-check`): the cs336 programs of
`fixtures/real` estimated at their own shapes, with fake tensors, give their real peak active and reserved bytes
within ±5 % and `attribute`'s bytes per category at the peak within ±10 %, except where this test names the
known miss (each named one is asserted to be still a miss, so that a fix is seen and the exception removed).
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

# Known misses, each with its cause (the closing note of issue 47 lists them):
KNOWN = {
    # attribute reads 0.54 GiB of 8 MiB bf16 autocast casts as copies of the same-sized w1/w3 weights in the estimate
    # and as the SwiGLU's input (MLP activations) in the real file: the same bytes (the peak is exact), another
    # category; the C++ frames the capture writes for an autocast cast are not yet the GPU's.
    ("cs336-medium-ctx1024-training-t2.11", "weights"),
    ("cs336-medium-ctx1024-training-t2.11", "mlp"),
}


@pytest.mark.parametrize("case", estimate_check.CASES, ids=[c[0] for c in estimate_check.CASES])
def test_the_estimate_gives_the_real_peak(case: tuple[str, int, str], tmp_path: Path) -> None:
    rows = estimate_check.check(*case, tmp_path)
    assert {r.what for r in rows} >= {"peak active", "peak reserved"}
    for r in rows:
        if (r.stem, r.what) in KNOWN:
            assert not r.ok, f"{r.stem} {r.what} is within tolerance now: drop it from KNOWN"
        else:
            assert r.ok, f"{r.stem} {r.what}: real {r.real:,} B, estimated {r.estimated:,} B ({r.error:+.1%})"
