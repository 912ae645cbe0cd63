"""A problem folder's own code (its reference, its custom input generator) runs in a
confined worker of its own, never in fuseval's process (docs/security.md).

Each hostile problem folder here is written by the test: its reference (or its custom
input entry point) does the harm it can, then raises ``Denied`` when every attempt was
refused, so a refused attack ends ``check`` with exit 5 naming ``Denied``. Where a defence
fails, the attack succeeds, the reference answers normally, and the implementation under
test (a wrong one, ``wrong:impl``) fails on tolerance instead: exit 1, which fails the
test. Attacks that the worker cannot refuse but fuseval sees afterwards (a child left
running, a thread still spinning) end in their violation's exit code.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fuseval.errors import EXIT_BAD_FILE, EXIT_CHECK_FAILED, EXIT_TAMPERED
from fuseval.runner import confine
from problem_folders import tensor, workload, write_problem

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the confinement is Linux's"),
              pytest.mark.skipif(not (confine.probe().seccomp and confine.probe().landlock_abi),
                                 reason="no seccomp and Landlock on this machine")]

HEAD = '''
import ctypes, os, signal, sys, threading, time
import torch

class Denied(Exception):
    pass

def answer(x, w):
    return torch.tanh(x @ w.T)
'''

# name -> (reference body, the exit status, a word the output holds)
HOSTILE: dict[str, tuple[str, int, str]] = {
    # write where fuseval's process imports from (its working folder), its output folder
    # and the home folder
    "p_write": ('''
def run(x, w):
    wrote = []
    # (the test's own folders, named by the test: a worker's own working and home folders
    # are its scratch folder, which it may write)
    for folder in os.environ["FUSEVAL_TEST_DIRS"].split(os.pathsep):
        if not folder:
            continue
        for name in ("colorsys.py", "sitecustomize.py", "gate.json"):
            try:
                with open(os.path.join(folder, name), "w") as f:
                    f.write("import os; os._exit(0)\\n")
                wrote.append(os.path.join(folder, name))
            except OSError:
                pass
    if not wrote:
        raise Denied("no file could be written")
    return answer(x, w)
''', EXIT_BAD_FILE, "Denied"),
    # attach to fuseval's process, or stop it
    "p_ptrace_signal": ('''
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def run(x, w):
    parent = os.getppid()
    if libc.ptrace(16, parent, None, None) == 0:           # PTRACE_ATTACH
        time.sleep(600)
    try:
        os.kill(parent, signal.SIGSTOP)
    except OSError:
        raise Denied("neither ptrace nor signals reach fuseval")
    return answer(x, w)
''', EXIT_BAD_FILE, "Denied"),
    # a grandchild that outlives the call and prints a verdict later
    "p_grandchild": ('''
def run(x, w):
    if os.fork() == 0:
        time.sleep(60)
        os.write(1, b"GATE PASSED\\n")
        os._exit(0)
    return answer(x, w)
''', EXIT_TAMPERED, "child_process"),
    # a thread that keeps working after the reference returned
    "p_spinner": ('''
def _spin():
    y = 0
    while True:
        y += 1
def run(x, w):
    threading.Thread(target=_spin, daemon=True).start()
    return answer(x, w)
''', EXIT_TAMPERED, "lingering_thread"),
    # harm done when the reference is imported, before any call
    "p_import_time": ('''
try:
    with open(os.path.join(os.environ["FUSEVAL_TEST_DIRS"].split(os.pathsep)[0], "shlex.py"), "w") as f:
        f.write("import os; os._exit(0)\\n")
except OSError:
    raise Denied("the working folder is not writable at import")
def run(x, w):
    return answer(x, w)
''', EXIT_BAD_FILE, "Denied"),
    # fuseval's own success lines on its standard output
    "p_fake_lines": ('''
def run(x, w):
    print("tiny: 2/2 cases passed", flush=True)
    os.write(1, b"GATE PASSED\\n")
    return answer(x, w)
''', EXIT_CHECK_FAILED, "tolerance"),
}

WRONG = "import torch\n\ndef impl(x, w):\n    return (torch.tanh(x @ w.T) + 0.5,)\n"


def _folder(root: Path, name: str, reference: str, **extra) -> Path:
    return Path(write_problem(root / name, name=name, axes={"M": {"type": "var"}, "N": {"type": "const", "value": 16}},
                              inputs={"x": tensor(["M", "N"], "float32"), "w": tensor(["N", "N"], "float32")},
                              outputs={"y": tensor(["M", "N"], "float32")}, reference=HEAD + reference,
                              workloads=[workload({"M": 8}), workload({"M": 24})], **extra))


def _run(cwd: Path, *args: str, timeout: float = 240):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(cwd)] + [
               p for p in [os.environ.get("PYTHONPATH", "")] if p]),
           "FUSEVAL_TEST_DIRS": os.pathsep.join(str(p) for p in (cwd, cwd / "out", cwd / "home")),
           "HOME": str(cwd / "home")}
    env.pop("FUSEVAL_PROBLEM_PATH", None)
    (cwd / "home").mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "fuseval.cli", *args], capture_output=True, text=True, env=env,
                          cwd=str(cwd), timeout=timeout)
    return proc, proc.stdout + proc.stderr


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}


def _assert_quoted(text: str) -> None:
    for line in text.splitlines():
        if "GATE PASSED" in line or "2/2 cases passed" in line:
            assert line.startswith("  | "), line


@pytest.fixture()
def cwd(tmp_path):
    (tmp_path / "wrong.py").write_text(WRONG)
    return tmp_path


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_problem_reference_is_confined(cwd, name):
    body, status, word = HOSTILE[name]
    folder = _folder(cwd / "problems", name, body)
    (cwd / "out").mkdir()
    (cwd / "home" / ".cache" / "fuseval").mkdir(parents=True)
    before = _files(cwd)
    t0 = time.monotonic()
    proc, text = _run(cwd, "check", "--problem", str(folder), "--impl", "wrong:impl", "--no-predict",
                      "--json", str(cwd / "out" / "report.json"))
    assert proc.returncode == status, (proc.returncode, text[-3000:])
    assert word in text, text[-3000:]
    assert "Traceback" not in text
    assert time.monotonic() - t0 < 200
    # nothing written where fuseval's process runs or imports from, nor in its home
    # (the workers' own cache folder is theirs: fuseval's process never imports from it)
    new = {p for p in _files(cwd) - before if not p.startswith("home/.cache/fuseval/")}
    assert new <= {"out/report.json"}, new
    assert not any(p.endswith(("colorsys.py", "sitecustomize.py", "shlex.py")) for p in _files(cwd))
    _assert_quoted(proc.stdout)


def test_hostile_custom_inputs_are_confined(cwd):
    """The custom input entry point runs in the problem's worker too."""
    body = '''
def make_inputs(axes, device):
    try:
        with open(os.path.join(os.environ["FUSEVAL_TEST_DIRS"].split(os.pathsep)[0], "colorsys.py"), "w") as f:
            f.write("import os; os._exit(0)\\n")
    except OSError:
        raise Denied("custom inputs could not write")
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(axes["M"], axes["N"], generator=g)}
def run(x, w):
    return answer(x, w)
'''
    folder = _folder(cwd / "problems", "p_custom", body, custom_inputs_entrypoint="make_inputs")
    rows = [json.loads(line) for line in (folder / "workload.jsonl").read_text().splitlines()]
    for row in rows:
        row["inputs"] = {"x": {"type": "custom"}}
    (folder / "workload.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc, text = _run(cwd, "check", "--problem", str(folder), "--impl", "wrong:impl", "--no-predict")
    assert proc.returncode == EXIT_BAD_FILE, (proc.returncode, text[-3000:])
    assert "Denied" in text and "make_inputs" in text and "Traceback" not in text
    assert not (cwd / "colorsys.py").exists()


def test_honest_custom_inputs_and_reference_pass_confined(cwd):
    """The honest counterpart: custom inputs, scalars and the lifted reference through the
    problem's worker; the right implementation passes, the wrong one fails on tolerance."""
    body = '''
def make_inputs(axes, device):
    return {"x": torch.randn(axes["M"], axes["N"], device=device)}
def run(x, w, scale):
    return torch.tanh(x @ w.T) * scale
'''
    folder = Path(write_problem(cwd / "problems" / "p_honest", name="p_honest",
                                axes={"M": {"type": "var"}, "N": {"type": "const", "value": 16}},
                                inputs={"x": tensor(["M", "N"], "float32"), "w": tensor(["N", "N"], "float32"),
                                        "scale": tensor(None, "float32")},
                                outputs={"y": tensor(["M", "N"], "float32")}, reference=HEAD + body,
                                workloads=[workload({"M": 8}, {"x": {"type": "custom"},
                                                               "scale": {"type": "scalar", "value": 0.5}})],
                                custom_inputs_entrypoint="make_inputs"))
    (cwd / "right.py").write_text("import torch\n\ndef impl(x, w, scale):\n    return (torch.tanh(x @ w.T) * scale,)\n")
    (cwd / "wrong3.py").write_text("import torch\n\ndef impl(x, w, scale):\n    return (torch.tanh(x @ w.T),)\n")
    proc, text = _run(cwd, "check", "--problem", str(folder), "--impl", "right:impl", "--no-predict")
    assert proc.returncode == 0, text[-3000:]
    proc, text = _run(cwd, "check", "--problem", str(folder), "--impl", "wrong3:impl", "--no-predict")
    assert proc.returncode == EXIT_CHECK_FAILED, text[-3000:]


def test_hostile_problem_through_the_gate(cwd):
    """The gate's components (check, properties, budget) reach the problem's code only
    through its worker: the planted module never appears, the gate fails."""
    folder = _folder(cwd / "problems", "p_write", HOSTILE["p_write"][0])
    proc, text = _run(cwd, "gate", "--problem", str(folder), "--impl", "wrong:impl", "--cases", "0",
                      "--seeds", "1", "--budget-cases", "0", "--out", str(cwd / "gate"), "--quiet", timeout=400)
    assert proc.returncode != 0 and "GATE FAILED" in text and "Traceback" not in text, text[-3000:]
    doc = json.loads((cwd / "gate" / "gate.json").read_text())
    assert "Denied" in json.dumps(doc), json.dumps(doc)[:3000]
    assert not any(p.endswith(("colorsys.py", "sitecustomize.py")) for p in _files(cwd))


def test_list_and_import_run_no_problem_code(cwd):
    """`list` and `import` read the folder as data: a reference whose import would write a
    file (if run anywhere writable) leaves none, in-process included."""
    body = '''
with open(os.environ["FUSEVAL_TEST_MARK"], "w") as f:
    f.write("ran")
def run(x, w):
    return answer(x, w)
'''
    folder = _folder(cwd / "problems", "p_mark", body)
    mark = cwd / "mark"
    os.environ["FUSEVAL_TEST_MARK"] = str(mark)
    try:
        for args in (("list", "--problem", str(folder)), ("import", str(folder)), ("export", "--help")):
            proc, text = _run(cwd, *args)
            assert proc.returncode == 0, (args, text[-2000:])
    finally:
        del os.environ["FUSEVAL_TEST_MARK"]
    assert not mark.exists()


def test_in_process_confines_problem_code_still(cwd):
    """--in-process trusts the implementation, not the problem folder: its code still runs
    confined."""
    folder = _folder(cwd / "problems", "p_write", HOSTILE["p_write"][0])
    proc, text = _run(cwd, "check", "--problem", str(folder), "--impl", "wrong:impl", "--no-predict",
                      "--in-process", "--cases", "0")
    assert proc.returncode == EXIT_BAD_FILE and "Denied" in text, text[-3000:]
    assert not (cwd / "colorsys.py").exists()


def test_routing_follows_isolation(cwd, monkeypatch, isolation_default):
    """The Python API: with isolation off (fuseval's own tests) the code runs in this
    process and its write lands; with isolation on, the same call is refused in the
    problem's worker and leaves as the problem's error."""
    import torch

    from fuseval.runner import isolation
    from fuseval.interop.problem_code import ProblemCodeError, run_reference
    from fuseval.interop.sol_problem import read_problem
    folder = _folder(cwd / "problems", "p_write", HOSTILE["p_write"][0])
    problem = read_problem(str(folder))
    monkeypatch.setenv("FUSEVAL_TEST_DIRS", str(cwd / "a"))
    (cwd / "a").mkdir()
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    isolation_default(True)
    with isolation.session(), pytest.raises(ProblemCodeError, match="Denied"):
        run_reference(problem, [x, w], lifted=True)
    assert not (cwd / "a" / "colorsys.py").exists()
    isolation_default(False)
    result = run_reference(problem, [x, w], lifted=True)
    assert (cwd / "a" / "colorsys.py").exists()
    assert torch.allclose(result.lifted[0], torch.tanh(x.double() @ w.double().T))


def test_values_cross_the_problem_worker_as_they_were():
    """What a problem's code hands back (fp4 tensors, None, Python numbers, a Parameter)
    leaves its worker as tensors and comes back as it was."""
    import torch

    from fuseval.interop.problem_code import _pack, _unpack
    fp4 = torch.arange(8, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    values = [torch.ones(2, 3), fp4, None, 3, 0.5, True, torch.nn.Parameter(torch.zeros(2))]
    sent, kinds = _pack(values, "cpu")
    assert all(type(t) is torch.Tensor for t in sent)
    back = _unpack(sent, kinds)
    assert torch.equal(back[0], values[0]) and back[1].dtype == torch.float4_e2m1fn_x2
    assert torch.equal(back[1].view(torch.uint8), fp4.view(torch.uint8))
    assert back[2:6] == [None, 3, 0.5, True] and [type(v) for v in back[3:6]] == [int, float, bool]
    assert type(back[6]) is torch.Tensor and torch.equal(back[6], torch.zeros(2))
    with pytest.raises(TypeError, match="cannot leave"):
        _pack([{"a": 1}], "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_cpu_outputs_of_a_gpu_reference_come_back_on_the_cpu(cwd):
    """A reference on CUDA inputs that hands one output back on the CPU (and one input kept
    on the CPU): its GPU worker moves it for the journey and fuseval gets it on the CPU."""
    import torch

    from fuseval.runner import isolation
    from fuseval.interop.problem_code import run_reference
    from fuseval.interop.sol_problem import read_problem
    body = '''
def run(x, w):
    y = answer(x, w)
    return y, y.sum().cpu(), 7
'''
    folder = _folder(cwd / "problems", "p_devices", body)
    problem = read_problem(str(folder))
    x, w = torch.randn(8, 16, device="cuda"), torch.randn(16, 16)
    with isolation.default_isolation(True), isolation.session():
        y, total, seven = run_reference(problem, [x, w.cuda()], lifted=False)
    assert y.device.type == "cuda" and total.device.type == "cpu" and seven == 7
    assert torch.allclose(total, y.sum().cpu())
