"""Running an error-budget report: per-stage errors of an implementation, case by case.

For each case (fresh inputs, seed + case index, exactly the inputs the kernel gets):

1. the float64 oracle runs once with taps: ``oracle[stage]``, ``oracle outputs``;
2. the implementation's production ``forward`` runs once: the end-to-end verdict
   (benchmark tolerance through ``fuseval.check.compare``, budget allowances);
3. when the implementation exposes stage taps (``forward.staged``, see docs/budget.md):

   * propagated error: one staged run with taps, ``impl[k]`` against ``oracle[k]``;
   * local error: for each stage k one staged run with every earlier stage overridden
     by the oracle's tap (the implementation casts it to its own input dtype), stopped
     as soon as stage k's tap is written. Every earlier stage, not only the previous
     one, because stages read more than their predecessor (attention reads v from
     qkv_proj, o_proj and residual read the residual stream);
   * downstream impact: for each stage k the oracle continued in float64 from the
     implementation's taps of stages <= k (``reference(override=...)``), compared with
     the oracle's outputs: the part of the final error that stages <= k cause;

4. the naive implementation in the budget's precision (see :mod:`.naive`), stage by
   stage, local and chained (propagated), for the relative allowances;
5. baselines: the float32 reference (per-stage propagated and final) and the plain
   torch path (final only).

The oracle's taps are computed once and shared by every pass; each pass keeps at most
one extra stage tensor alive, and everything of a case is freed before the next.
"""
from __future__ import annotations

import functools
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

import torch

from ..operators import implementations as _ops
from ..check import poison_allocator, resolve_device
from ..definitions import Definition
from ..errors import user_input
from ..inputs import TORCH_DTYPES, generate_inputs
from ..runner.isolation import DEFAULT_TIMEOUT, IsolatedImpl, decide
from .budgetfile import Allowance, Budget, load_budget
from ..precision import finer, round_to
from ..staged import as_tuple, has_params, reference_of, run_until, staged_of
from .metrics import error_metrics, final_metrics, storage_precision
from .naive import emulated_stages
from .report import BudgetCase, BudgetReport, EndToEnd, StageResult
from .request import BudgetRequest
from ..requests import as_request
from ..options import check_cases_in
from ..hygiene import draw_hygiene_seed, judge_partial_calls, partial_calls
from ..runner.in_process import Local
from ..runner.isolation import IsolationViolation, describe_exception

__all__ = ["run_budget", "staged_of", "run_until"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, IsolationViolation):
        return str(exc)
    line, where = describe_exception(exc)
    return line + (f" (at {where})" if where else "")


# --------------------------------------------------------------------------- verdicts
def _checks(allowances: Sequence[Allowance], measured: Mapping[str, Mapping | None],
            naive: Mapping[str, Mapping | None], axes: Mapping[str, int], scale: float,
            precision: str, *, stage: bool) -> list[dict[str, Any]]:
    """Evaluate allowances. ``measured`` / ``naive``: {"local": metrics, "propagated": ...}
    (end to end: {"final": ...})."""
    checks = []
    for a in allowances:
        which = a.applies_to if stage else "final"
        m = measured.get(which)
        value = math.nan if not m else float(m.get(a.metric, math.nan))
        limit = a.limit(axes, naive.get(which), scale, precision)
        passed = bool(value <= limit)   # NaN (missing, or the naive failed) never passes
        checks.append({"allowance": a.describe(), "kind": a.kind, "metric": a.metric,
                       "applies_to": which, "value": value, "limit": limit,
                       "usage": value / limit if limit > 0 else (0.0 if value == 0 else math.inf),
                       "passed": passed})
    return checks


# --------------------------------------------------------------------------- one case
class _CaseRunner:
    def __init__(self, defn: Definition, budget: Budget, forward: Callable, staged: Callable | None,
                 torch_impl: Callable | None, device: torch.device, baselines: bool):
        self.defn = defn
        self.budget = budget
        self.forward = forward
        self.staged = staged
        self.torch_impl = torch_impl
        self.device = device
        self.baselines = baselines
        self.stages = [s.name for s in defn.stages]
        self.parents = {s.name: s.parent for s in defn.stages}
        self.reference = reference_of(defn)
        # an oracle without stages (an imported problem's lifted reference) takes the inputs
        # alone: no taps, no validate switch, no float32 twin
        self.tapped = bool(self.stages) or has_params(self.reference, "taps")
        plain = not has_params(self.reference, "validate")
        self.oracle = self.reference if plain else functools.partial(self.reference, validate=False)
        self.reference32 = functools.partial(self.reference, dtype=torch.float32, validate=False) \
            if has_params(self.reference, "dtype") else None
        self.tolerance = defn.tolerance       # the case's own, set per case by run()
        self.hygiene = True                   # make the partial-cache calls (run_budget's hygiene)
        self.out_dtypes = [TORCH_DTYPES[s.dtype] for s in defn.outputs]
        self.out_names = [s.name for s in defn.outputs]
        self.needs_naive = any(a.kind == "relative_to_naive" for sb in budget.stages.values()
                               for a in sb.allowances) or \
            any(a.kind == "relative_to_naive" for a in budget.end_to_end.allowances)

    def _timed(self, seconds: dict, key: str, fn: Callable):
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            _sync(self.device)
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - t0

    def _final(self, outputs, oracle_out) -> dict[str, Any]:
        outs = [o.to(d) if o.dtype != d else o for o, d in zip(outputs, self.out_dtypes)]
        return final_metrics(outs, oracle_out, self.out_names, self.tolerance, self.budget.end_to_end.dtype)

    def run(self, case, seed: int, mode: str, drawn: Future | None = None) -> BudgetCase:
        """One case. ``drawn``: a future of the case's inputs (prefetched on the run's device
        while the previous case ran), else they are drawn here."""
        defn, dev = self.defn, self.device
        seconds: dict[str, float] = {}
        messages: list[str] = []
        axes_all = defn.resolve_axes(case.axes)
        self.tolerance = case.tolerance or defn.tolerance
        if drawn is None:
            inputs = self._timed(seconds, "inputs", lambda: generate_inputs(defn, case.axes, seed=seed, mode=mode,
                                                                             device=dev))
        else:
            inputs = self._timed(seconds, "inputs", lambda: [
                v.to(dev).contiguous() if isinstance(v, torch.Tensor) else v for v in drawn.result()])
        oracle_taps: dict[str, torch.Tensor] = {}
        oracle_out = self._timed(seconds, "oracle", lambda: as_tuple(
            self.reference(*inputs, taps=oracle_taps) if self.tapped else
            self.reference(*inputs)))   # validates the inputs once
        results = {name: StageResult(name, self.parents[name], self.budget.stages[name].dtype)
                   for name in self.stages}
        e2e = EndToEnd()

        produced = self._production(inputs, oracle_out, e2e, seconds, messages)
        raised = produced is None
        if self.hygiene and produced is not None and e2e.impl and e2e.impl.get("tolerance_passed"):
            raised |= self._timed(seconds, "hygiene", lambda: self._partial_cache(
                case, seed, mode, inputs, produced, messages))
        if self.staged is not None:
            raised |= self._staged_passes(inputs, oracle_taps, oracle_out, produced, results, e2e, seconds,
                                          messages)
        else:
            messages.append("the implementation exposes no stage taps (no forward.staged): end-to-end only")
        del produced
        if self.needs_naive:
            self._timed(seconds, "naive", lambda: self._naive(inputs, oracle_taps, oracle_out, results, e2e))
        if self.baselines:
            self._baselines(inputs, oracle_taps, oracle_out, results, e2e, seconds, messages)

        first = self._verdicts(results, e2e, axes_all)
        limits = [c["limit"] for c in e2e.checks if c["metric"] == "max_abs"]
        if e2e.staged_vs_forward is not None and limits and e2e.staged_vs_forward > min(limits):
            messages.append(f"forward and forward.staged disagree by {e2e.staged_vs_forward:.3g} (more than the "
                            f"end-to-end allowance {min(limits):.3g}): the stage taps may not describe the "
                            "production kernel")
        passed = first is None and not raised
        del inputs, oracle_taps, oracle_out
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        return BudgetCase(case.index, dict(case.axes), seed, self.staged is not None,
                          [results[n] for n in self.stages], e2e, passed, first, raised, messages, seconds)

    # ---- the passes
    def _production(self, inputs, oracle_out, e2e: EndToEnd, seconds, messages):
        """The production forward once: the end-to-end verdict. Returns its outputs (None
        when it raised)."""
        poison_allocator(self.device, 2 * sum(o.numel() * 4 for o in oracle_out))
        try:
            produced = self._timed(seconds, "impl", lambda: as_tuple(self.forward(*inputs)))
            e2e.impl = self._final(produced, oracle_out)
            return produced
        except Exception as exc:  # noqa: BLE001 - an implementation's failure is a verdict
            messages.append(f"implementation raised: {_error_text(exc)}")
            return None

    def _partial_cache(self, case, seed: int, mode: str, inputs, produced, messages) -> bool:
        """The check's cached-result rule (:func:`fuseval.hygiene.judge_partial_calls` on
        :func:`fuseval.hygiene.partial_calls`: only the activations, then only the weights
        drawn anew): each answer must differ from the first and match the oracle on its own
        inputs (a result cached on part of the inputs would otherwise be measured as exact).
        Returns True when one of them did not."""
        calls = partial_calls(self.defn, case, draw_hygiene_seed(), inputs, mode, self.device)
        violations: list[str] = []
        found: list[str] = []
        # the budget makes these calls only when the first answer passed the tolerance
        # (judge), with no deadline and no output-shape rule of its own
        judge_partial_calls(self.defn, Local(self.forward, self.device), calls, produced, self.oracle,
                            self.tolerance, rules="fuseval", judge=True, all_zero=False, deadline=None,
                            expected=None, check_shapes=lambda outputs: [], violations=violations,
                            messages=found)
        kinds = ", ".join(dict.fromkeys(violations))
        messages.extend(f"{kinds}: {m}" for m in found)
        return bool(violations)

    def _precision_of(self, r: StageResult, tap: torch.Tensor) -> None:
        """Record the precision the implementation stores the stage in, and the precision
        the stage is judged in: that one, but never coarser than the budget's dtype."""
        r.impl_dtype = str(tap.dtype).replace("torch.", "")
        r.impl_storage = storage_precision(tap)
        r.precision = finer(r.impl_storage, r.dtype)

    def _stage_metrics(self, r: StageResult, which: str, tap: torch.Tensor, oracle: torch.Tensor,
                       seconds: dict) -> None:
        """Set ``r.<which>`` (propagated / local) to the tap's error metrics against the
        oracle in the stage's precision; a tap that cannot be compared becomes a message."""
        try:
            setattr(r, which, self._timed(seconds, "metrics", lambda: error_metrics(
                tap, oracle, r.precision, hist=True)))
        except ValueError as exc:
            r.messages.append(f"{which} tap: {exc}")

    def _staged_passes(self, inputs, oracle_taps, oracle_out, produced, results, e2e, seconds, messages) -> bool:
        """Propagated, local and downstream passes of a staged implementation. Returns
        True when one of its runs raised."""
        raised = False
        prop: dict[str, torch.Tensor] = {}
        try:
            staged_out = self._timed(seconds, "staged", lambda: as_tuple(
                self.staged(*inputs, taps=prop, override={})))
            if produced is not None:
                e2e.staged_vs_forward = max(
                    (float((a.detach().to(torch.float64) - b.detach().to(torch.float64)).abs().max())
                     for a, b in zip(produced, staged_out) if a.numel()), default=0.0)
            del staged_out
        except Exception as exc:  # noqa: BLE001
            raised = True
            messages.append(f"staged run raised: {_error_text(exc)}")
        for name in self.stages:
            r = results[name]
            if name not in prop:
                r.messages.append("no tap (the staged run raised)" if raised else
                                  "the staged implementation wrote no tap for this stage")
                continue
            self._precision_of(r, prop[name])
            self._stage_metrics(r, "propagated", prop[name], oracle_taps[name], seconds)
        # local: stage k fed every earlier stage's oracle tap, rounded to the precision the
        # implementation stores that stage in (what its stage k reads in production: e.g.
        # TF32-rounded activations, which a TF32 dot then reads exactly), stopped right
        # after stage k
        fed: dict[str, torch.Tensor] = {}
        for i, name in enumerate(self.stages):
            r = results[name]
            for s in self.stages[:i]:
                if s not in fed:
                    storage = results[s].impl_storage
                    fed[s] = oracle_taps[s] if storage in (None, "float64") else round_to(oracle_taps[s], storage)
            override = {s: fed[s] for s in self.stages[:i]}
            try:
                taps, _ = self._timed(seconds, "local", lambda: run_until(
                    self.staged, inputs, override=override, stop=name))
            except Exception as exc:  # noqa: BLE001
                raised = True
                r.messages.append(f"local run raised: {_error_text(exc)}")
                continue
            if name not in taps:
                r.messages.append("the local run wrote no tap for this stage")
                continue
            if r.precision is None:
                self._precision_of(r, taps[name])
            self._stage_metrics(r, "local", taps[name], oracle_taps[name], seconds)
            del taps
        del fed
        # downstream: the implementation up to stage k, the float64 oracle after
        for i, name in enumerate(self.stages):
            if not all(s in prop for s in self.stages[:i + 1]):
                continue
            override = {s: prop[s] for s in self.stages[:i + 1]}
            try:
                out = self._timed(seconds, "downstream", lambda: as_tuple(self.oracle(*inputs, override=override)))
                results[name].downstream = self._timed(seconds, "metrics", lambda: final_metrics(
                    out, oracle_out, self.out_names, self.tolerance, self.budget.end_to_end.dtype,
                    full=False))
                del out
            except Exception as exc:  # noqa: BLE001 - e.g. a tap of the wrong shape
                results[name].messages.append(f"downstream continuation failed: {_error_text(exc)}")
        return raised

    def _naive(self, inputs, oracle_taps, oracle_out, results, e2e) -> None:
        """The naive, one stage at a time: local (fed the oracle's taps rounded to each
        earlier stage's precision) and chained (fed its own outputs); each stage's
        output rounded to the precision the stage is judged in."""
        sb = self.budget.stages
        prec = {n: results[n].precision or sb[n].dtype for n in self.stages}
        last = self.stages[-1]
        rounded: dict[str, torch.Tensor] = {}
        chained: dict[str, torch.Tensor] = {}
        final = None
        for i, name in enumerate(self.stages):
            fn = functools.partial(self.reference32, stages=emulated_stages(sb[name].operand_dtype))
            earlier = self.stages[:i]
            for s in earlier:
                if s not in rounded:
                    rounded[s] = round_to(oracle_taps[s], prec[s])
            taps, _ = run_until(fn, inputs, override={s: rounded[s] for s in earlier}, stop=name)
            results[name].naive_local = error_metrics(round_to(taps[name], prec[name]), oracle_taps[name],
                                                      prec[name], hist=True)
            del taps
            taps, out = run_until(fn, inputs, override={s: chained[s] for s in earlier},
                                  stop=None if name == last else name)
            chained[name] = round_to(taps[name], prec[name])
            results[name].naive_propagated = error_metrics(chained[name], oracle_taps[name], prec[name])
            if name == last:
                final = out
            del taps
        del rounded, chained
        e2e.naive = self._final(final, oracle_out)

    def _baselines(self, inputs, oracle_taps, oracle_out, results, e2e, seconds, messages) -> None:
        """The float32 reference (per stage and final; where the oracle has a float32 twin)
        and plain torch (final)."""
        def fp32():
            taps32: dict[str, torch.Tensor] = {}
            out32 = as_tuple(self.reference32(*inputs, taps=taps32))
            for name in self.stages:
                r = results[name]
                r.fp32_propagated = error_metrics(taps32[name], oracle_taps[name], r.precision or r.dtype)
            e2e.reference_fp32 = self._final(out32, oracle_out)
        if self.reference32 is not None:
            self._timed(seconds, "baselines", fp32)
        if self.torch_impl is not None:
            def plain_torch():
                e2e.torch = self._final(as_tuple(self.torch_impl(*inputs)), oracle_out)
            try:
                self._timed(seconds, "baselines", plain_torch)
            except Exception as exc:  # noqa: BLE001 - a baseline's failure is reported, not fatal
                messages.append(f"torch baseline raised: {_error_text(exc)}")

    def _verdicts(self, results, e2e: EndToEnd, axes_all) -> str | None:
        """Judge every stage and the final outputs; return the first over budget (pipeline
        order, then "end_to_end"), or None."""
        sb = self.budget.stages
        for name in self.stages:
            r = results[name]
            if self.staged is None:
                continue
            scale = (r.local or r.propagated or {}).get("scale", 0.0)
            r.checks = _checks(sb[name].allowances, {"local": r.local, "propagated": r.propagated},
                               {"local": r.naive_local, "propagated": r.naive_propagated},
                               axes_all, scale, r.precision or r.dtype, stage=True)
            # a missing measurement is a failing check (NaN), so a stage without taps fails
            r.passed = all(c["passed"] for c in r.checks) and not r.messages
        if e2e.impl is not None:
            e2e.tolerance_passed = e2e.impl["tolerance_passed"]
            e2e.checks = _checks(self.budget.end_to_end.allowances, {"final": e2e.impl}, {"final": e2e.naive},
                                 axes_all, e2e.impl.get("scale", 0.0), self.budget.end_to_end.dtype, stage=False)
            e2e.passed = (e2e.tolerance_passed or not self.budget.end_to_end.tolerance) and \
                all(c["passed"] for c in e2e.checks)
        # the same end-to-end allowances on the baselines (e.g. how much of each workload's
        # tolerance the benchmark's own reference spends): reported, never the verdict
        for kind in ("naive", "reference_fp32", "torch"):
            measured = getattr(e2e, kind)
            if measured is not None:
                e2e.baseline_checks[kind] = _checks(
                    self.budget.end_to_end.allowances, {"final": measured}, {"final": e2e.naive}, axes_all,
                    measured.get("scale", 0.0), self.budget.end_to_end.dtype, stage=False)
        first = next((n for n in self.stages if results[n].passed is False), None)
        if first is None and not e2e.passed:
            first = "end_to_end"
        return first


# --------------------------------------------------------------------------- a whole run
def run_budget(op: str | Definition | BudgetRequest, impl: str | Callable | None = None,
               **options: Any) -> BudgetReport:
    """Per-stage error-budget report of ``impl`` on ``op``'s benchmark cases.

    ``impl``: a name of the operator's table ("fast", "torch", "reference_fp32"...),
    "module:function" or a callable; stage taps come from ``forward.staged`` (see
    docs/budget.md), otherwise the report is end to end only. ``budget``: a path, a dict
    or None for the packaged default of the operator. ``progress(case, done, total)`` is
    called after each case (and ``progress.start(case, done, total)`` before, if the
    callback has it). ``baselines``: also run the float32 reference and plain torch.
    ``cpu_threads``: torch CPU threads during the run; by default 1 for a scaled-down
    configuration on the CPU (its tensors are tiny: extra threads only add
    synchronisation, which costs 5-10x on a busy machine), unchanged otherwise.
    ``prefetch``: how many cases' inputs to draw ahead on worker threads, on the run's
    device (default none: inputs are drawn on their device, which is fast, and give the
    same tensors as ``fuseval check`` draws for the same seed and case).

    ``isolate`` (default): the implementation runs in a worker process of its own
    (:mod:`fuseval.runner.isolation`; its stage taps come back through shared memory), each call
    within ``timeout`` seconds; a call that ends without outputs (timeout, exit, crash,
    tampering) makes the case fail as raised, with the violation in its messages.

    ``hygiene`` False leaves out the partial-cache calls (:mod:`fuseval.hygiene`): for a
    caller that applied the same rules to the same cases, seed and inputs already (the
    gate's check component), so that they are not made twice.

    Case i uses inputs drawn with seed + i, like ``fuseval check``. The keyword arguments
    (``config`` "small", ``cases``, ``device`` "cpu", ``seed`` 0, ``mode`` "benchmark" and
    the above) are the fields of :class:`fuseval.budget.request.BudgetRequest`, and
    ``run_budget(request)`` takes such a request whole (what the command line builds);
    either is validated here, once, and :func:`run_request` runs it."""
    return run_request(as_request(BudgetRequest, op, impl, options).validated())


def run_request(request: BudgetRequest) -> BudgetReport:
    """Run a validated :class:`~fuseval.budget.request.BudgetRequest` (see :func:`run_budget`)."""
    r = request
    op, impl, config, cases, device, seed, mode = r.op, r.impl, r.config, r.cases, r.device, r.seed, r.mode
    budget, progress, baselines, cpu_threads, prefetch = r.budget, r.progress, r.baselines, r.cpu_threads, r.prefetch
    isolate, timeout, hygiene = r.isolate, r.timeout, r.hygiene
    with user_input(r.name("config")):
        operator = _ops.get(op, config)
    check_cases_in(cases, len(operator.definition.seed_cases), r.name("cases"))
    defn = operator.definition
    bud = load_budget(budget, defn)
    dev = resolve_device(device)
    fn = _implementation(operator, impl, dev, isolate, timeout)
    staged = fn.staged if isinstance(fn, IsolatedImpl) and hasattr(fn, "staged") else \
        None if isinstance(fn, IsolatedImpl) else staged_of(defn, impl, fn)
    torch_impl = operator.implementation("torch") if baselines and "torch" in defn.implementations else None
    runner = _CaseRunner(defn, bud, fn, staged, torch_impl, dev, baselines)
    runner.hygiene = bool(hygiene)
    selected = defn.cases(cases)
    results = []
    if cpu_threads is None and dev.type == "cpu" and defn.config != "seed":
        cpu_threads = 1
    old_threads = torch.get_num_threads()
    t0 = time.perf_counter()
    # inputs are drawn on the run's device (the same tensors check draws); ``prefetch``
    # draws the next cases on worker threads while the current one runs
    ahead = 0 if prefetch is None else int(prefetch)
    pool = ThreadPoolExecutor(max_workers=ahead) if ahead > 0 else None
    futures: dict[int, Future] = {}

    def draw_ahead(upto: int) -> None:
        for c in selected[:upto]:
            if pool is not None and c.index not in futures:
                futures[c.index] = pool.submit(generate_inputs, defn, c.axes, seed=seed + c.index, mode=mode,
                                               device=dev)
    try:
        if cpu_threads:
            torch.set_num_threads(cpu_threads)
        for n, case in enumerate(selected):
            draw_ahead(n + 1 + ahead)
            if progress is not None and hasattr(progress, "start"):
                progress.start(case, n, len(selected))
            result = runner.run(case, seed + case.index, mode, drawn=futures.pop(case.index, None))
            results.append(result)
            if progress is not None:
                progress(result, n + 1, len(selected))
    finally:
        torch.set_num_threads(old_threads)
        if pool is not None:
            for f in futures.values():
                f.cancel()
            pool.shutdown(wait=True)
    return BudgetReport(
        op=defn.name, impl=_ops.impl_label(impl), config=defn.config, device=str(dev),
        device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        seed=seed, mode=mode, tolerance={"atol": defn.tolerance.atol, "rtol": defn.tolerance.rtol,
                                         "min_matched_ratio": defn.tolerance.min_matched_ratio,
                                         "max_abs_error": defn.tolerance.max_abs_error},
        budget=bud.to_dict(), budget_summary=_budget_summary(bud),
        stages=runner.stages, stage_parents={k: v for k, v in runner.parents.items() if v},
        staged=staged is not None, cases=results, seconds=time.perf_counter() - t0,
        torch_version=torch.__version__,
        torch_baseline=defn.implementations.get("torch", "torch").rpartition(":")[2] if torch_impl else "torch")


def _implementation(operator, impl, dev: torch.device, isolate: bool, timeout: float | None):
    """The implementation as the runner calls it: a proxy to its worker process, or (not
    isolated, or a Python object a worker cannot import) the callable itself."""
    if decide(impl, isolate, warn=True, stacklevel=3):
        return IsolatedImpl(impl, operator.definition, str(dev), DEFAULT_TIMEOUT if timeout is None else timeout)
    return operator.implementation(impl)


def _budget_summary(bud: Budget) -> dict[str, Any]:
    """Per stage: dtype, operand dtype and allowances in words (for the reports)."""
    out = {name: {"dtype": s.dtype, "operand_dtype": s.operand_dtype,
                  "allowances": [a.describe() + ("" if a.applies_to == "local" else f" ({a.applies_to})")
                                 for a in s.allowances]}
           for name, s in bud.stages.items()}
    out["end_to_end"] = {"dtype": bud.end_to_end.dtype, "tolerance": bud.end_to_end.tolerance,
                         "allowances": [a.describe() for a in bud.end_to_end.allowances]}
    return out
