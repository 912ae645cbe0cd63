"""Hostile implementations: each tries to pass without computing the operator, or to take
fuseval's verdict or process down with it. Every one must be rejected with a named
violation and a non-zero exit code through ``fuseval check``, ``fuseval gate`` and the
pytest plugin's gate items, and pass nothing through the budget.

The hostile modules are written to a temporary folder and named as a user would
(``module:function``). They are never imported into this test process: by default the
implementation runs in a worker process of its own (fuseval.runner.isolation), and that is what is
under test. (Importing one here would patch this very process.) The checks are also shown
to be needed: the in-process runs in a subprocess, where the same tricks succeed.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fuseval import cli
from fuseval.errors import (EXIT_BAD_OUTPUTS, EXIT_CHECK_FAILED, EXIT_HYGIENE, EXIT_IMPL_DIED, EXIT_OK,
                            EXIT_TAMPERED, EXIT_TIMEOUT, VIOLATION_EXIT)

pytest_plugins = ["pytester"]

OP = "nvfp4_qkv_rope"
TIMEOUT = "2"           # seconds per case for these runs: the sleeper sleeps far longer

COMMON = '''
import torch
from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager

def noise(*a):
    # noise that depends on the inputs (noise that does not is also a cached result)
    total = sum(float(t.double().abs().sum()) for t in a if isinstance(t, torch.Tensor))
    g = torch.Generator().manual_seed(int(total * 1000) % (2 ** 31))
    return tuple(torch.randn(o.shape, generator=g).to(o.dtype) for o in torch_eager(*a))
'''

# module name -> (source, the violation it must be rejected with)
HOSTILE: dict[str, tuple[str, str]] = {
    # replaces fuseval's comparison at import time, returns noise
    "hostile_patch_compare": ('''
import sys
fc = sys.modules["fuseval.check"]      # (fuseval.check is also the name of the function)
_real = fc.compare
def _always(out, ref, tol, name="output", rules="fuseval"):
    m = _real(ref.to(out.dtype), ref, tol, name, rules)
    return m
fc.compare = _always

def impl(*a):
    return noise(*a)
''', "tampered"),
    # makes every subtraction return zeros, at call time
    "hostile_patch_sub": ('''
def impl(*a):
    torch.Tensor.__sub__ = lambda self, other: torch.zeros_like(self)
    return noise(*a)
''', "tampered"),
    # looks for the oracle's outputs in its callers' frames; noise when there is none
    "hostile_frames": ('''
import sys
def impl(*a):
    f = sys._getframe(1)
    while f is not None:
        refs = f.f_locals.get("refs")
        if isinstance(refs, tuple) and len(refs) == 3:
            return tuple(r.to(torch.bfloat16).clone() for r in refs)
        f = f.f_back
    return noise(*a)
''', "tolerance"),
    # ends the check with status 0
    "hostile_sys_exit": ('''
import sys
def impl(*a):
    sys.exit(0)
''', "exited"),
    # ends its process with status 0 from inside the call
    "hostile_os_exit": ('''
import os
def impl(*a):
    os._exit(0)
''', "exited"),
    # turns any failing exit status into 0 when the process ends; returns noise
    "hostile_atexit": ('''
import atexit, os
atexit.register(lambda: os._exit(0))
def impl(*a):
    return noise(*a)
''', "tolerance"),
    # dies by a signal
    "hostile_signal": ('''
import os, signal
def impl(*a):
    os.kill(os.getpid(), signal.SIGKILL)
''', "crashed"),
    # hangs
    "hostile_sleep": ('''
import time
def impl(*a):
    time.sleep(120)
    return torch_eager(*a)
''', "timeout"),
    # correct, but caches the answer under the weights only (a second call with new
    # activations and the same weights returns the first answer)
    "hostile_weights_cache": ('''
_cache = {}
def impl(*a):
    key = tuple(float(t.double().sum()) if isinstance(t, torch.Tensor) else t for t in a[3:])
    if key not in _cache:
        _cache[key] = tuple(o.clone() for o in torch_eager(*a))
    return tuple(o.clone() for o in _cache[key])
''', "cached_result"),
    # the same, keyed on the activations only
    "hostile_activations_cache": ('''
_cache = {}
def impl(*a):
    key = tuple(float(t.double().sum()) for t in a[:3])
    if key not in _cache:
        _cache[key] = tuple(o.clone() for o in torch_eager(*a))
    return tuple(o.clone() for o in _cache[key])
''', "cached_result"),
    # answers on another device (the oracle used to be moved to the output's device)
    "hostile_wrong_device": ('''
def impl(*a):
    return tuple(o.to("meta") for o in torch_eager(*a))
''', "wrong_device"),
    # leaves a thread running that could write into the outputs after the check read them
    "hostile_thread": ('''
import threading, time
def impl(*a):
    out = torch_eager(*a)
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    return out
''', "lingering_thread"),
    # returns a tensor subclass whose comparisons it controls
    "hostile_subclass": ('''
class Liar(torch.Tensor):
    def __sub__(self, other):
        return torch.zeros_like(other)
def impl(*a):
    return tuple(o.as_subclass(Liar) for o in torch_eager(*a))
''', "bad_outputs"),
}

# honest bugs that the isolated runner must see as the in-process one does: aliasing is
# judged from the worker's storages, mutation through the shared input memory, reuse from a
# second copy of the first answer taken after the later calls
BUGS: dict[str, tuple[str, str | None]] = {
    "bug_alias": ('''
def impl(*a):
    q, k, v = torch_eager(*a)
    alias = a[0].view(-1)[:v.numel()].view(v.shape)     # value_states written into hidden_states
    alias.copy_(v)
    return q, k, alias
''', "aliased_output"),
    "bug_mutates": ('''
def impl(*a):
    out = torch_eager(*a)
    a[1].add_(1.0)
    return out
''', "mutated_input"),
    "bug_reuses": ('''
_buf = []
def impl(*a):
    out = torch_eager(*a)
    if not _buf:
        _buf.extend(o.clone() for o in out)
    for b, o in zip(_buf, out):
        b.copy_(o)
    return tuple(_buf)
''', "output_reused"),
    "bug_good": ('''
def impl(*a):
    return torch_eager(*a)
''', None),
}

EXIT_OF = dict(VIOLATION_EXIT)


@pytest.fixture(autouse=True)
def _isolated_by_default(isolation_default):
    """The product's default (the suite's conftest runs other tests in-process)."""
    isolation_default(True)


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    for name, (source, _) in {**HOSTILE, **BUGS}.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(COMMON) + textwrap.dedent(source))
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    from fuseval.runner import isolation
    isolation.close_all()


def test_the_table_is_honest():
    """Every violation named here exists and has an exit code other than 0."""
    for name, (_, violation) in HOSTILE.items():
        assert violation in EXIT_OF, name
        assert EXIT_OF[violation] != EXIT_OK
    assert EXIT_OF["tampered"] == EXIT_TAMPERED and EXIT_OF["timeout"] == EXIT_TIMEOUT
    assert EXIT_OF["exited"] == EXIT_OF["crashed"] == EXIT_IMPL_DIED
    assert EXIT_OF["wrong_device"] == EXIT_BAD_OUTPUTS and EXIT_OF["cached_result"] == EXIT_HYGIENE


@pytest.mark.parametrize("name", list(HOSTILE))
def test_check_rejects(hostile_dir, capsys, name):
    violation = HOSTILE[name][1]
    rc = cli.main(["check", "--op", OP, "--impl", f"{name}:impl", "--cases", "0", "--timeout", TIMEOUT,
                   "--no-predict"])
    out, err = capsys.readouterr()
    assert rc == EXIT_OF[violation], (rc, out[-2000:], err[-2000:])
    assert violation in out + err
    assert "Traceback" not in out + err


@pytest.mark.parametrize("name", list(BUGS))
def test_isolated_hygiene_rules(hostile_dir, name):
    from fuseval.check import check
    report = check(OP, f"{name}:impl", cases="0", predict=False)
    assert report.isolated
    expected = BUGS[name][1]
    if expected is None:
        assert report.passed, report.cases[0].messages
    else:
        assert expected in report.cases[0].violations, report.cases[0].messages


@pytest.mark.parametrize("name", list(HOSTILE))
def test_gate_rejects_and_budget_passes_nothing(hostile_dir, tmp_path, capsys, name):
    violation = HOSTILE[name][1]
    out_dir = tmp_path / "gate"
    rc = cli.main(["gate", "--op", OP, "--impl", f"{name}:impl", "--skip", "properties", "--cases", "0",
                   "--seeds", "1", "--budget-cases", "0", "--timeout", TIMEOUT, "--out", str(out_dir), "--quiet"])
    out, err = capsys.readouterr()
    assert rc == EXIT_OF[violation], (rc, out[-3000:], err[-2000:])
    assert "GATE FAILED" in out and "Traceback" not in out + err
    doc = json.loads((out_dir / "gate.json").read_text())
    status = {c["name"]: c for c in doc["components"]}
    assert status["check"]["status"] == "fail"
    assert violation in json.dumps(status["check"]["data"]["failures"])
    assert status["budget"]["status"] == "fail", status["budget"]["summary"]


def test_plugin_items_reject_every_one(hostile_dir, pytester):
    args = [f"--fuseval-gate={OP}={name}:impl" for name in HOSTILE]
    pytester.syspathinsert(hostile_dir)
    pytester.makepyfile(test_nothing="def test_nothing():\n    pass\n")
    import importlib.metadata
    registered = any(ep.name == "fuseval" and ep.value == "fuseval.pytest_plugin"
                     for ep in importlib.metadata.entry_points(group="pytest11"))
    extra = [] if registered else ["-p", "fuseval.pytest_plugin"]
    result = pytester.runpytest_inprocess(*extra, "-p", "no:cacheprovider", "-v", *args,
                                          "--fuseval-components=check", "--fuseval-cases=0",
                                          "--fuseval-seeds=1", f"--fuseval-timeout={TIMEOUT}")
    result.assert_outcomes(passed=1, failed=len(HOSTILE))
    text = result.stdout.str()
    for name, (_, violation) in HOSTILE.items():
        assert f"fuseval[{OP}={name}:impl]::check FAILED" in text, name
        assert f"exit code {EXIT_OF[violation]}" in text
    assert "Traceback" not in text


def _subprocess_check(hostile_dir, name, *extra):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hostile_dir), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "fuseval.cli", "check", "--op", OP, "--impl", f"{name}:impl",
                           "--cases", "0", "--no-predict", *extra], capture_output=True, text=True, env=env,
                          cwd=str(hostile_dir), timeout=300)


def test_atexit_hook_cannot_change_the_exit_status(hostile_dir):
    """The whole command in a process of its own: its exit status is the verdict's, though
    the implementation registered os._exit(0) to run at exit."""
    proc = _subprocess_check(hostile_dir, "hostile_atexit")
    assert proc.returncode == EXIT_CHECK_FAILED, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "tolerance" in proc.stdout


def test_in_process_trusts_the_implementation(hostile_dir):
    """Why isolation is the default: in fuseval's own process the same tricks work."""
    fooled = _subprocess_check(hostile_dir, "hostile_patch_compare", "--in-process", "--no-hygiene")
    assert fooled.returncode == EXIT_TAMPERED        # reported, since the patch is seen...
    assert "FAIL tampered" in fooled.stderr or "tampered" in fooled.stdout
    assert "tolerance" not in fooled.stdout          # ...but the numbers were judged by the patch
    exited = _subprocess_check(hostile_dir, "hostile_frames", "--in-process", "--no-hygiene")
    assert exited.returncode == EXIT_OK, exited.stdout[-2000:]  # the oracle's outputs, read from a frame
