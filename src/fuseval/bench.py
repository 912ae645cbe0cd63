"""GPU benchmark harness, the same for every operator.

What one run measures, for each benchmark case of an operator:

* the **median latency** of every implementation timed (the fast path and the torch
  baselines), with CUDA events around each call, after a warm-up, over many repetitions,
  with the L2 cache flushed (a 256 MiB buffer written) before every repetition so that
  no call finds its weights or activations left in cache by the previous one;
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
* the **SM clock and power** while the ceilings and each timing ran (``fuseval.clocks``,
  sampled by nvidia-smi in a separate process): long tensor-core loads meet the GPU's
  power cap and run at a lower clock than the short ceiling measurements, which the
  fraction of the floor alone does not show;
* the **sustained floor** (``sustained_s`` > 0): the same floor with the matmul ceiling
  of the operator's dtype measured again over the last half of ``sustained_s`` seconds
  of back-to-back products, i.e. at whatever clock the power cap leaves. The burst floor
  stays the benchmark's floor (the targets are stated against it); the sustained one
  says how much of a large case's distance to it no kernel can close on this GPU.

Per-operator pieces come from the operator's files, nothing here names an operator:
the implementations to time default to every entry of the definition's
``implementations`` table except the oracles (``reference*``), or the reference module's
``BENCH_IMPLS`` list when it defines one; the implementation called ``fast`` (or the
module's ``BENCH_FAST``) is the one the others are compared with; the floor comes from the
module's ``cost_model``. ``benchmarks/README.md`` says how to add an operator.

Everything that touches the GPU is skipped (``BenchSkipped``) when there is none.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from . import operators
from . import ops as _ops
from .definitions import Definition

__all__ = ["BenchSkipped", "Ceilings", "measure_ceilings", "measure_sustained", "Timing", "time_call",
           "SustainedRate", "sustained_rate", "BenchSpec",
           "bench_spec", "floor_seconds", "CaseBench", "BenchReport", "run_bench",
           "print_bench_report", "write_outputs", "plot_report"]

L2_FLUSH_BYTES = 256 << 20


class BenchSkipped(RuntimeError):
    """The benchmark cannot run here (no CUDA device)."""


def _require_cuda(device: torch.device) -> None:
    if device.type != "cuda":
        raise BenchSkipped(f"benchmarks need a CUDA device, got device {device}")
    if not torch.cuda.is_available():
        raise BenchSkipped(f"no CUDA device (torch {torch.__version__} sees none)")


# --------------------------------------------------------------------------- timing
@dataclass
class Timing:
    """Latency of one implementation on one case, in milliseconds."""
    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    reps: int

    @classmethod
    def from_samples(cls, samples: Sequence[float]) -> "Timing":
        s = sorted(samples)
        q = lambda f: s[min(len(s) - 1, int(round(f * (len(s) - 1))))]
        return cls(statistics.median(s), q(0.2), q(0.8), s[0], len(s))


class _Flusher:
    """Writes a buffer larger than the L2 cache (H200: 60 MB) before each timed call."""

    def __init__(self, device: torch.device, nbytes: int = L2_FLUSH_BYTES):
        self.buf = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


def time_call(fn: Callable[[], Any], *, device: torch.device | str = "cuda", warmup_ms: float = 30.0,
              rep_ms: float = 150.0, min_reps: int = 10, max_reps: int = 500,
              flush: bool = True) -> Timing:
    """Median latency of ``fn()``: CUDA events around each call on a GPU (perf_counter
    around a synchronous call on the CPU), after a warm-up of at least ``warmup_ms``
    (and at least two calls), with as many repetitions as fit ``rep_ms`` within
    [min_reps, max_reps], the L2 flushed before each one when ``flush``."""
    device = torch.device(device)
    if device.type != "cuda":
        # CPU: no cache to flush meaningfully, no async queue; used by tests and dry runs
        t_end, n = time.perf_counter() + warmup_ms / 1e3, 0
        while n < 2 or time.perf_counter() < t_end:
            fn()
            n += 1
        t0 = time.perf_counter()
        fn()
        est = max(time.perf_counter() - t0, 1e-7)
        reps = int(min(max_reps, max(min_reps, rep_ms / 1e3 / est)))
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return Timing.from_samples(samples)

    flusher = _Flusher(device) if flush else None
    torch.cuda.synchronize(device)
    # warm-up: compilation, autotuning, caches of the implementation; also a first estimate
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t_end, n = time.perf_counter() + warmup_ms / 1e3, 0
    while n < 2 or time.perf_counter() < t_end:
        if flusher:
            flusher()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize(device)
        n += 1
    est_ms = max(start.elapsed_time(end), 1e-4)
    reps = int(min(max_reps, max(min_reps, rep_ms / est_ms)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flusher:
            flusher()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize(device)
    return Timing.from_samples([s.elapsed_time(e) for s, e in zip(starts, ends)])


@dataclass(frozen=True)
class SustainedRate:
    """FLOP/s of a call repeated back to back: over its first 100 ms (``burst``) and over
    the second half of the run (``steady``), with that half's wall-clock interval (for
    ``fuseval.clocks``)."""
    steady_flops_per_s: float
    burst_flops_per_s: float
    calls: int
    seconds: float
    steady_interval: tuple[float, float]


def sustained_rate(fn: Callable[[], Any], flops: float, seconds: float, *,
                   device: torch.device | str = "cuda", idle_s: float = 1.0) -> SustainedRate:
    """Call ``fn`` (``flops`` FLOPs per call) back to back for ``seconds`` after ``idle_s``
    of rest, timing every call: on a GPU with CUDA events, four calls queued ahead so that
    the device never waits for the host (no L2 flush: a steady state, not a latency); on
    the CPU with perf_counter around synchronous calls (tests). A GPU at its power cap
    settles within a fraction of a second, so the second half is its steady rate."""
    device = torch.device(device)
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    time.sleep(idle_s)
    durations, finish = [], []          # ms of each call; ms from the first start to its end
    t0 = time.time()
    if device.type == "cuda":
        events = []
        while time.time() - t0 < seconds:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
            if len(events) > 4:
                events[-5][1].synchronize()
        torch.cuda.synchronize(device)
        first = events[0][0]
        durations = [s.elapsed_time(e) for s, e in events]
        finish = [first.elapsed_time(e) for _, e in events]
    else:
        p0 = time.perf_counter()
        while time.time() - t0 < seconds:
            a = time.perf_counter()
            fn()
            b = time.perf_counter()
            durations.append(1e3 * (b - a))
            finish.append(1e3 * (b - p0))
    t1 = time.time()
    half = finish[-1] / 2
    steady = [d for f, d in zip(finish, durations) if f > half] or durations[-1:]
    burst = [d for f, d in zip(finish, durations) if f <= 100.0] or durations[:1]
    return SustainedRate(flops * len(steady) / (sum(steady) / 1e3), flops * len(burst) / (sum(burst) / 1e3),
                         len(durations), t1 - t0, (t0 + (t1 - t0) / 2, t1))


# --------------------------------------------------------------------------- ceilings
@dataclass
class Ceilings:
    """Measured rates of this device: bytes/s of a device copy (read + write) and
    FLOP/s of large matrix products per operand dtype, in short bursts; optionally the
    matmul rate of some dtypes sustained for seconds (``sustained_*``)."""
    device_name: str
    copy_bytes_per_s: float
    matmul_flops_per_s: dict[str, float]
    sustained_matmul_flops_per_s: dict[str, float] = field(default_factory=dict)
    sustained_s: float = 0.0
    sustained_intervals: dict[str, tuple[float, float]] = field(default_factory=dict)

    def rate(self, dtype: str, *, sustained: bool = False) -> float:
        rates = self.sustained_matmul_flops_per_s if sustained else self.matmul_flops_per_s
        if dtype not in rates:
            kind = "sustained matmul ceiling" if sustained else "matmul ceiling"
            raise ValueError(f"no measured {kind} for dtype {dtype!r}; measured: {sorted(rates)}")
        return rates[dtype]


_MATMUL_DTYPES = {"bf16": (torch.bfloat16, False), "fp16": (torch.float16, False),
                  "tf32": (torch.float32, True), "fp32": (torch.float32, False)}


def _square_matmul(name: str, n: int, device: torch.device):
    """A thunk for one n^3 product of random operands in the dtype named ``name`` (with
    torch's TF32 switch set for it while it runs)."""
    dtype, tf32 = _MATMUL_DTYPES[name]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def product():
        old = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            torch.matmul(a, b, out=out)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old
    return product


def measure_ceilings(device: torch.device | str = "cuda", *, matmul_n: int = 8192,
                     copy_bytes: int = 2 << 30) -> Ceilings:
    """Copy bandwidth and matmul rates (bf16, fp16, tf32, fp32), measured here and now in
    short bursts."""
    device = torch.device(device)
    _require_cuda(device)
    src = torch.randn(copy_bytes // 4, device=device)
    dst = torch.empty_like(src)
    t = time_call(lambda: dst.copy_(src), device=device, warmup_ms=20, rep_ms=100, min_reps=10,
                  max_reps=50, flush=False)
    copy_bw = 2 * copy_bytes / (t.median_ms / 1e3)
    del src, dst

    rates = {}
    for name in _MATMUL_DTYPES:
        product = _square_matmul(name, matmul_n, device)
        t = time_call(product, device=device, warmup_ms=20, rep_ms=60 if name != "fp32" else 150,
                      min_reps=3, max_reps=30, flush=False)
        rates[name] = 2 * matmul_n ** 3 / (t.median_ms / 1e3)
        del product
    torch.cuda.empty_cache()
    return Ceilings(torch.cuda.get_device_name(device), copy_bw, rates)


def measure_sustained(ceilings: Ceilings, dtypes: Sequence[str], seconds: float, *,
                      device: torch.device | str = "cuda", matmul_n: int = 8192) -> Ceilings:
    """Add to ``ceilings`` the steady rate (``sustained_rate``) of the n^3 product in each
    of ``dtypes``, run back to back for ``seconds``."""
    device = torch.device(device)
    _require_cuda(device)
    unknown = sorted(set(dtypes) - set(_MATMUL_DTYPES))
    if unknown:
        raise ValueError(f"dtypes: expected some of {sorted(_MATMUL_DTYPES)}, got {unknown}")
    for name in dtypes:
        product = _square_matmul(name, matmul_n, device)
        r = sustained_rate(product, 2 * matmul_n ** 3, seconds, device=device)
        ceilings.sustained_matmul_flops_per_s[name] = r.steady_flops_per_s
        ceilings.sustained_intervals[name] = r.steady_interval
        del product
    ceilings.sustained_s = seconds
    torch.cuda.empty_cache()
    return ceilings


# --------------------------------------------------------------------------- per-operator pieces
@dataclass
class BenchSpec:
    """What to time for one operator and how to compute its floor."""
    op: str
    impls: list[str]
    fast: str | None
    cost_model: Callable[[Mapping[str, int]], Mapping[str, Any]] | None

    @property
    def baselines(self) -> list[str]:
        return [i for i in self.impls if i != self.fast]


def bench_spec(defn: Definition, impls: Sequence[str] | None = None) -> BenchSpec:
    """The operator's benchmark pieces, from its spec: ``cost_model(axes)``, the
    implementations timed by default and which of them is its fast path."""
    op = operators.spec(defn.name)
    default = list(op.bench_impls or [k for k in defn.implementations if "reference" not in k])
    chosen = list(impls) if impls else default
    if not chosen:
        raise ValueError(f"{defn.name}: no implementation to benchmark")
    fast = op.bench_fast if op.bench_fast in chosen else None
    return BenchSpec(defn.name, chosen, fast, op.cost())


def floor_seconds(cost: Mapping[str, Any], ceilings: Ceilings, *, sustained: bool = False) -> tuple[float, str]:
    """max(FLOPs / matmul rate, bytes / copy bandwidth), and which term bounds it; with
    ``sustained`` the matmul rate is the sustained one."""
    compute = float(cost["flops"]) / ceilings.rate(str(cost.get("matmul_dtype", "bf16")), sustained=sustained)
    memory = float(cost["bytes"]) / ceilings.copy_bytes_per_s
    return (compute, "compute") if compute >= memory else (memory, "memory")


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
    check: dict[str, dict[str, Any]] = field(default_factory=dict)  # impl -> check summary
    clocks: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # impl -> SM clock/power while timed

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

    def suite_mean(self, impl: str) -> float | None:
        """Mean latency over the cases (SOL-ExecBench's suite score); None if any is missing."""
        vals = [c.median(impl) for c in self.cases]
        return None if not vals or any(v is None for v in vals) else sum(vals) / len(vals)

    def floor_mean(self, *, sustained: bool = False) -> float | None:
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


def run_bench(op: str | Definition, impls: Sequence[str] | None = None, *,
              cases: Sequence[int] | str | None = None, config: str = "seed",
              device: str | torch.device = "cuda", seed: int | None = None, mode: str = "benchmark",
              check: bool = False, hygiene: bool = True, flush: bool = True,
              warmup_ms: float = 30.0, rep_ms: float = 150.0, min_reps: int = 10, max_reps: int = 500,
              ceilings: Ceilings | None = None, monitor_clocks: bool = True, sustained_s: float = 0.0,
              progress: Callable[[str], None] | None = None) -> BenchReport:
    """Time ``impls`` of ``op`` on its benchmark cases; see the module docstring.
    ``monitor_clocks``: sample the GPU's SM clock and power while timing (``fuseval.clocks``).
    ``sustained_s``: also measure the matmul ceiling of the operator's dtype(s) sustained
    for that many seconds, and give each case a sustained floor (0: not)."""
    from .clocks import ClockMonitor, wall
    from .clocks import summarize as summarize_clocks

    if sustained_s < 0:
        raise ValueError(f"sustained_s: expected seconds >= 0 (0 = off), got {sustained_s}")
    device = torch.device(device)
    _require_cuda(device)
    operator = _ops.get(op, config)
    defn = operator.definition
    spec = bench_spec(defn, impls)
    fns = {name: operator.implementation(name) for name in spec.impls}
    reference = operator.reference
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") & 0x3FFFFFFF  # fresh inputs each run
    say = progress or (lambda msg: None)

    monitor = ClockMonitor(device) if monitor_clocks else None
    if monitor is not None and not monitor.start():
        say(f"not sampling GPU clocks: {monitor.unavailable}")
    intervals: dict[tuple[int, str], tuple[float, float]] = {}   # (case, impl) -> wall-clock interval
    ceilings_interval = None
    try:
        if ceilings is None and spec.cost_model is not None:
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

    settings = {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "min_reps": min_reps, "max_reps": max_reps,
                "l2_flush_bytes": L2_FLUSH_BYTES if flush else 0, "timer": "cuda events, median",
                "check": check, "hygiene": hygiene, "torch": torch.__version__,
                "triton": _triton_version(), "tolerance": asdict(defn.tolerance), "clocks": clocks}
    return BenchReport(defn.name, defn.config, torch.cuda.get_device_name(device), seed, mode,
                       spec.impls, spec.fast, asdict(ceilings) if ceilings else None, settings, results)


def _bench_cases(defn, spec, fns, reference, cases, seed, device, mode, check, hygiene, flush,
                 warmup_ms, rep_ms, min_reps, max_reps, ceilings, intervals, say) -> list[CaseBench]:
    """The per-case loop of ``run_bench``; records each timing's wall-clock interval in
    ``intervals`` so that the clock samples can be matched to it afterwards."""
    from .check import SOL_REFERENCE, run_case
    from .clocks import wall
    from .inputs import generate_inputs
    from .ops import resolve_impl
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
        inputs = generate_inputs(defn, case.axes, seed=seed + case.index, mode=mode, device=device)
        if check:
            for name in spec.impls:
                # the fast path gets the full hygiene rules; baselines only the numerics
                result = run_case(defn, fns[name], case, seed=seed, device=device, mode=mode,
                                  reference=reference, inputs=inputs,
                                  hygiene=hygiene and name == spec.fast, predictor=predictor)
                cb.check[name] = _check_summary(result)
        for name in spec.impls:
            fn = fns[name]
            try:
                t0 = wall()
                t = time_call(lambda: fn(*inputs), device=device, warmup_ms=warmup_ms, rep_ms=rep_ms,
                              min_reps=min_reps, max_reps=max_reps, flush=flush)
                intervals[(case.index, name)] = (t0, wall())
                cb.timings[name] = asdict(t)
            except Exception as exc:  # noqa: BLE001 - a failing implementation is reported, not fatal
                cb.timings[name] = None
                cb.errors[name] = f"{type(exc).__name__}: {exc}"
        results.append(cb)
        del inputs
        torch.cuda.empty_cache()
        times = ", ".join(f"{k} {v['median_ms']:.4f} ms" if v else f"{k} -" for k, v in cb.timings.items())
        floor = f", floor {cb.floor_ms:.4f} ms" if cb.floor_ms is not None else ""
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


# --------------------------------------------------------------------------- output
def _ms(x: float | None) -> str:
    return "-" if x is None else (f"{x:.4f}" if x < 10 else f"{x:.2f}")


def print_bench_report(report: BenchReport, stream=None) -> None:
    """The per-case table, the error comparison (when checked) and the summary lines."""
    from rich.table import Table

    from .report import console
    out = console(stream)
    c = report.ceilings
    title = f"{report.op} [{report.config}] on {report.device}, mode={report.mode}, seed={report.seed}"
    if c:
        rates = ", ".join(f"{k} {v / 1e12:.0f}" for k, v in c["matmul_flops_per_s"].items())
        title += f"\nceilings: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s; matmul TFLOP/s: {rates}"
        if c.get("sustained_matmul_flops_per_s"):
            title += f"; sustained for {c['sustained_s']:g} s: " + ", ".join(
                f"{k} {v / 1e12:.0f}" for k, v in c["sustained_matmul_flops_per_s"].items())
    from rich.markup import escape
    table = Table(title=escape(title))
    table.add_column("case", justify="right")
    table.add_column(",".join(report.cases[0].axes) if report.cases else "axes")
    for i in report.impls:
        table.add_column(f"{i} ms", justify="right")
    table.add_column("floor ms", justify="right")
    fast = report.fast
    show_sustained = bool(fast) and any(cb.floor_sustained_ms for cb in report.cases)
    if fast:
        table.add_column(f"{fast} % floor", justify="right")
        if show_sustained:
            table.add_column(f"{fast} % sust. floor", justify="right")
        for b in report.impls:
            if b != fast:
                table.add_column(f"x vs {b}", justify="right")
    show_mhz = bool(fast) and any(cb.clocks.get(fast) for cb in report.cases)
    if show_mhz:
        table.add_column(f"{fast} MHz", justify="right")
    if report.checked:
        table.add_column("check")
    for cb in report.cases:
        row = [str(cb.case), ",".join(str(v) for v in cb.axes.values())]
        row += [_ms(cb.median(i)) for i in report.impls]
        row.append(_ms(cb.floor_ms))
        if fast:
            f = cb.median(fast)
            row.append(f"{100 * cb.floor_ms / f:.1f}%" if f and cb.floor_ms else "-")
            if show_sustained:
                row.append(f"{100 * cb.floor_sustained_ms / f:.1f}%" if f and cb.floor_sustained_ms else "-")
            for b in report.impls:
                if b != fast:
                    t = cb.median(b)
                    row.append(f"{t / f:.2f}" if t and f else "-")
        if show_mhz:
            c = cb.clocks.get(fast)
            row.append(f"{c['sm_mhz_median']:.0f}" if c else "-")
        if report.checked:
            failed = [k for k, v in cb.check.items() if not v["passed"]]
            row.append("FAIL " + ",".join(failed) if failed else "ok")
        table.add_row(*row)
    s = report.summary()
    means = s["suite_mean_ms"]
    table.add_row("mean", "", *[_ms(means[i]) for i in report.impls], _ms(s["floor_mean_ms"]),
                  *([f"{100 * s['fraction_of_floor'][fast]:.1f}%" if s.get("fraction_of_floor") and
                     s["fraction_of_floor"].get(fast) else "-"] if fast else []),
                  *([f"{100 * s['fraction_of_sustained_floor'][fast]:.1f}%"
                     if s.get("fraction_of_sustained_floor", {}).get(fast) else "-"] if show_sustained else []),
                  *([f"{s['speedup_of_fast'][b]:.2f}" if s.get("speedup_of_fast") and s["speedup_of_fast"].get(b)
                     else "-" for b in report.impls if b != fast] if fast else []),
                  *([""] if show_mhz else []), *([""] if report.checked else []))
    out.print(table)
    for cb in report.cases:
        for impl, err in cb.errors.items():
            out.print(f"case {cb.case}: {impl} was not timed: {err}", markup=False, highlight=False)
    if report.checked:
        _print_error_table(report, out)
    for line in summary_lines(report):
        out.print(line, markup=False, highlight=False)


def _print_error_table(report: BenchReport, out) -> None:
    from rich.table import Table
    table = Table(title="errors against the float64 oracle (max abs / matched ratio)")
    table.add_column("case", justify="right")
    table.add_column("output")
    for i in report.impls:
        table.add_column(i, justify="right")
    for cb in report.cases:
        names = next((list(v["outputs"]) for v in cb.check.values() if v["outputs"]), [])
        for j, o in enumerate(names):
            cells = []
            for i in report.impls:
                m = cb.check.get(i, {}).get("outputs", {}).get(o)
                cells.append("-" if m is None else f"{m['max_abs']:.3e} / {m['matched_ratio']:.4%}")
            table.add_row(str(cb.case) if j == 0 else "", o, *cells)
    out.print(table)
    for cb in report.cases:
        for impl, v in cb.check.items():
            for msg in v["messages"]:
                out.print(f"case {cb.case}: {impl}: {msg}", markup=False, highlight=False)


def summary_lines(report: BenchReport) -> list[str]:
    s = report.summary()
    lines = [f"{report.op}: suite mean over {len(report.cases)} cases: " + ", ".join(
        f"{i} {_ms(m)} ms" for i, m in s["suite_mean_ms"].items())
        + (f", floor {_ms(s['floor_mean_ms'])} ms" if s["floor_mean_ms"] is not None else "")]
    if s.get("fraction_of_floor") and report.fast and s["fraction_of_floor"].get(report.fast):
        lines.append(f"{report.fast} reaches {100 * s['fraction_of_floor'][report.fast]:.1f}% of the floor "
                     "(floor mean / suite mean)")
    lines.extend(sustained_lines(report))
    if s.get("speedup_of_fast"):
        lines.append(f"{report.fast} is " + ", ".join(
            f"{v:.2f}x faster than {k}" for k, v in s["speedup_of_fast"].items() if v) + " (ratio of suite means)")
    if s.get("cases_passed"):
        lines.append("check: " + ", ".join(f"{i} {n}/{s['cases']} cases passed"
                                           for i, n in s["cases_passed"].items()))
        if report.fast:
            lines.extend(_error_comparison(report))
    lines.extend(clock_lines(report))
    return lines


def sustained_lines(report: BenchReport) -> list[str]:
    """The sustained matmul ceilings against the burst ones, with the clock and power they
    ran at, and the fast path's fraction of the floor at that rate."""
    c = report.ceilings or {}
    steady = c.get("sustained_matmul_flops_per_s") or {}
    if not steady:
        return []
    clocks = ((report.settings.get("clocks") or {}).get("sustained_ceilings")) or {}
    parts = []
    for dtype, rate in steady.items():
        burst = c["matmul_flops_per_s"].get(dtype)
        w = clocks.get(dtype)
        where = f" at {w['sm_mhz_median']:.0f} MHz, {w['power_w_median'] or 0:.0f} W" if w else ""
        parts.append(f"{dtype} {rate / 1e12:.0f} TFLOP/s" + (f" ({100 * rate / burst:.1f}% of the burst ceiling)"
                                                            if burst else "") + where)
    lines = [f"sustained ceilings (second half of {c['sustained_s']:g} s of back-to-back products): "
             + "; ".join(parts)]
    s = report.summary()
    frac = (s.get("fraction_of_sustained_floor") or {}).get(report.fast) if report.fast else None
    if s.get("sustained_floor_mean_ms") is not None:
        lines.append(f"floor at the sustained rate: {_ms(s['sustained_floor_mean_ms'])} ms (suite mean)"
                     + (f"; {report.fast} reaches {100 * frac:.1f}% of it" if frac else "")
                     + ". It binds only the cases whose kernels draw the GPU to its power cap (their clock "
                       "falls below the ceilings'); a kernel that runs at full clock can go below it")
    return lines


def clock_lines(report: BenchReport) -> list[str]:
    """What the SM clock was while the ceilings and each implementation were timed: a
    floor measured in a burst at a high clock is not what a power-capped case runs at."""
    clocks = report.settings.get("clocks") or {}
    if not clocks.get("sampled"):
        why = clocks.get("unavailable")
        return [f"GPU clocks not sampled ({why})"] if why else []
    def span(summaries):
        got = [c for c in summaries if c]
        if not got:
            return None
        return (min(c["sm_mhz_min"] for c in got), statistics.median(c["sm_mhz_median"] for c in got),
                max(c["sm_mhz_max"] for c in got), max((c["power_w_max"] or 0) for c in got))
    parts = []
    ceil = span([clocks.get("ceilings")])
    if ceil:
        parts.append(f"ceilings {ceil[1]:.0f} MHz (median; {ceil[0]:.0f}-{ceil[2]:.0f})")
    for impl in report.impls:
        sp = span([cb.clocks.get(impl) for cb in report.cases])
        if sp:
            parts.append(f"{impl} {sp[1]:.0f} MHz ({sp[0]:.0f}-{sp[2]:.0f}, up to {sp[3]:.0f} W)")
    if not parts:
        return ["GPU clocks sampled, but no sample fell inside a timing (intervals shorter than the sampling period)"]
    limit = clocks.get("power_limit_w")
    return ["SM clock while timed: " + "; ".join(parts) + (f"; power limit {limit:.0f} W" if limit else "")]


def _error_comparison(report: BenchReport) -> list[str]:
    """Per baseline: in how many (case, output) pairs the fast path's max abs error is no
    larger and its matched ratio no smaller than the baseline's."""
    lines = []
    for b in report.impls:
        if b == report.fast:
            continue
        total = not_worse_max = not_worse_ratio = 0
        for cb in report.cases:
            f, o = cb.check.get(report.fast), cb.check.get(b)
            if not f or not o:
                continue
            for name, mf in f["outputs"].items():
                mo = o["outputs"].get(name)
                if mo is None:
                    continue
                total += 1
                not_worse_max += mf["max_abs"] <= mo["max_abs"]
                not_worse_ratio += mf["matched_ratio"] >= mo["matched_ratio"]
        if total:
            lines.append(f"errors: {report.fast} vs {b}: max abs error no larger in {not_worse_max}/{total}, "
                         f"matched ratio no smaller in {not_worse_ratio}/{total} (case, output) pairs")
    return lines


def plot_report(report: BenchReport, path: str) -> str:
    """Latency per case (log scale) of every implementation, and the floor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{c.case}\n" + "\n".join(f"{v}" for v in c.axes.values()) for c in report.cases]
    xs = list(range(len(report.cases)))
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(xs) + 3), 5))
    for impl in report.impls:
        ys = [c.median(impl) for c in report.cases]
        ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None],
                marker="o", label=f"{impl} (mean {_ms(report.suite_mean(impl))} ms)")
    floors = [c.floor_ms for c in report.cases]
    if any(f is not None for f in floors):
        ax.plot([x for x, f in zip(xs, floors) if f is not None], [f for f in floors if f is not None],
                linestyle="--", color="black", label=f"floor (mean {_ms(report.floor_mean())} ms)")
    sustained = [c.floor_sustained_ms for c in report.cases]
    if any(f is not None for f in sustained):
        ax.plot([x for x, f in zip(xs, sustained) if f is not None], [f for f in sustained if f is not None],
                linestyle=":", color="gray",
                label=f"floor at the sustained matmul rate (mean {_ms(report.floor_mean(sustained=True))} ms)")
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_xlabel("case (" + ", ".join(report.cases[0].axes) + ")" if report.cases else "case")
    ax.set_ylabel("median latency (ms, log)")
    ax.set_title(f"{report.op} on {report.device}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_outputs(report: BenchReport, out_dir: str, *, plot: bool = True) -> list[str]:
    """bench.json (everything), bench.txt (the terminal table) and bench.png under out_dir."""
    import io
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    p = os.path.join(out_dir, "bench.json")
    with open(p, "w") as f:
        json.dump(report.to_dict(), f, indent=1, default=_json_default)
    paths.append(p)
    buf = io.StringIO()
    print_bench_report(report, buf)
    p = os.path.join(out_dir, "bench.txt")
    with open(p, "w") as f:
        f.write(buf.getvalue())
    paths.append(p)
    if plot and report.cases:
        paths.append(plot_report(report, os.path.join(out_dir, "bench.png")))
    return paths


def _json_default(x):
    return str(x)
