"""Running the gate: every operator's context validated first, then each component in
turn, guarded so that one that crashes is reported and the others still run."""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Iterable, Sequence, TextIO

from ..errors import ImplementationError, UsageError
from . import components as _components
from .components import run_guarded
from .context import COMPONENTS, GateContext, Profile, context, resolve_ops, settings
from .results import ComponentResult, GateReport, not_run
from ..terminal import utc_timestamp
from ..operators import load
from ..operators.implementations import impl_label, missing_implementation
from ..runner import isolation
from ..runner.isolation import decide
from . import parallel


def stderr_progress(stream: TextIO | None = None) -> Callable[[str], None]:
    t0 = time.perf_counter()

    def report(message: str) -> None:
        print(f"[gate {time.perf_counter() - t0:6.1f}s] {message}", file=stream or sys.stderr, flush=True)
    return report


def _components_of(components: Iterable[str]) -> list[str]:
    chosen = list(components)
    for c in chosen:
        if c not in COMPONENTS:
            raise UsageError(f"components: unknown gate component {c!r}; expected one of {', '.join(COMPONENTS)}")
    if not chosen:
        raise UsageError(f"components: the gate would run nothing: no component selected "
                         f"(of {', '.join(COMPONENTS)})")
    return chosen


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


def _check_jobs(jobs: Any) -> None:
    if jobs != "auto" and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UsageError(f"jobs: expected a number of processes >= 1 or 'auto', got {jobs!r}")


def _run_plan(plan: list, chosen: list[str], options: dict, s, jobs: int | str) -> list[ComponentResult]:
    """Every component of the plan, in the plan's order: serially, or ``jobs`` at a time
    (:mod:`fuseval.gate.parallel`: a thread per operator, or a pool of processes)."""
    units = [(entry, c) for entry in plan if isinstance(entry, GateContext)
             for c in chosen if c not in entry.not_run]
    isolated = decide(options["impl"], s.isolate)
    if jobs == "auto":
        jobs = parallel.default_jobs(s.device, len(units), len({ctx.op for ctx, _ in units}), isolated)
    done: dict[tuple[str, str], ComponentResult] = {}
    if jobs > 1 and len(units) > 1 and isinstance(options["impl"], str):
        if parallel.by_operator(units, s.device, isolated, jobs):
            ran = parallel.run_operators(units, jobs)
        else:
            ran = parallel.run_units(units, options, min(jobs, len(units)), s.progress, s.device)
        done = {(ctx.op, c): r for (ctx, c), r in zip(units, ran)}
    results: list[ComponentResult] = []
    for entry in plan:
        if isinstance(entry, list):
            results += entry
        else:
            results += [done.get((entry.op, c)) or run_guarded(c, entry) for c in chosen]
    _components.join_budget_hygiene(results)
    return results


def run_component(name: str, op: str, impl: str | Callable, *, profile: str | Profile = "ci",
                  device: str | None = None, config: str | None = None, cases: str | None = None,
                  seeds: int | Sequence[int] | None = None, mode: str = "benchmark",
                  warn_margin: float | None = None, strict: bool = False,
                  budget_config: str | None = None, budget_cases: str | None = "profile",
                  budget: Any = None, out: str | None = None,
                  progress: Callable[[str], None] | None = None, isolate: bool | None = None,
                  timeout: float | None = None, seed: int | None = None) -> ComponentResult:
    """Run one gate component on one operator (see :func:`run_gate` for the arguments);
    an operator without the implementation is an ImplementationError here."""
    _components_of([name])
    names = resolve_ops(op)
    if len(names) != 1:
        raise UsageError(f"op: one operator expected here, got {', '.join(names)}")
    s = settings(profile=profile, device=device, config=config, cases=cases, seeds=seeds, mode=mode,
                 warn_margin=warn_margin, strict=strict, budget_config=budget_config, budget_cases=budget_cases,
                 budget=budget, out=out, progress=progress, isolate=isolate, timeout=timeout, components=[name],
                 seed=seed)
    return run_guarded(name, context(names[0], impl, s))


def run_gate(op: str | Sequence[str], impl: str | Callable, *, profile: str | Profile = "ci",
             device: str | None = None, config: str | None = None, cases: str | None = None,
             seeds: int | Sequence[int] | None = None, mode: str = "benchmark",
             components: Iterable[str] = COMPONENTS, warn_margin: float | None = None,
             strict: bool = False, budget_config: str | None = None, budget_cases: str | None = "profile",
             budget: Any = None, out: str | None = None,
             progress: Callable[[str], None] | None = None, isolate: bool | None = None,
             timeout: float | None = None, jobs: int | str = 1, warmup: bool = True,
             seed: int | None = None) -> GateReport:
    """Run the gate on one operator, several ("a,b", a list) or "all".

    ``impl``: a name of the operators' implementation tables ("fast", "torch"...),
    "module:function" or a callable; under "all", an operator whose table lacks the name
    is reported as not run ("no implementation 'fast'"), while naming such an operator is
    an error. ``profile`` sets config, device, seeds and the properties / budget profiles
    (``PROFILES``); ``config``, ``device``, ``cases``, ``seeds``, ``budget_config`` and
    ``budget_cases`` ("all", a selection, or "profile") override it. ``seed``: the first
    seed of the check (None: drawn at random; the report has the seeds). ``components``:
    which of "check", "properties", "budget" to run. ``strict``: warnings fail.
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
    implementation given as a callable runs serially. ``warmup``: on CUDA, a few processes
    compile the implementation's kernels for the run's case shapes and properties beside
    it (:mod:`fuseval.gate.warmup`; it changes no result, only how soon the kernels are in
    Triton's cache).

    Raises :class:`~fuseval.errors.FusevalError` for bad input to the gate itself (unknown
    operator, profile or component, an implementation that does not import, no CUDA
    device, a malformed budget file), before anything runs."""
    t_start = time.perf_counter()
    started = utc_timestamp()
    names = resolve_ops(op)
    chosen = _components_of(components)
    _check_jobs(jobs)
    s = settings(profile=profile, device=device, config=config, cases=cases, seeds=seeds, mode=mode,
                 warn_margin=warn_margin, strict=strict, budget_config=budget_config, budget_cases=budget_cases,
                 budget=budget, out=out, progress=progress, isolate=isolate, timeout=timeout, components=chosen,
                 seed=seed)
    plan = _plan(op, names, impl, s, chosen)
    # the seeds as this run resolved them: a pool process must not draw seeds of its own
    options = {"impl": impl, "settings": dict(
        profile=profile, device=device, config=config, cases=cases, seeds=list(s.seeds), mode=mode,
        warn_margin=warn_margin, strict=strict, budget_config=budget_config, budget_cases=budget_cases,
        budget=budget, out=out, isolate=isolate, timeout=timeout, components=chosen)}
    warm = None
    if warmup:
        from ..runner.isolation import decide
        from . import warmup as _warmup
        warm = _warmup.start([p for p in plan if isinstance(p, GateContext)], impl, s.device, s.mode,
                             isolated=decide(impl, s.isolate), progress=s.progress, components=chosen)
    try:
        results = _run_plan(plan, chosen, options, s, jobs)
    finally:
        if warm is not None:
            s.progress(warm.stop())
    report = GateReport(names, impl_label(impl), s.profile.name, s.device, s.strict, results,
                        time.perf_counter() - t_start, started, seeds=list(s.seeds),
                        seed_drawn=seed is None and not isinstance(seeds, (list, tuple, range)))
    for r in results:
        report.files.update({f"{r.op}.{k}": v for k, v in r.files.items()})
    if out:
        report.save(out)
    return report
