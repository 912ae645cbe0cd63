"""User mistakes and what the command line says about them: a usage error (exit 2) found
before any work, one line, no traceback; out of memory its own code; a closed pipe quiet;
an implementation's exception with its file and line, in ``check`` and ``baseline
compare`` (exit 12, not 14); ``check`` without ``--impl``; ``list`` showing what an
implementation receives; the in-process runner's own output rules (device, subclass,
partial caches). Every check here has an implementation or a command that breaks it."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from fuseval import cli
from fuseval.check import check, input_groups
from fuseval.operators import load
from fuseval.errors import (EXIT_BROKEN_PIPE, EXIT_HYGIENE, EXIT_IMPL_RAISED, EXIT_OK, EXIT_OUT_OF_MEMORY,
                            EXIT_USAGE)

OP = "nvfp4_qkv_rope"
OP_A = "qwen2vl_decoder_layer"

USER = textwrap.dedent('''
    import threading, time
    import torch
    from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager

    def good(*a):
        return torch_eager(*a)

    def raises(*a):
        x = torch_eager(*a)
        raise RuntimeError("kernel launch failed")   # RAISES_LINE

    def oom(*a):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def meta(*a):
        return tuple(o.to("meta") for o in torch_eager(*a))

    class Sub(torch.Tensor):
        pass

    def subclass(*a):
        return tuple(o.as_subclass(Sub) for o in torch_eager(*a))

    def thread(*a):
        threading.Thread(target=time.sleep, args=(3,), daemon=True).start()
        return torch_eager(*a)

    def exits(*a):
        raise SystemExit(0)

    _cache = {}
    def weights_cache(*a):
        key = tuple(float(t.double().sum()) if isinstance(t, torch.Tensor) else t for t in a[3:])
        if key not in _cache:
            _cache[key] = tuple(o.clone() for o in torch_eager(*a))
        return tuple(o.clone() for o in _cache[key])
''')
RAISES_LINE = next(i for i, line in enumerate(USER.splitlines(), 1) if "RAISES_LINE" in line)


@pytest.fixture
def user(tmp_path, monkeypatch):
    (tmp_path / "usage_user_kernels.py").write_text(USER)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def usage_error(rc, err, *needles):
    assert rc == EXIT_USAGE, err
    assert "Traceback" not in err and "error:" in err
    for n in needles:
        assert n in err, (n, err)
    assert "case 0" not in err          # found before any case ran


# ----------------------------------------------------------------- usage errors before work
@pytest.mark.parametrize("device", ["tpu", "meta", "cuda:x", "gpu"])
@pytest.mark.parametrize("command", ["check", "gate", "budget"])
def test_bad_device_is_a_usage_error(capsys, command, device):
    extra = ["--impl", "torch"] if command != "gate" else []
    rc, _, err = run(capsys, command, "--op", OP, *extra, "--device", device)
    usage_error(rc, err, f"--device: expected cpu, cuda or cuda:N, got {device!r}")
    assert len(err.strip().splitlines()) == 1


def test_unwritable_outputs_are_found_before_work(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    bad = str(blocker / "sub")                       # a path below a regular file
    usage_error(*run(capsys, "check", "--op", OP, "--impl", "torch", "--cases", "0", "--json", bad + "/r.json")[::2],
                "--json")
    usage_error(*run(capsys, "gate", "--op", OP, "--out", bad, "--quiet")[::2], "--out")
    usage_error(*run(capsys, "budget", "--op", OP, "--cases", "0", "--out", bad)[::2], "--out")
    usage_error(*run(capsys, "baseline", "compare", "--baseline", "x.json", "--markdown", bad + "/d.md")[::2],
                "--markdown")
    assert not (tmp_path / "r.json").exists()


def test_writable_outputs_still_work(tmp_path, capsys):
    path = tmp_path / "deeper" / "r.json"
    rc, out, err = run(capsys, "check", "--op", OP, "--impl", "torch", "--cases", "0", "--json", str(path),
                       "--no-predict")
    assert rc == EXIT_OK and path.exists()


@pytest.mark.parametrize("argv, needle", [
    (["gate", "--op", OP, "--seeds", "0"], ">= 1"),
    (["gate", "--op", OP, "--seeds", "-2"], ">= 1"),
    (["gate", "--op", OP, "--jobs", "0"], "--jobs: expected a number of processes >= 1"),
    (["gate", "--op", OP, "--jobs", "many"], "--jobs: expected a number of processes >= 1"),
    (["check", "--op", OP, "--impl", "torch", "--cases", ""], "empty"),
    (["check", "--op", OP, "--impl", "torch", "--cases", ","], "empty"),
    (["check", "--op", OP, "--impl", "torch", "--cases", "1,1"], "more than once"),
    (["check", "--op", OP, "--impl", "torch", "--cases", "0-3,2"], "more than once"),
    (["check", "--op", OP, "--impl", "torch", "--timeout", "-1"], ">= 0"),
    (["check", "--op", OP], "--impl"),
])
def test_argument_errors(capsys, argv, needle):
    try:
        rc = cli.main(argv)
    except SystemExit as exc:         # argparse's own: a required option missing
        rc = exc.code
    _, err = capsys.readouterr()
    assert rc == EXIT_USAGE and needle in err and "Traceback" not in err


def test_a_gate_that_would_run_nothing(capsys):
    usage_error(*run(capsys, "gate", "--op", OP, "--skip", "check,properties,budget", "--quiet")[::2], "nothing")
    from fuseval.errors import FusevalError
    from fuseval.gate import run_gate
    with pytest.raises(FusevalError, match="nothing"):
        run_gate(OP, "torch", components=[])
    with pytest.raises(FusevalError, match=">= 1"):
        run_gate(OP, "torch", seeds=0, components=["check"])


def test_python_api_rejects_empty_and_duplicate_selections():
    for bad in ([], [1, 1], "", " , "):
        with pytest.raises(ValueError, match="case selection"):
            check(OP, "torch", cases=bad)


# ----------------------------------------------------------------- pipe, out of memory
def test_closed_pipe_ends_quietly():
    # the command starts writing only once the reader has gone (like `| head -1` that
    # already has its line): the write end of the pipe then polls POLLERR. Without the
    # wait this would race: a short listing can be written whole before the reader closes
    code = textwrap.dedent(f"""
        import select, sys
        from fuseval import cli
        print("ready", flush=True)
        waiting = select.poll()
        waiting.register(sys.stdout.fileno(), select.POLLERR)
        waiting.poll(60_000)
        sys.exit(cli.main(['list', '--op', {OP!r}]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    proc.stdout.close()                 # the reader goes away
    err = proc.stderr.read().decode()
    assert proc.wait(60) == EXIT_BROKEN_PIPE
    assert "Traceback" not in err and "BrokenPipe" not in err and "internal error" not in err


def test_out_of_memory_in_fuseval_has_its_own_code(capsys, monkeypatch):
    fc = sys.modules["fuseval.check"]

    def no_memory(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:118] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 68719476736 bytes.")
    monkeypatch.setattr(fc, "run_check", no_memory)     # what the command runs, once its request is validated
    rc, out, err = run(capsys, "check", "--op", OP, "--impl", "torch")
    assert rc == EXIT_OUT_OF_MEMORY and "68719476736 bytes" in err and "Traceback" not in err


@pytest.mark.parametrize("isolated", [True, False])
def test_out_of_memory_in_the_implementation(user, capsys, monkeypatch, isolated, isolation_default):
    from fuseval.runner import isolation
    isolation_default(isolated)
    rc, out, err = run(capsys, "check", "--op", OP, "--impl", "usage_user_kernels:oom", "--cases", "0", "--no-predict")
    assert rc == EXIT_OUT_OF_MEMORY and "out_of_memory" in out + err and "2.00 GiB" in out + err


# ----------------------------------------------------------------- where an implementation raised
@pytest.mark.parametrize("isolated", [True, False])
def test_exception_is_shown_with_file_and_line(user, capsys, monkeypatch, isolated, isolation_default):
    from fuseval.runner import isolation
    isolation_default(True)          # --in-process below turns it off
    rc, out, err = run(capsys, "check", "--op", OP, "--impl", "usage_user_kernels:raises", "--cases", "0",
                       "--no-predict", "--json", str(user / "r.json"), *([] if isolated else ["--in-process"]))
    assert rc == EXIT_IMPL_RAISED
    where = f"usage_user_kernels.py:{RAISES_LINE}"
    assert where in (user / "r.json").read_text()
    assert "kernel launch failed" in (user / "r.json").read_text()


def test_baseline_compare_reports_the_exception_not_a_regression(user, tmp_path, capsys, monkeypatch, isolation_default):
    from fuseval.runner import isolation
    isolation_default(True)
    (user / "usage_user_kernels2.py").write_text(USER.replace("def raises(", "def raises_real(")
                                                 .replace("def good(", "def raises("))
    base = tmp_path / "b.json"
    rc, out, err = run(capsys, "baseline", "save", "--op", OP, "--impl", "usage_user_kernels2:raises", "--cases",
                       "0", "--out", str(base), "--no-stages")
    assert rc == EXIT_OK, err
    rc, out, err = run(capsys, "baseline", "compare", "--baseline", str(base), "--impl",
                       "usage_user_kernels:raises")
    assert rc == EXIT_IMPL_RAISED, (rc, out[-1500:], err[-1500:])
    assert f"usage_user_kernels.py:{RAISES_LINE}" in err and "kernel launch failed" in err


# ----------------------------------------------------------------- list and the skeleton
def test_list_says_what_arrives(capsys):
    rc, out, err = run(capsys, "list", "--op", OP, "--config", "small")
    assert rc == EXIT_OK
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("q_proj_weight_fp4:"))
    assert "uint8" in line and "(64, 32)" in line            # small: q_size 64, hidden 64 / 2
    assert "Python float" in next(ln for ln in out.splitlines() if ln.strip().startswith("rms_norm_eps:"))
    assert "(batch_size, seq_len, 64)" in next(ln for ln in out.splitlines()
                                               if ln.strip().startswith("hidden_states:"))
    rc, full, _ = run(capsys, "list", "--op", OP)
    assert "(batch_size, seq_len, 4096)" in full or "4096" in full


def test_skeleton_is_python_with_the_inputs_in_order(capsys):
    rc, out, err = run(capsys, "list", "--op", OP_A, "--config", "small", "--skeleton")
    assert rc == EXIT_OK
    tree = ast.parse(out)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
    assert [a.arg for a in fn.args.args] == load(OP_A).input_names
    assert out.rstrip().endswith("return output")
    with pytest.raises(SystemExit) as exc:
        cli.main(["list", "--skeleton", "--config", "small", "--op"])
    assert exc.value.code == EXIT_USAGE


# ----------------------------------------------------------------- in-process output rules
@pytest.mark.parametrize("impl, violation", [("meta", "wrong_device"), ("subclass", "bad_outputs"),
                                             ("thread", "lingering_thread"), ("exits", "exited"),
                                             ("weights_cache", "cached_result")])
def test_in_process_rules(user, impl, violation):
    report = check(OP, f"usage_user_kernels:{impl}", cases="0", isolate=False, predict=False)
    assert violation in report.cases[0].violations and not report.passed
    good = check(OP, "usage_user_kernels:good", cases="0", isolate=False, predict=False)
    assert good.passed


def test_input_groups_split_activations_from_weights():
    g = input_groups(load(OP))
    names = load(OP).input_names
    assert [names[i] for i in g["activations"]] == ["hidden_states", "cos", "sin"]
    assert "rms_norm_eps" not in [names[i] for i in g["weights"]]       # a fixed value: never redrawn
    assert "q_proj_global_decode_scale" in [names[i] for i in g["weights"]]
    ga = input_groups(load(OP_A))
    assert [load(OP_A).input_names[i] for i in ga["activations"]] == ["hidden_states", "rope_cos", "rope_sin"]


# ----------------------------------------------------------------- the error type
def test_fuseval_error_carries_its_exit_code():
    from fuseval.errors import (EXIT_BAD_FILE, EXIT_IMPORT_ERROR, EXIT_NO_DEVICE, EXIT_UNKNOWN_OPERATOR,
                                BadFileError, FusevalError, ImplementationError, NoDeviceError,
                                UnknownOperatorError, UsageError)
    assert FusevalError("x").exit_code == EXIT_USAGE
    assert FusevalError("x", EXIT_OUT_OF_MEMORY).exit_code == EXIT_OUT_OF_MEMORY
    for kind, code in ((UsageError, EXIT_USAGE), (UnknownOperatorError, EXIT_UNKNOWN_OPERATOR),
                       (ImplementationError, EXIT_IMPORT_ERROR), (BadFileError, EXIT_BAD_FILE),
                       (NoDeviceError, EXIT_NO_DEVICE)):
        err = kind("message")
        assert err.exit_code == code and str(err) == "message"
        assert isinstance(err, FusevalError) and isinstance(err, ValueError)   # the Python API's bad input
    with pytest.raises(TypeError, match="exit_code"):
        FusevalError("x", "2")


def test_user_input_converts_only_value_errors_inside_it():
    from fuseval.errors import EXIT_BAD_FILE, FusevalError, UsageError, user_input
    with pytest.raises(UsageError) as e:
        with user_input("--config"):
            raise ValueError("unknown config 'bogus'")
    assert e.value.exit_code == EXIT_USAGE and str(e.value) == "--config: unknown config 'bogus'"
    with pytest.raises(FusevalError) as e:
        with user_input("--budget", EXIT_BAD_FILE):
            raise ValueError("--budget x.json: not valid JSON")
    assert e.value.exit_code == EXIT_BAD_FILE and str(e.value) == "--budget x.json: not valid JSON"
    known = FusevalError("already known", EXIT_OUT_OF_MEMORY)
    with pytest.raises(FusevalError) as e:
        with user_input("--config"):
            raise known
    assert e.value is known
    with pytest.raises(KeyError):                # not a statement about the user's input
        with user_input("--config"):
            raise KeyError("stage")


def test_a_validation_error_of_the_library_becomes_a_usage_error_only_at_validation(capsys):
    # `--config` validated before any work: usage error naming the option
    rc, out, err = run(capsys, "check", "--op", OP, "--impl", "torch", "--config", '{"no_such_axis": 3}')
    usage_error(rc, err, "--config", "no_such_axis")
    rc, out, err = run(capsys, "export", "--op", OP, "--config", "bogus")
    usage_error(rc, err, "--config", "bogus")
    rc, out, err = run(capsys, "budget", "--op", OP, "--cases", "99")
    usage_error(rc, err, "--cases", "out of range")
    rc, out, err = run(capsys, "check", "--op", OP, "--impl", "reference", "--cases", "0")
    usage_error(rc, err, "'reference' is the float64 oracle", "reference_fp32")


def test_a_replay_file_that_does_not_fit_is_a_usage_error(tmp_path, capsys):
    """--replay of an unreadable file, or of a case of another configuration: one line
    naming --replay and the file, the usage exit code, no traceback."""
    from fuseval.inputs import generate_inputs, save_inputs
    defn = load(OP, "small")
    path = save_inputs(str(tmp_path / "case.pt"), defn, generate_inputs(defn, defn.cases([0])[0].axes, seed=3),
                       case=0, seed=3, mode="benchmark", config="small", variant=defn.variant)
    for argv, needle in ((["--config", "tiny", "--replay", path], "holds a case of config 'small'"),
                         (["--replay", str(tmp_path / "missing.pt")], "cannot be read")):
        code = cli.main(["check", "--op", OP, "--impl", "torch", *argv])
        _, err = capsys.readouterr()
        assert code == EXIT_USAGE and "--replay: inputs file" in err and needle in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
