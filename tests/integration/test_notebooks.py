"""The drill-down notebooks run on a user's own file: parameters injected as papermill does, then checked here.

Each notebook has one code cell tagged "parameters" (plain assignments: SNAPSHOT, RUN, SWEEP, …). A run
inserts a cell tagged "injected-parameters" after it — what `papermill -p NAME VALUE` does — and executes the
notebook with nbclient in a fresh kernel of this interpreter (cwd = the repository root); any cell that
raises fails the test with the cell's source and error. The notebooks hold no assertions: their last cell,
tagged "result", prints what they found as JSON, and the tests compare it with the fixtures' answer keys
and inspect the outputs (readable tables in GiB/MiB and %, plotly figures). Each notebook runs on at least
two inputs.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is a dev dependency: pip install -e '.[dev]'")
nbclient = pytest.importorskip("nbclient", reason="nbclient is a dev dependency: pip install -e '.[dev]'")
pytest.importorskip("ipykernel", reason="ipykernel is a dev dependency: pip install -e '.[dev]'")

pytestmark = pytest.mark.slow        # each test executes a notebook in a real kernel

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "snapanalyze-test-python"
SCENARIOS = ROOT / "fixtures" / "scenarios"
RUNS = ROOT / "fixtures" / "runs"
SWEEPS = ROOT / "fixtures" / "sweeps"
# What a notebook may import from the package: its exports, the figures and the units people read.
PUBLIC = {"snapanalyze", "snapanalyze.plots", "snapanalyze.plots_capacity", "snapanalyze.units"}
SIZE = re.compile(r"\d(?:\.\d\d)? (?:B|KiB|MiB|GiB|TiB)\b")
SHARE = re.compile(r"\d+\.\d%")


def _expected(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _code(path: Path) -> list[Any]:
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kernelspec that runs this very interpreter, so the notebooks see the package under test."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "snapanalyze tests", "language": "python"}))
    return root


class Executed:
    """A notebook run with injected parameters: its cells with outputs, and what its result cell printed."""

    def __init__(self, nb: Any) -> None:
        self.nb = nb
        self.code = [c for c in nb.cells if c.cell_type == "code"]
        result = [c for c in self.code if "result" in c.metadata.get("tags", [])]
        assert len(result) == 1, "one cell tagged result"
        text = "".join(o.get("text", "") for o in result[0].outputs if o.get("name") == "stdout")
        self.found: dict[str, Any] = json.loads(text)

    def outputs(self, mime: str) -> list[Any]:
        return [o["data"][mime] for c in self.code for o in c.outputs if mime in o.get("data", {})]

    def stdout(self) -> str:
        return "".join(o.get("text", "") for c in self.code for o in c.outputs if o.get("name") == "stdout")


def execute(path: Path, kernel_dir: Path, monkeypatch: pytest.MonkeyPatch, **params: Any) -> Executed:
    """Run `path` with `params` injected after its parameters cell, as papermill does."""
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_dir))
    nb = nbformat.read(path, as_version=4)
    at = next(i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    injected = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in params.items()))
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(at + 1, injected)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=300, allow_errors=False,
                                     resources={"metadata": {"path": str(ROOT)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{path.name} with {params}: a cell failed\n{exc}")
    run = Executed(nb)
    assert all(c.execution_count for c in run.code), "every code cell ran"
    return run


def _readable(run: Executed) -> None:
    """Tables show sizes in binary units and shares in %, and figures come out as plotly JSON."""
    html = "\n".join(run.outputs("text/html"))
    assert SIZE.search(html) and SHARE.search(html), "tables show sizes in KiB/MiB/GiB and shares in %"
    assert run.outputs("application/vnd.plotly.v1+json"), "plots come out as plotly figures"


# -- the notebooks as committed ------------------------------------------------------------------------------

def test_the_notebooks_exist() -> None:
    assert [p.name for p in NOTEBOOKS] == ["01_drilldown.ipynb", "02_ranks_and_oom.ipynb", "03_capacity.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_clean(path: Path) -> None:
    """No outputs or execution counts in the repository: diffs stay readable, results come from running."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: clear the outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_parameters_come_first_as_plain_assignments(path: Path) -> None:
    """The first code cell is tagged parameters and only assigns literals, so papermill can override it."""
    first = _code(path)[0]
    assert first.metadata.get("tags") == ["parameters"]
    tree = ast.parse(first.source)
    assert tree.body and all(isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) for s in tree.body)
    names = [s.targets[0].id for s in tree.body]  # type: ignore[attr-defined]
    assert all(n.isupper() for n in names) and {"SNAPSHOT", "RUN", "SWEEP"} & set(names)
    for s in tree.body:
        ast.literal_eval(s.value)  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebooks_use_the_public_api_and_hold_no_asserts(path: Path) -> None:
    for cell in _code(path):
        tree = ast.parse(cell.source)
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Assert)], f"an assert in {cell.source[:60]!r}"
        for node in ast.walk(tree):
            modules = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                       [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for module in modules:
                if module.startswith("snapanalyze"):
                    imported = {f"{module}.{a.name}" for a in node.names} if isinstance(node, ast.ImportFrom) else set()
                    assert module in PUBLIC or imported <= PUBLIC, f"{path.name} imports {module}"


# -- 01: drill-down ------------------------------------------------------------------------------------------

NB01 = ROOT / "notebooks" / "01_drilldown.ipynb"


@pytest.mark.parametrize("scenario, category, rose", [
    ("prompt_logprobs_logits", "logits", "logits"),      # the logprobs step's logits made the peak
    ("moe_long_prefill", "mlp", None),
], ids=["prompt_logprobs_logits", "moe_long_prefill"])
def test_drilldown_on_a_scenario(scenario: str, category: str, rose: str | None, kernel_dir: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    exp = _expected(SCENARIOS / f"{scenario}.expected.json")
    run = execute(NB01, kernel_dir, monkeypatch, SNAPSHOT=f"fixtures/scenarios/{scenario}.pickle")
    found = run.found
    assert found["peak_event_index"] == exp["peak"]["event_index"]
    assert found["peak_active_bytes"] == exp["peak"]["active_bytes"]
    assert found["categories"] == exp["categories"]
    assert found["category"] == category and found["category_in_window_bytes"] > 0
    if rose is not None:
        assert found["rose_most"] == rose and found["rose_bytes"] > 0
    _readable(run)
    assert "replay matches the end state" in run.stdout()


def test_drilldown_of_a_run_directory_and_a_chosen_category(kernel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exp = _expected(RUNS / "tp2_vision_encoder.expected.json")["ranks"]["1"]
    run = execute(NB01, kernel_dir, monkeypatch, SNAPSHOT="fixtures/runs/tp2_vision_encoder", RANK=1,
                  CATEGORY="vision_encoder")
    assert run.found["peak_active_bytes"] == exp["peak"]["active_bytes"]
    assert run.found["category"] == "vision_encoder"
    assert run.found["categories"]["vision_encoder"] == exp["categories"]["vision_encoder"]


# -- 02: ranks and OOMs --------------------------------------------------------------------------------------

NB02 = ROOT / "notebooks" / "02_ranks_and_oom.ipynb"


def _ranks_match(found: dict[str, Any], exp: dict[str, Any]) -> None:
    assert found["ranks"] == sorted(int(r) for r in exp["ranks"])
    for rank, facts in exp["ranks"].items():
        assert found["peak_active_bytes"][rank] == facts["peak"]["active_bytes"]
        assert found["outside"][rank]["outside_bytes"] == facts["nvml"]["outside_bytes"]
        assert found["outside"][rank]["nvml_used_bytes"] == facts["nvml"]["nvml_used_bytes"]
        assert found["outside"][rank]["uncertain"] == (not facts["nvml"]["measured"])


def test_ranks_of_a_tp2_run_and_a_fragmentation_oom(kernel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = execute(NB02, kernel_dir, monkeypatch, RUN="fixtures/runs/tp2_vision_encoder",
                  SNAPSHOT="fixtures/scenarios/oom_fragmentation.pickle")
    exp = _expected(RUNS / "tp2_vision_encoder.expected.json")
    found = run.found
    _ranks_match(found, exp)
    assert found["outliers"] == [exp["outlier"]["rank"]] and found["median_rank"] == exp["outlier"]["median_rank"]
    top = found["differences"][0]
    assert top["category"] == exp["outlier"]["category"]
    assert top["bytes"] == exp["ranks"]["1"]["categories"]["vision_encoder"]
    oom = _expected(SCENARIOS / "oom_fragmentation.expected.json")["oom"]
    [got] = found["ooms"]
    assert got["verdict"] == oom["verdict"] == "fragmentation"
    assert got["largest_free_block_bytes"] == oom["largest_free_block"]
    assert got["reserved_free_bytes"] == oom["reserved_free_bytes"] and got["active_bytes"] == oom["active_bytes"]
    _readable(run)
    assert "fragmentation" in run.stdout() and "expandable_segments" in run.stdout()


def test_an_oom_from_another_process_in_a_run(kernel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SNAPSHOT None explains the run itself: its NVML samples name the other process."""
    run = execute(NB02, kernel_dir, monkeypatch, RUN="fixtures/runs/oom_other_process", SNAPSHOT=None)
    exp = _expected(RUNS / "oom_other_process.expected.json")
    _ranks_match(run.found, exp)
    assert run.found["outliers"] == []
    [got] = run.found["ooms"]
    assert got["rank"] == 0 and got["verdict"] == exp["ranks"]["0"]["oom"]["verdict"] == "outside_pressure"


def test_a_run_without_an_oom_and_a_live_exhaustion(kernel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = execute(NB02, kernel_dir, monkeypatch, RUN="fixtures/runs/slow_nvml_spike",
                  SNAPSHOT="fixtures/scenarios/oom_live_exhaustion.pickle")
    _ranks_match(run.found, _expected(RUNS / "slow_nvml_spike.expected.json"))
    oom = _expected(SCENARIOS / "oom_live_exhaustion.expected.json")["oom"]
    [got] = run.found["ooms"]
    assert (got["verdict"], got["index"], got["active_bytes"]) == (oom["verdict"], oom["event_index"],
                                                                   oom["active_bytes"])
    none = execute(NB02, kernel_dir, monkeypatch, RUN="fixtures/runs/slow_nvml_spike", SNAPSHOT=None)
    assert none.found["ooms"] == [] and "no OOM recorded" in none.stdout()


def test_only_an_oom_pickle_and_no_run(kernel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user with nothing but the pickle dumped at their OOM sets RUN = None: the ranks part says it is
    skipped, and the OOM is explained as with a run beside it."""
    run = execute(NB02, kernel_dir, monkeypatch, RUN=None, SNAPSHOT="fixtures/scenarios/oom_fragmentation.pickle")
    assert run.found["run"] is None and run.found["ranks"] == [] and run.found["median_rank"] is None
    assert run.found["outside"] == {} and "the ranks part is skipped" in run.stdout()
    oom = _expected(SCENARIOS / "oom_fragmentation.expected.json")["oom"]
    [got] = run.found["ooms"]
    assert got["verdict"] == oom["verdict"] and got["largest_free_block_bytes"] == oom["largest_free_block"]
    assert run.outputs("application/vnd.plotly.v1+json")          # the icicle and timeline at the failure


# -- 03: capacity --------------------------------------------------------------------------------------------

NB03 = ROOT / "notebooks" / "03_capacity.ipynb"


def test_capacity_of_the_attention_threshold_sweep(kernel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exp = _expected(SWEEPS / "attention_threshold" / "expected.json")
    run = execute(NB03, kernel_dir, monkeypatch, SWEEP="fixtures/sweeps/attention_threshold", BUDGET="80GiB")
    found = run.found
    assert found["driver"] == exp["driver"]
    assert found["transient_bytes"] == [f["transient_bytes"] for f in exp["files"].values()]
    [jump] = found["jumps"]
    assert (jump["from_x"], jump["to_x"], jump["category"], jump["how"]) == (
        exp["jump"]["from_tokens"], exp["jump"]["to_tokens"], exp["jump"]["category"], exp["jump"]["how"])
    assert [m for _, m in found["total_regimes"]] == [exp["total_model_below"], exp["total_model_above"]]
    largest = max(found["x"])
    limits = found["limits"]
    assert limits and all(lim["max_x"] <= 2 * largest for lim in limits if lim["max_x"] is not None)
    assert any(lim["bounded"] for lim in limits)
    html = "\n".join(run.outputs("text/html"))
    assert "bytes/token²" in html and "(bound: 2× measured)" in html and "(extrapolated)" in html
    _readable(run)


def test_capacity_of_a_manifest_and_of_a_run_with_markers(kernel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunked = _expected(SWEEPS / "chunked_prefill" / "expected.json")
    run = execute(NB03, kernel_dir, monkeypatch, SWEEP="fixtures/sweeps/chunked_prefill/manifest.csv",
                  BUDGET="24GiB")
    assert run.found["driver"] == "chunk" and run.found["models"]["total"] == chunked["model"]
    assert run.found["jumps"] == [] and run.found["limits"] == []          # the 66 GiB baseline alone is over
    assert any("already exceeds the budget" in n for n in run.found["notes"])
    assert "KiB/token" in "\n".join(run.outputs("text/html"))
    markers = _expected(SWEEPS / "phase_markers" / "expected.json")
    run = execute(NB03, kernel_dir, monkeypatch, SWEEP="fixtures/sweeps/phase_markers/run", SHAPE_FROM="markers",
                  BUDGET=None)
    assert run.found["labels"] == [f"run:{p['phase']}" for p in markers["phases"]]
    assert run.found["transient_bytes"] == [p["transient_bytes"] for p in markers["phases"]]
    assert run.found["models"]["total"] == markers["model"] and run.found["limits"] is None
    _readable(run)
