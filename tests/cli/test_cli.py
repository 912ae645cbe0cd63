"""Tests for the ``fuseval`` command line: ``check``, ``list`` and the error handling of
fuseval.cli (one clear message and an exit code from fuseval.errors, never a bare
traceback). Commands run in-process through ``fuseval.cli.main`` (fast); one test runs
the installed console script in a subprocess."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch

from fuseval import cli
from fuseval.errors import (EXIT_BAD_FILE, EXIT_BAD_OUTPUTS, EXIT_CHECK_FAILED, EXIT_HYGIENE, EXIT_IMPL_RAISED,
                            EXIT_IMPORT_ERROR, EXIT_INTERNAL, EXIT_NO_DEVICE, EXIT_NONFINITE, EXIT_OK,
                            EXIT_UNKNOWN_OPERATOR, EXIT_USAGE, BadFileError, FusevalError, ImplementationError,
                            NoDeviceError, UnknownOperatorError, UsageError)

OP_A = "qwen2vl_decoder_layer"
OP_B = "nvfp4_qkv_rope"


def fuseval(capsys, *argv):
    """Run ``fuseval argv...`` in-process; returns (exit code, stdout, stderr)."""
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_clean_error(err: str, *needles: str):
    """A user error: a one-line message from fuseval, no traceback."""
    assert "Traceback" not in err
    assert "error:" in err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"


def case_rows(table: str) -> list[int]:
    """Case numbers of the rows of the rich table printed by ``check``."""
    return [int(m.group(1)) for m in re.finditer(r"^│\s+(\d+)\s+│", table, flags=re.M)]


USER_MODULE = '''
import torch
from fuseval.operators.qwen2vl_decoder_layer.reference import torch_eager
from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager as torch_eager_b

def good(*x):
    return torch_eager(*x)

def good_b(*x):
    return torch_eager_b(*x)

def nan(*x):
    (out,) = torch_eager(*x)
    out[0, 0, 0] = float("nan")
    return (out,)

def boom(*x):
    raise RuntimeError("user kernel failed")

def wrong_shape(*x):
    return (torch_eager(*x)[0][..., :3],)

def two_outputs_b(*x):
    return torch_eager_b(*x)[:2]

def zeros(*x):
    return (torch.zeros_like(x[0]),)

def off(*x):
    return (torch_eager(*x)[0] + 0.01,)

def mutates(*x):
    out = torch_eager(*x)
    x[0].add_(1.0)
    return out

NOT_CALLABLE = 3
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A uniquely named module of user implementations, importable from tmp_path."""
    name = f"user_impl_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


# ------------------------------------------------------------------ check: passing runs
@pytest.mark.parametrize("op, label", [(OP_A, "kv_seq_len=512 seq_len=512 batch_size=1"),
                                       (OP_B, "seq_len=512 batch_size=1")])
def test_check_torch_small_passes_and_prints_a_per_case_table(capsys, op, label):
    rc, out, err = fuseval(capsys, "check", "--op", op, "--impl", "torch", "--config", "small")
    assert rc == EXIT_OK, out + err
    assert case_rows(out) == list(range(16))
    assert label in out                                 # the last case's axes
    assert out.count("pass") >= 16 and "FAIL" not in out
    assert f"{op}: 16/16 cases passed" in out
    assert "[16/16]" in err                             # progress lines go to stderr
    if op == OP_B:
        for name in ("query_states", "key_states", "value_states"):
            assert out.count(name) == 16


def test_check_cases_subset(capsys, tmp_path):
    report = tmp_path / "r.json"
    rc, out, _ = fuseval(capsys, "check", "--op", OP_B, "--impl", "torch", "--cases", "1,3-4",
                         "--json", str(report))
    assert rc == EXIT_OK
    assert case_rows(out) == [1, 3, 4]
    assert "3/3 cases passed" in out
    assert [c["case"] for c in json.loads(report.read_text())["cases"]] == [1, 3, 4]


def test_check_json_report(capsys, tmp_path):
    path = tmp_path / "sub" / "report.json"
    path.parent.mkdir()
    rc, _, _ = fuseval(capsys, "check", "--op", OP_A, "--impl", "torch_tf32", "--cases", "0,2",
                       "--seed", "3", "--mode", "realistic", "--json", str(path))
    assert rc == EXIT_OK
    data = json.loads(path.read_text())
    assert data["op"] == OP_A and data["impl"] == "torch_tf32" and data["config"] == "small"
    assert data["passed"] is True and data["seed"] == 3 and data["mode"] == "realistic"
    assert data["tolerance"]["atol"] == 4e-3
    assert [c["seed"] for c in data["cases"]] == [3, 5]
    out0 = data["cases"][0]["outputs"][0]
    assert out0["name"] == "output" and 0 < out0["max_abs"] < 4e-3 and out0["matched_ratio"] == 1.0


def test_check_user_function_from_module_path(capsys, user_module):
    rc, out, _ = fuseval(capsys, "check", "--op", OP_A, "--impl", f"{user_module}:good", "--cases", "0,5")
    assert rc == EXIT_OK
    assert f"impl={user_module}:good" in out


def test_check_user_function_found_through_the_working_directory(capsys, tmp_path, monkeypatch):
    name = f"cwd_impl_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        rc, _, err = fuseval(capsys, "check", "--op", OP_B, "--impl", f"{name}:good_b", "--cases", "0")
    finally:
        sys.modules.pop(name, None)
    assert rc == EXIT_OK, err


# ------------------------------------------------------------------ check: broken implementations
@pytest.mark.parametrize("op, function, code, needle", [
    (OP_A, "nan", EXIT_NONFINITE, "nonfinite"),
    (OP_A, "boom", EXIT_IMPL_RAISED, "user kernel failed"),
    (OP_A, "wrong_shape", EXIT_BAD_OUTPUTS, "(1, 8, 3)"),
    (OP_B, "two_outputs_b", EXIT_BAD_OUTPUTS, "2 outputs"),
    (OP_A, "zeros", EXIT_CHECK_FAILED, "all_zero"),
    (OP_A, "off", EXIT_CHECK_FAILED, "tolerance"),
    (OP_A, "mutates", EXIT_HYGIENE, "hidden_states"),
])
def test_check_broken_user_impl_exits_with_its_code(capsys, user_module, op, function, code, needle):
    rc, out, err = fuseval(capsys, "check", "--op", op, "--impl", f"{user_module}:{function}",
                           "--cases", "0")
    assert rc == code
    assert "FAIL" in out and "0/1 cases passed" in out
    assert needle in out
    assert "Traceback" not in out + err


def test_check_broken_impl_json_report_records_the_violation(capsys, tmp_path, user_module):
    path = tmp_path / "r.json"
    rc, _, _ = fuseval(capsys, "check", "--op", OP_A, "--impl", f"{user_module}:nan", "--cases", "2",
                       "--json", str(path))
    assert rc == EXIT_NONFINITE
    data = json.loads(path.read_text())
    assert data["passed"] is False and data["cases"][0]["violations"] == ["nonfinite"]


def test_no_hygiene_flag_skips_the_hygiene_rules(capsys, user_module):
    rc, _, _ = fuseval(capsys, "check", "--op", OP_A, "--impl", f"{user_module}:mutates", "--cases", "0",
                       "--no-hygiene")
    # without hygiene the input mutation is not reported as such (the oracle, computed after
    # the call, may still disagree with the output)
    assert rc != EXIT_HYGIENE
    rc, _, _ = fuseval(capsys, "check", "--op", OP_A, "--impl", f"{user_module}:good", "--cases", "0",
                       "--no-hygiene")
    assert rc == EXIT_OK


# ------------------------------------------------------------------ check: usage errors
def test_unknown_operator(capsys):
    rc, out, err = fuseval(capsys, "check", "--op", "qwen3_moe", "--impl", "torch")
    assert rc == EXIT_UNKNOWN_OPERATOR
    assert_clean_error(err, "unknown operator", "qwen3_moe", OP_A, OP_B)


@pytest.mark.parametrize("impl, needles", [
    ("no_such_module_q1w2:forward", ["no_such_module_q1w2"]),
    ("fuseval.refimpl.stages:no_such_function", ["no_such_function", "fuseval.refimpl.stages"]),
    ("fast_but_misspelled", ["fast_but_misspelled", "torch"]),          # not a name of the table
])
def test_bad_impl_path(capsys, impl, needles):
    rc, _, err = fuseval(capsys, "check", "--op", OP_A, "--impl", impl, "--cases", "0")
    assert rc == EXIT_IMPORT_ERROR
    assert_clean_error(err, *needles)


def test_impl_module_that_fails_to_import(capsys, tmp_path, monkeypatch):
    name = f"broken_impl_{uuid.uuid4().hex[:10]}"
    (tmp_path / f"{name}.py").write_text("def forward(*x:\n    pass\n")       # a syntax error
    monkeypatch.syspath_prepend(str(tmp_path))
    rc, _, err = fuseval(capsys, "check", "--op", OP_A, "--impl", f"{name}:forward", "--cases", "0")
    assert rc == EXIT_IMPORT_ERROR
    assert_clean_error(err, name, "SyntaxError")


def test_impl_that_is_not_callable(capsys, user_module):
    rc, _, err = fuseval(capsys, "check", "--op", OP_A, "--impl", f"{user_module}:NOT_CALLABLE")
    assert rc == EXIT_IMPORT_ERROR
    assert_clean_error(err, "not callable")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_device_cuda_without_a_gpu(capsys):
    rc, _, err = fuseval(capsys, "check", "--op", OP_A, "--impl", "torch", "--device", "cuda")
    assert rc == EXIT_NO_DEVICE
    assert_clean_error(err, "cuda", "no CUDA device")


@pytest.mark.parametrize("error, code", [
    (UnknownOperatorError("no such thing"), EXIT_UNKNOWN_OPERATOR),
    (NoDeviceError("nothing here"), EXIT_NO_DEVICE),
    (ImplementationError("cannot import module 'x'"), EXIT_IMPORT_ERROR),
    (BadFileError("budget.json: not valid JSON"), EXIT_BAD_FILE),
    (UsageError("--cases: case indices [99] are out of range"), EXIT_USAGE),
    (FusevalError("unknown operator mentioned, but the code says otherwise", EXIT_NONFINITE), EXIT_NONFINITE),
], ids=["unknown_operator", "no_device", "import", "bad_file", "usage", "explicit_code"])
def test_exit_code_follows_the_error_type_not_its_wording(capsys, monkeypatch, error, code):
    """Messages get reworded; the exit code a CI system branches on must not move with them."""
    from fuseval.commands import check as check_command

    def raising(args):
        raise error
    monkeypatch.setattr(check_command, "run", raising)
    rc, _, err = fuseval(capsys, "check", "--op", OP_A, "--impl", "torch")
    assert rc == code
    assert_clean_error(err, str(error))


@pytest.mark.parametrize("error", [
    ValueError("unknown operator mentioned, but a plain ValueError"),
    KeyError("query_states"),
    TypeError("unsupported operand"),
], ids=["value_error", "key_error", "type_error"])
def test_a_bug_in_fuseval_is_exit_70_with_a_traceback(capsys, monkeypatch, error):
    """Any exception that is not a FusevalError is fuseval's own bug, whatever its type or
    wording: a ValueError from fuseval's code is not the user's mistake."""
    from fuseval.commands import check as check_command

    def raising(args):
        raise error
    monkeypatch.setattr(check_command, "run", raising)
    rc, _, err = fuseval(capsys, "check", "--op", OP_A, "--impl", "torch")
    assert rc == EXIT_INTERNAL
    assert "Traceback" in err and "raising" in err and "bug in fuseval" in err
    assert type(error).__name__ in err


def test_a_bug_deep_in_a_command_is_exit_70_not_a_usage_error(capsys, monkeypatch):
    # the check itself (not the validation of the user's input) raises a ValueError:
    # before, every ValueError became a usage error
    fc = sys.modules["fuseval.check"]          # the module (fuseval.check is also the function)

    def buggy_check(*a, **k):
        raise ValueError("operands could not be broadcast together")
    monkeypatch.setattr(fc, "run_check", buggy_check)   # what the command runs, once its request is validated
    rc, _, err = fuseval(capsys, "check", "--op", OP_B, "--impl", "torch", "--cases", "0")
    assert rc == EXIT_INTERNAL and "Traceback" in err and "broadcast" in err


@pytest.mark.parametrize("argv, needles", [
    (["--cases", "99"], ["99", "out of range"]),
    (["--cases", "5-3"], ["5-3"]),
    (["--config", "bogus"], ["bogus", "small"]),
])
def test_usage_errors_exit_with_a_message(capsys, argv, needles):
    rc, _, err = fuseval(capsys, "check", "--op", OP_B, "--impl", "torch", *argv)
    assert rc == EXIT_USAGE
    assert_clean_error(err, *needles)


def test_argparse_errors_and_no_command(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["check", "--op", OP_A, "--impl", "torch", "--no-such-option"])
    assert e.value.code == EXIT_USAGE
    assert "--no-such-option" in capsys.readouterr().err
    rc, _, err = fuseval(capsys, "check", "--op", OP_A, "--impl", "torch", "--mode", "weird")
    assert rc == EXIT_USAGE and "--mode" in err and "weird" in err
    rc, out, _ = fuseval(capsys)
    assert rc == EXIT_USAGE and "check" in out and "list" in out


# ------------------------------------------------------------------ list
def test_list_in_process(capsys):
    rc, out, _ = fuseval(capsys, "list")
    assert rc == EXIT_OK and OP_A in out and OP_B in out
    rc, out, _ = fuseval(capsys, "list", "--op", OP_B, "--config", "small")
    assert rc == EXIT_OK
    assert "torch_cached" in out and "dequant" in out
    assert "case 15: seq_len=512 batch_size=1" in out
    rc, _, err = fuseval(capsys, "list", "--op", "nope")
    assert rc == EXIT_UNKNOWN_OPERATOR
    assert_clean_error(err, "nope")


def test_installed_console_script_lists_operators():
    script = shutil.which("fuseval", path=str(Path(sys.executable).parent)) or shutil.which("fuseval")
    assert script, "the fuseval console script is not installed"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([script, "list"], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert OP_A in done.stdout and OP_B in done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("op", [OP_A, OP_B])
def test_check_on_cuda(capsys, op):
    rc, out, err = fuseval(capsys, "check", "--op", op, "--impl", "torch", "--device", "cuda",
                           "--cases", "0,15")
    assert rc == EXIT_OK, out + err
    assert "device=cuda" in out and case_rows(out) == [0, 15]


def test_a_crashed_gate_component_is_exit_70_with_its_traceback(capsys, monkeypatch, tmp_path):
    # a ValueError inside a component is fuseval's bug, not "no CUDA device" nor a usage error
    from fuseval.gate import RUNNERS

    def crashing(ctx):
        raise ValueError("shape mismatch inside fuseval")
    monkeypatch.setitem(RUNNERS, "check", crashing)
    rc, out, err = fuseval(capsys, "gate", "--op", OP_B, "--impl", "torch", "--skip", "properties,budget",
                           "--cases", "0", "--seeds", "1", "--quiet", "--out", str(tmp_path))
    text = out + err
    assert rc == EXIT_INTERNAL and "GATE FAILED (exit code 70)" in " ".join(text.split())
    assert "Traceback" in text and "crashing" in text and "bug in fuseval" in text
    doc = json.loads((tmp_path / "gate.json").read_text())
    assert "Traceback" in doc["components"][0]["data"]["traceback"]


def test_the_command_line_starts_without_the_harness():
    # the parser of every command and `fuseval list` read data only: no torch, no Hypothesis
    # (the gate's profiles come from fuseval.gate.profiles; the gate package resolves the rest lazily)
    import subprocess
    import sys
    code = ("import io, contextlib, sys\nfrom fuseval.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    rc = main(['list'])\n"
            "print(rc, sorted(m for m in ('torch', 'hypothesis', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "0 []", out
