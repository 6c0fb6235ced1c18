"""Everything the README shows runs: its rules-file example loads, every `snapanalyze …` command it names runs
on the shipped fixtures (each placeholder filled with one, each `a|b` alternative and each [optional] part
tried), and every name it imports from the package exists."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from snapanalyze import load_rules
from snapanalyze.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
FIXTURES = ROOT / "fixtures"
SWEEP = sorted(str(p) for p in (FIXTURES / "sweeps" / "attention_threshold").glob("*.pickle"))
STEM = "cs336-medium-ctx128-inference-t2.11"


def _toml() -> str:
    blocks = re.findall(r"```toml\n(.*?)```", README, re.S)
    assert len(blocks) == 1
    return blocks[0]


def test_the_rules_file_example_loads_and_names_real_rules(tmp_path: Path) -> None:
    (tmp_path / "mine.toml").write_text(_toml())
    rules = load_rules(tmp_path / "mine.toml")
    shipped = {r.name for r in load_rules().rules}
    disabled = re.search(r"^disable = \[(.*?)\]", _toml(), re.M)
    assert disabled is not None
    named = re.findall(r'"([^"]+)"', disabled.group(1))
    assert named and set(named) <= shipped and not set(named) & {r.name for r in rules.rules}
    assert {"mine.rope", "mine.router"} <= {r.name for r in rules.rules} and "rope_cache" in rules.categories


def _commands() -> list[str]:
    return sorted({" ".join(m.split()) for m in re.findall(r"`(snapanalyze [^`]*)`", README)} |
                  {line.split("&& ", 1)[1] for line in re.findall(r"```bash\n(.*?)```", README, re.S)[0].splitlines()
                   if "&& snapanalyze " in line})


def _fill(tokens: list[str], tmp: Path) -> list[str]:
    """Placeholders → fixtures; `a|b` → a; `…` (more of the same) dropped."""
    marked = FIXTURES / "sweeps" / "phase_markers" / "run" / "rank=0" / "snapshot-final.pickle"   # has prefills
    subject = {"FILE": str(marked), "RUN": str(FIXTURES / "runs" / "tp2_vision_encoder"), "BASELINE": str(marked),
               "DIR": str(FIXTURES / "real" / "source" / STEM), "mine.toml": str(tmp / "mine.toml"),
               "report.html": str(tmp / "report.html"), "D": "0", "K": "2", "N": "1", "SPEC": "peak",
               "NAME": "score", "manifest.csv": "filename",                      # NAME: diff's, of A and B
               "LOG": str(FIXTURES / "sweeps" / "vllm_budget" / "vllm.log"), "est.pickle": str(tmp / "est.pickle"),
               "train.py": str(ROOT / "examples" / "train_gpt.py"), "KEY:VALUE": "expandable_segments:True"}
    out: list[str] = []
    for token in tokens:
        if token.startswith("FILES"):
            out.extend(SWEEP)
            continue
        if token in ("…", "...") or token.endswith("…"):
            continue
        if token == "ARGS":                                               # the example program, small
            out.extend(["--batch", "2", "--tokens", "64", "--layers", "1", "--d-model", "64", "--heads", "2",
                        "--vocab", "128"])
            continue
        if token == "A":
            out.append(str(FIXTURES / "sweeps" / "logits_float_fix" / "before.pickle"))
        elif token == "B":
            out.append(str(FIXTURES / "sweeps" / "logits_float_fix" / "after.pickle"))
        else:
            first = token.split("|")[0] if "|" in token and not token.startswith("-") else token
            out.append(subject.get(first, first))
    return out


def _variants(command: str) -> list[str]:
    """The command without its [optional] parts, and with all of them (nested ones too)."""
    bare = command
    while re.search(r"\[[^\[\]]*\]", bare):
        bare = re.sub(r"\[[^\[\]]*\]", "", bare)
    full = command.replace("[", "").replace("]", "")
    return sorted({" ".join(bare.split()), " ".join(full.split())})


@pytest.mark.parametrize("command", _commands())
def test_every_command_the_readme_shows_runs(command: str, tmp_path: Path) -> None:
    (tmp_path / "mine.toml").write_text(_toml())
    for variant in _variants(command):
        tokens = variant.split()[1:]
        if tokens[0].startswith("--") and tokens[-1] == "…":           # a global option: before any command
            tokens = [*tokens[:-1], "summary", "FILE"]
        if tokens == ["peaks", "--format", "json"]:                      # "the same … as" a file's
            tokens = ["peaks", "FILE", "--format", "json"]
        args = _fill(tokens, tmp_path)
        if args[0] == "report":
            args += ["--samples", "2", "--force"]
        if args[0] == "estimate":                                        # both variants write est.pickle
            args.insert(1, "--force")
        if args[0] == "mcp":                                             # a server: test_mcp talks to it
            args.append("--help")
        if args[0] == "convert":
            run = tmp_path / "run"
            shutil.copytree(args[1], run, dirs_exist_ok=True)
            args[1] = str(run)
        alternatives = [args]
        if "FILE|RUN" in variant.split():
            alternatives.append([str(FIXTURES / "runs" / "tp2_vision_encoder") if a == _fill(["FILE"], tmp_path)[0]
                                 else a for a in args])
        for argv in alternatives:
            result = CliRunner().invoke(main, argv)
            assert result.exit_code in (0, 1), f"{' '.join(argv)}\n{result.output}"   # 1: check found a limit
            assert result.exit_code == 0 or argv[0] == "check", f"{' '.join(argv)}\n{result.output}"


def test_every_name_the_readme_imports_exists() -> None:
    code = "\n".join(re.findall(r"```python\n(.*?)```", README, re.S))
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("snapanalyze"):
            module = __import__(node.module, fromlist=["_"])
            for alias in node.names:
                assert hasattr(module, alias.name) or __import__(f"{node.module}.{alias.name}", fromlist=["_"])
    import snapanalyze
    shown = {name for span in re.findall(r"`([^`]*)`", README) for name in re.findall(r"\b([A-Z]\w+)\(", span)}
    foreign = {"Client": "dask.distributed", "ProcessPoolExecutor": "concurrent.futures"}   # others' classes
    serving = {"LLM", "SamplingParams"}                        # vLLM's, in the recipe: not installed here
    assert "Limits" in shown                                   # the README builds these inline, with no import
    for name in shown - serving:
        module = __import__(foreign[name], fromlist=["_"]) if name in foreign else snapanalyze
        assert hasattr(module, name), f"the README shows {name}(…), which {module.__name__} does not have"
