"""Running the gate: every operator's context validated first, then each component in
turn, guarded so that one that crashes is reported and the others still run."""
from __future__ import annotations

import sys
import time
from dataclasses import replace
from typing import Any, Callable, Sequence, TextIO

from ..errors import ImplementationError, UsageError
from . import components as _components
from .components import run_guarded
from .context import GateContext, context, resolve_ops, settings
from .request import GateRequest
from ..requests import as_request
from .results import ComponentResult, GateReport, not_run
from ..terminal import utc_timestamp
from ..operators import load
from ..operators.implementations import impl_label, missing_implementation
from ..runner import isolation
from ..runner.isolation import decide
from . import parallel
from . import warmup as _warmup


def stderr_progress(stream: TextIO | None = None) -> Callable[[str], None]:
    t0 = time.perf_counter()

    def report(message: str) -> None:
        print(f"[gate {time.perf_counter() - t0:6.1f}s] {message}", file=stream or sys.stderr, flush=True)
    return report


def _plan(op: str | Sequence[str], names: list[str], impl: Any, s,
          chosen: list[str]) -> list[GateContext | list[ComponentResult]]:
    """Per operator, in order: its context, or (under "all") the components it does not
    run because it has no implementation ``impl``. Every context is built (validated)
    before anything runs."""
    every = isinstance(op, str) and op == "all"
    reasons = {name: missing_implementation(load(name), impl) if every else None for name in names}
    _prespawn_workers([n for n in names if not reasons[n]], impl, s)
    plan: list[GateContext | list[ComponentResult]] = []
    for name in names:
        reason = reasons[name]
        plan.append([not_run(name, c, reason) for c in chosen] if reason else context(name, impl, s))
    if not any(isinstance(p, GateContext) for p in plan):
        raise ImplementationError(f"implementation {impl_label(impl)!r}: no operator has it "
                                  "(see `fuseval list --op NAME`, or give 'module:function')")
    return plan


def _prespawn_workers(names: list[str], impl: Any, s) -> None:
    """The implementation's worker processes of every operator spawned side by side before
    the contexts start them one by one (each imports torch meanwhile)."""
    if len(names) < 2 or not isolation.decide(impl, s.isolate):
        return
    try:
        defns = [load(n, s.config or s.profile.config) for n in names]
    except Exception:  # noqa: BLE001 - a bad configuration: the contexts report it, with its exit code
        return
    isolation.prespawn(impl, defns, s.device)


def _run_plan(plan: list, request: GateRequest, s) -> list[ComponentResult]:
    """Every component of the plan, in the plan's order: serially, or ``request.jobs`` at
    a time (:mod:`fuseval.gate.parallel`: a thread per operator, or a pool of processes)."""
    chosen, impl, jobs = s.components, request.impl, request.jobs
    units = [(entry, c) for entry in plan if isinstance(entry, GateContext)
             for c in chosen if c not in entry.not_run]
    isolated = decide(impl, s.isolate)
    if jobs == "auto":
        jobs = parallel.default_jobs(s.device, len(units), len({ctx.op for ctx, _ in units}), isolated)
    done: dict[tuple[str, str], ComponentResult] = {}
    if jobs > 1 and len(units) > 1 and isinstance(impl, str):
        if parallel.by_operator(units, s.device, isolated, jobs):
            ran = parallel.run_operators(units, jobs)
        else:
            # the seeds as this run resolved them: a pool process must not draw seeds of its own
            resolved = replace(request, seeds=list(s.seeds), seed=None, progress=None)
            ran = parallel.run_units(units, resolved, min(jobs, len(units)), s.progress, s.device)
        done = {(ctx.op, c): r for (ctx, c), r in zip(units, ran)}
    results: list[ComponentResult] = []
    for entry in plan:
        if isinstance(entry, list):
            results += entry
        else:
            results += [done.get((entry.op, c)) or run_guarded(c, entry) for c in chosen]
    _components.join_budget_hygiene(results)
    return results


def run_component(name: str, op: str, impl: str | Callable, **options: Any) -> ComponentResult:
    """Run one gate component on one operator (the keyword arguments are :func:`run_gate`'s);
    an operator without the implementation is an ImplementationError here."""
    request = GateRequest(op, impl, components=(name,), **options).validated()
    names = resolve_ops(op)
    if len(names) != 1:
        raise UsageError(f"{request.name('op')}: one operator expected here, got {', '.join(names)}")
    return run_guarded(name, context(names[0], impl, settings(request)))


def run_gate(op: str | Sequence[str] | GateRequest, impl: str | Callable | None = None,
             **options: Any) -> GateReport:
    """Run the gate on one operator, several ("a,b", a list) or "all".

    The keyword arguments are the fields of :class:`fuseval.gate.request.GateRequest`, and
    ``run_gate(request)`` takes such a request whole (what the command line builds);
    either is validated here, once (a :class:`~fuseval.errors.UsageError` naming the first
    bad option), and :func:`run_request` runs it.

    ``impl``: a name of the operators' implementation tables ("fast", "torch"...),
    "module:function" or a callable; under "all", an operator whose table lacks the name
    is reported as not run ("no implementation 'fast'"), while naming such an operator is
    an error. ``profile`` (default "ci") sets config, device, seeds and the properties /
    budget profiles (``PROFILES``); ``config``, ``device``, ``cases``, ``seeds``,
    ``budget_config`` and ``budget_cases`` ("all", a selection, or "profile", the default)
    override it. ``seed``: the first seed of the check (None: drawn at random; the report
    has the seeds). ``mode``: "benchmark" (default) or "realistic" inputs.
    ``components``: which of "check", "properties", "budget" to run (default all).
    ``warn_margin``: warn when less than this fraction of a rule's allowance is left
    (default 0.5). ``strict``: warnings fail.
    ``budget``: a budget file or mapping for :func:`fuseval.budget.run_budget`. ``out``: a
    folder for junit.xml, gate.json, gate.md and the components' reports.
    ``progress(message)``: called as work proceeds (the CLI prints these on stderr).
    ``isolate`` (default): the implementation runs in a worker process of its own in every
    component (:mod:`fuseval.runner.isolation`), each case within ``timeout`` seconds; False
    trusts it and runs it in this process. ``jobs``: components run side by side, ``jobs``
    at a time (:mod:`fuseval.gate.parallel`; "auto": one per CPU core, at most 4, on the
    CPU, one per GPU on a machine with several, one per operator on one GPU when isolated,
    else 1; default 1, serial): isolated, with at least as many operators as jobs and no
    GPU for each, one thread per operator drives that operator's worker; otherwise a pool
    of processes. The report is the same as a serial run's, in the same order. An
    implementation given as a callable runs serially. ``warmup`` (default True): on CUDA,
    a few processes compile the implementation's kernels for the run's case shapes and
    properties beside it (:mod:`fuseval.gate.warmup`; it changes no result, only how soon
    the kernels are in Triton's cache).

    Raises :class:`~fuseval.errors.FusevalError` for bad input to the gate itself (unknown
    operator, profile or component, an implementation that does not import, no CUDA
    device, a malformed budget file), before anything runs."""
    return run_request(as_request(GateRequest, op, impl, options).validated())


def run_request(request: GateRequest) -> GateReport:
    """Run a validated :class:`~fuseval.gate.request.GateRequest` (see :func:`run_gate`)."""
    t_start = time.perf_counter()
    started = utc_timestamp()
    op, impl = request.op, request.impl
    names = resolve_ops(op)
    s = settings(request)
    chosen = list(s.components)
    plan = _plan(op, names, impl, s, chosen)
    warm = None
    if request.warmup:
        warm = _warmup.start([p for p in plan if isinstance(p, GateContext)], impl, s.device, s.mode,
                             isolated=decide(impl, s.isolate), progress=s.progress, components=chosen)
    try:
        results = _run_plan(plan, request, s)
    finally:
        if warm is not None:
            s.progress(warm.stop())
    report = GateReport(names, impl_label(impl), s.profile.name, s.device, s.strict, results,
                        time.perf_counter() - t_start, started, seeds=list(s.seeds),
                        seed_drawn=request.seed is None and not request.seeds_given)
    for r in results:
        report.files.update({f"{r.op}.{k}": v for k, v in r.files.items()})
    if request.out:
        report.save(request.out)
    return report
