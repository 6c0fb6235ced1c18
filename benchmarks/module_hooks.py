#!/usr/bin/env python3
"""What `collect.modules` costs a forward pass: CPU torch, a Llama-shaped model, hooks off / on outside a
recording / on inside one, as ratios measured in one run (the median of --repeat rounds, interleaved).

Usage: python benchmarks/module_hooks.py [--layers 12] [--d 256] [--tokens 256] [--repeat 7]
Needs torch (the collect extra). Prints µs per forward and per module call; the GPU's forward is faster than
this CPU one, so the same absolute µs are a larger share there: read the per-call cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import torch  # noqa: E402
from tinylm import TinyLM  # noqa: E402

from snapanalyze.collect import markers, modules  # noqa: E402
from snapanalyze.collect.markers import MarkerLog  # noqa: E402


def _time(model: torch.nn.Module, ids: torch.Tensor, n: int) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(n):
            model(ids)
        return (time.perf_counter() - start) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--forwards", type=int, default=10)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = TinyLM(vocab=1024, d=a.d, layers=a.layers).eval()
    ids = torch.randint(0, 1024, (1, a.tokens))
    calls = len(list(model.named_modules())) - 1             # every module but the ModuleList runs once
    results: dict[str, list[float]] = {"no hooks": [], "hooks, no recording": [], "hooks, recording": []}
    _time(model, ids, 2)                                      # warm-up
    for _ in range(a.repeat):
        results["no hooks"].append(_time(model, ids, a.forwards))
        with modules(model):
            results["hooks, no recording"].append(_time(model, ids, a.forwards))
            log = MarkerLog(rank=0)
            markers.set_active(log)
            try:
                results["hooks, recording"].append(_time(model, ids, a.forwards))
            finally:
                markers.set_active(None)
    base = statistics.median(results["no hooks"])
    print(f"TinyLM {a.layers} layers, d={a.d}, {a.tokens} tokens, CPU, 1 thread: {calls} module calls per forward")
    for name, values in results.items():
        t = statistics.median(values)
        extra = (t - base) * 1e6
        print(f"  {name:20s} {t * 1e3:8.2f} ms/forward  {t / base:5.3f}×  +{extra:7.0f} µs  "
              f"({extra / calls:5.2f} µs per module call)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
