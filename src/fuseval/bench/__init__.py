"""GPU benchmark harness, the same for every operator.

What one run measures, for each benchmark case of an operator:

* the **median latency** of every implementation timed (the fast path and the torch
  baselines), each in its own confined worker (:mod:`fuseval.runner.clock`: CUDA events
  around each call after a warm-up, the L2 cache flushed before each, the calls rotating
  over input sets whose activations change every call), judged in this process
  (:mod:`fuseval.runner.timing`: a timing with a stale output, unwatched work, a patched
  timer or a median below the floor is refused, never shown as a time);
* the **floor**: ``max(FLOPs / matmul ceiling, bytes / bandwidth ceiling)``, from the
  operator's cost model (``cost_model(axes)`` in its reference module: the minimal FLOPs
  and bytes of one call and the dtype its matrix products run in) and from ceilings
  **measured in the same run** (device copy bandwidth counting bytes read plus written;
  bf16, fp16, tf32 and fp32 matrix products of 8192^3 with torch, random data);
* the **fraction of the floor** reached (floor / latency, 1.0 = at the floor);
* the **suite mean** in the SOL-ExecBench sense: the arithmetic mean of the 16 case
  latencies of each implementation (and of the floors);
* optionally (``check=True``) the correctness of each timed implementation on each case
  against the float64 oracle, through :func:`fuseval.check.run_case`: fresh random inputs
  (the seed is drawn at random unless given, and recorded), the device allocator poisoned
  with NaN before the call, the definition's tolerance rule;
* the **SM clock and power** while the ceilings and each timing ran (``fuseval.bench.clocks``,
  sampled by nvidia-smi in a separate process): long tensor-core loads meet the GPU's
  power cap and run at a lower clock than the short ceiling measurements, which the
  fraction of the floor alone does not show;
* the **sustained floor** (``sustained_s`` > 0): the same floor with the matmul ceiling
  of the operator's dtype measured again over the last half of ``sustained_s`` seconds
  of back-to-back products, i.e. at whatever clock the power cap leaves. The burst floor
  stays the benchmark's floor (the targets are stated against it); the sustained one
  says how much of a large case's distance to it no kernel can close on this GPU.

* the **fast path's options** in force (``OperatorRecord.fast_options()``: tile tables,
  precision policy), so that a timing can be tied to the configuration that produced it.

Per-operator pieces come from the operator's record (``defn.operator``, see
:mod:`fuseval.operators`), nothing here names an operator: the implementations to time
default to its spec's ``bench_impls``, else every entry of the definition's
``implementations`` table except the oracles (``reference*``); the spec's ``bench_fast`` is
the one the others are compared with; the floor comes from its ``cost_model``.

:func:`time_call` (:mod:`fuseval.bench.ceilings`) times fuseval's own work (the ceilings, the fast
path's parts).
Rendering of a report is :mod:`fuseval.bench.render`.

Everything that touches the GPU is skipped (``BenchSkipped``) when there is none.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from ..operators import implementations as _ops
from .render import plot_report, print_bench_report, write_outputs
from .ceilings import (MAX_REPS, MIN_REPS, REP_MS, WARMUP_MS, BenchSkipped, Ceilings, SustainedRate, Timing,
                       _require_cuda, floor_seconds, measure_ceilings, measure_sustained, square_matmul,
                       sustained_rate, time_call, timer_rules)
from ..definitions import Definition
from ..runner.clock import L2_FLUSH_BYTES  # noqa: F401 - fuseval.bench.L2_FLUSH_BYTES, as before
from ..terminal import fmt_number
from ..runner.timing import CHECKED_CALLS, FLOOR_MARGIN, ROTATION_SETS, WATCHED_CALLS, time_impl
from ..check import _runner, run_case
from ..inputs import generate_inputs
from ..operators.implementations import resolve_impl
from ..oracles import SOL_REFERENCE
from ..errors import user_input
from ..options import check_cases_in
from .request import BenchRequest
from .parts import time_parts
from ..requests import as_request
from .clocks import ClockMonitor, summarize as summarize_clocks, wall

__all__ = ["BenchSkipped", "Ceilings", "measure_ceilings", "measure_sustained", "Timing", "time_call",
           "timer_rules", "SustainedRate", "sustained_rate", "square_matmul", "BenchSpec",
           "bench_spec", "floor_seconds", "CaseBench", "BenchReport", "run_bench",
           "print_bench_report", "write_outputs", "plot_report"]



# --------------------------------------------------------------------------- per-operator pieces
@dataclass
class BenchSpec:
    """What to time for one operator and how to compute its floor."""
    op: str
    impls: list[str]
    fast: str | None
    cost_model: Callable[[Mapping[str, int]], Mapping[str, Any]] | None
    parts: Callable[..., Mapping[str, Any]] | None = None      # the fast path's parts (fuseval.bench.parts)

    @property
    def baselines(self) -> list[str]:
        return [i for i in self.impls if i != self.fast]


def bench_spec(defn: Definition, impls: Sequence[str] | None = None) -> BenchSpec:
    """The operator's benchmark pieces, from its record: ``cost_model(axes)``, the
    implementations timed by default and which of them is its fast path."""
    record = defn.operator
    default = list(record.spec.bench_impls or [k for k in defn.implementations if "reference" not in k])
    chosen = list(impls) if impls else default
    if not chosen:
        raise ValueError(f"{defn.name}: no implementation to benchmark")
    fast = record.spec.bench_fast if record.spec.bench_fast in chosen else None
    return BenchSpec(defn.name, chosen, fast, record.cost_model, record.fast_parts if fast else None)


# --------------------------------------------------------------------------- results
@dataclass
class CaseBench:
    case: int
    axes: dict[str, int]
    timings: dict[str, dict[str, Any] | None]       # impl -> asdict(Timing) or None
    errors: dict[str, str] = field(default_factory=dict)       # impl -> why it was not timed
    flops: float | None = None
    bytes: float | None = None
    floor_ms: float | None = None
    bound: str | None = None
    floor_sustained_ms: float | None = None          # the floor at the sustained matmul rate
    floors_at_ms: dict[str, float] = field(default_factory=dict)  # the cost model's "floors_also_at" dtypes
    check: dict[str, dict[str, Any]] = field(default_factory=dict)  # impl -> check summary
    clocks: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # impl -> SM clock/power while timed
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)  # the fast path's parts (fuseval.bench.parts)
    refused: dict[str, list[list[str]]] = field(default_factory=dict)  # impl -> [reason, message] of a refused timing
    timed: dict[str, dict[str, Any]] = field(default_factory=dict)  # impl -> what its timing was judged from

    def median(self, impl: str) -> float | None:
        t = self.timings.get(impl)
        return None if t is None else t["median_ms"]


@dataclass
class BenchReport:
    op: str
    config: str
    device: str
    seed: int
    mode: str
    impls: list[str]
    fast: str | None
    ceilings: dict[str, Any] | None
    settings: dict[str, Any]
    cases: list[CaseBench]
    fast_options: dict[str, Any] | None = None     # the fast path's options in force (None: not timed)

    def suite_mean(self, impl: str) -> float | None:
        """Mean latency over the cases (SOL-ExecBench's suite score); None if any is missing."""
        vals = [c.median(impl) for c in self.cases]
        return None if not vals or any(v is None for v in vals) else sum(vals) / len(vals)

    def floor_mean(self, *, sustained: bool = False, dtype: str | None = None) -> float | None:
        """Mean floor over the cases: at the cost model's matmul rate, its sustained rate,
        or (``dtype``) at the rate of one of the dtypes its ``floors_also_at`` names."""
        if dtype is not None:
            vals = [c.floors_at_ms.get(dtype) for c in self.cases]
        else:
            vals = [c.floor_sustained_ms if sustained else c.floor_ms for c in self.cases]
        return None if not vals or any(v is None for v in vals) else sum(vals) / len(vals)

    @property
    def checked(self) -> bool:
        return any(c.check for c in self.cases)

    def check_passed(self, impl: str) -> int:
        return sum(1 for c in self.cases if c.check.get(impl, {}).get("passed"))

    def summary(self) -> dict[str, Any]:
        means = {i: self.suite_mean(i) for i in self.impls}
        floor = self.floor_mean()
        out: dict[str, Any] = {"suite_mean_ms": means, "floor_mean_ms": floor}
        if floor is not None:
            out["fraction_of_floor"] = {i: (floor / m if m else None) for i, m in means.items()}
        also = sorted({d for c in self.cases for d in c.floors_at_ms})
        at = {d: self.floor_mean(dtype=d) for d in also}
        at = {d: f for d, f in at.items() if f is not None}
        if at:
            out["floor_mean_at_ms"] = at
            out["fraction_of_floor_at"] = {d: {i: (f / m if m else None) for i, m in means.items()}
                                           for d, f in at.items()}
        sustained = self.floor_mean(sustained=True)
        if sustained is not None:
            out["sustained_floor_mean_ms"] = sustained
            out["fraction_of_sustained_floor"] = {i: (sustained / m if m else None) for i, m in means.items()}
        if self.fast and means.get(self.fast):
            out["speedup_of_fast"] = {i: (m / means[self.fast] if m else None)
                                      for i, m in means.items() if i != self.fast}
        if self.checked:
            out["cases_passed"] = {i: self.check_passed(i) for i in self.impls}
            out["cases"] = len(self.cases)
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["summary"] = self.summary()
        return d


# --------------------------------------------------------------------------- the run
def _check_summary(result) -> dict[str, Any]:
    pred = result.predicted
    return {"passed": result.passed, "violations": list(result.violations),
            "messages": list(result.messages), "seed": result.seed,
            "outputs": {m.name: {"max_abs": m.max_abs, "mean_abs": m.mean_abs, "rel_l2": m.rel_l2,
                                 "matched_ratio": m.matched_ratio} for m in result.outputs},
            "predicted": None if pred is None else {
                "passed": pred.passed, "violations": list(pred.violations),
                "matched_ratio": {m.name: m.matched_ratio for m in pred.outputs}}}


def run_bench(op: str | Definition | BenchRequest, impls: Sequence[str] | None = None,
              **options: Any) -> BenchReport:
    """Time ``impls`` of ``op`` on its benchmark cases; see the module docstring. The
    keyword arguments are the fields of :class:`fuseval.bench.request.BenchRequest`
    (``cases``, ``config`` "seed", ``device`` "cuda", ``seed``, ``mode``, ``check``,
    ``hygiene``, ``flush``, the timer's ``warmup_ms``, ``rep_ms``, ``min_reps``,
    ``max_reps``, ``ceilings``, ``progress`` and the below), and ``run_bench(request)``
    takes such a request whole (what the command line builds); either is validated here,
    once, and :func:`run_request` runs it.
    ``monitor_clocks``: sample the GPU's SM clock and power while timing (``fuseval.bench.clocks``).
    ``sustained_s``: also measure the matmul ceiling of the operator's dtype(s) sustained
    for that many seconds, and give each case a sustained floor (0: not). ``parts``: also
    time the fast path's parts apart (:mod:`fuseval.bench.parts`) where its operator declares them."""
    return run_request(as_request(BenchRequest, op, impls, options).validated())


def run_request(request: BenchRequest) -> BenchReport:
    """Run a validated :class:`~fuseval.bench.request.BenchRequest` (see :func:`run_bench`)."""
    r = request
    op, impls, cases, config, device, seed, mode = r.op, r.impls, r.cases, r.config, r.device, r.seed, r.mode
    check, hygiene, flush, ceilings, parts, progress = r.check, r.hygiene, r.flush, r.ceilings, r.parts, r.progress
    warmup_ms, rep_ms, min_reps, max_reps = r.warmup_ms, r.rep_ms, r.min_reps, r.max_reps
    monitor_clocks, sustained_s = r.monitor_clocks, r.sustained_s
    with user_input(r.name("config")):
        operator = _ops.get(op, config)
    defn = operator.definition
    check_cases_in(cases, len(defn.seed_cases), r.name("cases"))
    device = torch.device(device)
    if device.type != "cpu":
        _require_cuda(device)
    spec = bench_spec(defn, impls)
    if not parts or device.type != "cuda":
        spec.parts = None
    # every implementation runs (and is timed) in a worker of its own, never in this process
    fns = {name: _runner(operator, name, device, None, None)[0] for name in spec.impls}
    # read once the fast path is resolved, i.e. with the options its module settled on
    fast_options = defn.operator.fast_options() if spec.fast else None
    reference = operator.reference
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") & 0x3FFFFFFF  # fresh inputs each run
    say = progress or (lambda msg: None)

    monitor = ClockMonitor(device) if monitor_clocks and device.type == "cuda" else None
    if monitor is not None and not monitor.start():
        say(f"not sampling GPU clocks: {monitor.unavailable}")
    intervals: dict[tuple[int, str], tuple[float, float]] = {}   # (case, impl) -> wall-clock interval
    ceilings_interval = None
    try:
        if ceilings is None and spec.cost_model is not None and device.type == "cuda":
            dtypes = sorted({str(spec.cost_model(defn.resolve_axes(c.axes)).get("matmul_dtype", "bf16"))
                             for c in defn.cases(cases)}) if sustained_s > 0 else []
            say("measuring ceilings (copy bandwidth, matmul rates"
                + (f"; {', '.join(dtypes)} sustained for {sustained_s:g} s" if dtypes else "") + ")...")
            t0 = wall()
            ceilings = measure_ceilings(device)
            ceilings_interval = (t0, wall())
            if dtypes:
                measure_sustained(ceilings, dtypes, sustained_s, device=device)
        results = _bench_cases(defn, spec, fns, reference, cases, seed, device, mode, check, hygiene, flush,
                               warmup_ms, rep_ms, min_reps, max_reps, ceilings, intervals, say)
    finally:
        if monitor is not None:
            monitor.stop()
    clocks: dict[str, Any] = {"sampled": False}
    if monitor is not None:
        clocks = {"sampled": monitor.unavailable is None, "unavailable": monitor.unavailable,
                  "power_limit_w": monitor.power_limit_w, "interval_ms": monitor.interval_ms}
        samples = monitor.samples()
        monitor.close()
        if ceilings_interval is not None:
            clocks["ceilings"] = summarize_clocks(samples, *ceilings_interval)
        if ceilings is not None and ceilings.sustained_intervals:
            clocks["sustained_ceilings"] = {d: summarize_clocks(samples, *iv)
                                            for d, iv in ceilings.sustained_intervals.items()}
        for cb in results:
            for name in spec.impls:
                if (cb.case, name) in intervals:
                    cb.clocks[name] = summarize_clocks(samples, *intervals[(cb.case, name)])

    settings = {**timer_rules(warmup_ms=warmup_ms, rep_ms=rep_ms, min_reps=min_reps, max_reps=max_reps,
                              flush=flush),
                "check": check, "hygiene": hygiene, "torch": torch.__version__,
                "triton": _triton_version(), "tolerance": asdict(defn.tolerance), "clocks": clocks}
    settings["timing"] = {"rotation_sets": ROTATION_SETS, "checked_calls": CHECKED_CALLS,
                          "watched_calls": WATCHED_CALLS, "floor_margin": FLOOR_MARGIN,
                          "runner": "each implementation in its confined worker"}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (perf_counter timer)"
    return BenchReport(defn.name, defn.config, name, seed, mode,
                       spec.impls, spec.fast, asdict(ceilings) if ceilings else None, settings, results,
                       fast_options)


def _bench_cases(defn, spec, fns, reference, cases, seed, device, mode, check, hygiene, flush,
                 warmup_ms, rep_ms, min_reps, max_reps, ceilings, intervals, say) -> list[CaseBench]:
    """The per-case loop of ``run_bench``; records each timing's wall-clock interval in
    ``intervals`` so that the clock samples can be matched to it afterwards."""
    # the benchmark's predicted verdict beside the oracle's, where the operator has its reference
    predictor = resolve_impl(defn, SOL_REFERENCE) if SOL_REFERENCE in defn.implementations else None
    results: list[CaseBench] = []
    selected = defn.cases(cases)
    for n, case in enumerate(selected):
        axes = defn.resolve_axes(case.axes)
        cb = CaseBench(case.index, dict(case.axes), {})
        if spec.cost_model is not None:
            cost = spec.cost_model(axes)
            cb.flops, cb.bytes = float(cost["flops"]), float(cost["bytes"])
            if ceilings is not None:
                floor, cb.bound = floor_seconds(cost, ceilings)
                cb.floor_ms = floor * 1e3
                if ceilings.sustained_matmul_flops_per_s:
                    cb.floor_sustained_ms = floor_seconds(cost, ceilings, sustained=True)[0] * 1e3
                for dtype in cost.get("floors_also_at", ()):
                    cb.floors_at_ms[dtype] = floor_seconds(dict(cost, matmul_dtype=dtype), ceilings)[0] * 1e3
        inputs = generate_inputs(defn, case.axes, seed=seed + case.index, mode=mode, device=device)
        if check:
            for name in spec.impls:
                # the fast path gets the full hygiene rules; baselines only the numerics
                result = run_case(defn, fns[name], case, seed=seed, device=device, mode=mode,
                                  reference=reference, inputs=inputs,
                                  hygiene=hygiene and name == spec.fast, predictor=predictor)
                cb.check[name] = _check_summary(result)
        rules = {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "min_reps": min_reps, "max_reps": max_reps,
                 "flush": flush}
        for name in spec.impls:
            t0 = wall()
            try:
                run = time_impl(fns[name], defn, case, seed=seed, mode=mode, device=device, reference=reference,
                                tolerance=case.tolerance or defn.tolerance, rules=rules, floor_ms=cb.floor_ms)
            except Exception as exc:  # noqa: BLE001 - a failing implementation is reported, not fatal
                cb.timings[name] = None
                cb.errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            intervals[(case.index, name)] = (t0, wall())
            cb.timings[name] = run.timing
            cb.timed[name] = {"calls": run.calls, "checked_calls": run.checked_calls, "watched": run.watched,
                              "overhead_ms": run.overhead_ms}
            if run.refused:
                cb.refused[name] = [[r, m] for r, m in run.refused]
                cb.errors[name] = "timing refused: " + ", ".join(dict.fromkeys(r for r, _ in run.refused))
        if spec.parts is not None and cb.timings.get(spec.fast):
            cb.parts = time_parts(spec.parts(*inputs), ceilings, device, warmup_ms=warmup_ms, rep_ms=rep_ms,
                                  min_reps=min_reps, max_reps=max_reps, flush=flush)
        results.append(cb)
        del inputs
        torch.cuda.empty_cache()
        times = ", ".join(f"{k} {fmt_number(v['median_ms'] if v else None, 3, 'g')} ms" for k, v in cb.timings.items())
        floor = f", floor {fmt_number(cb.floor_ms, 3, 'g')} ms" if cb.floor_ms is not None else ""
        verdict = ""
        if cb.check:
            verdict = " | check: " + ", ".join(
                f"{k} {'ok' if v['passed'] else 'FAIL'}"
                + ("" if v["predicted"] is None else f" (bench {'ok' if v['predicted']['passed'] else 'FAIL'})")
                for k, v in cb.check.items())
        say(f"[{n + 1}/{len(selected)}] case {case.index} {case.label}: {times}{floor}{verdict}")
    return results


def _triton_version() -> str | None:
    try:
        import triton
        return triton.__version__
    except Exception:  # noqa: BLE001
        return None
