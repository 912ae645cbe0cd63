"""Derived bounds on the float32 reference's error against the float64 oracle (test-only:
tests/properties/test_invariants.py checks the two operators' float32 references with them;
nothing in fuseval calls them, so they live with the tests).

The float32 reference (``reference(..., dtype=torch.float32)``) runs the very formulas of
the oracle in float32. Its inputs are exactly representable in float32 (op A's inputs
are float32; op B's are bf16, fp8, fp4 codes and fp32 scalars), so both runs start from
the same numbers and every difference is float32 rounding. This module bounds that
difference element by element with the standard model of floating-point arithmetic
(Higham, *Accuracy and Stability of Numerical Algorithms*, ch. 2-3):

* ``u = 2^-24`` (float32 unit roundoff), ``gamma(n) = n u / (1 - n u)``;
* a dot product of length n, in any summation order: ``|fl(x.y) - x.y| <= gamma(n) |x|.|y|``;
* an input error e_x propagates through y = x W^T (+ b) as ``e_x |W|^T``;
* elementary functions (exp, rsqrt) are allowed 4u each (a few ulp, more than the
  <= 1-2 ulp that vectorised libm implementations claim);
* first-order terms only, then the bound is doubled (``SAFETY``), which covers the
  second-order terms and any slack in the function ulps.

Every magnitude (|x|, |W|, the softmax probabilities...) comes from the float64 run's
stage taps, so the bounds are computed, not guessed. Two forms:

``end to end`` (:func:`fp32_error_vs_bound`)
    e_k of each stage from the propagated e_{k-1} plus the stage's own rounding; the
    output must satisfy ``|out32 - out64| <= 2 e_out``. Rigorous but, for op A, loose (the
    worst case adds every error with the same sign through four matrix products and the
    softmax: about 10^4-10^5 times the observed error); for op B about 100x.
``stage-local`` (:func:`fp32_stage_errors_vs_bounds`)
    stage k run in float32 from the oracle's exact stage inputs (every other stage
    overridden with its float64 tap, rounded to float32 by the reference), against
    ``2 * (local rounding + input rounding u|input| propagated through the stage)``. These
    are within ~10-100x of the observed errors and catch a stage computed in a lower
    precision (bf16 rounding is 2^16 times u).

Derivation per stage: docs/properties.md ("float32 vs float64").
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import torch

from fuseval.operators import load
from fuseval.operators.implementations import resolve_impl
from fuseval.precision import unit_roundoff
from fuseval.refimpl import stages as st

__all__ = ["U32", "U_BF16", "SAFETY", "gamma", "stage_bounds", "fp32_error_vs_bound",
           "fp32_stage_errors_vs_bounds"]

U32 = unit_roundoff("float32")       # 2^-24
U_BF16 = unit_roundoff("bfloat16")   # 2^-8: bf16 has an 8-bit significand
FUNC = 4 * U32              # allowance for one elementary-function evaluation (exp, rsqrt)
SAFETY = 2.0

OP_A, OP_B = "qwen2vl_decoder_layer", "nvfp4_qkv_rope"


def gamma(n: int, u: float = U32) -> float:
    return n * u / (1 - n * u)


def _norm_local(n: int) -> float:
    """Relative rounding error of rms_norm(x) = x * rsqrt(mean(x^2) + eps) * w in float32:
    mean of n squares (gamma(n + 1)), + eps (u), rsqrt (a function) halves the relative
    error of its argument and adds its own, then two products (2u)."""
    return 0.5 * gamma(n + 2) + FUNC + 2 * U32


def _norm_propagated(y: torch.Tensor, e_y: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """First-order effect of an input error e_y on rms_norm over the last axis:
    d(y_i r) = r dy_i + y_i dr with |dr| <= r^3 mean(|y| e_y)."""
    r = torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return w.abs() * r * (e_y + y.abs() * r * r * (y.abs() * e_y).mean(-1, keepdim=True))


def _swap_halves(t: torch.Tensor) -> torch.Tensor:
    """|rotate_half(t)| for nonnegative t: the two halves exchanged."""
    h = t.shape[-1] // 2
    return torch.cat([t[..., h:], t[..., :h]], dim=-1)


def _rope_bound(y: torch.Tensor, e_y: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """y*c + rotate_half(y)*s: propagated |e||c| + |swap e||s|, local gamma(2) on each term."""
    return (e_y * c.abs() + _swap_halves(e_y) * s.abs()
            + gamma(2) * (y.abs() * c.abs() + _swap_halves(y.abs()) * s.abs()))


def _heads(t: torch.Tensor, d: int) -> torch.Tensor:
    b, s, n = t.shape
    return t.reshape(b, s, n // d, d).transpose(1, 2)


def _merge(t: torch.Tensor) -> torch.Tensor:
    b, h, s, d = t.shape
    return t.transpose(1, 2).reshape(b, s, h * d)


def _abs_mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return a.abs() @ w.abs().transpose(-1, -2)


def _attention_bound(q, k, v, e_q, e_k, e_v, group: int) -> torch.Tensor:
    """Causal softmax attention o = softmax(q k^T / sqrt(D)) v in float32, heads layout.

    Scores z = q.k * sc: |dz| <= (e_q.|k| + |q|.e_k + gamma(D + 2)|q|.|k|) sc (the scale is
    a rounded float32 constant: one more u). With D_s = max_j |dz_j| over the visible keys,
    |dp_j| <= p_j (2 D_s + 2u|z_j - max z| + gamma(S + 6) + FUNC) (softmax's shift, exp, sum
    and normalisation), and o = sum_j p_j v_j adds sum_j p_j e_v + gamma(S + 1) sum_j p_j |v_j|."""
    k, e_k = k.repeat_interleave(group, 1), e_k.repeat_interleave(group, 1)
    v, e_v = v.repeat_interleave(group, 1), e_v.repeat_interleave(group, 1)
    d = q.shape[-1]
    n_seq = q.shape[2]
    sc = 1.0 / math.sqrt(d)
    z = (q @ k.transpose(-1, -2)) * sc
    e_z = (e_q @ k.abs().transpose(-1, -2) + q.abs() @ e_k.transpose(-1, -2)
           + gamma(d + 2) * _abs_mm(q, k)) * sc
    mask = torch.ones(n_seq, n_seq, dtype=torch.bool, device=z.device).tril()
    z = z.masked_fill(~mask, -math.inf)
    e_z = e_z.masked_fill(~mask, 0.0)
    p = torch.softmax(z, dim=-1)
    delta = e_z.amax(dim=-1, keepdim=True)
    gap = (z.amax(dim=-1, keepdim=True) - z).masked_fill(~mask, 0.0)
    rel_p = 2 * delta + 2 * U32 * gap + gamma(n_seq + 6) + FUNC
    return (p * rel_p) @ v.abs() + p @ e_v + gamma(n_seq + 1) * (p @ v.abs())


# --------------------------------------------------------------------------- per-stage bounds
def _stage_bounds_a(inputs: Sequence[Any], taps: Mapping[str, torch.Tensor], local: bool) -> dict:
    """Op A: stage -> bound (tap layout). ``local``: each stage's inputs carry only their
    rounding to float32 (u |input|) instead of the propagated error of the stages before."""
    f = lambda t: t.to(torch.float64)
    (x, w_in, wq, bq, wk, bk, wv, bv, wo, rcos, rsin, w_post, wg, wu, wd) = (f(t) for t in inputs[:15])
    eps = float(inputs[15])
    H = x.shape[-1]
    d = rcos.shape[-1]
    hq, hkv = wq.shape[0] // d, wk.shape[0] // d
    inp = lambda name, propagated: U32 * taps[name].abs() if local else propagated
    out: dict[str, torch.Tensor] = {}

    h = taps["input_norm"]                                      # x is exact
    out["input_norm"] = _norm_local(H) * h.abs()
    W, bias = torch.cat([wq, wk, wv]), torch.cat([bq, bk, bv])
    e_h = inp("input_norm", out["input_norm"])
    out["qkv_proj"] = e_h @ W.abs().t() + gamma(H + 2) * (_abs_mm(h, W) + bias.abs())
    y = taps["qkv_proj"]
    e_y = inp("qkv_proj", out["qkv_proj"])
    split = [hq * d, hkv * d, hkv * d]
    q, k, v = torch.split(y, split, dim=-1)
    e_q, e_k, e_v = torch.split(e_y, split, dim=-1)
    n = x.shape[1]                                              # tokens (<= rope table rows)
    c, s = st.mrope_select(rcos, n)[:, None], st.mrope_select(rsin, n)[:, None]   # the select is exact
    out["mrope"] = torch.cat([_merge(_rope_bound(_heads(q, d), _heads(e_q, d), c, s)),
                              _merge(_rope_bound(_heads(k, d), _heads(e_k, d), c, s))], dim=-1)
    rot = taps["mrope"]
    e_rot = inp("mrope", out["mrope"])
    qr, kr = torch.split(rot, split[:2], dim=-1)
    e_qr, e_kr = torch.split(e_rot, split[:2], dim=-1)
    out["attention"] = _merge(_attention_bound(_heads(qr, d), _heads(kr, d), _heads(v, d),
                                               _heads(e_qr, d), _heads(e_kr, d), _heads(e_v, d), hq // hkv))
    attn = taps["attention"]
    e_attn = inp("attention", out["attention"])
    out["o_proj"] = e_attn @ wo.abs().t() + gamma(hq * d + 2) * (_abs_mm(attn, wo) + x.abs())
    x1 = taps["o_proj"]
    e_x1 = inp("o_proj", out["o_proj"])
    h2 = taps["post_norm"]
    out["post_norm"] = _norm_propagated(x1, e_x1, w_post, eps) + _norm_local(H) * h2.abs()
    e_h2 = inp("post_norm", out["post_norm"])
    I = wg.shape[0]
    out["gate_up"] = torch.cat([e_h2 @ wg.abs().t() + gamma(H + 1) * _abs_mm(h2, wg),
                                e_h2 @ wu.abs().t() + gamma(H + 1) * _abs_mm(h2, wu)], dim=-1)
    g, u_ = torch.split(taps["gate_up"], [I, I], dim=-1)
    e_g, e_u = torch.split(inp("gate_up", out["gate_up"]), [I, I], dim=-1)
    # act: |silu'| <= 1.1; silu = g / (1 + exp(-g)): exp (FUNC) + add + divide
    silu_g = st.silu(g)
    a = taps["act"]
    out["act"] = (1.1 * e_g + (FUNC + 3 * U32) * silu_g.abs()) * u_.abs() + silu_g.abs() * e_u + U32 * a.abs()
    e_a = inp("act", out["act"])
    out["down"] = e_a @ wd.abs().t() + gamma(I + 1) * _abs_mm(a, wd)
    e_m = inp("down", out["down"])
    out["residual"] = e_x1 + e_m + U32 * taps["residual"].abs()
    return out


def _stage_bounds_b(inputs: Sequence[Any], taps: Mapping[str, torch.Tensor], local: bool) -> dict:
    """Op B: stage -> bound (tap layout); NaN weights (NaN scale codes) count as 0 (their
    outputs are NaN in both runs and are not compared)."""
    x, cos, sin = inputs[0], inputs[1], inputs[2]
    q_norm_w, k_norm_w, eps = inputs[12], inputs[13], float(inputs[14])
    d = cos.shape[-1]
    hidden = x.shape[-1]
    rows = [inputs[3].shape[0], inputs[6].shape[0], inputs[9].shape[0]]
    clean = lambda t: t.nan_to_num(0.0)
    inp = lambda name, propagated: U32 * clean(taps[name]).abs() if local else propagated
    out: dict[str, torch.Tensor] = {}

    w = clean(taps["dequant"])
    out["dequant"] = U32 * w.abs()                     # the exact product rounded once
    if "act_quant" in taps:          # W4A4: x_hat is exact up to its rounding to float32
        x64 = clean(taps["act_quant"])
        out["act_quant"] = U32 * x64.abs()
    else:                            # the w4a16 variant: the bf16 activations as given
        x64 = x.to(torch.float64)
    e_w = inp("dequant", out["dequant"])
    out["proj"] = x64.abs() @ e_w.t() + gamma(hidden) * _abs_mm(x64, w)
    y = clean(taps["proj"])
    e_y = inp("proj", out["proj"])
    yq, yk, _ = torch.split(y, rows, dim=-1)
    eq, ek, ev = torch.split(e_y, rows, dim=-1)
    normed = []
    for yt, et, nw in ((yq, eq, q_norm_w), (yk, ek, k_norm_w)):
        b, sl, n = yt.shape
        yt, et = yt.reshape(b, sl, n // d, d), et.reshape(b, sl, n // d, d)
        wt = nw.to(torch.float64)
        n_t = st.rms_norm(yt, wt, eps)
        normed.append((_norm_propagated(yt, et, wt, eps) + _norm_local(d) * n_t.abs()).flatten(2))
    out["qk_norm"] = torch.cat(normed, dim=-1)
    nq = clean(taps["qk_norm"])
    e_n = inp("qk_norm", out["qk_norm"])
    c, s = cos.to(torch.float64)[:, :, None], sin.to(torch.float64)[:, :, None]
    b, sl, _ = nq.shape
    out["rope"] = _rope_bound(nq.reshape(b, sl, -1, d), e_n.reshape(b, sl, -1, d), c, s).flatten(2)
    e_r = inp("rope", out["rope"])                      # (ev is already u|v| in local mode)
    out["layout"] = torch.cat([_heads(e_r, d), _heads(ev, d)], dim=1)   # a copy: no rounding
    return out


def stage_bounds(op: str, inputs: Sequence[Any], taps: Mapping[str, torch.Tensor], *,
                 local: bool) -> dict[str, torch.Tensor]:
    """First-order bound per stage (without the safety factor) from the oracle's taps."""
    return (_stage_bounds_a if op == OP_A else _stage_bounds_b)(inputs, taps, local)


# --------------------------------------------------------------------------- checks
def _ratio(err: torch.Tensor, bound: torch.Tensor) -> float:
    return float((err / bound.clamp(min=1e-300)).max()) if err.numel() else 0.0


def _error_vs_bound(what: str, value: torch.Tensor, oracle: torch.Tensor,
                    bound: torch.Tensor) -> tuple[dict[str, float], torch.Tensor]:
    """{max_err, max_ratio, max_bound} of |value - oracle| against ``bound`` over the
    oracle's finite elements (an AssertionError when the two disagree on which elements are
    finite), and that finite mask."""
    finite = torch.isfinite(oracle)
    if not torch.equal(torch.isfinite(value), finite):
        raise AssertionError(f"{what}: float32 and float64 disagree on which elements are finite")
    err = (value.to(torch.float64) - oracle).abs()[finite]
    bnd = bound[finite]
    return {"max_err": float(err.max()) if err.numel() else 0.0, "max_ratio": _ratio(err, bnd),
            "max_bound": float(bnd.max()) if bnd.numel() else 0.0}, finite


def fp32_error_vs_bound(op: str, inputs: Sequence[Any], run: Callable | None = None) -> dict[str, Any]:
    """End-to-end: run the float32 reference (or ``run(*inputs)``, unrounded outputs) and
    the bound; return per output the max error, the max of error / bound (<= 1 when the
    bound holds), the largest bound element and, for bf16 outputs, the ratio after rounding
    to bf16 (bound + U_BF16 (|oracle| + bound))."""
    defn = load(op)
    ref = resolve_impl(defn, "reference")
    taps: dict = {}
    oracle = ref(*inputs, taps=taps)
    e = stage_bounds(op, inputs, taps, local=False)
    if op == OP_A:
        bounds_out = [SAFETY * e["residual"]]
    else:
        hq, hkv = inputs[3].shape[0] // inputs[1].shape[-1], inputs[6].shape[0] // inputs[1].shape[-1]
        bounds_out = [SAFETY * t for t in torch.split(e["layout"], [hq, hkv, hkv], dim=1)]
    outs32 = run(*inputs) if run is not None else ref(*inputs, dtype=torch.float32)
    result = {}
    for spec, o32, o64, bound in zip(defn.outputs, outs32, oracle, bounds_out):
        entry, finite = _error_vs_bound(f"{op}/{spec.name}", o32, o64, bound)
        if spec.dtype == "bfloat16":
            o64f, bnd = o64[finite], bound[finite]
            rounded = o32.to(torch.bfloat16).to(torch.float64)[finite]
            entry["max_ratio_bf16"] = _ratio((rounded - o64f).abs(), bnd + U_BF16 * (o64f.abs() + bnd))
        result[spec.name] = entry
    return result


def fp32_stage_errors_vs_bounds(op: str, inputs: Sequence[Any],
                                run_staged: Callable | None = None) -> dict[str, dict[str, float]]:
    """Stage-local: for each stage k, ``run_staged(*inputs, taps=, override=)`` (default: the
    float32 reference) with every other stage overridden by the oracle's tap; its stage-k
    tap against the oracle's, divided by 2 x the local bound. Returns stage -> {max_err,
    max_ratio, max_bound}."""
    defn = load(op)
    ref = resolve_impl(defn, "reference")
    if run_staged is None:
        run_staged = lambda *a, taps, override: ref(*a, taps=taps, override=override, dtype=torch.float32)
    taps64: dict = {}
    ref(*inputs, taps=taps64)
    local = stage_bounds(op, inputs, taps64, local=True)
    result = {}
    for name in defn.stage_names:
        taps32: dict = {}
        run_staged(*inputs, taps=taps32, override={k: v for k, v in taps64.items() if k != name})
        result[name], _ = _error_vs_bound(f"{op}/{name}", taps32[name], taps64[name], SAFETY * local[name])
    return result
