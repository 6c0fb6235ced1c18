"""The drill-down notebooks run top to bottom on the shipped fixtures, headless, as a reader would run them.

Each notebook is executed with nbclient in a fresh kernel of this interpreter (cwd = the repository root);
any cell that raises fails the test with the cell's source and error. The notebooks carry their own
assertions (the category that rose between two peaks, the OOM verdicts against the fixtures' answers).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is a dev dependency: pip install -e '.[dev]'")
nbclient = pytest.importorskip("nbclient", reason="nbclient is a dev dependency: pip install -e '.[dev]'")
pytest.importorskip("ipykernel", reason="ipykernel is a dev dependency: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "snapanalyze-test-python"


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
def test_notebook_runs_top_to_bottom(path: Path, kernel_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_PATH", str(kernel_dir))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=300, allow_errors=False,
                                     resources={"metadata": {"path": str(ROOT)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{path.name}: a cell failed\n{exc}")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "every code cell ran"
    html = [o for c in code for o in c.outputs if "text/html" in o.get("data", {})]
    assert html, "displayed objects render as HTML tables"
    figures = [o for c in code for o in c.outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert figures, "plots come out as plotly figures"
