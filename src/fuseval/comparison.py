"""Comparing one output with the oracle's, and whether a tolerance can see an error at all.

``compare(out, ref, tol)`` applies the definition's tolerance rule element by element
(|out - ref| <= atol + rtol*|ref|) and summarises the case (matched ratio, optional
max-abs bound, NaN/Inf, all-zero) under one of two rule sets (``RULES``): ``"fuseval"``
(float64 comparison; a NaN or Inf the oracle has at the same place by construction may
match) and ``"sol"``, the benchmark's evaluator (float32 comparison; any NaN or Inf on
either side fails).

Integer and bool outputs (``fuseval.inputs.exact_dtype``) are compared **exactly** under
the ``fuseval`` rules: an element matches only when it equals the oracle's (the
tolerance's atol and rtol do not apply: there is no rounding error to allow for), and the
case still needs the tolerance's matched ratio; ``OutputMetrics.exact`` says so in every
report. The ``sol`` rules keep the benchmark's own comparison (float32 and its tolerance,
for integers too), since they predict its verdict.

fuseval's rules also bound the worst element and the error's RMS, each relative to the
elements' allowance ``atol + rtol*|ref|`` (``Tolerance.max_error_ratio``,
``Tolerance.max_rms_ratio``; reasons ``worst_element`` and ``error_rms``): a matched ratio
leaves a few elements unjudged, and garbage there (1e30 in one row of every tile) would
pass it. The ``sol`` rules have neither bound: they predict the benchmark's verdict exactly.

``blind_outputs`` reports the outputs on which a tolerance is blind: where the absolute
tolerance is at least a tenth of the output's RMS, an error of 10% of the output's size
passes every element, so a kernel off by that much would be judged correct.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .definitions import TensorSpec, Tolerance
from .inputs import exact_dtype
from .options import check_one_of

__all__ = ["RULES", "OutputMetrics", "compare", "BlindOutput", "blind_outputs", "rms", "BLIND_FRACTION",
           "read_scalars"]

# "fuseval": float64 comparison, a NaN both sides have by construction may match;
# "sol": the benchmark's evaluator (float32 comparison, any NaN/Inf on either side fails)
RULES = ("fuseval", "sol")

# an error this fraction of an output's RMS must be visible to the tolerance
BLIND_FRACTION = 0.1


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
    exact: bool = False     # compared exactly (integer / bool output): atol and rtol did not apply
    # fuseval's own bounds (its rules): the worst element's |out - ref| over its allowance
    # atol + rtol*|ref|, and the error's RMS over the allowance's RMS (None: not computed)
    error_ratio: float | None = None
    rms_ratio: float | None = None

    def margin(self, tol: Tolerance) -> float:
        """Matched ratio minus the required ratio (negative: failing)."""
        return self.matched_ratio - tol.min_matched_ratio


def compare(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, name: str = "output",
            rules: str = "fuseval") -> OutputMetrics:
    """Compare an implementation's output with the oracle's under ``tol`` and ``rules``."""
    check_one_of(rules, RULES, "rules")
    if rules == "fuseval" and (exact_dtype(out.dtype) or exact_dtype(ref.dtype)):
        return _compare_exact(out, ref, tol, name)
    if rules == "sol":
        return _compare_sol(out, ref, tol, name)
    o, r, both, same_nonfinite, diff = _float_elements(out, ref)
    # every element not finite on both sides and not the same NaN/Inf on both fails: a
    # non-finite output the oracle does not have, and also a finite output where the oracle
    # is NaN/Inf (e.g. a NaN scale code decoded as some number silently repairs a value the
    # format defines as poisoned)
    bad_nonfinite = (~both & ~same_nonfinite).sum()
    allowance = tol.atol + tol.rtol * r.abs()
    ok = same_nonfinite | (both & (diff <= allowance))
    all_zero = (o == 0).all() & ((r != 0) & torch.isfinite(r)).any()
    return _metrics(name, o, r, diff, ok, both, bad_nonfinite, all_zero, tol, allowance)


def _float_elements(out: torch.Tensor, ref: torch.Tensor):
    """Both sides in float64 and, per element, (both finite, the same non-finite value on
    both sides, |out - ref| where both are finite, 0 for the same non-finite value, inf
    otherwise): what fuseval's rule judges."""
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    o_fin, r_fin = torch.isfinite(o), torch.isfinite(r)
    # a non-finite output is acceptable only where the oracle has the very same value
    same_nonfinite = (~o_fin) & (~r_fin) & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
    both = o_fin & r_fin
    diff = torch.where(both, (o - r).abs(), torch.where(same_nonfinite, torch.zeros_like(o),
                                                        torch.full_like(o, math.inf)))
    return o, r, both, same_nonfinite, diff


def tolerance_ratios(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    """Per element, how much of its bound fuseval's rule lets it use: |out - ref| /
    (atol + rtol |ref|) in float64, 0 for an exact match (the same non-finite value
    included, and an equal element under a zero bound), inf for a non-finite value the
    oracle does not have. Integer and bool outputs: 0 where equal, inf where not. An
    element passes :func:`compare` exactly when its ratio is at most 1."""
    o, r = out.detach(), ref.detach().to(device=out.device)
    if exact_dtype(o.dtype) or exact_dtype(r.dtype):
        equal = o.to(torch.float64) == r.to(torch.float64)
        return torch.where(equal, torch.zeros((), dtype=torch.float64), torch.full((), math.inf, dtype=torch.float64))
    o, r, both, same_nonfinite, diff = _float_elements(o, r)
    ratio = torch.where(both, diff / (tol.atol + tol.rtol * r.abs()), diff)
    # 0 / 0 (an equal element under a zero bound, set to 0 below) and inf stay infinite:
    # nan_to_num's default would turn inf into the largest float64
    ratio = torch.nan_to_num(ratio, nan=math.inf, posinf=math.inf)
    return torch.where(same_nonfinite | (both & (diff == 0)), torch.zeros_like(ratio), ratio)


def _compare_sol(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, name: str) -> OutputMetrics:
    """The benchmark's comparison: both sides in float32, the bound atol + rtol*|ref| in
    float32, every non-finite element of either side a failure, an all-zero output against
    a reference of non-zero norm a failure."""
    o = out.detach().to(torch.float32)
    r = ref.detach().to(device=o.device, dtype=torch.float32)
    o_fin, r_fin = torch.isfinite(o), torch.isfinite(r)
    bad_nonfinite = (~o_fin).sum() + (~r_fin).sum()
    both = o_fin & r_fin
    diff = torch.where(both, (o - r).abs(), torch.full_like(o, math.inf))
    ok = both & (diff <= tol.atol + tol.rtol * r.abs())
    all_zero = (torch.linalg.vector_norm(_finite_or_zero(r, r_fin)) > 0) \
        & (torch.linalg.vector_norm(_finite_or_zero(o, o_fin)) == 0) & (bad_nonfinite == 0)
    return _metrics(name, o, r, diff, ok, both, bad_nonfinite, all_zero, tol)


def _compare_exact(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, name: str) -> OutputMetrics:
    """An integer or bool output: an element matches when it equals the oracle's value
    (compared in int64, exact for every integer dtype; an oracle lifted to float64 gives
    integers exactly below 2**53). The error statistics are of the differences in float64."""
    o = out.detach()
    r = ref.detach().to(device=o.device)
    if r.is_floating_point():
        r_fin = torch.isfinite(r)
        r_int = torch.where(r_fin, r, torch.zeros((), dtype=r.dtype, device=r.device))
        ok = r_fin & (r_int == r_int.round()) & (o.to(torch.float64) == r_int.to(torch.float64))
        bad_nonfinite = (~r_fin).sum()
    else:
        r_fin = torch.ones_like(o, dtype=torch.bool)
        ok = o.to(torch.int64) == r.to(torch.int64)
        bad_nonfinite = 0
    o64, r64 = o.to(torch.float64), r.to(torch.float64)
    diff = torch.where(r_fin, (o64 - r64).abs(), torch.full_like(o64, math.inf))
    all_zero = ~o.to(torch.bool).any() & ((r64 != 0) & r_fin).any()
    m = _metrics(name, o64, r64, diff, ok, r_fin, bad_nonfinite, all_zero, tol)
    m.exact = True
    return m


def read_scalars(values: Sequence[Any], device: torch.device) -> list[float]:
    """0-dim tensors (or Python numbers) as float64 numbers, read from ``device`` in one
    copy: each read is a synchronisation on CUDA. Counts and indices below 2**53 come back
    exact."""
    return torch.stack([torch.as_tensor(v, device=device).to(torch.float64) for v in values]).tolist()


def _finite_or_zero(t: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """``t`` with the elements outside ``finite`` zeroed: what reductions over the finite
    elements need, without a boolean-mask gather (which is slow on the CPU)."""
    return torch.where(finite, t, torch.zeros((), dtype=t.dtype, device=t.device))


def _unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    index = []
    for n in reversed(shape):
        flat, i = divmod(flat, n)
        index.append(i)
    return tuple(reversed(index))


def _metrics(name, o, r, diff, ok, both, bad_nonfinite, all_zero, tol, allowance=None) -> OutputMetrics:
    """The summary of one comparison: error statistics and the reasons it fails.
    ``bad_nonfinite`` and ``all_zero`` may be tensors on the device: every number is read
    from it in one copy (:func:`read_scalars`). ``allowance`` (fuseval's rules): each
    element's atol + rtol*|ref|, for fuseval's own bounds."""
    numel = o.numel()
    if numel == 0:
        return OutputMetrics(name, 0.0, 0.0, 0.0, 1.0, 0, 0, False, True, [], None)
    finite_diff = _finite_or_zero(diff.to(torch.float64), both)      # >= 0 where both are finite
    scalars = [ok.sum(), both.sum(), finite_diff.max(), finite_diff.sum(),
               torch.linalg.vector_norm(_finite_or_zero(r.to(torch.float64), both)),
               torch.linalg.vector_norm(finite_diff), torch.argmax(diff.flatten()), bad_nonfinite, all_zero]
    if allowance is not None:
        allow = _finite_or_zero(allowance, both)
        # an element with no allowance (atol 0, ref 0) that is exact uses none of it
        used = torch.where(finite_diff > 0, finite_diff / allow, torch.zeros_like(finite_diff))
        scalars += [used.max(), torch.linalg.vector_norm(allow)]
    values = read_scalars(scalars, o.device)
    (n_ok, n_both, max_abs, sum_abs, ref_norm, err_norm, worst_flat, bad_nonfinite, all_zero) = values[:9]
    n_both, bad_nonfinite, all_zero = int(n_both), int(bad_nonfinite), bool(all_zero)
    matched = n_ok / numel
    if not n_both:
        max_abs = sum_abs = ref_norm = err_norm = 0.0
    if bad_nonfinite:
        max_abs = math.inf
    mean_abs = sum_abs / n_both if n_both else 0.0
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
    error_ratio = rms_ratio = None
    if allowance is not None:
        error_ratio = values[9] if n_both else 0.0
        allow_norm = values[10]
        rms_ratio = err_norm / allow_norm if allow_norm > 0 else (0.0 if err_norm == 0 else math.inf)
        if tol.max_error_ratio is not None and error_ratio > tol.max_error_ratio:
            reasons.append("worst_element")
        if tol.max_rms_ratio is not None and rms_ratio > tol.max_rms_ratio:
            reasons.append("error_rms")
    # (torch.unravel_index would import sympy, seconds of CPU, on its first call)
    worst = _unravel(int(worst_flat), o.shape)
    return OutputMetrics(name, max_abs, mean_abs, rel_l2, matched, numel, bad_nonfinite, all_zero,
                         not reasons, reasons, worst, error_ratio=error_ratio, rms_ratio=rms_ratio)


# --------------------------------------------------------------------------- blind tolerances
@dataclass
class BlindOutput:
    """An output of a case on which the tolerance cannot see an error of
    ``BLIND_FRACTION`` of its RMS: ``atol >= BLIND_FRACTION * rms``."""
    case: int
    output: str
    rms: float
    atol: float
    # the RMS of the benchmark's own reference's output (None: not run); where it is as
    # small, the blindness is the problem's (its tolerance against its own outputs)
    benchmark_rms: float | None = None

    @property
    def in_benchmark(self) -> bool:
        """Whether the benchmark's own reference shows the same blindness."""
        return self.benchmark_rms is not None and self.atol >= BLIND_FRACTION * self.benchmark_rms

    def describe(self) -> str:
        return (f"case {self.case}: the tolerance is blind on {self.output}: atol {self.atol:g} >= "
                f"{BLIND_FRACTION:g} x its RMS {self.rms:.3g}, so an error of {BLIND_FRACTION:.0%} of the "
                "output's size passes every element"
                + (" (the benchmark's own reference shows the same)" if self.in_benchmark else ""))


def rms(t: torch.Tensor) -> float:
    """Root mean square of the finite elements of ``t`` (0.0 when there are none)."""
    x = t.detach().to(torch.float64)
    finite = torch.isfinite(x)
    n = int(finite.sum())
    return float(torch.linalg.vector_norm(_finite_or_zero(x, finite))) / math.sqrt(n) if n else 0.0


def blind_outputs(case: int, refs: Sequence[torch.Tensor], specs: Sequence[TensorSpec],
                  tol: Tolerance, benchmark_refs: Sequence[Any] | None = None) -> list[BlindOutput]:
    """The outputs of one case (the oracle's ``refs``) on which ``tol`` is blind, each
    with the RMS of the benchmark's own reference's output (``benchmark_refs``) where given."""
    found = []
    for i, (spec, ref) in enumerate(zip(specs, refs)):
        if not isinstance(ref, torch.Tensor):
            continue
        size = rms(ref)
        if tol.atol >= BLIND_FRACTION * size:
            theirs = benchmark_refs[i] if benchmark_refs is not None and i < len(benchmark_refs) else None
            found.append(BlindOutput(case, spec.name, size, float(tol.atol),
                                     rms(theirs) if isinstance(theirs, torch.Tensor) else None))
    return found
