"""docs/error_analysis.ipynb runs from top to bottom on a CPU (nbclient + ipykernel), so the
notebook cannot rot as the budget report changes; its plot cell must produce an image."""
from __future__ import annotations

import json
import pathlib

import pytest

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "docs" / "error_analysis.ipynb"


def test_notebook_executes_and_plots(tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (pip install -e '.[test]')")
    nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (pip install -e '.[test]')")
    pytest.importorskip("ipykernel", reason="ipykernel is not installed (pip install -e '.[test]')")
    pytest.importorskip("fuseval.budget.runner", reason="fuseval.budget is not part of this checkout")

    report = tmp_path / "budget-report.json"
    monkeypatch.setenv("FUSEVAL_NB_REPORT", str(report))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "commit the notebook without outputs"
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()                                     # raises CellExecutionError on any failing cell

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, "the plot cell produced no image"
    # the notebook saved the report it analysed, and it is a budget report
    doc = json.loads(report.read_text())
    assert doc["kind"] == "fuseval.budget" and doc["stages"]
    tables = [o for o in outputs if "text/html" in o.get("data", {})]
    assert any("propagated" in o["data"]["text/html"] for o in tables)
