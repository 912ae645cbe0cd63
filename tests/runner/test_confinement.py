"""The confined worker against implementations that attack fuseval's process, its files, its
clock of idleness, its hygiene calls and its own accuracy rule (docs/security.md).

Each hostile module is run by ``python -m fuseval.cli check`` in a process of its own, in a
folder of its own, with a seed drawn at random (the product's default): if a defence fails,
the damage lands on that subprocess (or the test's timeout), never on the test runner.
Every hostile does the harm it can and then answers with noise or a wrong answer, so a run
that passes, or ends with another exit status than the defence's, fails the test.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fuseval.errors import (EXIT_CHECK_FAILED, EXIT_HYGIENE, EXIT_RESOURCE_LIMIT, EXIT_TAMPERED,
                            EXIT_USAGE)
from fuseval.runner import confine

OP = "nvfp4_qkv_rope"
ROOT = Path(__file__).resolve().parents[2]

# the device the hostiles run on (FUSEVAL_TEST_DEVICE=cuda on a GPU machine)
DEVICE = os.environ.get("FUSEVAL_TEST_DEVICE", "cpu")


def _path(folder) -> str:
    """The subprocess's import path: this tree, the hostile's folder, then the caller's own
    (where the confinement's bindings may be installed)."""
    return os.pathsep.join([str(ROOT / "src"), str(folder)] + [p for p in [os.environ.get("PYTHONPATH", "")] if p])


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the confinement is Linux's")
needs_seccomp = pytest.mark.skipif(not confine.probe().seccomp, reason="no seccomp on this machine")
needs_landlock = pytest.mark.skipif(not confine.probe().landlock_abi, reason="no Landlock on this machine")

COMMON = '''
import os, sys, time
import torch
from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager

def noise(*a):
    """Wrong answers of the right shapes, different for different inputs."""
    total = sum(int(t.contiguous().view(-1).view(torch.uint8).long().sum()) * (i + 1)
                for i, t in enumerate(a) if isinstance(t, torch.Tensor) and t.numel())
    g = torch.Generator().manual_seed(total % (2 ** 31))
    return tuple(torch.randn(o.shape, generator=g).to(o.dtype).to(o.device) for o in torch_eager(*a))
'''

# name -> (source, the exit status the check must end with, a word its output must hold)
HOSTILE: dict[str, tuple[str, int, str]] = {
    # attach to fuseval's process: once attached it could make fuseval exit 0
    "h_ptrace": ('''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
def impl(*a):
    for request in (16, 0x4206):                    # PTRACE_ATTACH, PTRACE_SEIZE
        if libc.ptrace(request, os.getppid(), None, None) == 0:
            time.sleep(600)                          # fuseval stays stopped: the test times out
    return noise(*a)
''', EXIT_CHECK_FAILED, "tolerance"),
    # stop or kill fuseval's process, its process group, or itself out of its session
    "h_signals": ('''
import signal
def impl(*a):
    parent = os.getppid()
    for attempt in (lambda: os.kill(parent, signal.SIGSTOP),
                    lambda: os.killpg(os.getpgid(parent), signal.SIGSTOP),
                    lambda: os.setsid()):
        try:
            attempt()
        except OSError:
            pass
    return noise(*a)
''', EXIT_CHECK_FAILED, "tolerance"),
    # plant modules where fuseval's process would import them later, to rewrite its exit
    "h_plant_modules": ('''
import atexit
PLANT = "import atexit, os\\natexit.register(lambda: os._exit(0))\\n"
def impl(*a):
    for folder in {os.environ.get("PWD", ""), *sys.path, os.path.expanduser("~")}:
        for name in ("colorsys", "hmac", "shlex", "sitecustomize", "usercustomize"):
            try:
                with open(os.path.join(folder, name + ".py"), "w") as f:
                    f.write(PLANT)
            except OSError:
                pass
    return noise(*a)
''', EXIT_CHECK_FAILED, "tolerance"),
    # a grandchild that outlives the call, holds fuseval's output and writes a verdict later
    "h_grandchild": ('''
def impl(*a):
    if os.fork() == 0:
        os.setpgid(0, 0) if hasattr(os, "setpgid") else None
        time.sleep(60)
        os.write(1, b"GATE PASSED\\n")
        os._exit(0)
    return torch_eager(*a)
''', EXIT_TAMPERED, "child_process"),
    # prints fuseval's own success lines
    "h_fake_lines": ('''
def impl(*a):
    print("nvfp4_qkv_rope: 1/1 cases passed", flush=True)
    os.write(1, b"GATE PASSED\\n")
    os.write(2, b"nvfp4_qkv_rope: 1/1 cases passed\\n")
    return noise(*a)
''', EXIT_CHECK_FAILED, "tolerance"),
    # a thread that keeps working after the answer, with the worker's integrity report faked
    "h_spinner": ('''
import threading
import fuseval.runner.integrity as integrity
integrity.new_threads = lambda before: []
integrity.changed = lambda baseline: []
def _spin():
    x = 0
    while True:
        x += 1
def impl(*a):
    threading.Thread(target=_spin, name="MainThread", daemon=True).start()
    return torch_eager(*a)
''', EXIT_TAMPERED, "lingering_thread"),
    # a cache keyed on the weights that writes the first activations back into the inputs,
    # so that later calls look like repeats of the first
    "h_write_back_cache": ('''
_cache = {}
def impl(*a):
    key = float(a[4].float().sum())
    if key in _cache:
        acts, outs = _cache[key]
        for t, saved in zip(a[:3], acts):
            t.copy_(saved)
        return tuple(o.clone() for o in outs)
    outs = torch_eager(*a)
    _cache[key] = ([t.clone() for t in a[:3]], [o.clone() for o in outs])
    return outs
''', EXIT_HYGIENE, "mutated_input"),
    # uses an input as scratch memory and restores it before returning
    "h_scribble_restore": ('''
def impl(*a):
    saved = a[0].clone()
    a[0].fill_(0)
    a[0].copy_(saved)
    return torch_eager(*a)
''', EXIT_HYGIENE, "mutated_input"),
    # answers into a ring of three output buffers, reused in turn
    "h_ring": ('''
_ring, _turn = [], [0]
def impl(*a):
    out = torch_eager(*a)
    if len(_ring) < 3:
        _ring.append([o.clone() for o in out])
    bufs = _ring[_turn[0] % len(_ring)]
    _turn[0] += 1
    for b, o in zip(bufs, out):
        b.copy_(o)
    return tuple(bufs)
''', EXIT_HYGIENE, "output_reused"),
    # right almost everywhere, 1e30 in one element of every 200 (0.5%: the benchmark's
    # matched-ratio rule alone passes it)
    "h_sparse_huge": ('''
def impl(*a):
    out = [o.clone() for o in torch_eager(*a)]
    for o in out:
        o.view(-1)[::200] = 1e30
    return tuple(out)
''', EXIT_CHECK_FAILED, "worst_element"),
    # right everywhere but the first row of every 256-row tile of tokens, set to 1e30
    "h_tile_rows": ('''
def impl(*a):
    out = [o.clone() for o in torch_eager(*a)]
    for o in out:
        o.view(-1, o.shape[-1])[::256] = 1e30
    return tuple(out)
''', EXIT_CHECK_FAILED, "worst_element"),
    # finds fuseval's channel among its objects and floods it
    "h_flood_channel": ('''
import gc
from multiprocessing.connection import Connection
def impl(*a):
    for obj in gc.get_objects():
        if isinstance(obj, Connection):
            try:
                obj.send_bytes(b"x" * (64 << 20))
            except Exception:
                pass
    return noise(*a)
''', EXIT_TAMPERED, "tampered"),
}


@pytest.fixture(scope="module")
def hostile_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("confinement")
    for name, (source, _, _) in HOSTILE.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(COMMON) + textwrap.dedent(source))
    return folder


def run_check(folder: Path, impl: str, *extra: str, timeout: float = 240, preexec=None):
    """``fuseval check`` of ``impl`` in a process of its own, in ``folder``, seed at random."""
    env = {**os.environ, "PYTHONPATH": _path(folder)}
    env.pop("FUSEVAL_PROBLEM_PATH", None)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "fuseval.cli", "check", "--op", OP, "--impl", impl,
                           "--cases", "0", "--no-predict", "--device", DEVICE, *extra], capture_output=True, text=True, env=env,
                          cwd=str(folder), timeout=timeout, preexec_fn=preexec)
    return proc, time.monotonic() - t0


@linux_only
@needs_seccomp
@needs_landlock
@pytest.mark.parametrize("name", list(HOSTILE))
def test_confined_worker_rejects(hostile_dir, name, request):
    _, status, word = HOSTILE[name]
    if name == "h_scribble_restore" and DEVICE.startswith("cuda"):
        # the documented gap (docs/security.md): a CUDA input restored before the call
        # returns is not seen; strict, so that closing the gap shows here
        request.applymarker(pytest.mark.xfail(strict=True, reason="a restored scribble on CUDA is not seen"))
    before = {p.name for p in hostile_dir.iterdir()}
    proc, seconds = run_check(hostile_dir, f"{name}:impl", "--timeout", "60", timeout=45 if name == "h_grandchild"
                              else 240)
    text = proc.stdout + proc.stderr
    assert proc.returncode == status, (proc.returncode, text[-3000:])
    assert word in text, text[-3000:]
    assert "Traceback" not in text
    assert "drawn at random" in text                 # no fixed seed a kernel could recognise
    # nothing written where fuseval's process runs or imports from
    assert {p.name for p in hostile_dir.iterdir()} - before == set()
    # fuseval's own lines are never the implementation's: whatever it printed is quoted
    for line in text.splitlines():
        if "GATE PASSED" in line or "1/1 cases passed" in line:
            assert line.startswith("  | "), line


@linux_only
def test_fault_free_implementation_passes_confined(hostile_dir):
    """The honest counterpart: the eager reference in the same confined worker passes, and
    the report says how it was confined."""
    (hostile_dir / "honest.py").write_text(textwrap.dedent(COMMON) + "\ndef impl(*a):\n    return torch_eager(*a)\n")
    proc, _ = run_check(hostile_dir, "honest:impl")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    probe = confine.probe()
    if probe.seccomp and probe.landlock_abi:
        assert "seccomp" in proc.stdout and "Landlock" in proc.stdout, proc.stdout[-2000:]


@linux_only
def test_recognised_inputs_do_not_pass(hostile_dir, tmp_path):
    """A kernel that is right only on the inputs of a known seed (here seed 0's, which used to
    be the default): the default draws a seed at random, so it fails; with ``--seed 0`` its
    first call passes and only the hygiene calls' fresh inputs expose it."""
    import torch
    from fuseval.operators import load
    from fuseval.inputs import generate_inputs
    defn = load(OP)
    first = generate_inputs(defn, defn.cases("0")[0].axes, seed=0)[0]
    mark = float(first.float().sum())
    (hostile_dir / "h_seed_zero.py").write_text(textwrap.dedent(COMMON) + textwrap.dedent(f'''
    def impl(*a):
        if abs(float(a[0].float().sum()) - {mark!r}) < 1e-6:
            return torch_eager(*a)
        return noise(*a)
    '''))
    random_seed, _ = run_check(hostile_dir, "h_seed_zero:impl")
    assert random_seed.returncode == EXIT_CHECK_FAILED, random_seed.stdout[-2000:]
    known_seed, _ = run_check(hostile_dir, "h_seed_zero:impl", "--seed", "0")
    assert known_seed.returncode == EXIT_CHECK_FAILED, known_seed.stdout[-2000:]
    first_call = re.search(r"case 0 .*", known_seed.stdout)
    assert "hygiene" in known_seed.stdout or "tolerance" in known_seed.stdout, first_call
    del torch


@linux_only
def test_against_refuses_what_is_not_the_operators(hostile_dir):
    """``--against`` names one of the operator's own implementations, never a module of the
    user's (it would run unconfined in fuseval's process)."""
    proc, _ = run_check(hostile_dir, "h_ring:impl", "--against", "h_ring:impl")
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "--against" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_timeout_must_be_finite(hostile_dir, value):
    proc, _ = run_check(hostile_dir, "h_ring:impl", "--timeout", value)
    assert proc.returncode == EXIT_USAGE, proc.stdout + proc.stderr
    assert "--timeout" in proc.stderr and "Traceback" not in proc.stderr


@linux_only
def test_few_open_files_is_a_resource_error(hostile_dir):
    import resource

    def few():
        resource.setrlimit(resource.RLIMIT_NOFILE, (30, 30))
    proc, _ = run_check(hostile_dir, "h_ring:impl", preexec=few)
    assert proc.returncode == EXIT_RESOURCE_LIMIT, proc.stdout + proc.stderr
    assert "open-file limit" in proc.stderr and "Traceback" not in proc.stderr


def test_stage_taps_come_back_by_name_through_the_worker(monkeypatch, isolation_default):
    """A staged run in the worker hands back every stage tap under its own name, parts
    (``stage.part``) included, whatever the order the implementation wrote them in; the
    budget of op B's fast path through the worker is within budget."""
    import torch
    from fuseval.runner import isolation
    from fuseval.operators import load
    from fuseval.inputs import generate_inputs
    from fuseval.staged import staged_of
    from fuseval.operators.implementations import resolve_impl
    isolation_default(True)
    defn = load(OP, config="tiny")
    inputs = generate_inputs(defn, defn.cases("0")[0].axes, seed=3)
    local = staged_of(defn, "reference_fp32", resolve_impl(defn, "reference_fp32"))
    ref_taps: dict = {}
    local(*inputs, taps=ref_taps, override={})
    assert any("." in name for name in ref_taps)          # parts of a stage are among them
    runner = isolation.IsolatedImpl("reference_fp32", defn, "cpu")
    taps: dict = {}
    runner.staged(*inputs, taps=taps, override={})
    assert set(taps) == set(ref_taps), (sorted(taps), sorted(ref_taps))
    for name, value in ref_taps.items():
        assert taps[name].shape == value.shape and taps[name].dtype == value.dtype, name
        assert torch.equal(taps[name], value), name


# a few of them through the other routes: the gate (check and budget components) and the
# pytest plugin's gate items, each in a process of its own
ROUTES = ["h_tile_rows", "h_grandchild", "h_write_back_cache"]
PLUGIN_ROUTES = ["h_tile_rows", "h_fake_lines"]


@linux_only
@needs_seccomp
@needs_landlock
@pytest.mark.parametrize("name", ROUTES)
def test_gate_route_rejects(hostile_dir, tmp_path, name):
    import json
    _, status, word = HOSTILE[name]
    env = {**os.environ, "PYTHONPATH": _path(hostile_dir)}
    out = tmp_path / "gate"
    proc = subprocess.run([sys.executable, "-m", "fuseval.cli", "gate", "--op", OP, "--impl", f"{name}:impl",
                           "--skip", "properties", "--cases", "0", "--seeds", "1", "--budget-cases", "0",
                           "--timeout", "60", "--out", str(out), "--quiet"], capture_output=True, text=True,
                          env=env, cwd=str(hostile_dir), timeout=240)
    text = proc.stdout + proc.stderr
    assert proc.returncode == status, (proc.returncode, text[-3000:])
    assert "GATE FAILED" in text and "Traceback" not in text
    doc = json.loads((out / "gate.json").read_text())
    components = {c["name"]: c for c in doc["components"]}
    assert word in json.dumps(components["check"]["data"]), name
    assert components["budget"]["status"] == "fail", components["budget"]["summary"]
    for line in text.splitlines():
        if "GATE PASSED" in line:
            assert line.startswith("  | "), line


def _run_plugin(hostile_dir, tmp_path, names) -> str:
    """A pytest session in a process of its own over ``tmp_path``, with a gate item (the
    check) for each hostile of ``names``; what it printed."""
    import importlib.metadata
    env = {**os.environ, "PYTHONPATH": _path(hostile_dir)}
    args = [f"--fuseval-gate={OP}={name}:impl" for name in names]
    registered = any(ep.name == "fuseval" and ep.value == "fuseval.pytest_plugin"
                     for ep in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if registered else ["-p", "fuseval.pytest_plugin"]
    proc = subprocess.run([sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider",
                           "-q", "-p", "no:xdist", *args, "--fuseval-components=check", "--fuseval-cases=0",
                           "--fuseval-seeds=1", "--fuseval-timeout=60", str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=400)
    return proc.stdout + proc.stderr


@linux_only
def test_plugin_route_rejects(hostile_dir, tmp_path):
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    text = _run_plugin(hostile_dir, tmp_path, PLUGIN_ROUTES)
    assert f"{len(PLUGIN_ROUTES)} failed, 1 passed" in text, text[-3000:]


# kernel modules that a unit test of the session imports, which then patch what fuseval's
# verdict relies on in pytest's own process
IMPORT_ROUTE = {
    # fuseval's comparison made to pass everything (it runs in the gate's own process)
    "k_patch_compare": '''
import fuseval.check
fuseval.check.compare = lambda *a, **k: None
''',
    # the process the items start, and what reads its report, rewritten
    "k_patch_subprocess": '''
import json, subprocess
_run = subprocess.run
def run(*a, **k):
    return _run(*a, **k)
subprocess.run = run
json.loads = lambda text, *a, **k: {"passed": True}
''',
}


@linux_only
def test_pytest_import_route_rejects(hostile_dir, tmp_path):
    """A unit test imports kernel modules that patch fuseval's comparison, the subprocess
    machinery and the JSON reader in pytest's process: the plugin's gate items (wrong
    kernels) still fail, one on tolerance in the gate's own process, one as tampered."""
    for name, patch in IMPORT_ROUTE.items():
        (hostile_dir / f"{name}.py").write_text(textwrap.dedent(COMMON) + patch + "\ndef impl(*a):\n"
                                                "    return noise(*a)\n")
    (tmp_path / "test_uses_kernels.py").write_text("import k_patch_compare, k_patch_subprocess\n\n"
                                                   "def test_kernels_import():\n    pass\n")
    text = _run_plugin(hostile_dir, tmp_path, IMPORT_ROUTE)
    assert f"{len(IMPORT_ROUTE)} failed, 1 passed" in text, text[-3000:]
    assert "tampered" in text, text[-3000:]


def test_tap_bombs_are_bounded(tmp_path, monkeypatch, isolation_default):
    """Thousands of stage taps, and a tap of 2**33 elements that is one number strided 0:
    refused as bad_outputs before fuseval allocates anything for them."""
    import torch
    from fuseval.runner import isolation
    from fuseval.operators import load
    from fuseval.inputs import generate_inputs
    (tmp_path / "h_taps.py").write_text(textwrap.dedent(COMMON) + textwrap.dedent('''
    def impl(*a):
        return torch_eager(*a)
    def _staged(*a, taps=None, override=None):
        if taps is not None:
            for i in range(2000):
                taps[f"proj.{i}"] = torch.zeros(4)
        return torch_eager(*a)
    def _huge(*a, taps=None, override=None):
        if taps is not None:
            taps["proj"] = torch.zeros(1).expand(1 << 33)
        return torch_eager(*a)
    impl.staged = _staged
    def huge(*a):
        return torch_eager(*a)
    huge.staged = _huge
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    isolation_default(True)
    defn = load(OP, config="tiny")
    inputs = generate_inputs(defn, defn.cases("0")[0].axes, seed=1)
    for name in ("h_taps:impl", "h_taps:huge"):
        runner = isolation.IsolatedImpl(name, defn, "cpu")
        with pytest.raises(isolation.IsolationViolation, match="bad_outputs"):
            runner.staged(*inputs, taps={}, override={})
        del runner
    del torch
