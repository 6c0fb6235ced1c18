"""The analysis path never imports torch: load + replay + find_peaks + summarize (and the CLI commands) on
a real fixture, in a fresh interpreter where an importable `torch` is planted so that any import shows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REAL_FILES

FILE = next(p for p in REAL_FILES if p.name == "cs336-medium-ctx128-inference-t2.11.pickle")

SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    # Control: `import torch` would succeed here (the planted package), so the check below can fail.
    assert importlib.util.find_spec("torch") is not None

    import snapanalyze
    from snapanalyze import load
    from snapanalyze.analyze.peaks import find_peaks
    from snapanalyze.analyze.summary import summarize
    from snapanalyze.replay import replay

    path = sys.argv[1]
    snap = load(path)
    timeline = replay(snap)
    assert timeline.check_invariants() == []
    peaks = find_peaks(timeline)
    facts = summarize(snap)
    assert len(peaks) >= 1 and facts.devices[0].events > 0
    snap.events  # interns every stack

    from snapanalyze.cli import main
    for args in (["peaks", path], ["peaks", "--format", "json", path], ["summary", path]):
        main(args, standalone_mode=False)

    print(json.dumps(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))))
""")


def test_analysis_never_imports_torch(tmp_path: Path) -> None:
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import sys\nsys.stderr.write('planted torch was imported\\n')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "site")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(FILE)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
    assert "planted torch was imported" not in proc.stderr


def test_the_planted_torch_would_be_seen(tmp_path: Path) -> None:
    """Control for the test above: importing torch in that environment is detected."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    code = "import sys, torch; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.stdout.strip() == "True"
