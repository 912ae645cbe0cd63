"""Checking an implementation against the float64 oracle.

The rules are the seed benchmark's, made stricter where it is weak:

* the tolerance rule of the definition (element: |out - ref| <= atol + rtol*|ref|; case:
  matched ratio, optional max-abs bound);
* NaN or Inf in an output fails (``nonfinite``), unless the oracle has the same
  non-finite value at that position by construction (e.g. a NaN e4m3 scale code);
* an all-zero output against a non-zero oracle fails (``all_zero``);
* the device allocator is poisoned with NaN before each call, so output elements the
  implementation never wrote show up as NaN rather than as stale or zero memory;
* every case draws fresh inputs (seed + case index);
* the implementation may not mutate its inputs (``mutated_input``), return tensors that
  alias them (``aliased_output``), return a cached result (``cached_result``: a second
  call on different inputs returns the same outputs), or hand back buffers it overwrites
  on the next call (``output_reused``);
* wrong output count, shape or dtype (``bad_outputs``) and exceptions (``raised``).

Each violation is reported by name in :class:`CaseResult.violations`.

Two rule sets (``RULES``): ``"fuseval"`` (the above, the default) and ``"sol"``, the
benchmark's own (SOL-ExecBench's evaluator): outputs and reference compared in float32,
and any NaN or Inf in the output *or the reference* fails the case, even where both agree.
``check(..., against="sol_reference", rules="sol")`` predicts the benchmark's verdict; a
plain check reports that prediction beside its own verdict (``CaseResult.predicted``).
"""
from __future__ import annotations

import math
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from . import ops as _ops
from .definitions import Case, Definition, Tolerance
from .errors import VIOLATION_EXIT, NoDeviceError
from .inputs import generate_inputs
from .validate import bind_axes, check_outputs_shape

__all__ = ["compare", "OutputMetrics", "CaseResult", "CheckReport", "check", "run_case",
           "fingerprint", "poison_allocator", "VIOLATIONS", "RULES", "Prediction"]

# "fuseval": float64 comparison, a NaN both sides have by construction may match;
# "sol": the benchmark's evaluator (float32 comparison, any NaN/Inf on either side fails)
RULES = ("fuseval", "sol")
# what the benchmark compares against: the implementation name of its reference
SOL_REFERENCE = "sol_reference"

# every violation name, from the one table that also gives each its exit code
VIOLATIONS = tuple(name for name, _ in VIOLATION_EXIT)


# --------------------------------------------------------------------------- comparison
@dataclass
class OutputMetrics:
    name: str
    max_abs: float
    mean_abs: float
    rel_l2: float
    matched_ratio: float
    numel: int
    nonfinite: int          # elements where output and oracle disagree on being finite
    all_zero: bool
    passed: bool
    reasons: list[str] = field(default_factory=list)
    worst_index: tuple[int, ...] | None = None

    def margin(self, tol: Tolerance) -> float:
        """Matched ratio minus the required ratio (negative: failing)."""
        return self.matched_ratio - tol.min_matched_ratio


def compare(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, name: str = "output",
            rules: str = "fuseval") -> OutputMetrics:
    """Compare an implementation's output with the oracle's under ``tol`` and ``rules``."""
    if rules not in RULES:
        raise ValueError(f"rules: expected one of {RULES}, got {rules!r}")
    if rules == "sol":
        return _compare_sol(out, ref, tol, name)
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    o_fin, r_fin = torch.isfinite(o), torch.isfinite(r)
    # a non-finite output is acceptable only where the oracle has the very same value
    same_nonfinite = (~o_fin) & (~r_fin) & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
    # ... and a finite output where the oracle is NaN/Inf (e.g. a NaN scale code decoded as
    # some number) silently repairs a value the format defines as poisoned: also a failure
    bad_nonfinite = int(((~o_fin) & ~same_nonfinite).sum()) + int(((~r_fin) & o_fin).sum())
    both = o_fin & r_fin
    inf = torch.full_like(o, math.inf)
    diff = torch.where(both, (o - r).abs(), torch.where(same_nonfinite, torch.zeros_like(o), inf))
    ok = same_nonfinite | (both & (diff <= tol.atol + tol.rtol * r.abs()))
    all_zero = bool(o.numel()) and bool((o == 0).all()) and bool((r[r_fin] != 0).any())
    return _metrics(name, o, r, diff, ok, both, bad_nonfinite, all_zero, tol)


def _compare_sol(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, name: str) -> OutputMetrics:
    """The benchmark's comparison: both sides in float32, the bound atol + rtol*|ref| in
    float32, every non-finite element of either side a failure, an all-zero output against
    a reference of non-zero norm a failure."""
    o = out.detach().to(torch.float32)
    r = ref.detach().to(device=o.device, dtype=torch.float32)
    o_fin, r_fin = torch.isfinite(o), torch.isfinite(r)
    bad_nonfinite = int((~o_fin).sum()) + int((~r_fin).sum())
    both = o_fin & r_fin
    diff = torch.where(both, (o - r).abs(), torch.full_like(o, math.inf))
    ok = both & (diff <= tol.atol + tol.rtol * r.abs())
    all_zero = bool(torch.linalg.vector_norm(r[r_fin]) > 0) and bool(torch.linalg.vector_norm(o[o_fin]) == 0) \
        and not bad_nonfinite
    return _metrics(name, o, r, diff, ok, both, bad_nonfinite, all_zero, tol)


def _metrics(name, o, r, diff, ok, both, bad_nonfinite, all_zero, tol) -> OutputMetrics:
    """The summary of one comparison: error statistics and the reasons it fails."""
    numel = o.numel()
    matched = float(ok.sum()) / numel if numel else 1.0
    finite_diff = diff[both].to(torch.float64)
    max_abs = float(finite_diff.max()) if finite_diff.numel() else 0.0
    if bad_nonfinite:
        max_abs = math.inf
    mean_abs = float(finite_diff.mean()) if finite_diff.numel() else 0.0
    ref_norm = float(torch.linalg.vector_norm(r[both].to(torch.float64))) if both.any() else 0.0
    err_norm = float(torch.linalg.vector_norm(finite_diff)) if finite_diff.numel() else 0.0
    rel_l2 = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    reasons = []
    if bad_nonfinite:
        reasons.append("nonfinite")
    if all_zero:
        reasons.append("all_zero")
    if matched < tol.min_matched_ratio:
        reasons.append("tolerance")
    if tol.max_abs_error is not None and max_abs > tol.max_abs_error:
        reasons.append("max_abs")
    worst = None
    if numel:
        worst = tuple(int(i) for i in torch.unravel_index(torch.argmax(diff.flatten()), o.shape))
    return OutputMetrics(name, max_abs, mean_abs, rel_l2, matched, numel, bad_nonfinite, all_zero,
                         not reasons, reasons, worst)


# --------------------------------------------------------------------------- hygiene checks
def fingerprint(t: Any) -> Any:
    """A cheap content fingerprint (bitwise) of a tensor, computed where it lives."""
    if not isinstance(t, torch.Tensor):
        return t
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    bits = t.detach().contiguous().view(width).flatten().to(torch.int64)
    weights = torch.arange(1, bits.numel() + 1, device=bits.device, dtype=torch.int64) % 1_000_003
    return (tuple(t.shape), t.dtype, int(bits.sum()), int((bits * weights).sum()))


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device:
        return False
    a0, a1 = _storage_span(a)
    b0, b1 = _storage_span(b)
    return a0 < b1 and b0 < a1 and a1 > a0 and b1 > b0


def poison_allocator(device: torch.device, nbytes: int) -> None:
    """Fill the memory the caching allocator will hand out next with NaN.

    On CUDA, a freed block stays in torch's cache and is reused for the next allocations,
    so outputs an implementation allocates but never fully writes show NaN. The allocator
    hands out the smallest cached block that fits, and a segment that still holds a live
    tensor keeps its free fragments in the cache even through ``empty_cache``: so every
    free block in the cache is taken, filled with NaN and given back (small-pool
    fragments in pieces of at most 1 MiB, the largest request that pool serves), and then
    one fresh block of ``nbytes`` for outputs larger than anything cached. On the CPU,
    large allocations come fresh from the OS (zeros); unwritten elements are then caught
    by the comparison with the oracle and the all-zero rule."""
    if device.type != "cuda" or nbytes <= 0:
        return
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()                      # whole free segments go back to the driver
    index = device.index if device.index is not None else torch.cuda.current_device()
    small_max = 1 << 20
    requests = []
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device", index) != index:
            continue
        for block in segment.get("blocks", []):
            if block.get("state") != "inactive":
                continue
            size = int(block["size"])
            if segment.get("segment_type") == "small":
                requests += [small_max] * (size // small_max) + ([size % small_max] if size % small_max else [])
            else:
                requests.append(size)
    held = []
    for size in sorted(requests):
        held.append(torch.empty(max(size // 4, 1), dtype=torch.float32, device=device).fill_(float("nan")))
    try:
        held.append(torch.empty(int(nbytes) // 4 + 1, dtype=torch.float32, device=device).fill_(float("nan")))
    except torch.cuda.OutOfMemoryError:           # no room for a fresh block: the cache is poisoned
        pass
    del held


# --------------------------------------------------------------------------- one case
@dataclass
class Prediction:
    """The benchmark's predicted verdict on a case: the outputs compared with
    ``sol_reference`` (the benchmark's reference in its own precision) under its rules."""
    passed: bool
    outputs: list[OutputMetrics]
    violations: list[str]


@dataclass
class CaseResult:
    case: int
    axes: dict[str, int]
    outputs: list[OutputMetrics]
    violations: list[str]
    messages: list[str]
    passed: bool
    impl_seconds: float
    oracle_seconds: float
    seed: int
    tolerance: dict[str, Any] = field(default_factory=dict)
    predicted: Prediction | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _as_tuple(outputs: Any) -> tuple:
    if isinstance(outputs, torch.Tensor):
        return (outputs,)
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else outputs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _predict(defn: Definition, outputs, inputs, tol: Tolerance, predictor: Callable) -> Prediction:
    """The benchmark's verdict on ``outputs``: ``predictor`` (its reference) under its rules."""
    refs = _as_tuple(predictor(*inputs))
    metrics = [compare(o, r, tol, s.name, rules="sol") for o, r, s in zip(outputs, refs, defn.outputs)]
    violations = list(dict.fromkeys(reason for m in metrics for reason in m.reasons))
    return Prediction(not violations, metrics, violations)


def run_case(defn: Definition, impl: Callable, case: Case, *, seed: int, device: torch.device,
             mode: str = "benchmark", reference: Callable | None = None,
             inputs: Sequence[Any] | None = None, hygiene: bool = True, rules: str = "fuseval",
             predictor: Callable | None = None) -> CaseResult:
    """Check ``impl`` on one case: fresh inputs, oracle, tolerance and hygiene rules.

    ``reference``: what the outputs are compared with (default: the float64 oracle);
    ``rules``: "fuseval" or "sol" (see ``RULES``); ``predictor``: when given (the
    benchmark's ``sol_reference``), the benchmark's verdict is predicted beside."""
    reference = reference or _ops.resolve_impl(defn, "reference")
    tol = case.tolerance or defn.tolerance
    tol_dict = asdict(tol)
    case_seed = seed + case.index
    if inputs is None:
        inputs = generate_inputs(defn, case.axes, seed=case_seed, mode=mode, device=device)
    bound = bind_axes(defn, inputs, check_values=False)
    # fingerprints (a full int64 pass over every input) only when the hygiene rules use them;
    # taken before the oracle runs, so an oracle that mutated its inputs would show too
    before = [fingerprint(t) for t in inputs] if hygiene else None
    violations: list[str] = []
    messages: list[str] = []

    out_bytes = sum(math.prod(defn.shape_of(s, bound)) * 4 for s in defn.outputs)
    # the oracle runs first, on the untouched inputs: an implementation that mutates its
    # inputs is then compared with the answer to the question it was asked
    t0 = time.perf_counter()
    refs = reference(*inputs)
    _sync(device)
    oracle_seconds = time.perf_counter() - t0

    poison_allocator(device, 2 * out_bytes)
    t0 = time.perf_counter()
    try:
        outputs = _as_tuple(impl(*inputs))
        _sync(device)
    except Exception as exc:  # noqa: BLE001 - an implementation's failure is a verdict, not a crash
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return CaseResult(case.index, dict(case.axes), [], ["raised"], [f"implementation raised: {tb}"],
                          False, time.perf_counter() - t0, oracle_seconds, case_seed, tol_dict)
    impl_seconds = time.perf_counter() - t0

    problems = check_outputs_shape(defn, outputs, bound)
    if problems:
        return CaseResult(case.index, dict(case.axes), [], ["bad_outputs"], problems, False,
                          impl_seconds, oracle_seconds, case_seed, tol_dict)

    metrics = [compare(o, r, tol, s.name, rules) for o, r, s in zip(outputs, refs, defn.outputs)]
    del refs
    predicted = _predict(defn, outputs, inputs, tol, predictor) if predictor is not None else None
    for m in metrics:
        for reason in m.reasons:
            if reason not in violations:
                violations.append(reason)
            messages.append(f"{m.name}: {reason} (max abs {m.max_abs:.3g}, matched {m.matched_ratio:.4%})")

    if hygiene:
        after = [fingerprint(t) for t in inputs]
        for spec, a, b in zip(defn.inputs, before, after):
            if a != b:
                violations.append("mutated_input")
                messages.append(f"input {spec.name!r} was modified by the implementation")
        for o_spec, o in zip(defn.outputs, outputs):
            for i_spec, i in zip(defn.inputs, inputs):
                if isinstance(i, torch.Tensor) and _overlaps(o, i):
                    violations.append("aliased_output")
                    messages.append(f"output {o_spec.name!r} shares memory with input {i_spec.name!r}")
        # a second call on different inputs must give different outputs, and must not
        # overwrite what the first call returned
        first = [o.detach().clone() for o in outputs]
        other = generate_inputs(defn, case.axes, seed=case_seed + 7_919_993, mode=mode, device=device)
        try:
            second = _as_tuple(impl(*other))
            _sync(device)
        except Exception as exc:  # noqa: BLE001
            violations.append("raised")
            messages.append(f"second call raised: {type(exc).__name__}: {exc}")
            second = None
        if second is not None and not check_outputs_shape(defn, second, bound):
            # an all-zero answer is the same for any input: it is reported as all_zero, not
            # as a cached result (that rule is for answers that are right once, then stale)
            if "all_zero" not in violations and all(torch.equal(a.to(torch.float64).nan_to_num(1.5), b.to(torch.float64).nan_to_num(1.5))
                   for a, b in zip(first, second)):
                violations.append("cached_result")
                messages.append("a second call with different inputs returned identical outputs")
            if not all(torch.equal(a.nan_to_num(1.5), b.nan_to_num(1.5)) for a, b in zip(first, outputs)):
                violations.append("output_reused")
                messages.append("the second call overwrote the outputs returned by the first")
        del other, second, first

    violations = list(dict.fromkeys(violations))
    return CaseResult(case.index, dict(case.axes), metrics, violations, messages, not violations,
                      impl_seconds, oracle_seconds, case_seed, tol_dict, predicted)


# --------------------------------------------------------------------------- a whole check
@dataclass
class CheckReport:
    op: str
    impl: str
    config: str
    device: str
    seed: int
    mode: str
    tolerance: dict[str, Any]
    cases: list[CaseResult]
    variant: str = "sol"
    against: str = "reference"
    rules: str = "fuseval"

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def predicted_passed(self) -> bool | None:
        """The benchmark's predicted verdict over all cases (None: not predicted)."""
        preds = [c.predicted for c in self.cases]
        if not preds or any(p is None for p in preds):
            return None
        return all(p.passed for p in preds)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        d["predicted_passed"] = self.predicted_passed
        return d

    def rows(self) -> list[dict[str, Any]]:
        """One flat row per (case, output): handy for pandas."""
        rows = []
        for c in self.cases:
            if not c.outputs:
                rows.append({"case": c.case, **c.axes, "output": None, "passed": c.passed,
                             "violations": ",".join(c.violations)})
            for m in c.outputs:
                rows.append({"case": c.case, **c.axes, "output": m.name, "max_abs": m.max_abs,
                             "mean_abs": m.mean_abs, "rel_l2": m.rel_l2, "matched_ratio": m.matched_ratio,
                             "passed": c.passed, "violations": ",".join(c.violations)})
        return rows

    def to_dataframe(self):
        import pandas as pd
        return pd.DataFrame(self.rows())


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NoDeviceError("device 'cuda' was requested but torch sees no CUDA device "
                         f"(torch {torch.__version__}); use --device cpu")
    return device


def check(op: str | Definition, impl: str | Callable, *, config: str | Mapping[str, int] = "small",
          cases: Sequence[int] | str | None = None, device: str | torch.device | None = "cpu",
          seed: int = 0, mode: str = "benchmark", hygiene: bool = True,
          progress: Callable[[CaseResult, int, int], None] | None = None,
          variant: str | None = None, against: str = "reference", rules: str = "fuseval",
          predict: bool = True) -> CheckReport:
    """Check ``impl`` (name, 'module:function' or callable) on ``op``'s benchmark cases.

    ``config``: "seed" (full size), "small" or another named scaled-down configuration.
    ``variant``: a named semantic variant of the operator (default: the benchmark's).
    ``against``: the implementation the outputs are compared with ("reference": the
    float64 oracle; "sol_reference": the benchmark's reference in its own precision);
    ``rules``: "fuseval" or "sol" (the benchmark's evaluator). ``predict``: also predict
    the benchmark's verdict (``sol_reference`` under the "sol" rules) where the operator
    has a ``sol_reference`` and the check is not that prediction already.
    Returns a :class:`CheckReport`; ``report.passed`` is True only if every case passed."""
    if rules not in RULES:
        raise ValueError(f"rules: expected one of {', '.join(RULES)}, got {rules!r}")
    operator = _ops.get(op, config, variant)
    defn = operator.definition
    if impl == "reference":
        raise ValueError("'reference' is the float64 oracle itself (its outputs are float64, unrounded); "
                         "check 'reference_fp32' for the float32 reference, or another implementation")
    fn = operator.implementation(impl)
    reference = operator.implementation(against)
    predictor = None
    if predict and SOL_REFERENCE in defn.implementations and impl != SOL_REFERENCE \
            and (against, rules) != (SOL_REFERENCE, "sol"):
        predictor = operator.implementation(SOL_REFERENCE)
    dev = resolve_device(device)
    results = []
    selected = defn.cases(cases)
    for n, case in enumerate(selected):
        result = run_case(defn, fn, case, seed=seed, device=dev, mode=mode, reference=reference,
                          hygiene=hygiene, rules=rules, predictor=predictor)
        results.append(result)
        if progress:
            progress(result, n + 1, len(selected))
    return CheckReport(defn.name, _ops.impl_label(impl), defn.config, str(dev), seed, mode,
                       asdict(defn.tolerance), results, defn.variant, against, rules)
