"""pytest plugin: fuseval's gate as test items and fixtures, so a kernel repository gates
with plain ``pytest``.

Installed with fuseval (entry point ``pytest11: fuseval``); nothing happens unless asked.

**Test items.** Name the operator and implementation, on the command line or in the ini
file, and pytest collects one item per gate component (``check``, ``properties``,
``budget``) and operator::

    pytest --fuseval-gate nvfp4_qkv_rope=mypkg.kernels:qkv_rope --fuseval-profile ci

    # pyproject.toml
    [tool.pytest.ini_options]
    fuseval_gate = ["nvfp4_qkv_rope=mypkg.kernels:qkv_rope"]
    fuseval_profile = "ci"

The items are named ``fuseval[<op>=<impl>]::<component>``; ``-k`` selects among them as
usual. A failing component fails its item with the gate's findings (no traceback); a
warning (a metric passing with a small margin) is reported as a pytest warning. Under
``all``, an operator without the implementation named (``all=fast`` and an operator with
no ``fast``) gets items skipped with that reason; naming such an operator fails its items.

**Fixture.** ``fuseval_check(op, impl, **options)`` runs the gate (all components by
default; ``components=["check"]`` for the statistical check alone) and fails the test
with the summary when it fails; it returns the :class:`fuseval.gate.GateReport`::

    def test_my_kernel(fuseval_check):
        fuseval_check("nvfp4_qkv_rope", my_kernel, components=["check", "budget"])

Options of both: ``--fuseval-profile`` (ci, thorough, gpu), ``--fuseval-components``,
``--fuseval-cases``, ``--fuseval-seeds``, ``--fuseval-strict``, ``--fuseval-timeout``
and ``--fuseval-out DIR`` (reports; for the items also one ``junit.xml`` of the gate).
The items run the gate in a fuseval process of their own (``python -m fuseval.cli gate``,
one per operator and implementation), which runs the implementation in its confined worker
(``--fuseval-in-process`` makes that process trust it instead): a test module that imports
the kernel cannot reach the comparison, whatever it patches in pytest's process. The items
refuse to run, as ``tampered``, when the functions they rely on in pytest's process
(starting that process, reading its report) were replaced after the plugin loaded. Code
that runs in pytest's own process can still rewrite pytest's own report; a CI gate that must
not trust the kernel's repository runs ``fuseval gate`` itself (docs/security.md). The
fixture runs the callable it is given in the test's process. The module imports nothing
heavy until a fuseval item or fixture runs, so it costs other test suites nothing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from typing import Any

import pytest

from .gate import COMPONENTS as COMPONENT_NAMES   # fuseval.gate's modules import only the standard library at load


class FusevalGateWarning(UserWarning):
    """A gate component passed, with a metric close to its threshold."""


class FusevalGateFailure(Exception):
    """A gate component failed; the message is the gate's findings."""


# --------------------------------------------------------------------------- options
def pytest_addoption(parser) -> None:
    group = parser.getgroup("fuseval", "fuseval gate (numerical validation of fused kernels)")
    group.addoption("--fuseval-gate", action="append", default=[], metavar="OP=IMPL",
                    help="collect fuseval gate items for operator OP ('all' for every operator) and "
                         "implementation IMPL ('fast', 'module:function'); repeatable")
    group.addoption("--fuseval-profile", default=None, help="gate profile: ci, thorough or gpu (default: ci)")
    group.addoption("--fuseval-components", default=None,
                    help="comma list of gate components (default: check,properties,budget)")
    group.addoption("--fuseval-cases", default=None, help="case subset of the check, e.g. '0-3'")
    group.addoption("--fuseval-seeds", default=None, type=int, help="seeds of the statistical check")
    group.addoption("--fuseval-strict", action="store_true", default=None, help="warnings fail")
    group.addoption("--fuseval-out", default=None, metavar="DIR", help="write the gate's reports here")
    group.addoption("--fuseval-timeout", default=None, type=float, metavar="SECONDS",
                    help="seconds each case may spend in the implementation (default: fuseval's, 300)")
    group.addoption("--fuseval-in-process", action="store_true", default=None,
                    help="run the implementation of the gate items in this process (trusting it) instead of "
                         "a worker process of its own")
    parser.addini("fuseval_gate", type="linelist", default=[],
                  help="OP=IMPL pairs to collect as fuseval gate items")
    parser.addini("fuseval_profile", default="ci", help="fuseval gate profile (ci, thorough, gpu)")
    parser.addini("fuseval_components", default="check,properties,budget",
                  help="comma list of fuseval gate components")
    parser.addini("fuseval_cases", default="", help="case subset of the fuseval check")
    parser.addini("fuseval_seeds", default="", help="seeds of the fuseval statistical check")
    parser.addini("fuseval_out", default="", help="folder for the fuseval gate's reports")
    parser.addini("fuseval_timeout", default="", help="seconds each case may spend in the implementation")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "fuseval: a fuseval gate item (numerical validation of a kernel)")


def _option(config, name: str) -> Any:
    value = config.getoption(f"--fuseval-{name}")
    if value is None or value == []:
        value = config.getini(f"fuseval_{name}")
    return value if value not in ("", []) else None


def _settings(config) -> dict[str, Any]:
    """The gate's options from pytest's command line or ini file, checked by the gate
    request's helpers (:mod:`fuseval.options`), as ``fuseval gate`` checks them."""
    from .commands import as_number
    from .errors import UsageError
    from .options import check_one_of, check_seeds, check_timeout
    components = _option(config, "components") or ",".join(COMPONENT_NAMES)
    names = [c.strip() for c in str(components).split(",") if c.strip()]
    seeds, timeout = _option(config, "seeds"), _option(config, "timeout")
    try:
        for c in names:
            check_one_of(c, COMPONENT_NAMES, "fuseval_components")
        seeds = check_seeds(None if seeds is None else as_number(str(seeds)), "fuseval_seeds")
        timeout = check_timeout(None if timeout is None else as_number(str(timeout)), "fuseval_timeout")
    except UsageError as exc:
        raise pytest.UsageError(f"fuseval: {exc}") from None
    return {"profile": _option(config, "profile") or "ci", "components": names,
            "cases": _option(config, "cases"), "seeds": seeds,
            "strict": bool(config.getoption("--fuseval-strict")), "out": _option(config, "out"),
            "timeout": timeout, "isolate": False if config.getoption("--fuseval-in-process") else None}


def _pairs(config) -> list[tuple[str, str]]:
    raw = list(config.getoption("--fuseval-gate") or []) or list(config.getini("fuseval_gate") or [])
    pairs = []
    for entry in raw:
        op, sep, impl = str(entry).partition("=")
        if not sep or not op.strip() or not impl.strip():
            raise pytest.UsageError(f"fuseval gate entry {entry!r}: expected OP=IMPL, e.g. "
                                    "my_operator=mypkg.kernels:forward (operators: `fuseval list`)")
        pairs.append((op.strip(), impl.strip()))
    return pairs


# --------------------------------------------------------------------------- items
class FusevalItem(pytest.Item):
    """One gate component on one operator and implementation."""

    def __init__(self, *, op: str, impl: str, component: str, settings: dict[str, Any],
                 not_run: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.op, self.impl, self.component, self.settings = op, impl, component, settings
        self.not_run = not_run          # why this operator does not run (no such implementation)
        self.add_marker("fuseval")
        self.result = None

    def runtest(self) -> None:
        from .gate import not_run
        if self.not_run:
            self.config.stash.setdefault(_RESULTS, []).append(not_run(self.op, self.component, self.not_run))
            pytest.skip(f"fuseval {self.op} {self.component}: not run: {self.not_run}")
        replaced = _replaced()
        if replaced:
            from .errors import EXIT_TAMPERED, FusevalError
            raise FusevalError("tampered: functions the fuseval items rely on were replaced in pytest's process "
                               f"after the plugin loaded ({', '.join(replaced[:6])}); the gate was not run",
                               EXIT_TAMPERED)
        runs = self.config.stash.setdefault(_RUNS, {})
        key = (self.op, self.impl)
        if key not in runs:
            runs[key] = _gate_process(self.op, self.impl, self.settings, self.config)
        result = runs[key].get(self.component)
        if result is None:
            from .errors import EXIT_INTERNAL, FusevalError
            raise FusevalError(f"the gate process reported no {self.component} component", EXIT_INTERNAL)
        self.result = self.config.stash.setdefault(_RESULTS, [])
        self.result.append(result)
        _raise_for(result)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, FusevalGateFailure):
            return str(excinfo.value)
        from .errors import FusevalError
        if isinstance(excinfo.value, FusevalError):
            return f"fuseval: {excinfo.value} (exit code {excinfo.value.exit_code})"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return "fuseval", None, f"fuseval[{self.op}={self.impl}]::{self.component}"


_RESULTS = pytest.StashKey[list]()
_RUNS = pytest.StashKey[dict]()

# what the items rely on in pytest's process, as it was when the plugin loaded (before
# any test module, and so any kernel module, was imported)
_RELIED_ON = {
    "subprocess.Popen": subprocess.Popen, "subprocess.run": subprocess.run,
    "subprocess.Popen.communicate": subprocess.Popen.communicate, "json.loads": json.loads,
    "json.load": json.load, "tempfile.mkdtemp": tempfile.mkdtemp, "builtins.open": open,
}


def _replaced() -> list[str]:
    import builtins
    now = {"subprocess.Popen": subprocess.Popen, "subprocess.run": subprocess.run,
           "subprocess.Popen.communicate": subprocess.Popen.communicate, "json.loads": json.loads,
           "json.load": json.load, "tempfile.mkdtemp": tempfile.mkdtemp, "builtins.open": builtins.open}
    own = {f"fuseval.pytest_plugin.{name}": globals().get(name) for name in ("_gate_process", "_replaced",
                                                                            "_raise_for", "_component")}
    changed = [name for name, obj in now.items() if _RELIED_ON.get(name) is not obj]
    changed += [name for name, obj in own.items() if _OWN.get(name) is not obj]
    if FusevalItem.runtest is not _OWN.get("FusevalItem.runtest"):
        changed.append("fuseval.pytest_plugin.FusevalItem.runtest")
    return changed


def _gate_process(op: str, impl: str, settings: dict[str, Any], config) -> dict[str, Any]:
    """The gate's components for (op, impl), run by ``fuseval gate`` in a process of its
    own (importable paths of pytest's process handed on, so the implementation imports as
    in the tests); component name -> ComponentResult."""
    out = settings["out"] or tempfile.mkdtemp(prefix="fuseval-items-")
    folder = os.path.join(out, f"{op}-{abs(hash(impl)) % 10 ** 8}") if settings["out"] else out
    skip = [c for c in COMPONENT_NAMES if c not in settings["components"]]
    argv = [sys.executable, "-m", "fuseval.cli", "gate", "--op", op, "--impl", impl, "--profile",
            settings["profile"], "--out", folder, "--quiet", "--jobs", "1"]
    if skip:
        argv += ["--skip", ",".join(skip)]
    for flag, key in (("--cases", "cases"), ("--seeds", "seeds"), ("--timeout", "timeout")):
        if settings.get(key) is not None:
            argv += [flag, str(settings[key])]
    if settings["strict"]:
        argv.append("--strict")
    if settings["isolate"] is False:
        argv.append("--in-process")
    env = os.environ.copy()
    here = [p for p in sys.path if p and os.path.isdir(p)]
    paths = [*env.get("PYTHONPATH", "").split(os.pathsep), *here]
    env["PYTHONPATH"] = os.pathsep.join(p for p in dict.fromkeys(paths) if p)
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(config.rootpath))
    try:
        with open(os.path.join(folder, "gate.json")) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        from .errors import FusevalError
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-3:]
        raise FusevalError(f"the gate process ended with exit code {proc.returncode} and no report: "
                           + " / ".join(tail), proc.returncode or 1) from None
    return {c["name"]: _component(c) for c in doc.get("components", []) if c.get("op") == op}


def _component(d: dict[str, Any]):
    """A ComponentResult from its JSON form (gate.json)."""
    import dataclasses
    from .gate.results import ComponentResult, TestResult
    fields = {f.name for f in dataclasses.fields(ComponentResult)} - {"result"}
    tests = [TestResult(**{k: v for k, v in t.items() if k in {f.name for f in dataclasses.fields(TestResult)}})
             for t in d.get("tests", [])]
    return ComponentResult(**{**{k: v for k, v in d.items() if k in fields}, "tests": tests})


def _raise_for(result) -> None:
    """Turn a ComponentResult into pytest's outcomes."""
    if result.status == "skipped":
        pytest.skip(f"fuseval {result.name}: {result.summary}")
    if result.status == "warn":
        warnings.warn(FusevalGateWarning(f"fuseval {result.op} {result.name}: {result.summary}; "
                                         + "; ".join(result.messages[:3])), stacklevel=2)
    if result.failed:
        lines = [f"fuseval {result.op} / {result.name}: {result.status} (exit code {result.exit_code})",
                 result.summary] + [f"  {m}" for m in result.messages[:20]]
        if len(result.messages) > 20:
            lines.append(f"  ... {len(result.messages) - 20} more")
        raise FusevalGateFailure("\n".join(lines))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    pairs = _pairs(config)
    if not pairs:
        return
    settings = _settings(config)
    from .operators import load
    from .operators import names
    from .operators.implementations import missing_implementation
    known = names()
    for op, impl in pairs:
        ops = known if op == "all" else [op]
        for name in ops:
            if name not in known:
                raise pytest.UsageError(f"fuseval gate entry {op}={impl}: unknown operator {name!r}; "
                                        f"known: {', '.join(known)}")
            reason = missing_implementation(load(name), impl) if op == "all" else None
            for component in settings["components"]:
                items.append(FusevalItem.from_parent(session, name=f"fuseval[{name}={impl}]::{component}",
                                                     op=name, impl=impl, component=component,
                                                     settings=settings, not_run=reason))


def pytest_sessionfinish(session, exitstatus) -> None:
    results = session.config.stash.get(_RESULTS, None)
    if not results:
        return
    settings = _settings(session.config)
    if not settings["out"]:
        return
    from .gate import GateReport, utc_timestamp
    report = GateReport(sorted({r.op for r in results}), ",".join(sorted({i.impl for i in session.items
                                                                          if isinstance(i, FusevalItem)})),
                        settings["profile"], "-", False, results, sum(r.seconds for r in results),
                        utc_timestamp())
    report.save(settings["out"])


# --------------------------------------------------------------------------- fixture
@pytest.fixture
def fuseval_check(request):
    """``fuseval_check(op, impl, **options)``: run the fuseval gate and fail the test with
    its findings when it fails. Options are those of :func:`fuseval.gate.run_gate`
    (``profile``, ``components``, ``config``, ``cases``, ``seeds``, ``device``, ``strict``,
    ``out``...); defaults come from the ``--fuseval-*`` options / ini values. Returns the
    :class:`~fuseval.gate.GateReport`. The implementation runs in the test's own process
    (``isolate=False``: it is already imported there, so it is trusted); pass
    ``isolate=True`` to run it in a worker process of its own (it must then be importable
    by name: a module-level function)."""
    settings = _settings(request.config)

    def run(op, impl, **options):
        from .gate import run_gate
        for key in ("profile", "components", "cases", "seeds", "strict", "out", "timeout"):
            if settings.get(key) is not None and key not in options:
                options[key] = settings[key]
        options.setdefault("isolate", False)
        report = run_gate(op, impl, **options)
        for c in report.components:
            if c.status == "warn":
                warnings.warn(FusevalGateWarning(f"fuseval {c.op} {c.name}: {c.summary}"), stacklevel=2)
        if not report.passed:
            pytest.fail(report.text(), pytrace=False)
        return report

    return run


_OWN = {f"fuseval.pytest_plugin.{name}": globals()[name] for name in ("_gate_process", "_replaced", "_raise_for",
                                                                      "_component")}
_OWN["FusevalItem.runtest"] = FusevalItem.runtest
