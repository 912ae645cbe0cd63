"""docs/diagnosis.ipynb runs from top to bottom on a CPU and draws its plot."""
from __future__ import annotations

import pathlib

import pytest

NOTEBOOK = pathlib.Path(__file__).resolve().parents[2] / "docs" / "diagnosis.ipynb"


def test_diagnosis_notebook_executes_and_plots(tmp_path):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "structure" in text and "query head 1 holds the oracle's query head 0" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)
