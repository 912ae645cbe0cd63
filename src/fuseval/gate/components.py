"""The gate's three components, each calling its part of fuseval directly and turning its
report into a :class:`~fuseval.gate.results.ComponentResult`:

``check``       :func:`fuseval.stats.check_over_seeds` (the check over several seeds);
``properties``  :func:`fuseval.properties.check_implementation`;
``budget``      :func:`fuseval.budget.run_budget`.

Each is handed its context, validated (:mod:`fuseval.gate.context`): the requests built
from it are trusted as they are, not validated again.
"""
from __future__ import annotations

import os
import time
import traceback
from typing import Any, Callable

from ..errors import (EXIT_CHECK_FAILED, EXIT_OK, FusevalError, budget_exit_code, check_exit_code, exit_code_for,
                      exit_code_of)
from .context import GateContext
from .results import ComponentResult, TestResult, not_run
from ..budget.request import BudgetRequest
from ..budget.runner import run_request as run_budget_request
from ..definitions import axes_label, parse_selection
from ..jsonio import dumps, jsonable
from ..operators import load
from ..operators.implementations import get
from ..properties import check_implementation
from ..runner.isolation import IsolatedImpl, decide
from ..requests import CheckRequest
from ..stats import over_seeds, seed_values
from ..terminal import case_verdict, fmt_number


def _write_json(path: str, doc: Any) -> None:
    with open(path, "w") as f:
        f.write(dumps(doc, indent=1) + "\n")


# --------------------------------------------------------------------------- check
def _case_tests(ctx: GateContext, stats: Any) -> list[TestResult]:
    """One test per case, failing when any seed failed it, with the command that reruns it."""
    by_case: dict[int, list] = {}
    for rep in stats.reports:
        for c in rep.cases:
            by_case.setdefault(c.case, []).append((rep.seed, c))
    tests = []
    for case, runs in sorted(by_case.items()):
        name = f"case {case} ({axes_label(runs[0][1].axes)})"
        failed = [(s, c) for s, c in runs if not c.passed]
        seconds = sum(sum(c.timings.values()) for _, c in runs)
        if not failed:
            tests.append(TestResult(name, "pass", seconds))
            continue
        msg = "; ".join(f"seed {s}: {','.join(c.violations)}" for s, c in failed)
        details = "\n".join(f"seed {s}: {m}" for s, c in failed for m in c.messages)
        details += (f"\nreproduce: fuseval check --op {ctx.op} --impl {ctx.impl_label} "
                    f"--config {ctx.config} --cases {case} --device {ctx.device} "
                    f"--seed {failed[0][0]} --mode {ctx.mode}")
        tests.append(TestResult(name, "fail", seconds, msg, details))
    return tests


def _margin_tests(ctx: GateContext, stats: Any) -> list[TestResult]:
    tests = []
    for m in stats.metrics:
        if m.threshold is None:
            continue
        name = f"margin {m.output} {m.metric}"
        if m.verdict == "fail" or (m.verdict == "warn" and ctx.strict):
            tests.append(TestResult(name, "fail", 0.0, m.describe(), m.describe()))
        else:
            tests.append(TestResult(name, "pass", 0.0, output=("WARNING: " if m.verdict == "warn" else "")
                                    + m.describe()))
    return tests


def _blind_findings(stats: Any, in_benchmark: bool = False) -> list[str]:
    """One line per (case, output) whose tolerance cannot see an error of 10% of its RMS:
    with ``in_benchmark``, those where the benchmark's own reference shows the same (the
    problem's tolerance is blind on its own outputs: reported, not failed), else the rest."""
    seen: dict[tuple[int, str], list[int]] = {}
    records = {}
    for b in stats.blind:
        if bool(b.get("in_benchmark")) != in_benchmark:
            continue
        seen.setdefault((b["case"], b["output"]), []).append(b["seed"])
        records.setdefault((b["case"], b["output"]), b)
    tail = ("; the benchmark's own reference shows the same: a blind output of the problem, not a failure"
            if in_benchmark else "")
    return [f"{'blind_output' if in_benchmark else 'blind_tolerance'}: {output} on case {case} "
            f"(seed {', '.join(map(str, seeds))}): atol "
            f"{fmt_number(records[case, output]['atol'], 2, 'g')} >= 10% of its RMS "
            f"{fmt_number(records[case, output]['rms'], 2, 'g')}: an error that size passes every element{tail}"
            for (case, output), seeds in seen.items()]


def check_component(ctx: GateContext) -> ComponentResult:

    def progress(seed, result, done, total):
        ctx.progress(f"{ctx.op} check seed {seed} [{done}/{total}] case {result.case}: {case_verdict(result)} "
                     f"({result.impl_seconds:.2f}s)")

    # the context is validated: its request is trusted as it is
    request = CheckRequest(ctx.op, ctx.impl, config=ctx.config, cases=ctx.cases, device=ctx.device, mode=ctx.mode,
                           isolate=ctx.isolate, timeout=ctx.timeout,
                           blind_witness=True)   # a blind output the benchmark's reference shares is no failure
    stats = over_seeds(request, seed_values(ctx.seeds), hygiene=ctx.profile.hygiene, warn_margin=ctx.warn_margin,
                       extra_seed_cases=ctx.extra_seed_cases, progress=progress)
    blind = _blind_findings(stats)
    blind_problem = _blind_findings(stats, in_benchmark=True)
    violations = stats.violations + (["blind_tolerance"] if blind else [])
    status = stats.verdict
    if status == "pass" and blind_problem:
        status = "warn"
    if status == "fail" or blind or (status == "warn" and ctx.strict):
        status = "fail"
    # the gate's verdict is against the float64 oracle: one that was not made is said, and fails
    not_float64 = list(dict.fromkeys(note for rep in stats.reports for note in rep.oracle_notes))
    exit_code = check_exit_code(violations if status == "fail" else [], failed=status == "fail",
                                float64_missing=bool(not_float64))
    if exit_code != EXIT_OK:
        status = "fail"
    tests = _case_tests(ctx, stats) + _margin_tests(ctx, stats)
    if blind:
        tests.append(TestResult("blind tolerance", "fail", 0.0, blind[0], "\n".join(blind)))
    if blind_problem:
        tests.append(TestResult("blind outputs of the problem", "pass", 0.0,
                                output="WARNING: " + "\n".join(blind_problem)))
    quiet = tuple(f"{m.output} {m.metric}" for m in stats.metrics if m.verdict == "pass" or m.threshold is None)
    messages = [f"oracle: {note}" for note in not_float64] + blind + blind_problem + \
        [ln for ln in stats.lines() if not ln.startswith(quiet)]
    summary = stats.summary() + (f"; {len(blind)} output(s) with a blind tolerance" if blind else "") \
        + (f"; {len(blind_problem)} blind output(s) of the problem (the benchmark's reference too)"
           if blind_problem else "") \
        + (f"; no float64 oracle ({not_float64[0]})" if not_float64 else "")
    files = {}
    if ctx.out:
        path = os.path.join(ctx.out, f"check-{ctx.op}.json")
        _write_json(path, {**stats.to_dict(), "reports": [r.to_dict() for r in stats.reports]})
        files["check_json"] = path
    data = jsonable({**stats.to_dict(), "violations": violations, "case_timings": stats.case_timings()})
    return ComponentResult(ctx.op, "check", status, summary, exit_code=exit_code, messages=messages,
                           tests=tests, files=files, data=data, timings=stats.timings, result=stats)


# --------------------------------------------------------------------------- properties
class _Labelled:
    """The isolated implementation under the implementation's own label, so the property
    suite's reproduction commands name what the user gave (``--impl torch``)."""

    def __init__(self, fn: Callable, label: str, mutant_name: str | None):
        self._fn = fn
        self.__module__, _, self.__qualname__ = (label.partition(":") if ":" in label else ("", "", label))
        self.mutant_name = mutant_name
        if hasattr(fn, "staged"):        # IsolatedImpl has it exactly when the worker's implementation has taps
            self.staged = fn.staged

    def __call__(self, *args):
        return self._fn(*args)


def implementation_for(ctx: GateContext, config: Any) -> str | Callable:
    """What a component that calls the implementation like a function gets: a proxy to its
    worker process (isolated), or the implementation itself."""
    if not decide(ctx.impl, ctx.isolate):
        return ctx.impl
    proxy = IsolatedImpl(ctx.impl, get(ctx.op, config).definition, ctx.device, ctx.timeout)
    # a mutant of fuseval.operators.mutants is labelled by its name in the property reports
    mutant_name = getattr(ctx.impl, "mutant_name", None)
    return _Labelled(proxy, ctx.impl_label, mutant_name)


def properties_component(ctx: GateContext) -> ComponentResult:
    report = check_implementation(ctx.op, implementation_for(ctx, ctx.config), profile=ctx.profile.properties,
                                  device=ctx.device)
    messages = [str(f) for f in report.failures]
    tests: list[TestResult] = []
    for name in report.properties:
        mine = [t for f, t in zip(report.failures, messages) if f.property == name]
        tests.append(TestResult(name, "fail", 0.0, mine[0].splitlines()[0], "\n\n".join(mine)) if mine
                     else TestResult(name, "pass"))
    # a failure can name a violation (raised, nonfinite...) instead of one of the properties
    for f, t in zip(report.failures, messages):
        if f.property not in report.properties:
            tests.append(TestResult(f.property, "fail", 0.0, t.splitlines()[0], t))
    summary = (f"{', '.join(report.properties)}: "
               + ("held" if report.passed else f"{len(report.failures)} falsified")
               + f" over {report.examples_run} examples")
    if messages:
        summary += f"; first: {messages[0].splitlines()[0][:160]}"
    notes = report.notes()
    if notes:
        summary += "".join(f"; note: {n[:300]}" for n in notes)
    data = jsonable(report.to_dict())
    files = {}
    if ctx.out:
        files["properties_json"] = os.path.join(ctx.out, f"properties-{ctx.op}.json")
        _write_json(files["properties_json"], data)
    return ComponentResult(ctx.op, "properties", "pass" if report.passed else "fail", summary,
                           exit_code=EXIT_OK if report.passed else EXIT_CHECK_FAILED, messages=messages,
                           tests=tests, files=files, data=data, result=report)


# --------------------------------------------------------------------------- budget
def _budget_findings(report: Any, limit: int = 12) -> list[str]:
    """One line per case over budget: where, which allowance, value against limit."""
    lines: list[str] = []
    for c in report.cases:
        if c.passed:
            continue
        where = c.first_over_budget
        stage = next((s for s in c.stages if s.stage == where), None)
        checks = stage.checks if stage is not None else c.end_to_end.checks
        bad = [ch for ch in checks if not ch["passed"]]
        detail = ""
        if bad:
            ch = bad[0]
            detail = (f": {ch['allowance']} ({ch['applies_to']}) value {fmt_number(ch['value'], 2, 'g')} "
                      f"> limit {fmt_number(ch['limit'], 2, 'g')}")
        notes = (stage.messages if stage is not None else []) + c.messages
        verdict = "raised" if c.raised else f"{where or 'end_to_end'} over budget{detail}"
        lines.append(f"case {c.case} ({axes_label(c.axes)}): {verdict}" + (f"; {notes[0]}" if notes else ""))
        if len(lines) >= limit:
            break
    return lines


def _stage_tests(report: Any) -> list[TestResult]:
    """One test per stage (and end to end), failing with the cases where it is over budget."""
    tests = []
    for stage in list(report.stages) + ["end_to_end"]:
        if stage == "end_to_end":
            over = [c for c in report.cases if not c.end_to_end.passed]
        else:
            over = [c for c in report.cases if any(s.stage == stage and s.passed is False for s in c.stages)]
        if over:
            text = "; ".join(f"case {c.case}" + (f": {c.messages[0]}" if c.messages else "") for c in over[:3])
            tests.append(TestResult(f"stage {stage}", "fail", 0.0, f"{len(over)} case(s) over budget", text))
        else:
            tests.append(TestResult(f"stage {stage}", "pass"))
    return tests


def _check_covers_budget_hygiene(ctx: GateContext) -> bool:
    """Whether this run's check component applies the hygiene rules to every budget case
    with the budget's configuration, seed and inputs (its first seed, when the profile
    applies them there)."""
    if not ctx.check_runs or ctx.profile.hygiene not in (True, "first"):
        return False
    if ctx.budget_config != ctx.config:
        return False
    n = len(load(ctx.op, ctx.config).seed_cases)
    return set(parse_selection(ctx.budget_cases, n)) <= set(parse_selection(ctx.cases, n))


def budget_component(ctx: GateContext) -> ComponentResult:

    def progress(result, done, total):
        verdict = "ok" if result.passed else f"over budget ({result.first_over_budget or 'see the report'})"
        ctx.progress(f"{ctx.op} budget [{done}/{total}] case {result.case}: {verdict}")

    # the budget runs once, on the first seed of the check; where this run's check makes the
    # partial-cache calls on the same cases, seed and inputs, the budget does not repeat them
    repeated = _check_covers_budget_hygiene(ctx)
    report = run_budget_request(BudgetRequest(
        ctx.op, ctx.impl, config=ctx.budget_config, cases=ctx.budget_cases, device=ctx.device,
        seed=seed_values(ctx.seeds)[0], mode=ctx.mode, budget=ctx.budget, progress=progress,
        isolate=ctx.isolate, timeout=ctx.timeout, hygiene=not repeated))
    within = sum(c.passed for c in report.cases)
    summary = f"{within}/{len(report.cases)} cases within budget"
    messages: list[str] = []
    if not report.passed:
        summary += f"; first over budget: {report.first_over_budget or 'see the report'}"
        messages = [f"first stage over budget: {report.first_over_budget}"] + _budget_findings(report)
    files = {}
    if ctx.out:
        base = os.path.join(ctx.out, f"budget-{ctx.op}")
        files = {"budget_json": report.save_json(base + ".json"), "budget_markdown": report.save_markdown(base + ".md"),
                 "budget_html": report.save_html(base + ".html")}
    timings: dict[str, float] = {}
    for c in report.cases:
        for k, v in c.seconds.items():
            timings[k] = timings.get(k, 0.0) + v
    code = budget_exit_code(report.passed, [c.messages for c in report.cases if c.raised])
    data = report.to_dict()
    if repeated:
        data["hygiene_left_to_check"] = {"seed": seed_values(ctx.seeds)[0], "cases": [c.case for c in report.cases]}
    return ComponentResult(ctx.op, "budget", "pass" if report.passed else "fail", summary, exit_code=code,
                           messages=messages, tests=_stage_tests(report), files=files, data=data,
                           timings=timings, result=report)


# the check's violations that the budget's own partial-cache calls would have found
_PARTIAL_CALL_VIOLATIONS = ("cached_result", "timeout", "exited", "crashed", "raised", "out_of_memory")


def join_budget_hygiene(results: list[ComponentResult]) -> None:
    """A budget that left its partial-cache calls to the check of the same run takes the
    check's findings on its cases: where the check found a cached result (or a later call
    that ended without outputs) on a budget case of the same seed, the budget's figures
    were measured on an implementation that fails those rules, so the budget fails too,
    as it would have failed by its own calls. Applied once every component has run (in
    any order, serial or side by side)."""
    checks = {r.op: r for r in results if r.name == "check"}
    for r in results:
        left = r.data.get("hygiene_left_to_check") if r.name == "budget" else None
        check = checks.get(r.op)
        if not left or check is None:
            continue
        found = [f for f in check.data.get("failures", []) if f.get("seed") == left["seed"]
                 and f.get("case") in left["cases"] and set(f.get("violations", ())) & set(_PARTIAL_CALL_VIOLATIONS)]
        if not found:
            continue
        violations = sorted({v for f in found for v in f["violations"] if v in _PARTIAL_CALL_VIOLATIONS})
        why = (f"the check of this run found {', '.join(violations)} on budget case(s) "
               f"{', '.join(str(f['case']) for f in found)} (seed {left['seed']}): the budget's figures "
               "describe an implementation that fails the hygiene rules")
        r.status, r.exit_code = "fail", exit_code_for(violations)
        r.summary = f"{r.summary}; {why}"
        r.messages.insert(0, why)
        r.tests.append(TestResult("hygiene (from the check)", "fail", 0.0, why, why))


RUNNERS: dict[str, Callable[[GateContext], ComponentResult]] = {
    "check": check_component, "properties": properties_component, "budget": budget_component}


def _crashed(ctx: GateContext, name: str, exc: Exception, code: int, tb: str | None) -> ComponentResult:
    msg = f"{name} raised {type(exc).__name__}: {exc}" if tb else f"{name}: {exc}"
    return ComponentResult(ctx.op, name, "error", msg.splitlines()[0][:300], exit_code=code, messages=[msg],
                           tests=[TestResult(name, "error", 0.0, msg, tb or msg)],
                           data={"traceback": tb} if tb else {})


def run_guarded(name: str, ctx: GateContext) -> ComponentResult:
    """Run one component. A FusevalError it raises is a failure of its kind (its exit
    code); any other exception is a crash: a bug in fuseval (exit 70, its traceback kept),
    or out of memory; either way the other components still run."""
    if name in ctx.not_run:
        return not_run(ctx.op, name, ctx.not_run[name])
    t0 = time.perf_counter()
    ctx.progress(f"{ctx.op} {name}: started")
    try:
        result = RUNNERS[name](ctx)
    except FusevalError as exc:
        result = _crashed(ctx, name, exc, exit_code_of(exc), None)
    except Exception as exc:  # noqa: BLE001 - one broken component must not hide the others
        result = _crashed(ctx, name, exc, exit_code_of(exc), traceback.format_exc())
    result.seconds = time.perf_counter() - t0
    ctx.progress(f"{ctx.op} {name}: {result.status} ({result.seconds:.1f}s)")
    return result
