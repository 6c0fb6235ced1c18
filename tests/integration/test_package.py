"""The package and its command line load what a task needs: the public names resolve on first use, every
command is found where `cli.COMMANDS` says, and `peaks` on a converted run never imports pandas (a fresh
interpreter: pandas costs ≈ 0.3–0.4 s of a command that otherwise takes about as long again)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

import snapanalyze
from snapanalyze import cli

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "fixtures" / "real" / "cs336-medium-ctx128-inference-t2.11.pickle"


def test_every_public_name_resolves_to_what_its_module_defines() -> None:
    for name in snapanalyze.__all__:
        assert getattr(snapanalyze, name) is not None, name
    from snapanalyze.analyze.attribute import attribute
    from snapanalyze.replay import replay
    assert snapanalyze.attribute is attribute and snapanalyze.replay is replay and callable(snapanalyze.load)
    assert set(snapanalyze.__all__) <= set(dir(snapanalyze))
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        snapanalyze.nothing_here  # noqa: B018


def test_every_command_is_registered_by_the_module_cli_names() -> None:
    result = CliRunner().invoke(cli.main, ["--help"])
    assert result.exit_code == 0
    listed = {line.split()[0] for line in result.output.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == set(cli.COMMANDS)
    assert set(cli.main.commands) == set(cli.COMMANDS)              # --help imported them all
    for name, module in cli.COMMANDS.items():
        assert cli.main.commands[name].callback.__module__ == f"snapanalyze.cli.{module}", name


def test_peaks_on_a_converted_run_never_imports_pandas(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert CliRunner().invoke(cli.main, ["convert", str(REAL), "-o", str(run)]).exit_code == 0
    script = textwrap.dedent("""
        import json, sys
        from snapanalyze.cli import main
        main([sys.argv[2], sys.argv[1], "--format", "json"], standalone_mode=False)
        print(json.dumps(sorted(m for m in ("pandas", "plotly", "jinja2") if m in sys.modules)))
    """)
    done = subprocess.run([sys.executable, "-c", script, str(run), "peaks"], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    *document, loaded = done.stdout.strip().splitlines()
    assert json.loads("\n".join(document))["devices"][0]["peak"]["active_bytes"] > 0
    assert json.loads(loaded) == []
    # Control: the same check on `attribute` (which builds DataFrames) does see pandas, so it can fail.
    done = subprocess.run([sys.executable, "-c", script, str(run), "attribute"], capture_output=True, text=True,
                          cwd=ROOT, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["pandas"]


READERS = {"open", "read_text", "read_bytes", "iterdir", "glob", "rglob"}     # what reads a file or a folder


def _reads_files(path: Path, root: Path) -> bool:
    """Whether a module imports the loader (`snapanalyze.load`, relative or absolute), calls `open` or reads
    the file system through a path's methods (`READERS`)."""
    package = ["snapanalyze", *path.relative_to(root).parent.parts]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = package[: len(package) - node.level + 1] if node.level else []
            if ".".join([*names, *([node.module] if node.module else [])]).startswith("snapanalyze.load"):
                return True
        if isinstance(node, ast.Import) and any(a.name.startswith("snapanalyze.load") for a in node.names):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in READERS:
            return True                           # Path(...).read_text(), a resource's .open(), …
    return False


def test_analyses_read_data_and_import_no_loader() -> None:
    """Paths become data in the loader and the session: `--source` is resolved where files are read
    (`load(..., source=)`) and the analyses read the map the snapshot carries; run samples and shapes are
    neutral values (`model.RunSamples`, `batch_shape`). No analysis module imports `load` or opens a file."""
    root = Path(snapanalyze.__file__).parent
    assert _reads_files(root / "session" / "inputs.py", root)  # control: the check sees a loader import
    assert _reads_files(root / "tomldata.py", root)             # and a packaged file's .read_text()
    assert [str(p.relative_to(root)) for p in sorted((root / "analyze").rglob("*.py")) if _reads_files(p, root)] == []


def test_commands_and_reports_take_paths_only_through_the_session() -> None:
    """The commands and the report builders name paths; only `session` turns them into data (one place that
    chooses a run's snapshot and reads its markers, the program's source and an engine's log), so no module
    of `cli/` or `report/` imports the loader or opens a file itself."""
    root = Path(snapanalyze.__file__).parent
    modules = sorted([*(root / "cli").rglob("*.py"), *(root / "report").rglob("*.py")])
    assert len(modules) > 20
    assert [str(p.relative_to(root)) for p in modules if _reads_files(p, root)] == []


def _imports(root: Path) -> dict[str, set[str]]:
    """Each module of the package and the package's modules it imports (at module level or inside a function),
    leaving out a module's own packages (importing a submodule runs them) and a package's own children (its
    re-exports)."""
    def name(p: Path) -> str:
        parts = ["snapanalyze", *p.relative_to(root).with_suffix("").parts]
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    modules = {name(p): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                target = ".".join([*base, *([node.module] if node.module else [])])
                found.update(t for t in (target, *(f"{target}.{a.name}" for a in node.names)) if t in modules)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
        graph[mod] = {t for t in found - {mod} if not mod.startswith(t + ".") and not t.startswith(mod + ".")}
    return graph


def _reaches(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for t in graph[todo.pop()] - seen:
            seen.add(t)
            todo.append(t)
    return seen


def test_the_allocator_model_sits_below_the_collector_and_the_analyses() -> None:
    """The caching-allocator model is a package of its own that the collector (CPU capture) and the analyses
    (replay, what-if, explain-oom) both use: it imports nothing of theirs, and the analyses that drive it
    (oom → trace_replay → segment_map) import each other in one direction only."""
    graph = _imports(Path(snapanalyze.__file__).parent)
    allocator = {m for m in graph if m.startswith("snapanalyze.allocator")}
    assert {"snapanalyze.allocator.settings", "snapanalyze.allocator.state"} <= allocator
    for m in allocator:
        assert {t for t in graph[m] if not t.startswith("snapanalyze.allocator")} <= {"snapanalyze.errors"}, m
    for m in ("snapanalyze.analyze.oom", "snapanalyze.analyze.trace_replay", "snapanalyze.analyze.segment_map",
              "snapanalyze.analyze.whatif"):
        assert m not in _reaches(graph, m), f"{m} imports itself through other modules"
    assert "snapanalyze.allocator.state" in _reaches(graph, "snapanalyze.analyze.oom")
