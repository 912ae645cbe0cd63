"""Workload inputs stored in safetensors blobs (fuseval.interop.blobs): read when the blob
and the ``safetensors`` package are there, the workload left out with the reason
otherwise (found when the folder is read, without running anything).

The folders and blobs are written by these tests; the expected tensors are the ones
written here."""
import json
import os

import pytest
import torch

from fuseval.interop import blobs
from fuseval.interop.workload_inputs import draw_inputs
from fuseval.interop.sol_problem import ProblemError, read_problem
from problem_folders import tensor, workload, write_problem

BLOB = "data/blobs/w.safetensors"


def _folder(tmp_path, blob_key="weights"):
    rows = [workload({"n": 3}, {"w": {"type": "safetensors", "path": BLOB, "tensor_key": blob_key}}),
            workload({"n": 4})]
    return write_problem(
        tmp_path / "dataset" / "problems" / "p", name="test_blobs",
        axes={"n": {"type": "var"}, "h": {"type": "const", "value": 2}},
        inputs={"x": tensor(["n", "h"], "float32"), "w": tensor(["h"], "float32")},
        outputs={"y": tensor(["n", "h"], "float32")},
        reference="""
            def run(x, w):
                return x * w
            """,
        workloads=rows)


def test_a_missing_blob_leaves_its_workload_out_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.delenv(blobs.BLOB_ROOT_ENV, raising=False)
    problem = read_problem(_folder(tmp_path))
    assert [w.axes["n"] for w in problem.supported_workloads] == [4]
    why = problem.workloads[0].unsupported
    assert BLOB in why and ("not present" in why or "safetensors package" in why), why
    assert any("left out" in w for w in problem.warnings)


def test_a_folder_whose_every_workload_needs_a_missing_blob_imports_and_is_refused_when_run(
        tmp_path, monkeypatch, capsys, register):      # register: the commands' registrations are forgotten after
    """9 FlashInfer-Bench folders of the dataset: every workload reads a blob the dataset's
    mirror does not hold. Importing runs nothing, so it succeeds and says why nothing can be
    checked; check and gate refuse with that reason (exit 5), never exit 70."""
    from fuseval import cli
    monkeypatch.delenv(blobs.BLOB_ROOT_ENV, raising=False)
    folder = write_problem(
        tmp_path / "dataset" / "problems" / "only_blobs", name="test_only_blobs",
        axes={"n": {"type": "var"}}, inputs={"x": tensor(["n"], "float32")},
        outputs={"y": tensor(["n"], "float32")},
        reference="""
            def run(x):
                return x * 2
            """,
        workloads=[workload({"n": 3}, {"x": {"type": "safetensors", "path": BLOB, "tensor_key": "x"}})])
    problem = read_problem(folder)
    assert problem.supported_workloads == [] and BLOB in problem.workloads[0].unsupported
    assert cli.main(["import", folder]) == 0
    said = capsys.readouterr().out
    assert "0 of 1 drawable" in said and "no workload fuseval can draw" in said and BLOB in said, said
    for command in (["check", "--problem", folder, "--impl", "sol_reference", "--in-process"],
                    ["gate", "--problem", folder, "--impl", "sol_reference", "--profile", "ci",
                     "--out", str(tmp_path / "gate")]):
        assert cli.main(command) == 5, command
        assert "no workload fuseval can draw" in capsys.readouterr().err


def test_a_blob_under_the_dataset_root_is_read(tmp_path, monkeypatch):
    st = pytest.importorskip("safetensors.torch")
    monkeypatch.delenv(blobs.BLOB_ROOT_ENV, raising=False)
    folder = _folder(tmp_path)
    weights = torch.tensor([0.5, -3.0])
    os.makedirs(tmp_path / "dataset" / "data" / "blobs")
    st.save_file({"weights": weights}, str(tmp_path / "dataset" / BLOB))
    problem = read_problem(folder)
    assert [w.axes["n"] for w in problem.supported_workloads] == [3, 4]
    drawn = draw_inputs(problem, problem.workloads[0], seed=7)
    assert torch.equal(drawn["w"], weights) and drawn["x"].shape == (3, 2)


def test_a_blob_found_through_the_root_variable(tmp_path, monkeypatch):
    st = pytest.importorskip("safetensors.torch")
    folder = _folder(tmp_path)
    elsewhere = tmp_path / "blobs-root"
    os.makedirs(elsewhere / "data" / "blobs")
    st.save_file({"weights": torch.ones(2)}, str(elsewhere / BLOB))
    monkeypatch.setenv(blobs.BLOB_ROOT_ENV, str(elsewhere))
    assert blobs.find_blob(folder, BLOB) == str(elsewhere / BLOB)


@pytest.mark.parametrize("stored, words", [
    ({"weights": torch.ones(3)}, ["shape (3,)", "(2,)"]),
    ({"weights": torch.ones(2, dtype=torch.float16)}, ["torch.float16", "torch.float32"]),
    ({"other": torch.ones(2)}, ["no tensor 'weights'", "other"]),
])
def test_a_blob_that_does_not_fit_names_the_input(tmp_path, monkeypatch, stored, words):
    st = pytest.importorskip("safetensors.torch")
    monkeypatch.delenv(blobs.BLOB_ROOT_ENV, raising=False)
    folder = _folder(tmp_path)
    os.makedirs(tmp_path / "dataset" / "data" / "blobs")
    st.save_file(stored, str(tmp_path / "dataset" / BLOB))
    problem = read_problem(folder)
    with pytest.raises((ProblemError, KeyError)) as info:
        draw_inputs(problem, problem.workloads[0], seed=7)
    assert "'w'" in str(info.value) and all(w in str(info.value) for w in words), str(info.value)


def test_a_blob_without_a_path_is_named(tmp_path):
    why = blobs.unreadable(str(tmp_path), "w", {"type": "safetensors", "tensor_key": "k"})
    assert "'w'" in why and "'path'" in why and json.dumps(None) in why.replace("None", "null")
