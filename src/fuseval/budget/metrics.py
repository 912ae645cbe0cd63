"""Error metrics of one stage (or of the final outputs) against the float64 oracle.

Every comparison yields the same small dict of floats, so JSON reports, tables and
plots read one shape:

``max_abs``      max |value - oracle| over finite elements (inf when the value has a
                 NaN/Inf the oracle does not have)
``rel_l2``       ||value - oracle||_2 / ||oracle||_2
``ulp_median``,  |value - oracle| in units of the ulp *of each oracle element* in the
``ulp_p99``,     stage's nominal dtype (median, 99th percentile, max). Near-zero oracle
``ulp_max``      elements (cancellation) make ``ulp_max`` large for any finite-precision
                 implementation; it is reported, budgets rarely use it
``max_abs_ulp``  max_abs in ulps *at the stage's scale* (the ulp of max |oracle|): "how
                 many last places of the largest value the worst error is"
``scale``        max |oracle| (finite)
``nonfinite``    elements where the value is NaN/Inf and the oracle is not (or differs)
``numel``
``hist``         counts of log10 |error| in the bins of :data:`HIST_EDGES` (exact zeros
                 counted separately in ``hist_zero``); only when asked for

Final outputs add ``tolerance_used`` (:func:`tolerance_use`, the largest over the outputs):
how much of the case's tolerance the outputs spend, 1.0 being all of it.

Precisions are named (``"float32"``, ``"tf32"``...) as in :mod:`fuseval.precision`, the
one table of formats, unit roundoffs and ulps.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import torch

from ..comparison import read_scalars
from ..precision import dtype_precision, ulp
from ..check import compare
from ..comparison import tolerance_ratios
from ..inputs import exact_dtype

__all__ = ["error_metrics", "final_metrics", "storage_precision", "tolerance_use", "kth_smallest", "HIST_EDGES", "METRICS",
           "ULP_METRICS", "ABS_METRICS", "REL_METRICS", "TOLERANCE_METRICS"]

ABS_METRICS = ("max_abs",)
REL_METRICS = ("rel_l2",)
ULP_METRICS = ("ulp_median", "ulp_p99", "ulp_max", "max_abs_ulp")
# of final outputs only (end-to-end allowances): the share of the case's tolerance spent
TOLERANCE_METRICS = ("tolerance_used",)
METRICS = ABS_METRICS + REL_METRICS + ULP_METRICS + TOLERANCE_METRICS

# log10 |error| histogram: 0.25-decade bins from 1e-16 to 1e4; values outside land in the
# end bins, exact zeros are counted apart
HIST_EDGES: list[float] = [-16 + 0.25 * i for i in range(81)]

# quantiles are taken on at most this many elements (an evenly strided subset beyond);
# torch.quantile refuses more than 2**24 elements, and a p99 of 4M samples is exact to
# well below the differences a budget cares about
_QUANTILE_SAMPLE = 1 << 22


def storage_precision(t: torch.Tensor) -> str:
    """The precision a tensor's values are stored in: its dtype, or for float32 storage
    the coarsest grid every finite value lies on (bf16: low 16 bits zero; tf32: low 13
    bits zero), so a kernel that rounds its float32 stage output to TF32 (because a TF32
    GEMM reads it next) is recognised as storing TF32. Fewer than 64 nonzero values say
    nothing (float32 is assumed): small integers lie on every grid."""
    try:
        name = dtype_precision(t.dtype)
    except ValueError as exc:
        raise ValueError(f"stage tap: {exc}") from None
    if name != "float32":
        return name
    bits = t.detach().contiguous().view(torch.int32)
    nonzero = torch.isfinite(t) & (t != 0)
    # the count and both grid tests in one device-to-host read (no compaction of the values)
    count, on_bf16, on_tf32 = read_scalars([nonzero.sum(), (((bits & 0xFFFF) == 0) | ~nonzero).all(),
                                            (((bits & 0x1FFF) == 0) | ~nonzero).all()], t.device)
    if count < 64:
        return "float32"
    if on_bf16:
        return "bfloat16"
    if on_tf32:
        return "tf32"
    return "float32"


def _quantiles(x: torch.Tensor, qs: Sequence[float]) -> list[float]:
    if x.numel() == 0:
        return [0.0 for _ in qs]
    flat = x.flatten()
    if flat.numel() > _QUANTILE_SAMPLE:
        step = -(-flat.numel() // _QUANTILE_SAMPLE)
        flat = flat[::step]
    q = torch.quantile(flat, torch.tensor(list(qs), dtype=flat.dtype, device=flat.device))
    return q.tolist()


def error_metrics(value: torch.Tensor, oracle: torch.Tensor, precision: str, *,
                  hist: bool = False) -> dict[str, Any]:
    """Metrics of ``value`` against ``oracle`` (any dtypes; compared in float64).

    ``precision`` names the dtype whose ulps the ulp metrics count (the stage's nominal
    output precision). Shapes must match exactly; a mismatch is a ValueError."""
    if tuple(value.shape) != tuple(oracle.shape):
        raise ValueError(f"shape {tuple(value.shape)} does not match the oracle's {tuple(oracle.shape)}")
    v = value.detach().to(torch.float64)
    r = oracle.detach().to(device=v.device, dtype=torch.float64)
    numel = r.numel()
    r_fin = torch.isfinite(r)
    both = torch.isfinite(v) & r_fin
    same_nonfinite = ~torch.isfinite(v) & ~r_fin & ((v == r) | (torch.isnan(v) & torch.isnan(r)))
    bad = (~both & ~same_nonfinite).sum()
    diff = (v - r).abs()
    del v
    if bool(both.all()):
        d, rb = diff.reshape(-1), r.abs().reshape(-1)     # the usual case: nothing to leave out
    else:
        d, rb = diff[both], r[both].abs()
    del diff
    e_ulp = d / ulp(rb, precision)
    # every scalar read in one device-to-host copy
    if d.numel():
        scalars = [d.max(), rb.max(), torch.linalg.vector_norm(rb), torch.linalg.vector_norm(d), e_ulp.max()]
    else:
        scalars = [0.0] * 5
    max_abs, scale, ref_norm, err_norm, ulp_max, nonfinite = read_scalars(scalars + [bad], r.device)
    nonfinite = int(nonfinite)
    del rb
    med, p99 = _quantiles(e_ulp, (0.5, 0.99))
    out: dict[str, Any] = {
        "max_abs": math.inf if nonfinite else max_abs,
        "rel_l2": math.inf if nonfinite else (err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)),
        "ulp_median": med,
        "ulp_p99": p99,
        "ulp_max": math.inf if nonfinite else ulp_max,
        "max_abs_ulp": math.inf if nonfinite else max_abs / ulp(scale, precision),
        "scale": scale,
        "nonfinite": nonfinite,
        "numel": numel,
    }
    del e_ulp
    if hist:
        out["hist_zero"] = int((d == 0).sum())
        nz = d[d > 0]
        if nz.numel():
            lg = torch.log10(nz).clamp(HIST_EDGES[0], HIST_EDGES[-1] - 1e-3).to(torch.float32)
            counts = torch.histc(lg, bins=len(HIST_EDGES) - 1, min=HIST_EDGES[0], max=HIST_EDGES[-1])
            out["hist"] = [int(c) for c in counts.round().to(torch.int64).tolist()]
        else:
            out["hist"] = [0] * (len(HIST_EDGES) - 1)
    return out


def tolerance_use(out: torch.Tensor, ref: torch.Tensor, tol) -> float:
    """How much of the tolerance ``tol`` an output spends: the ``min_matched_ratio``
    quantile of the elements' ``|out - ref| / (atol + rtol |ref|)``
    (:func:`fuseval.comparison.tolerance_ratios`: a NaN/Inf the oracle does not have counts
    as infinitely far, an integer or bool element spends 0 when equal, infinitely much when
    not). The case's matched ratio reaches the required one exactly when this is at most
    1, so 0.4 means: the element at the required ratio sits at 40% of its bound."""
    if out.numel() == 0:
        return 0.0
    ratio = tolerance_ratios(out, ref, tol)
    k = min(ratio.numel(), max(1, math.ceil(tol.min_matched_ratio * ratio.numel())))
    return kth_smallest(ratio.flatten(), k)


def kth_smallest(x: torch.Tensor, k: int, *, select: bool | None = None, sample: int = 1 << 20) -> float:
    """The k-th smallest (1-based) of a flat float64 tensor (inf allowed, no NaN).

    On CUDA ``torch.kthvalue`` selects within one slice on one thread block: seconds for
    the 10^8 elements of a full-size output. There (above 4096 elements, or with
    ``select=True``) up to ``sample`` values are sorted. Beyond that, the answer is the
    r-th value from its nearer end (r = n-k+1 from the top when k is in the upper half: a
    tolerance's matched ratio asks for the 99th percentile or above). A strided
    ``sample`` of the values, sorted, gives a threshold t with somewhat more than r
    (scaled) sample values beyond it. When at least r of all values lie at or beyond t,
    the answer is among them: the r-th of those few candidates, sorted. Otherwise (a
    sample that misjudged the values) t moves fourfold further out, the last resort
    being a sort of everything. Exact in every case; two reads from the device when the
    sample judges right. (Why not a radix select:
    docs/design/harness.md#quantile-selection.)"""
    n = x.numel()
    if not 1 <= k <= n:
        raise ValueError(f"k: expected 1 <= k <= {n}, got {k}")
    if select is None:
        select = x.device.type == "cuda" and n > 1 << 12
    flat = x.reshape(-1)
    if not select:
        return float(flat.kthvalue(k).values)
    if n <= sample:
        return float(flat.sort().values[k - 1])
    upper = k > n // 2
    r = n - k + 1 if upper else k                # rank from the nearer end
    ordered = flat[::max(1, n // sample)].sort(descending=upper).values
    s = ordered.numel()
    expect = r * s / n                           # sample values expected beyond the answer
    j = math.ceil(1.25 * expect + 4 * math.sqrt(expect) + 16)
    while True:
        j = min(s, j)
        t = ordered[j - 1]
        candidates = flat[flat >= t] if upper else flat[flat <= t]
        if candidates.numel() >= r:
            return float(candidates.sort(descending=upper).values[r - 1])
        if j == s:
            return float(flat.sort().values[k - 1])
        j *= 4


def final_metrics(outputs: Sequence[torch.Tensor], oracle: Sequence[torch.Tensor], names: Sequence[str],
                  tolerance, precision: str, *, full: bool = True) -> dict[str, Any]:
    """Metrics of a pipeline's final outputs: the benchmark tolerance verdict per output
    (``fuseval.check.compare``) and, with ``full``, the error metrics of all outputs
    taken together (flattened and concatenated).

    Keys: ``tolerance_passed``, ``matched_ratio`` (the lowest over outputs), ``max_abs``,
    ``rel_l2``, ``reasons`` and ``outputs`` (per-output compare results), plus the
    :func:`error_metrics` keys with ``full``."""

    per = []
    sq_err = sq_ref = 0.0
    for out, ref, name in zip(outputs, oracle, names):
        m = compare(out, ref, tolerance, name)
        ref_norm = float(torch.linalg.vector_norm(ref.detach().to(torch.float64).nan_to_num(0, 0, 0)))
        sq_err += (m.rel_l2 * ref_norm) ** 2 if math.isfinite(m.rel_l2) else math.inf
        sq_ref += ref_norm ** 2
        per.append({"name": name, "max_abs": m.max_abs, "rel_l2": m.rel_l2, "matched_ratio": m.matched_ratio,
                    "passed": m.passed, "reasons": list(m.reasons), "nonfinite": m.nonfinite,
                    "exact": m.exact, "tolerance_used": tolerance_use(out, ref, tolerance)})
    res: dict[str, Any] = {
        "tolerance_passed": all(p["passed"] for p in per),
        "matched_ratio": min(p["matched_ratio"] for p in per) if per else 1.0,
        "max_abs": max(p["max_abs"] for p in per) if per else 0.0,
        "rel_l2": math.sqrt(sq_err / sq_ref) if sq_ref > 0 else (0.0 if sq_err == 0 else math.inf),
        "reasons": sorted({r for p in per for r in p["reasons"]}),
        "tolerance_used": max((p["tolerance_used"] for p in per), default=0.0),
        "outputs": per,
    }
    if full:
        # the error metrics of all outputs together (ulps of the float ones: an integer or
        # bool output has no ulp to count in, its verdict is the exact comparison above)
        floats = [(o, r) for o, r in zip(outputs, oracle) if not exact_dtype(o.dtype)] or list(zip(outputs, oracle))
        outputs, oracle = [o for o, _ in floats], [r for _, r in floats]
        value = torch.cat([o.detach().reshape(-1).to(torch.float64) for o in outputs])
        ref = torch.cat([r.detach().reshape(-1).to(device=value.device, dtype=torch.float64) for r in oracle])
        em = error_metrics(value, ref, precision, hist=True)
        del value, ref
        em.pop("max_abs")
        em.pop("rel_l2")
        res.update(em)
    return res
