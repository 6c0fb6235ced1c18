"""--env-source: an installed package's frames read at their package-relative path in this Python's
site-packages (found by path, nothing imported), only when asked, after the --source roots, and checked
against the run like any other copy; without it, a note names the installed file whose unread source
leaves live bytes undecided."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

from click.testing import CliRunner
from conftest import BASE, SnapshotBuilder, write_pickle

from snapanalyze import load
from snapanalyze.analyze.attribute import attribute
from snapanalyze.cli import main
from snapanalyze.load.source import SourceIndex

MiB = 1 << 20
# A module of a package installed here (a dependency) that nothing in snapanalyze or the tests imports.
PACKAGE, MODULE, CLASS, FUNCTION = "jinja2", "nativetypes", "NativeTemplate", "render"
ELSEWHERE = f"/opt/conda/lib/python3.11/site-packages/{PACKAGE}/{MODULE}.py"   # where the run had it


def _installed_line() -> int:
    """A line inside CLASS.FUNCTION of the installed copy, read with ast (not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.submodule_search_locations
    path = Path(spec.submodule_search_locations[0]) / f"{MODULE}.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == CLASS:
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == FUNCTION:
                    return fn.body[-1].lineno
    raise AssertionError("the installed module has no such method")


def _snapshot(tmp_path: Path) -> Path:
    frames = [{"filename": "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125,
               "name": "forward"},
              {"filename": ELSEWHERE, "line": _installed_line(), "name": FUNCTION},
              {"filename": "/app/serve.py", "line": 9, "name": "main"}]
    b = SnapshotBuilder()
    b.segment(BASE, [(8 * MiB, 8 * MiB, "active_allocated")])
    b.alloc(BASE, 8 * MiB, frames=frames)
    return write_pickle(tmp_path / "installed.pickle", b.build())


def test_an_installed_frame_resolves_from_this_environment_only_when_asked_and_nothing_is_imported():
    line = _installed_line()
    before = f"{PACKAGE}.{MODULE}" in sys.modules
    found = SourceIndex.of(None, environment=True).resolve(ELSEWHERE, line, FUNCTION)
    assert found is not None and found.qualname == f"{CLASS}.{FUNCTION}" and not found.drifted
    assert found.path.endswith(f"site-packages/{PACKAGE}/{MODULE}.py") and found.path != ELSEWHERE
    assert (f"{PACKAGE}.{MODULE}" in sys.modules) == before          # read as text, never imported
    assert SourceIndex.of(None) is None                               # neither roots nor the environment


def test_the_source_roots_come_before_the_environment(tmp_path):
    copy = tmp_path / "site" / PACKAGE
    copy.mkdir(parents=True)
    (copy / f"{MODULE}.py").write_text("class Mine:\n" + "    pass\n" * 200 + f"    def {FUNCTION}(self):\n"
                                       + "        return 1\n" * 200)
    line = _installed_line()
    index = SourceIndex.of(tmp_path / "site", environment=True)
    assert index is not None
    got = index.resolve(ELSEWHERE, line, FUNCTION)
    assert got is not None and got.path == str(copy / f"{MODULE}.py")      # the user's copy, not this Python's
    assert index.resolve("/opt/conda/lib/python3.11/site-packages/click/core.py", 1, "<module>") is not None


def test_the_snapshot_carries_what_the_environment_says_and_attribution_reads_it(tmp_path):
    path = _snapshot(tmp_path)
    read = attribute(load(path, source=SourceIndex.of(None, environment=True)))
    frame = read.blocks["frame"].iloc[0]
    assert frame.endswith(f"{MODULE}.py:{_installed_line()}:{CLASS}.{FUNCTION}"), frame
    assert not any("source is not read" in n for n in read.notes)
    blind = attribute(load(path))
    assert blind.blocks["frame"].iloc[0].endswith(f":{FUNCTION}")
    note = next(n for n in blind.notes if "source is not read" in n)
    assert note == (f"device 0: 100% of live bytes, made in {PACKAGE}/{MODULE}.py, are other or inferred, and its "
                    f"source is not read here; --env-source reads it from this environment when it has the "
                    f"{PACKAGE} that ran, or pass that site-packages with --source")


def test_env_source_on_the_command_line(tmp_path):
    path = _snapshot(tmp_path)
    runner = CliRunner()
    with_env = runner.invoke(main, ["attribute", str(path), "--env-source", "--format", "json"])
    assert with_env.exit_code == 0, with_env.output
    doc = json.loads(with_env.stdout)
    sites = [s for c in doc["devices"][0]["categories"] for s in c["top_frames"]]
    assert any(s.endswith(f"{CLASS}.{FUNCTION}") for s in sites), sites
    without = runner.invoke(main, ["attribute", str(path)])
    assert without.exit_code == 0 and "--env-source reads it" in " ".join(without.stdout.split())
