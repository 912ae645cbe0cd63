"""The CI gate: every check fuseval has, on one implementation, with one verdict.

``run_gate(op, impl, profile="ci")`` runs, per operator, three components:

``check``       the benchmark cases (scaled down on the CPU) against the float64 oracle,
                over several seeds, judged statistically (:mod:`fuseval.stats`): a case
                that fails on any seed fails the gate; a metric that passes with less than
                ``warn_margin`` of its allowance left is a warning;
``properties``  the Hypothesis property suite (:mod:`fuseval.properties`);
``budget``      the per-stage error budget (:mod:`fuseval.budget`).

Each component is isolated: if one raises, it is reported as a failed component with the
exception's message and the others still run, so one broken piece never hides the state
of the rest. Problems with the gate's own input (an unknown operator, an implementation
that does not import, ``--device cuda`` without a GPU) are raised as
:class:`~fuseval.errors.FusevalError` before anything runs, with their distinct exit codes.

The :class:`GateReport` prints a one-screen summary and writes, into ``out``:
``junit.xml`` (for CI systems), ``gate.json`` and ``gate.md``, ``check-<op>.json`` and
the budget's reports ``budget-<op>.json|md|html``.

Profiles fix how much work a run does:

=========  =======  ======  ==========================  ==========  ==================
profile    config   device  check seeds (cases)         properties  budget (cases)
=========  =======  ======  ==========================  ==========  ==================
ci         small    cpu     3 (16 on the first, 0-11)   ci          small (0,5,10,13)
thorough   small    cpu     5 (16 each)                 thorough    small (all)
gpu        seed     cuda    3 (16 each)                 gpu         seed (all)
=========  =======  ======  ==========================  ==========  ==================

Hygiene checks (which call the implementation twice) run on the first seed only.
"""
from __future__ import annotations

import dataclasses
import datetime
import inspect
import json
import math
import os
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence, TextIO

from .errors import (EXIT_BAD_FILE, EXIT_CHECK_FAILED, EXIT_IMPORT_ERROR, EXIT_INTERNAL, EXIT_NO_DEVICE,
                     EXIT_OK, EXIT_UNKNOWN_OPERATOR, FusevalError, exit_code_for)

__all__ = ["Profile", "PROFILES", "COMPONENTS", "TestResult", "ComponentResult", "GateReport",
           "run_gate", "run_component", "resolve_ops", "component_available", "jsonable"]

COMPONENTS = ("check", "properties", "budget")
# exit codes that mean "the gate's input is wrong", reported before any verdict
_INPUT_CODES = (EXIT_UNKNOWN_OPERATOR, EXIT_IMPORT_ERROR, EXIT_BAD_FILE, EXIT_NO_DEVICE)


@dataclass(frozen=True)
class Profile:
    name: str
    config: str                 # configuration of the check
    device: str
    seeds: int                  # seeds of the statistical check
    cases: str | None           # case selection of the check (None: all 16)
    properties: str             # profile name handed to fuseval.properties
    budget_config: str
    budget_cases: str | None
    extra_seed_cases: str | None = None   # cases of the seeds after the first (None: the same)
    hygiene: str | bool = "first"


PROFILES: dict[str, Profile] = {
    # ci: every case on the first seed; the two more seeds repeat cases 0-11 (the slow
    # long sequences 12-15 run once); the budget on four cases of increasing size
    "ci": Profile("ci", config="small", device="cpu", seeds=3, cases=None, properties="ci",
                  budget_config="small", budget_cases="0,5,10,13", extra_seed_cases="0-11"),
    "thorough": Profile("thorough", config="small", device="cpu", seeds=5, cases=None,
                        properties="thorough", budget_config="small", budget_cases=None),
    "gpu": Profile("gpu", config="seed", device="cuda", seeds=3, cases=None, properties="gpu",
                   budget_config="seed", budget_cases=None),
}


# --------------------------------------------------------------------------- results
@dataclass
class TestResult:
    """One JUnit test case."""
    name: str
    status: str                 # pass | fail | error | skipped
    seconds: float = 0.0
    message: str = ""           # one line: why it failed / was skipped
    details: str = ""           # the body: full messages, reproduction info
    output: str = ""            # system-out (warnings of a passing test)


@dataclass
class ComponentResult:
    op: str
    name: str                   # check | properties | budget
    status: str                 # pass | warn | fail | error | skipped
    summary: str
    seconds: float = 0.0
    exit_code: int = EXIT_OK
    messages: list[str] = field(default_factory=list)
    tests: list[TestResult] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    result: Any = field(default=None, repr=False)   # the component's own report object

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "error")


@dataclass
class GateReport:
    ops: list[str]
    impl: str
    profile: str
    device: str
    strict: bool
    components: list[ComponentResult]
    seconds: float
    started: str
    files: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not any(c.failed for c in self.components)

    @property
    def exit_code(self) -> int:
        """The exit code of the most telling failure: a problem with the gate's own input
        (a bad file, an implementation that does not import) first, then the check's verdict
        on the implementation (raised, wrong outputs, NaN, hygiene, tolerance), then the
        other components' failures, and a component that crashed last."""
        failed = [c for c in self.components if c.failed]
        if not failed:
            return EXIT_OK

        def rank(c: ComponentResult) -> int:
            if (c.exit_code or EXIT_CHECK_FAILED) in _INPUT_CODES:
                return 0
            if c.name == "check" and c.status == "fail":
                return 1
            return 2 if c.status == "fail" else 3
        best = min(failed, key=rank)   # min keeps the first of equals: operators, components in order
        return best.exit_code or EXIT_CHECK_FAILED

    @property
    def warnings(self) -> list[ComponentResult]:
        return [c for c in self.components if c.status == "warn"]

    # ---- serialisation
    def to_dict(self) -> dict[str, Any]:
        return jsonable({
            "schema_version": 1, "tool": "fuseval gate", "ops": self.ops, "impl": self.impl,
            "profile": self.profile, "device": self.device, "strict": self.strict,
            "started": self.started, "seconds": round(self.seconds, 3), "passed": self.passed,
            "exit_code": self.exit_code, "files": self.files,
            "components": [{k: v for k, v in dataclasses.asdict(c).items() if k != "result"}
                           for c in self.components],
        })

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    def to_markdown(self) -> str:
        verdict = "PASSED" if self.passed else f"FAILED (exit code {self.exit_code})"
        if self.passed and self.warnings:
            verdict += f" with {len(self.warnings)} warning(s)"
        lines = [f"# fuseval gate: {verdict}", "",
                 f"impl `{self.impl}`, profile `{self.profile}`, device `{self.device}`, "
                 f"{self.seconds:.1f} s, started {self.started}", "",
                 "| operator | component | status | time | summary |", "| --- | --- | --- | --- | --- |"]
        for c in self.components:
            lines.append(f"| {c.op} | {c.name} | {c.status} | {c.seconds:.1f} s | {_md(c.summary)} |")
        judged = [(c.op, m) for c in self.components if c.name == "check"
                  for m in c.data.get("metrics", []) if m.get("threshold") is not None]
        if judged:
            lines += ["", "## Margins over seeds (check)", "",
                      "| operator | output | metric | min | median | max | rule | worst at | allowance left | verdict |",
                      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
            for op, m in judged:
                pct = m["metric"] == "matched_ratio"
                f = (lambda x: f"{100 * x:.3f}%") if pct else (lambda x: f"{x:.3g}")
                left = m.get("margin_fraction")
                left = "all" if left is None else (f"{left:.0%}" if math.isfinite(left) else "none")
                rule = (">= " if m["direction"] == "min" else "<= ") + f(m["threshold"])
                lines.append(f"| {op} | {m['output']} | {m['metric']} | {f(m['min'])} | {f(m['median'])} | "
                             f"{f(m['max'])} | {rule} | case {m['worst_case']}, seed {m['worst_seed']} | "
                             f"{left} | {m['verdict']} |")
        for c in self.components:
            if c.messages and c.status != "pass":
                lines += ["", f"## {c.op} / {c.name}: {c.status}", ""]
                lines += [f"- {_md(m)}" for m in c.messages[:40]]
                if len(c.messages) > 40:
                    lines.append(f"- ... {len(c.messages) - 40} more")
        return "\n".join(lines) + "\n"

    def to_junit_xml(self) -> str:
        root = ET.Element("testsuites", name="fuseval gate")
        totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        for c in self.components:
            tests = c.tests or [TestResult(c.name, "pass" if c.status in ("pass", "warn") else
                                           "fail" if c.status == "fail" else c.status,
                                           c.seconds, c.summary, "\n".join(c.messages))]
            suite = ET.SubElement(root, "testsuite", name=f"fuseval.{c.op}.{c.name}")
            counts = {"tests": len(tests), "failures": 0, "errors": 0, "skipped": 0}
            for t in tests:
                case = ET.SubElement(suite, "testcase", classname=f"fuseval.{c.op}.{c.name}",
                                     name=t.name, time=f"{t.seconds:.3f}")
                if t.status in ("fail", "error"):
                    tag = "failure" if t.status == "fail" else "error"
                    counts[tag + "s"] += 1
                    el = ET.SubElement(case, tag, message=_clean(t.message)[:500])
                    el.text = _clean(t.details or t.message)
                elif t.status == "skipped":
                    counts["skipped"] += 1
                    ET.SubElement(case, "skipped", message=_clean(t.message)[:500])
                if t.output:
                    ET.SubElement(case, "system-out").text = _clean(t.output)
            for k, v in counts.items():
                suite.set(k, str(v))
                totals[k] += v
            suite.set("time", f"{c.seconds:.3f}")
        for k, v in totals.items():
            root.set(k, str(v))
        root.set("time", f"{self.seconds:.3f}")
        ET.indent(root)
        return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"

    def save(self, out: str) -> dict[str, str]:
        """Write junit.xml, gate.json and gate.md into the folder ``out``."""
        os.makedirs(out, exist_ok=True)
        paths = {"junit": os.path.join(out, "junit.xml"), "json": os.path.join(out, "gate.json"),
                 "markdown": os.path.join(out, "gate.md")}
        self.files.update(paths)
        with open(paths["junit"], "w") as f:
            f.write(self.to_junit_xml())
        with open(paths["json"], "w") as f:
            f.write(self.to_json() + "\n")
        with open(paths["markdown"], "w") as f:
            f.write(self.to_markdown())
        return paths

    def text(self, max_findings: int = 12) -> str:
        """The summary as plain text (for pytest failures and logs)."""
        verdict = "PASSED" if self.passed else f"FAILED (exit code {self.exit_code})"
        lines = [f"fuseval gate {verdict}: impl={self.impl} profile={self.profile} device={self.device}"]
        for c in self.components:
            lines.append(f"  {c.op:24s} {c.name:10s} {c.status:7s} {c.seconds:6.1f}s  {c.summary}")
        for c, found in self._findings(max_findings):
            lines.append(f"{c.op} / {c.name} ({c.status}):")
            lines += ["  " + line for line in found]
        return "\n".join(lines)

    def _findings(self, max_findings: int):
        """(component, lines) for each component with problems: its first findings, at most
        4 per component and ``max_findings`` in all, each shortened by :func:`_short`."""
        shown = 0
        for c in self.components:
            if c.status in ("pass", "skipped") or not c.messages:
                continue
            found = []
            for m in c.messages[:4]:
                if shown >= max_findings:
                    break
                found += _short(m)
                shown += 1
            yield c, found

    def print_summary(self, stream: TextIO | None = None, max_findings: int = 12) -> None:
        """One screen: a table of components, then the first findings of each problem."""
        from rich.table import Table
        from .report import console
        out = console(stream)
        title = f"fuseval gate: impl={self.impl} profile={self.profile} device={self.device}"
        table = Table(title=title, title_justify="left")
        for col in ("operator", "component", "status", "time", "summary"):
            table.add_column(col, overflow="fold")
        colors = {"pass": "green", "warn": "yellow", "fail": "red", "error": "red", "skipped": "dim"}
        for c in self.components:
            table.add_row(c.op, c.name, f"[{colors.get(c.status, 'white')}]{c.status}[/]",
                          f"{c.seconds:.1f}s", _escape(c.summary))
        out.print(table)
        for c, found in self._findings(max_findings):
            out.print(f"{c.op} / {c.name} ({c.status}):", markup=False, highlight=False)
            for line in found:
                out.print("  " + line, markup=False, highlight=False)
            if len(c.messages) > 4:
                out.print(f"  ... {len(c.messages) - 4} more (see the reports)", markup=False,
                          highlight=False)
        if self.files:
            folders = sorted({os.path.dirname(p) or "." for p in self.files.values()})
            main = [os.path.basename(self.files[k]) for k in ("junit", "json", "markdown") if k in self.files]
            others = len(self.files) - len(main)
            out.print(f"reports in {', '.join(folders)}: {', '.join(main)}"
                      + (f" and {others} component report(s)" if others else ""), markup=False, highlight=False)
        if self.passed:
            extra = f" with {len(self.warnings)} warning(s)" if self.warnings else ""
            out.print(f"[green]GATE PASSED[/]{extra} in {self.seconds:.1f}s")
        else:
            out.print(f"[red]GATE FAILED[/] (exit code {self.exit_code}) in {self.seconds:.1f}s")


def _short(message: str, width: int = 200) -> list[str]:
    """A finding in at most two lines: its first line and, if any, how to reproduce it."""
    lines = str(message).splitlines() or [""]
    keep = [lines[0]] + [ln.strip() for ln in lines[1:] if ln.strip().startswith("reproduce")][:1]
    return [ln if len(ln) <= width else ln[:width - 3] + "..." for ln in keep]


def utc_timestamp() -> str:
    """Now, in UTC, as the reports record it: 2025-01-31T12:00:00Z."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _escape(text: str) -> str:
    from rich.markup import escape
    return escape(str(text))


def _clean(text: str) -> str:
    """Text safe for XML 1.0 (no control characters)."""
    return "".join(ch for ch in str(text) if ch in "\t\n\r" or ord(ch) >= 32)


def jsonable(obj: Any) -> Any:
    """``obj`` with dataclasses, tuples, numpy / torch scalars and non-finite floats made
    JSON-safe (non-finite floats become the strings "inf", "-inf", "nan")."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else ("nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf"))
    if hasattr(obj, "item") and callable(obj.item):
        try:
            return jsonable(obj.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(obj)


# --------------------------------------------------------------------------- input checks
def resolve_ops(op: str | Sequence[str]) -> list[str]:
    """Operator names from "all", one name, a comma list or a list; unknown names raise
    :class:`FusevalError` (exit code EXIT_UNKNOWN_OPERATOR)."""
    from .definitions import list_operators
    known = list_operators()
    if isinstance(op, str):
        names = known if op == "all" else [p.strip() for p in op.split(",") if p.strip()]
    else:
        names = list(op)
    if not names:
        raise FusevalError(f"no operator given; known operators: {', '.join(known)} (or 'all')",
                           EXIT_UNKNOWN_OPERATOR)
    for name in names:
        if name not in known:
            raise FusevalError(f"unknown operator {name!r}; known operators: {', '.join(known)} "
                               "(or 'all')", EXIT_UNKNOWN_OPERATOR)
    return names


def _resolve_device(device: str | None) -> str:
    """The check's device resolution (default cpu), its one error given the gate's exit code."""
    import torch
    from .check import resolve_device
    try:
        return str(resolve_device(device or "cpu"))
    except ValueError:
        raise FusevalError(f"device {device!r} was requested but torch {torch.__version__} sees no CUDA "
                           "device; use --device cpu or a CPU profile (ci, thorough)", EXIT_NO_DEVICE) from None


def _resolve_impl(op: str, impl: str | Callable, config: str, device: str = "cpu", isolate: bool = False) -> None:
    """Fail early when the implementation does not import: isolated, by starting its worker
    (which imports it there; the worker then serves the run), otherwise here."""
    from .isolation import can_isolate, worker_for
    from .ops import ImplementationError, get
    try:
        operator = get(op, config)
        if isolate and can_isolate(impl)[0]:
            worker_for(impl, operator.definition, device)
        else:
            operator.implementation(impl)
    except ImplementationError as exc:
        raise FusevalError(f"{op}: {exc}", EXIT_IMPORT_ERROR) from exc


def component_available(name: str) -> tuple[bool, str]:
    """Whether a component's module is there (with its entry point), and why not."""
    import importlib
    entry = {"check": ("fuseval.stats", "check_over_seeds"),
             "properties": ("fuseval.properties", "check_implementation"),
             "budget": ("fuseval.budget", "run_budget")}[name]
    try:
        module = importlib.import_module(entry[0])
    except ModuleNotFoundError as exc:
        if exc.name and entry[0].startswith(exc.name):
            return False, f"{entry[0]} is not part of this installation"
        raise
    if not hasattr(module, entry[1]):
        return False, f"{entry[0]} has no {entry[1]}() yet"
    return True, ""


def _call(fn: Callable, *args, **kwargs):
    """Call ``fn`` with the keyword arguments its signature accepts (the components are
    developed independently; an argument one of them does not take is left out)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


# --------------------------------------------------------------------------- components
@dataclass
class _Context:
    op: str
    impl: str | Callable
    impl_label: str
    profile: Profile
    device: str
    config: str
    cases: str | None
    seeds: int | Sequence[int]
    mode: str
    warn_margin: float
    strict: bool
    budget_config: str
    budget_cases: str | None
    budget: Any
    out: str | None
    progress: Callable[[str], None]
    extra_seed_cases: str | None = None
    isolate: bool = True
    timeout: float | None = None


def _component_check(ctx: _Context) -> ComponentResult:
    from .definitions import axes_label
    from .report import case_verdict
    from .stats import check_over_seeds

    def progress(seed, result, done, total):
        ctx.progress(f"{ctx.op} check seed {seed} [{done}/{total}] case {result.case}: {case_verdict(result)} "
                     f"({result.impl_seconds:.2f}s)")

    stats = check_over_seeds(ctx.op, ctx.impl, config=ctx.config, cases=ctx.cases, device=ctx.device,
                             seeds=ctx.seeds, mode=ctx.mode, hygiene=ctx.profile.hygiene,
                             warn_margin=ctx.warn_margin, extra_seed_cases=ctx.extra_seed_cases,
                             progress=progress, isolate=ctx.isolate, timeout=ctx.timeout)
    verdict = stats.verdict
    status = "fail" if verdict == "fail" or (verdict == "warn" and ctx.strict) else verdict
    exit_code = EXIT_OK
    if status == "fail":
        exit_code = exit_code_for(stats.violations) if stats.failures else EXIT_CHECK_FAILED
    tests = []
    # one test per case, failing when any seed failed it
    by_case: dict[int, list] = {}
    for rep in stats.reports:
        for c in rep.cases:
            by_case.setdefault(c.case, []).append((rep.seed, c))
    for case, runs in sorted(by_case.items()):
        axes = axes_label(runs[0][1].axes)
        failed = [(s, c) for s, c in runs if not c.passed]
        seconds = sum(c.impl_seconds + c.oracle_seconds for _, c in runs)
        if failed:
            msg = "; ".join(f"seed {s}: {','.join(c.violations)}" for s, c in failed)
            details = "\n".join(f"seed {s}: {m}" for s, c in failed for m in c.messages)
            details += (f"\nreproduce: fuseval check --op {ctx.op} --impl {ctx.impl_label} "
                        f"--config {ctx.config} --cases {case} --device {ctx.device} "
                        f"--seed {failed[0][0]} --mode {ctx.mode}")
            tests.append(TestResult(f"case {case} ({axes})", "fail", seconds, msg, details))
        else:
            tests.append(TestResult(f"case {case} ({axes})", "pass", seconds))
    for m in stats.metrics:
        if m.threshold is None:
            continue
        name = f"margin {m.output} {m.metric}"
        if m.verdict == "fail" or (m.verdict == "warn" and ctx.strict):
            tests.append(TestResult(name, "fail", 0.0, m.describe(), m.describe()))
        else:
            tests.append(TestResult(name, "pass", 0.0, output=("WARNING: " if m.verdict == "warn" else "")
                                    + m.describe()))
    quiet = tuple(f"{m.output} {m.metric}" for m in stats.metrics if m.verdict == "pass" or m.threshold is None)
    messages = [ln for ln in stats.lines() if not ln.startswith(quiet)]
    files = {}
    if ctx.out:
        path = os.path.join(ctx.out, f"check-{ctx.op}.json")
        with open(path, "w") as f:
            json.dump(jsonable({**stats.to_dict(),
                                "reports": [r.to_dict() for r in stats.reports]}), f, indent=1)
        files["check_json"] = path
    return ComponentResult(ctx.op, "check", status, stats.summary(), exit_code=exit_code,
                           messages=messages, tests=tests, files=files, data=stats.to_dict(),
                           result=stats)


def _callable_for(ctx: _Context, config: str):
    """The implementation as a component that calls it like a function sees it: a proxy to
    its worker process (isolated), or the implementation itself."""
    from .isolation import IsolatedImpl, can_isolate
    if ctx.isolate and can_isolate(ctx.impl)[0]:
        from .ops import get
        proxy = IsolatedImpl(ctx.impl, get(ctx.op, config).definition, ctx.device, ctx.timeout)
        proxy.mutant_name = getattr(ctx.impl, "mutant_name", None)
        return proxy if proxy.mutant_name else _Labelled(proxy, ctx.impl_label)
    return ctx.impl


class _Labelled:
    """A proxy that reports under the implementation's own label."""

    def __init__(self, fn, label: str):
        self._fn = fn
        self.__module__, _, self.__qualname__ = (label.partition(":") if ":" in label else ("", "", label))
        if hasattr(fn, "staged"):
            self.staged = fn.staged

    def __call__(self, *args):
        return self._fn(*args)


def _failure_text(failure: Any) -> str:
    """A readable line for a property failure of unknown shape."""
    if isinstance(failure, str):
        return failure
    for attr in ("describe", "summary", "message"):
        v = getattr(failure, attr, None)
        if callable(v):
            try:
                return str(v())
            except TypeError:
                continue
        if isinstance(v, str) and v:
            extra = getattr(failure, "reproduction", None) or getattr(failure, "reproduce", None)
            return v + (f" (reproduce: {extra})" if isinstance(extra, str) and extra else "")
    if isinstance(failure, dict):
        return "; ".join(f"{k}: {v}" for k, v in failure.items())
    return str(failure)


def _report_data(report: Any) -> dict:
    """A component report's ``to_dict()`` made JSON-safe ({} when it has none)."""
    to_dict = getattr(report, "to_dict", None)
    if not callable(to_dict):
        return {}
    try:
        return jsonable(to_dict())
    except Exception as exc:  # noqa: BLE001 - a report that cannot serialise is not a verdict
        return {"to_dict_error": f"{type(exc).__name__}: {exc}"}


def _component_properties(ctx: _Context) -> ComponentResult:
    import fuseval.properties as properties
    result = _call(properties.check_implementation, ctx.op, _callable_for(ctx, ctx.config),
                   profile=ctx.profile.properties, device=ctx.device, progress=ctx.progress)
    passed = bool(getattr(result, "passed"))
    failures = list(getattr(result, "failures", None) or [])
    messages = [_failure_text(f) for f in failures]
    # one JUnit test per property: it fails with the failures that name it
    names = [p for p in (getattr(result, "properties", None) or []) if isinstance(p, str)]
    tests: list[TestResult] = []
    for name in names:
        mine = [t for f, t in zip(failures, messages) if getattr(f, "property", None) == name]
        tests.append(TestResult(name, "fail", 0.0, mine[0].splitlines()[0], "\n\n".join(mine)) if mine
                     else TestResult(name, "pass"))
    for f, t in zip(failures, messages):
        if getattr(f, "property", None) not in names:
            tests.append(TestResult(str(getattr(f, "property", None) or "property"), "fail", 0.0,
                                    t.splitlines()[0] if t else "", t))
    n = getattr(result, "examples_run", None)
    what = f"{', '.join(names)}" if names else "properties"
    summary = (f"{what}: " + ("held" if passed else f"{len(failures)} falsified")
               + (f" over {n} examples" if isinstance(n, int) else ""))
    if not passed and failures:
        first = messages[0].splitlines()
        summary += f"; first: {first[0][:160]}" if first else ""
    data = _report_data(result)
    files = {}
    if ctx.out and data:
        path = os.path.join(ctx.out, f"properties-{ctx.op}.json")
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
        files["properties_json"] = path
    return ComponentResult(ctx.op, "properties", "pass" if passed else "fail", summary,
                           exit_code=EXIT_OK if passed else EXIT_CHECK_FAILED, messages=messages,
                           tests=tests, files=files, data=data, result=result)


def _component_budget(ctx: _Context) -> ComponentResult:
    import fuseval.budget as budget

    # the budget runs once, on the first seed of the check (a count of seeds starts at 0)
    seed = 0 if isinstance(ctx.seeds, int) else int(list(ctx.seeds)[0])

    def progress(result, done, total):
        verdict = "ok" if getattr(result, "passed", False) else \
            f"over budget ({getattr(result, 'first_over_budget', None) or 'see the report'})"
        ctx.progress(f"{ctx.op} budget [{done}/{total}] case {getattr(result, 'case', '?')}: {verdict}")

    chosen = ctx.budget
    if chosen is not None and hasattr(budget, "load_budget"):
        # a budget file that does not parse, or is for another operator, is bad input (exit 5)
        from .ops import get
        try:
            chosen = budget.load_budget(chosen, get(ctx.op, ctx.budget_config).definition)
        except (ValueError, OSError) as exc:
            raise FusevalError(f"{ctx.op}: budget {ctx.budget!r} is malformed or does not apply: {exc}",
                               EXIT_BAD_FILE) from exc
    report = _call(budget.run_budget, ctx.op, ctx.impl, config=ctx.budget_config, cases=ctx.budget_cases,
                   device=ctx.device, seed=seed, mode=ctx.mode, budget=chosen, progress=progress,
                   isolate=ctx.isolate, timeout=ctx.timeout)
    passed = bool(getattr(report, "passed"))
    first = getattr(report, "first_over_budget", None)
    messages: list[str] = []
    if not passed:
        messages.append(f"first stage over budget: {_failure_text(first)}" if first is not None
                        else "the error budget was exceeded")
        messages += _budget_findings(report)
    summary_attr = getattr(report, "summary", None)
    summary = summary_attr() if callable(summary_attr) else summary_attr
    if not isinstance(summary, str) or not summary:
        summary = "every stage within budget" if passed else messages[0]
    files = {}
    if ctx.out:
        # a report that fails to render is noted, but does not change the budget's verdict
        base = os.path.join(ctx.out, f"budget-{ctx.op}")
        for key, ext, method in (("budget_json", ".json", "save_json"), ("budget_markdown", ".md", "save_markdown"),
                                 ("budget_html", ".html", "save_html")):
            fn = getattr(report, method, None)
            if not callable(fn):
                continue
            try:
                fn(base + ext)
                files[key] = base + ext
            except Exception as exc:  # noqa: BLE001
                messages.append(f"could not write {base + ext}: {type(exc).__name__}: {exc}")
    tests = []
    rows = None
    to_df = getattr(report, "to_dataframe", None)
    if callable(to_df):
        try:
            rows = to_df().to_dict("records")
        except Exception:  # noqa: BLE001 - the tests below are a convenience
            rows = None
    if rows and any("stage" in r for r in rows):
        by_stage: dict[str, list[dict]] = {}
        for r in rows:
            by_stage.setdefault(str(r.get("stage")), []).append(r)
        for stage, rs in by_stage.items():
            flags = [r.get("within_budget", r.get("passed", r.get("ok"))) for r in rs]
            bad = [r for r, ok in zip(rs, flags) if ok is False]
            if bad:
                text = "; ".join(", ".join(f"{k}={v}" for k, v in r.items()) for r in bad[:3])
                tests.append(TestResult(f"stage {stage}", "fail", 0.0, f"{len(bad)} row(s) over budget", text))
            else:
                tests.append(TestResult(f"stage {stage}", "pass"))
    data = _report_data(report)
    return ComponentResult(ctx.op, "budget", "pass" if passed else "fail", summary,
                           exit_code=EXIT_OK if passed else EXIT_CHECK_FAILED, messages=messages,
                           tests=tests, files=files, data=data, result=report)


def _budget_findings(report: Any, limit: int = 12) -> list[str]:
    """One line per case over budget: where, which allowance, value against limit."""
    from .definitions import axes_label
    lines: list[str] = []
    for c in getattr(report, "cases", None) or []:
        if getattr(c, "passed", True):
            continue
        axes = axes_label(getattr(c, "axes", None) or {})
        where = getattr(c, "first_over_budget", None)
        detail = ""
        stage = next((s for s in getattr(c, "stages", []) if getattr(s, "stage", None) == where), None)
        checks = getattr(stage, "checks", None) if stage is not None else \
            getattr(getattr(c, "end_to_end", None), "checks", None)
        bad = [ch for ch in (checks or []) if isinstance(ch, dict) and not ch.get("passed", True)]
        if bad:
            ch = bad[0]
            detail = (f": {ch.get('allowance')} ({ch.get('applies_to')}) value {float(ch.get('value')):.3g} "
                      f"> limit {float(ch.get('limit')):.3g}")
        notes = list(getattr(stage, "messages", None) or []) + list(getattr(c, "messages", None) or [])
        lines.append(f"case {c.case} ({axes}): {where or 'end_to_end'} over budget{detail}"
                     + (f"; {notes[0]}" if notes else ""))
        if len(lines) >= limit:
            break
    return lines


_RUNNERS = {"check": _component_check, "properties": _component_properties, "budget": _component_budget}


def _run_isolated(name: str, ctx: _Context) -> ComponentResult:
    """Run one component; anything it raises becomes a failed ('error') component."""
    t0 = time.perf_counter()
    available, why = component_available(name) if name != "check" else (True, "")
    if not available:
        return ComponentResult(ctx.op, name, "skipped", f"not run: {why}", 0.0,
                               tests=[TestResult(name, "skipped", 0.0, why)])
    ctx.progress(f"{ctx.op} {name}: started")
    try:
        result = _RUNNERS[name](ctx)
    except Exception as exc:  # noqa: BLE001 - one broken component must not hide the others
        from .ops import ImplementationError
        from .errors import EXIT_OUT_OF_MEMORY, is_out_of_memory
        code = getattr(exc, "exit_code", None)
        if code is None:
            code = EXIT_IMPORT_ERROR if isinstance(exc, ImplementationError) else \
                EXIT_OUT_OF_MEMORY if is_out_of_memory(exc) else EXIT_INTERNAL
        tb = traceback.format_exc()
        msg = f"{name} raised {type(exc).__name__}: {exc}"
        result = ComponentResult(ctx.op, name, "error", msg.splitlines()[0][:300], exit_code=code,
                                 messages=[msg], tests=[TestResult(name, "error", 0.0, msg, tb)],
                                 data={"traceback": tb})
    result.seconds = time.perf_counter() - t0
    ctx.progress(f"{ctx.op} {name}: {result.status} ({result.seconds:.1f}s)")
    return result


def stderr_progress(stream: TextIO | None = None) -> Callable[[str], None]:
    t0 = time.perf_counter()

    def report(message: str) -> None:
        print(f"[gate {time.perf_counter() - t0:6.1f}s] {message}", file=stream or sys.stderr, flush=True)
    return report


def run_component(name: str, op: str, impl: str | Callable, *, profile: str | Profile = "ci",
                  device: str | None = None, config: str | None = None, cases: str | None = None,
                  seeds: int | Sequence[int] | None = None, mode: str = "benchmark",
                  warn_margin: float | None = None, strict: bool = False,
                  budget_config: str | None = None, budget_cases: str | None = "profile",
                  budget: Any = None, out: str | None = None,
                  progress: Callable[[str], None] | None = None, isolate: bool | None = None,
                  timeout: float | None = None) -> ComponentResult:
    """Run one gate component on one operator (see :func:`run_gate` for the arguments)."""
    if name not in COMPONENTS:
        raise FusevalError(f"unknown gate component {name!r}; expected one of {', '.join(COMPONENTS)}")
    ctx = _context(op, impl, profile=profile, device=device, config=config, cases=cases, seeds=seeds,
                   mode=mode, warn_margin=warn_margin, strict=strict, budget_config=budget_config,
                   budget_cases=budget_cases, budget=budget, out=out, progress=progress,
                   isolate=isolate, timeout=timeout)
    return _run_isolated(name, ctx)


def _profile(profile: str | Profile) -> Profile:
    if isinstance(profile, Profile):
        return profile
    if profile not in PROFILES:
        raise FusevalError(f"unknown gate profile {profile!r}; expected one of {', '.join(PROFILES)}")
    return PROFILES[profile]


def _context(op, impl, *, profile, device, config, cases, seeds, mode, warn_margin, strict,
             budget_config, budget_cases, budget, out, progress, isolate=None, timeout=None) -> _Context:
    from .isolation import default_isolate
    from .ops import impl_label
    isolate = default_isolate(isolate)
    from .stats import DEFAULT_WARN_MARGIN
    prof = _profile(profile)
    names = resolve_ops(op)
    if len(names) != 1:
        raise FusevalError(f"one operator expected here, got {', '.join(names)}")
    op = names[0]
    dev = _resolve_device(device or prof.device)
    cfg = config or prof.config
    if seeds is not None and (isinstance(seeds, bool) or (isinstance(seeds, int) and seeds < 1)
                              or (not isinstance(seeds, int) and not list(seeds))):
        raise FusevalError(f"seeds: expected a number of seeds >= 1 (or a non-empty list), got {seeds!r}")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
        raise FusevalError(f"timeout: expected a number of seconds >= 0, got {timeout!r}")
    _resolve_impl(op, impl, cfg, dev, isolate)      # fail early, with exit code EXIT_IMPORT_ERROR
    if mode not in ("benchmark", "realistic"):
        raise FusevalError(f"input mode must be 'benchmark' or 'realistic', got {mode!r}")
    if out:
        os.makedirs(out, exist_ok=True)
    return _Context(op=op, impl=impl, impl_label=impl_label(impl), profile=prof, device=dev, config=cfg,
                    cases=cases if cases is not None else prof.cases,
                    seeds=seeds if seeds is not None else prof.seeds, mode=mode,
                    warn_margin=DEFAULT_WARN_MARGIN if warn_margin is None else warn_margin, strict=strict,
                    budget_config=budget_config or (config or prof.budget_config),
                    budget_cases=prof.budget_cases if budget_cases == "profile" else budget_cases,
                    budget=budget, out=out, progress=progress or (lambda message: None),
                    # explicit --cases apply to every seed
                    extra_seed_cases=prof.extra_seed_cases if cases is None else None,
                    isolate=isolate, timeout=timeout)


def run_gate(op: str | Sequence[str], impl: str | Callable, *, profile: str | Profile = "ci",
             device: str | None = None, config: str | None = None, cases: str | None = None,
             seeds: int | Sequence[int] | None = None, mode: str = "benchmark",
             components: Iterable[str] = COMPONENTS, warn_margin: float | None = None,
             strict: bool = False, budget_config: str | None = None, budget_cases: str | None = "profile",
             budget: Any = None, out: str | None = None,
             progress: Callable[[str], None] | None = None, isolate: bool | None = None,
             timeout: float | None = None) -> GateReport:
    """Run the gate on one operator, several ("a,b", a list) or "all".

    ``impl``: a name of the operators' implementation tables ("fast", "torch"...),
    "module:function" or a callable. ``profile`` sets config, device, seeds and the
    properties / budget profiles (``PROFILES``); ``config``, ``device``, ``cases``,
    ``seeds``, ``budget_config`` and ``budget_cases`` override it. ``components``: which of
    "check", "properties", "budget" to run. ``strict``: warnings fail. ``budget``: handed to
    :func:`fuseval.budget.run_budget` (a budget file or mapping). ``out``: a folder for
    junit.xml, gate.json, gate.md and the components' reports. ``progress(message)``:
    called as work proceeds (the CLI prints these on stderr). ``isolate`` (default): the
    implementation runs in a worker process of its own in every component
    (:mod:`fuseval.isolation`), each case within ``timeout`` seconds; False trusts it
    and runs it in this process.

    Raises :class:`FusevalError` for bad input to the gate itself (unknown operator,
    profile or component, an implementation that does not import, no CUDA device)."""
    t_start = time.perf_counter()
    started = utc_timestamp()
    names = resolve_ops(op)
    components = list(components)
    for c in components:
        if c not in COMPONENTS:
            raise FusevalError(f"unknown gate component {c!r}; expected one of {', '.join(COMPONENTS)}")
    if not components:
        raise FusevalError(f"the gate would run nothing: no component selected (of {', '.join(COMPONENTS)})")
    contexts = [_context(name, impl, profile=profile, device=device, config=config, cases=cases,
                         seeds=seeds, mode=mode, warn_margin=warn_margin, strict=strict,
                         budget_config=budget_config, budget_cases=budget_cases, budget=budget, out=out,
                         progress=progress, isolate=isolate, timeout=timeout) for name in names]
    results = []
    for ctx in contexts:
        for c in components:
            results.append(_run_isolated(c, ctx))
    from .ops import impl_label
    report = GateReport(names, impl_label(impl), _profile(profile).name, contexts[0].device, strict,
                        results, time.perf_counter() - t_start, started)
    for r in results:
        report.files.update({f"{r.op}.{k}": v for k, v in r.files.items()})
    if out:
        report.save(out)
    return report
