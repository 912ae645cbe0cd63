"""What the device can do, measured by fuseval's own timer.

:func:`time_call` is the timer of fuseval's own work (the ceilings, the fast path's parts
in ``fuseval bench``): CUDA events around each call after a warm-up, the L2 flushed before
each. Implementations under test are never timed here: they are timed in their worker
(:mod:`fuseval.runner.clock`). :func:`measure_ceilings` gives the copy bandwidth and the
matrix-product rates per dtype in short bursts, :func:`measure_sustained` the rate a
product keeps for seconds (at whatever clock the power cap leaves).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from ..runner.clock import L2_FLUSH_BYTES
from ..runner.timing import Timing
from ..torch_flags import matmul_flags

__all__ = ["BenchSkipped", "Timing", "time_call", "timer_rules", "floor_seconds", "SustainedRate", "sustained_rate",
           "Ceilings",
           "square_matmul", "measure_ceilings", "measure_sustained", "WARMUP_MS", "REP_MS", "MIN_REPS", "MAX_REPS"]

# the timer's rules by default: warm-up, time filled by repetitions, repetition bounds
WARMUP_MS, REP_MS, MIN_REPS, MAX_REPS = 30.0, 150.0, 10, 500


class BenchSkipped(RuntimeError):
    """The benchmark cannot run here (no CUDA device)."""


def _require_cuda(device: torch.device) -> None:
    if device.type != "cuda":
        raise BenchSkipped(f"benchmarks need a CUDA device, got device {device}")
    if not torch.cuda.is_available():
        raise BenchSkipped(f"no CUDA device (torch {torch.__version__} sees none)")


# --------------------------------------------------------------------------- timing
class _Flusher:
    """Writes a buffer larger than the L2 cache (H200: 60 MB) before each timed call."""

    def __init__(self, device: torch.device, nbytes: int = L2_FLUSH_BYTES):
        self.buf = torch.empty(nbytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


def timer_rules(*, warmup_ms: float = WARMUP_MS, rep_ms: float = REP_MS, min_reps: int = MIN_REPS,
                max_reps: int = MAX_REPS, flush: bool = True) -> dict[str, Any]:
    """The rules :func:`time_call` times under, as bench.json and baselines record them."""
    return {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "min_reps": min_reps, "max_reps": max_reps,
            "l2_flush_bytes": L2_FLUSH_BYTES if flush else 0, "timer": "cuda events, median"}


def time_call(fn: Callable[[], Any], *, device: torch.device | str = "cuda", warmup_ms: float = WARMUP_MS,
              rep_ms: float = REP_MS, min_reps: int = MIN_REPS, max_reps: int = MAX_REPS,
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
    ``fuseval.bench.clocks``)."""
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


def square_matmul(name: str, n: int, device: torch.device):
    """A thunk for one n^3 product of random operands in the dtype named ``name`` (with
    torch's TF32 switch set for it while it runs)."""
    dtype, tf32 = _MATMUL_DTYPES[name]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)

    def product():
        with matmul_flags(tf32=tf32):
            torch.matmul(a, b, out=out)
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
        product = square_matmul(name, matmul_n, device)
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
        product = square_matmul(name, matmul_n, device)
        r = sustained_rate(product, 2 * matmul_n ** 3, seconds, device=device)
        ceilings.sustained_matmul_flops_per_s[name] = r.steady_flops_per_s
        ceilings.sustained_intervals[name] = r.steady_interval
        del product
    ceilings.sustained_s = seconds
    torch.cuda.empty_cache()
    return ceilings


def floor_seconds(cost: Mapping[str, Any], ceilings: Ceilings, *, sustained: bool = False) -> tuple[float, str]:
    """max(FLOPs / matmul rate, bytes / copy bandwidth), and which term bounds it; with
    ``sustained`` the matmul rate is the sustained one."""
    compute = float(cost["flops"]) / ceilings.rate(str(cost.get("matmul_dtype", "bf16")), sustained=sustained)
    memory = float(cost["bytes"]) / ceilings.copy_bytes_per_s
    return (compute, "compute") if compute >= memory else (memory, "memory")
