"""Bad input to fuseval itself: each mistake gives one clear message and its own exit code
(fuseval/errors.py), never a bare traceback.

Every case runs the real command line in-process (``fuseval.cli.main``) on one small case,
with implementations written to a temporary module the way a user would name them
(``module:function``)."""
from __future__ import annotations

import json
import textwrap

import pytest

from fuseval import cli
from fuseval.errors import (EXIT_BAD_FILE, EXIT_BAD_OUTPUTS, EXIT_IMPL_RAISED, EXIT_IMPORT_ERROR,
                            EXIT_NONFINITE, EXIT_OK, EXIT_UNKNOWN_OPERATOR, EXIT_USAGE)

OP = "nvfp4_qkv_rope"

USER_MODULE = textwrap.dedent("""
    import torch
    from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager

    def good(*a):
        return torch_eager(*a)

    def two_outputs(*a):
        return torch_eager(*a)[:2]

    def wrong_shape(*a):
        q, k, v = torch_eager(*a)
        return q[..., :-1].contiguous(), k, v

    def wrong_dtype(*a):
        q, k, v = torch_eager(*a)
        return q.float(), k, v

    def not_a_tuple(*a):
        return "done"

    def raises(*a):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def nan(*a):
        q, k, v = torch_eager(*a)
        q = q.clone()
        q.view(-1)[0] = float("nan")
        return q, k, v

    NOT_CALLABLE = 3
""")


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "tool_errors_user_kernels.py").write_text(USER_MODULE)
    (tmp_path / "tool_errors_broken_import.py").write_text("import torch\nraise ImportError('libcuda.so not found')\n")
    (tmp_path / "tool_errors_syntax.py").write_text("def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "tool_errors_user_kernels"


def run(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    return code, out, err


def check_cmd(impl):
    return ["check", "--op", OP, "--impl", impl, "--cases", "0"]


def gate_cmd(impl, tmp_path, *extra):
    return ["gate", "--op", OP, "--impl", impl, "--cases", "0", "--seeds", "1", "--skip", "properties,budget",
            "--out", str(tmp_path / "gate"), "--quiet", *extra]


# --------------------------------------------------------------------------- operators
@pytest.mark.parametrize("argv", [
    ["check", "--op", "qwen3_attention", "--impl", "torch"],
    ["gate", "--op", "qwen3_attention", "--impl", "torch"],
    ["baseline", "save", "--op", "qwen3_attention", "--impl", "torch"],
    ["list", "--op", "qwen3_attention"],
])
def test_unknown_operator(argv, capsys):
    code, out, err = run(argv, capsys)
    assert code == EXIT_UNKNOWN_OPERATOR
    assert "unknown operator 'qwen3_attention'" in err and "nvfp4_qkv_rope" in err


# --------------------------------------------------------------------------- implementation paths
@pytest.mark.parametrize("impl, words", [
    ("tool_errors_no_such_module:fn", "cannot import module 'tool_errors_no_such_module'"),
    ("tool_errors_broken_import:fn", "libcuda.so not found"),
    ("tool_errors_syntax:f", "SyntaxError"),
    ("tool_errors_user_kernels:missing", "has no attribute 'missing'"),
    ("tool_errors_user_kernels:NOT_CALLABLE", "is not callable"),
    ("fastest", "unknown implementation 'fastest'"),
])
@pytest.mark.parametrize("command", ["check", "gate"])
def test_implementation_that_does_not_import(user_module, tmp_path, capsys, impl, words, command):
    argv = check_cmd(impl) if command == "check" else gate_cmd(impl, tmp_path)
    code, out, err = run(argv, capsys)
    assert code == EXIT_IMPORT_ERROR
    assert words in err


# --------------------------------------------------------------------------- implementation behaviour
@pytest.mark.parametrize("fn, code, words", [
    ("good", EXIT_OK, "1/1 case"),
    ("two_outputs", EXIT_BAD_OUTPUTS, "returned 2 outputs, expected 3"),
    ("wrong_shape", EXIT_BAD_OUTPUTS, "has shape"),
    ("wrong_dtype", EXIT_BAD_OUTPUTS, "has dtype torch.float32, expected torch.bfloat16"),
    ("not_a_tuple", EXIT_BAD_OUTPUTS, "returned str"),
    ("raises", EXIT_IMPL_RAISED, "an illegal memory access"),
    ("nan", EXIT_NONFINITE, "nonfinite"),
])
@pytest.mark.parametrize("command", ["check", "gate"])
def test_implementation_misbehaving(user_module, tmp_path, capsys, fn, code, words, command):
    impl = f"{user_module}:{fn}"
    argv = check_cmd(impl) if command == "check" else gate_cmd(impl, tmp_path)
    got, out, err = run(argv, capsys)
    assert got == code, out + err
    text = " ".join((out + err).split())                   # rich wraps long lines
    if command == "gate" and code != EXIT_OK:
        assert "GATE FAILED" in text
    assert " ".join(words.split()) in text


# --------------------------------------------------------------------------- files
def test_malformed_budget_file(user_module, tmp_path, capsys):
    bad = tmp_path / "budget.json"
    bad.write_text("{'stages': }")
    code, out, err = run(gate_cmd("torch", tmp_path, "--budget", str(bad)), capsys)
    assert code == EXIT_BAD_FILE and "not valid JSON" in err and "budget.json" in err
    missing = tmp_path / "nope.json"
    code, out, err = run(gate_cmd("torch", tmp_path, "--budget", str(missing)), capsys)
    assert code == EXIT_BAD_FILE and "no such file" in err and "nope.json" in err


def test_budget_file_with_a_wrong_field(user_module, tmp_path, capsys):
    pytest.importorskip("fuseval.budget.budgetfile")
    bad = tmp_path / "budget.json"
    bad.write_text(json.dumps({"schema_version": 1, "op": OP,
                               "stages": {"no_such_stage": {"dtype": "float32", "allowance": []}}}))
    code, out, err = run(gate_cmd("torch", tmp_path, "--budget", str(bad)), capsys)
    assert code == EXIT_BAD_FILE and "no_such_stage" in err


@pytest.mark.parametrize("content, words", [
    ("not json at all", "not valid JSON"),
    (json.dumps({"schema_version": "one"}), "schema_version"),
    (json.dumps({"schema_version": 1, "op": OP, "impl": "torch", "config": "small", "device": "cpu",
                 "mode": "benchmark", "seeds": [0], "tolerance": {}, "cases": {"zero": {}}}), "case indices"),
])
def test_malformed_baseline_file(tmp_path, capsys, content, words):
    bad = tmp_path / "baseline.json"
    bad.write_text(content)
    code, out, err = run(["baseline", "compare", "--baseline", str(bad)], capsys)
    assert code == EXIT_BAD_FILE and words in err and "baseline.json" in err


def test_bad_options_are_usage_errors(capsys, tmp_path):
    code, out, err = run(["gate", "--op", OP, "--impl", "torch", "--skip", "lint", "--out", str(tmp_path)], capsys)
    assert code == EXIT_USAGE and "--skip: expected one of check, properties, budget, got 'lint'" in err
    code, out, err = run(["check", "--op", OP, "--impl", "torch", "--cases", "99"], capsys)
    assert code == EXIT_USAGE and "out of range" in err
