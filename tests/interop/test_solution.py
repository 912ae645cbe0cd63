"""Implementations from SOL-ExecBench solution.json files (fuseval.interop.solution),
checked through fuseval's normal check on a problem folder written for these tests."""
import json
import os
import shutil

import pytest
import torch

import fuseval
from fuseval import operators
from fuseval.operators import _CACHE
from fuseval.errors import ImplementationError
from fuseval.interop.sol_problem import PROBLEM_PATH_VARIABLE, read_problem
from fuseval.interop.solution import find_solutions, load_solution

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "sol_problems")
RMSNORM = os.path.join(DATA, "rmsnorm")

GOOD_KERNEL = ("import torch\n\n\ndef run(hidden_states, weight, eps, output):\n"
               "    x = hidden_states.float()\n"
               "    output.copy_((x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float())"
               ".to(output.dtype))\n")


@pytest.fixture
def problem_copy(tmp_path, monkeypatch):
    """A copy of the RMSNorm problem (its own module, so solutions added here stay here),
    registered as an operator for one test."""
    # set (to nothing) rather than deleted, so that monkeypatch restores it after the test
    monkeypatch.setenv(PROBLEM_PATH_VARIABLE, "")
    monkeypatch.setenv("FUSEVAL_SOLUTION_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "rmsnorm"
    shutil.copytree(RMSNORM, folder)
    names = []

    def register():
        spec = operators.register_problem(str(folder))
        names.append(spec.name)
        return spec
    yield folder, register
    for name in names:
        operators.registry().pop(name, None)
        _CACHE.pop(name, None)


def _solution(folder, file_name, content, *, dps=True, languages=("pytorch",), entry="kernel.py::run",
              definition="test_rmsnorm_h64", name=None, sources=None):
    doc = {"name": name or os.path.splitext(file_name)[0], "definition": definition, "author": "fuseval tests",
           "spec": {"languages": list(languages), "target_hardware": ["local"], "entry_point": entry,
                    "destination_passing_style": dps},
           "sources": sources if sources is not None else [{"path": entry.split("::")[0], "content": content}]}
    path = os.path.join(folder, file_name)
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def test_solutions_of_the_folder_are_implementations():
    names = [n for n, _ in find_solutions(RMSNORM)]
    assert names == ["rmsnorm_torch_dps", "rmsnorm_triton_rows"]


def test_python_and_triton_solutions_pass_the_check(problem_copy):
    folder, register = problem_copy
    spec = register()
    for impl in ("rmsnorm_torch_dps", "rmsnorm_triton_rows"):
        report = fuseval.check(spec.name, impl)
        assert report.passed, (impl, [(c.violations, c.messages) for c in report.cases])


def test_a_solution_that_writes_half_its_output_fails(problem_copy):
    folder, register = problem_copy
    half = GOOD_KERNEL.replace("output.copy_(", "output[..., :32].copy_(").replace(".to(output.dtype))",
                                                                             "[..., :32].to(output.dtype))")
    _solution(folder, "solution_half.json", half)
    spec = register()
    report = fuseval.check(spec.name, "solution_half")
    assert not report.passed and all("nonfinite" in c.violations for c in report.cases)


def test_a_value_returning_solution(problem_copy):
    folder, register = problem_copy
    _solution(folder, "solution_returns.json",
              "import torch\n\n\ndef run(hidden_states, weight, eps):\n    x = hidden_states.float()\n"
              "    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).bfloat16()\n",
              dps=False)
    spec = register()
    assert fuseval.check(spec.name, "solution_returns").passed


def test_a_solution_named_like_the_problems_own_implementation_is_prefixed(problem_copy):
    folder, register = problem_copy
    _solution(folder, "solution_torch.json", GOOD_KERNEL, name="torch")
    names = [n for n, _ in find_solutions(str(folder))]
    assert "solution:solution_torch.json" in names and names.count("torch") == 0


@pytest.mark.parametrize("change, words", [
    ({"definition": "some_other_problem"}, ["solves 'some_other_problem'"]),
    ({"entry": "missing.py::run", "sources": [{"path": "kernel.py", "content": GOOD_KERNEL}]},
     ["'missing.py' is not among the sources"]),
    ({"entry": "kernel.py"}, ["'file::function'"]),
    ({"languages": ("fortran",)}, ["unknown languages ['fortran']"]),
    ({"languages": ("pytorch", "cuda_cpp")}, ["cannot be mixed"]),
    ({"sources": [{"path": "../kernel.py", "content": "x = 1\n"}]}, ["relative 'path'"]),
])
def test_malformed_solutions_are_named(problem_copy, change, words):
    folder, _ = problem_copy
    path = _solution(folder, "solution_bad.json", GOOD_KERNEL, **change)
    with pytest.raises(ImplementationError) as info:
        load_solution(path, read_problem(str(folder)))
    assert all(w in str(info.value) for w in words), str(info.value)
    assert info.value.exit_code == 4


def test_a_solution_whose_entry_function_is_missing(problem_copy):
    folder, _ = problem_copy
    path = _solution(folder, "solution_bad.json", "def other():\n    pass\n")
    with pytest.raises(ImplementationError, match="has no function 'run'"):
        load_solution(path, read_problem(str(folder)))


def test_a_cuda_solution_without_nvcc_is_a_clear_error(problem_copy, monkeypatch):
    from torch.utils import cpp_extension
    folder, _ = problem_copy
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    path = _solution(folder, "solution_cuda.json", "#include <torch/extension.h>\n", languages=("cuda_cpp",),
                     entry="kernel.cu::run")
    with pytest.raises(ImplementationError, match="needs nvcc"):
        load_solution(path, read_problem(str(folder)))


def test_a_dps_solution_gets_its_outputs_allocated_and_returned():
    fn = load_solution(os.path.join(RMSNORM, "solution_python.json"), read_problem(RMSNORM))
    x = torch.randn(1, 2, 64).bfloat16()
    out = fn(x, torch.ones(64).bfloat16(), 1e-6)
    assert len(out) == 1 and out[0].shape == (1, 2, 64) and out[0].dtype == torch.bfloat16
    assert bool(torch.isfinite(out[0]).all())
