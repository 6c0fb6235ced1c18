"""`make estimate-check`: the estimate against reality. Each cs336 program of `fixtures/real` (the 'medium' model:
24 layers of d 1024, 16 heads, d_ff 4096, vocabulary 10,000, batch 4) is estimated at the shapes its GPU run used —
its own model code from the file's source folder, driven as its `cs336_systems/nsys_profile.py --memory-profile
true` drove it (five warm-up steps, then the recorded one; ctx 512 and the training step under bf16 autocast,
as their runs used `--autocast true`), with fake tensors — and compared with the real
snapshot: peak active and peak reserved (each within ±5 %), and each category's bytes at the global peak as
`attribute` reads both files (within ±10 %, for categories holding ≥ 1 % of the peak).

The driver is restated here, not run from the file: `nsys_profile.py` uses Python 3.12's f-string quoting, which
this machine's 3.11 cannot compile. Needs torch and the program's imports (einops, einx, jaxtyping).
"""

from __future__ import annotations

import pickle
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "fixtures" / "real"
CASES = (("cs336-medium-ctx128-inference-t2.11", 128, "forward-only"),
         ("cs336-medium-ctx256-inference-t2.11", 256, "forward-only"),
         ("cs336-medium-ctx512-inference-t2.11", 512, "forward-only"),
         ("cs336-medium-ctx1024-inference-t2.11", 1024, "forward-only"),
         ("cs336-medium-ctx1024-training-t2.11", 1024, "full-training-step"))
# How each was run (labels/truth.json's notes, from the repository's commit): ctx 512 and the training step with
# --autocast true.
AUTOCAST = {"cs336-medium-ctx512-inference-t2.11": True, "cs336-medium-ctx1024-training-t2.11": True}
PEAK_TOLERANCE, CATEGORY_TOLERANCE, CATEGORY_FLOOR = 0.05, 0.10, 0.01


@dataclass(frozen=True)
class Row:
    stem: str
    what: str               # "peak active", "peak reserved" or a category
    real: int
    estimated: int
    tolerance: float

    @property
    def error(self) -> float:
        return (self.estimated - self.real) / self.real if self.real else float(self.estimated != 0)

    @property
    def ok(self) -> bool:
        return abs(self.error) <= self.tolerance


def program(stem: str, context: int, pattern: str) -> Any:
    """The recorded part of `memory_profile` in the program's nsys_profile.py, with its own model code."""
    source = REAL / "source" / stem / "assignment2-systems" / "cs336-basics"
    autocast = AUTOCAST.get(stem, False)

    def main() -> None:
        import torch
        sys.path.insert(0, str(source))
        try:
            for name in [m for m in sys.modules if m.startswith("cs336_basics")]:
                del sys.modules[name]
            from cs336_basics.model import BasicsTransformerLM
            if pattern != "forward-only":          # the inference folders hold only the files their frames name
                from cs336_basics.nn_utils import cross_entropy
                from cs336_basics.optimizer import AdamW
        finally:
            sys.path.remove(str(source))
        device = torch.device("cuda")
        model = BasicsTransformerLM(vocab_size=10000, context_length=context, d_model=1024, num_layers=24,
                                    num_heads=16, d_ff=4096)
        model.to(device)
        warmup_steps, batch_size = 5, 4
        shape = (warmup_steps, batch_size, context)
        warmup_inputs = torch.randint(0, 10000, shape, dtype=torch.long, device=device)
        execution_inputs = torch.randint(0, 10000, (1, batch_size, context), dtype=torch.long, device=device)
        if pattern == "forward-only":
            model.eval()
            with torch.inference_mode():
                for i in range(warmup_steps):
                    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
                        model(warmup_inputs[i])
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                torch.cuda.memory._record_memory_history(max_entries=1000000)
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
                    model(execution_inputs[0])
            torch.cuda.memory._dump_snapshot("inference_memory_snapshot.pickle")
            return
        warmup_targets = torch.randint(0, 10000, shape, dtype=torch.long, device=device)
        execution_targets = torch.randint(0, 10000, (1, batch_size, context), dtype=torch.long, device=device)
        optimizer = AdamW(model.parameters())
        model.train()
        for i in range(warmup_steps):
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
                output = model(warmup_inputs[i])
                loss = cross_entropy(output, warmup_targets[i])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        del output, loss
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=1000000)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=autocast):
            output = model(execution_inputs[0])
            loss = cross_entropy(output, execution_targets[0])
        loss.backward()
        optimizer.step()
        torch.cuda.memory._dump_snapshot("training_memory_snapshot.pickle")
    return main


def measure(path: Path) -> tuple[int, int, dict[str, int]]:
    """Peak active and reserved bytes over the file (replay) and `attribute`'s category bytes at its global peak."""
    import snapanalyze as sa
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        snapshot = sa.load(path)
    result = sa.attribute(snapshot)
    timeline = result.timeline
    device = min(result.instants)
    instant = result.instants[device]
    curve = timeline.devices[device]
    reserved = max(curve.baseline_reserved, int(curve.reserved.max()) if len(curve.reserved) else 0)
    categories = {c.category: int(c.bytes) for c in result.shares(device, 1)}
    return int(instant.active_bytes), reserved, categories


def check(stem: str, context: int, pattern: str, folder: Path) -> list[Row]:
    from snapanalyze.collect import estimate
    made = estimate.run(program(stem, context, pattern), torch_version="2.11")
    path = folder / f"{stem}.estimate.pickle"
    path.write_bytes(pickle.dumps(made.snapshot, protocol=4))
    real = measure(REAL / f"{stem}.pickle")
    ours = measure(path)
    rows = [Row(stem, "peak active", real[0], ours[0], PEAK_TOLERANCE),
            Row(stem, "peak reserved", real[1], ours[1], PEAK_TOLERANCE)]
    for name in sorted(set(real[2]) | set(ours[2]), key=lambda n: -max(real[2].get(n, 0), ours[2].get(n, 0))):
        if max(real[2].get(name, 0), ours[2].get(name, 0)) >= CATEGORY_FLOOR * real[0]:
            rows.append(Row(stem, name, real[2].get(name, 0), ours[2].get(name, 0), CATEGORY_TOLERANCE))
    return rows


def table(rows: list[Row]) -> str:
    from snapanalyze.units import fmt_bytes
    out = ["| file | what | real | estimated | error | within |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.stem} | {r.what} | {fmt_bytes(r.real)} | {fmt_bytes(r.estimated)} | {r.error:+.1%} | "
                   f"{'yes' if r.ok else 'NO'} (±{r.tolerance:.0%}) |")
    return "\n".join(out)


def main() -> int:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            rows += check(*case, Path(tmp))
    print(table(rows))
    bad = [r for r in rows if not r.ok]
    print(f"\n{len(rows) - len(bad)} of {len(rows)} within tolerance")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
