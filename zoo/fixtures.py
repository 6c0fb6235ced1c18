"""The zoo's fast subset for CI: one captured program per family, its truth and its grades, checked in.

Contract: ``python -m zoo.fixtures [--from build/zoo] [--to fixtures/zoo]`` copies `SUBSET`'s captures (the
snapshot and its labels, from a full ``make zoo`` run) into the fixtures folder in the labelled-set layout
(``STEM.pickle``, ``labels/blocks-STEM.csv``, ``labels/truth.json``) and writes ``grades.json``: each program's
grades without its source (`zoo.grade`) as they stand. ``tests/integration/test_zoo_subset.py`` grades the
checked-in captures again and fails where a grade falls (a regression) — it needs neither torch nor the model
libraries. Rerun this after a rule change that moves the grades, and say why in the commit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from zoo import FAMILIES
from zoo.grade import grade_stem

# One program per family: the smallest capture that still shows what the family is about.
SUBSET = {
    "hf_decoder": "llama_train", "hf_encoder": "bert_classify_eval", "hf_multimodal": "clip_train",
    "hf_speech": "whisper_train", "timm": "resnet_eval", "diffusers": "vae_decode", "torchvision": "vit_eval",
    "pyg": "gcn_train", "lightning": "lm_closure", "peft": "lora_gpt2_train", "checkpoint": "sequential",
    "amp": "autocast_scaler_train", "optim": "sgd_momentum", "handwritten": "mlp_train",
    "vocab": "prompt_logprobs", "sdpa_math": "math_train", "hf_ssm": "mamba2_generate", "hf_vision": "swin_train",
    "hf_seq2seq": "bart_train", "hf_audio": "hubert_classify_eval", "tv_detection": "retinanet_eval",
}
ROOT = Path(__file__).resolve().parent.parent


def stems() -> list[str]:
    return [f"{family}-{SUBSET[family]}" for family in FAMILIES]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zoo.fixtures")
    ap.add_argument("--from", dest="source", type=Path, default=ROOT / "build" / "zoo")
    ap.add_argument("--to", type=Path, default=ROOT / "fixtures" / "zoo")
    a = ap.parse_args(argv)
    missing = sorted(set(FAMILIES) - set(SUBSET))
    if missing:
        print(f"no subset program for {', '.join(missing)}", file=sys.stderr)
        return 1
    truth = json.loads((a.source / "labels" / "truth.json").read_text())
    (a.to / "labels").mkdir(parents=True, exist_ok=True)
    kept = {}
    for stem in stems():
        if stem not in truth:
            print(f"{stem}: not in {a.source} (run `make zoo` first)", file=sys.stderr)
            return 1
        shutil.copy(a.source / f"{stem}.pickle", a.to / f"{stem}.pickle")
        shutil.copy(a.source / "labels" / f"blocks-{stem}.csv", a.to / "labels" / f"blocks-{stem}.csv")
        kept[stem] = truth[stem]
    (a.to / "labels" / "truth.json").write_text(json.dumps(kept, indent=1) + "\n")
    out = {}
    for stem in stems():
        g = grade_stem(a.to, stem, source=False)
        out[stem] = {"lifecycle": round(g.lifecycle, 4), "category": round(g.category, 4),
                     "wrong": round(g.wrong, 4), "unflagged": round(g.unflagged, 4)}
    (a.to / "grades.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(out)} programs into {a.to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
