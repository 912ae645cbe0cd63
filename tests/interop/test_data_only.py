"""`fuseval import`, `list` and `export` read a problem folder as data: none of the
problem's code runs (a folder whose code cannot run here, or does not fit, still imports).

The folder is written by the test; its reference leaves a marker file when its module is
executed, so running it anywhere shows."""
import os

import pytest

from fuseval import cli
from problem_folders import tensor, workload, write_problem


def _marked_problem(tmp_path):
    marker = tmp_path / "reference-ran"
    folder = write_problem(
        tmp_path / "marked", name="test_marked_scale",
        axes={"n": {"type": "var"}, "h": {"type": "const", "value": 8}},
        inputs={"x": tensor(["n", "h"], "float32")}, outputs={"y": tensor(["n", "h"], "float32")},
        reference=f"""
            import torch
            open({str(marker)!r}, "w").write("ran")


            def run(x):
                return x * 2
            """,
        workloads=[workload({"n": 3}), workload({"n": 5})])
    return folder, marker


@pytest.mark.parametrize("argv", [
    ["import", "{folder}"],
    ["list", "--problem", "{folder}"],
    ["list", "--problem", "{folder}", "--op", "test_marked_scale"],
    ["export", "--problem", "{folder}", "--out", "{out}"],
], ids=["import", "list", "list_op", "export"])
def test_reading_a_problem_runs_none_of_its_code(tmp_path, register, capsys, argv):
    folder, marker = _marked_problem(tmp_path)
    code = cli.main([a.format(folder=folder, out=tmp_path / "exported") for a in argv])
    assert code == 0, capsys.readouterr()
    assert not marker.exists(), f"{argv[0]} executed the problem's reference"


def test_import_lift_runs_the_reference_when_asked(tmp_path, register, capsys):
    folder, marker = _marked_problem(tmp_path)
    assert cli.main(["import", folder, "--lift"]) == 0
    assert marker.exists()
    assert "lifted oracle" in capsys.readouterr().out


def test_export_of_a_problem_writes_its_workloads(tmp_path, register):
    folder, _ = _marked_problem(tmp_path)
    assert cli.main(["export", "--problem", folder, "--out", str(tmp_path / "exported")]) == 0
    rows = (tmp_path / "exported" / "test_marked_scale" / "workload.jsonl").read_text().splitlines()
    assert len(rows) == 2 and os.path.exists(tmp_path / "exported" / "test_marked_scale" / "definition.json")
