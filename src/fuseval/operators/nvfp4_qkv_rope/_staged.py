"""Op B's stage-tap protocol: the fast path's computation as one launch per SPEC stage.

``forward_staged`` runs the same quantizer, decode, GEMM, norm and RoPE code as the fused
``forward``, but as separate launches, so that the error budget (``fuseval.budget``) can
read each stage's output (``taps``) and feed the oracle's output of a stage into the next
(``override``). The deliberate bugs of ``fast.variant`` live in the fused kernel only: this
path is the production arithmetic.
"""
from __future__ import annotations

from typing import Mapping, MutableMapping

import torch
from ... import fast as _kernel_runtime  # noqa: F401  (before triton: selects the interpreter on CPU-only machines)
import triton

from . import _kernels as K
from ._launch import NAME, as_table, bind, gemm, _pow2_at_least, word_aligned
from ._quant import act_quant
from ...validate import storage_views

__all__ = ["forward_staged", "STAGES", "STAGES_W4A16"]

STAGES = ("act_quant", "dequant", "proj", "qk_norm", "rope", "layout")
STAGES_W4A16 = STAGES[1:]


def _override(override, name, shape, dtype, device) -> torch.Tensor:
    t = override[name]
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(shape):
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{NAME}: override[{name!r}] must be a tensor of shape {tuple(shape)}, got {got}")
    return t.to(device=device, dtype=dtype).contiguous()


def _act_quant_stage(x, weight_scales, override, emit):
    """Stage ``act_quant``: the quantizer's taps, or x_hat overridden (divided by this x's
    global decode scale and rounded to bf16). Returns (xs, gs, global_decode)."""
    aq = act_quant(x, weight_scales, codes="act_quant" not in override)
    if "act_quant" in override:
        x_hat = _override(override, "act_quant", tuple(x.shape), torch.float64, x.device)
        xs = (x_hat / aq.global_decode.to(torch.float64)).to(torch.bfloat16)
        act_tap = xs.to(torch.float64) * aq.global_decode.to(torch.float64)
    else:
        xs = aq.xs
        emit("act_quant.codes", aq.codes)
        emit("act_quant.scales", aq.scales)
        emit("act_quant.global_decode", aq.global_decode)
        act_tap = aq.dequantize(torch.float64)
    emit("act_quant", act_tap)
    return xs, aq.gs, aq.global_decode


def _dequantized(projections, hidden: int) -> torch.Tensor:
    """Stage tap ``dequant``: code * scale * global as fp32, the q, k, v rows stacked."""
    parts = []
    for w, sc, g in projections:
        rows = w.shape[0]
        out = torch.empty((rows, hidden), dtype=torch.float32, device=w.device)
        bk = 64 if hidden % 64 == 0 else 16
        K._dequant_kernel[(triton.cdiv(rows, 32), hidden // bk)](
            word_aligned(w), sc, out, float(g), rows, K=hidden, BR=32, BK=bk)
        parts.append(out)
    return torch.cat(parts)


def forward_staged(*inputs, taps: MutableMapping[str, torch.Tensor] | None = None,
                   override: Mapping[str, torch.Tensor] | None = None, config=None,
                   activations: str = "nvfp4"):
    """The same computation as :func:`forward`, one launch per stage, for the error budget.

    Taps (same layouts as the reference's): ``act_quant`` float64 [B, S, H] (x_hat = xs *
    global decode, exact), with ``act_quant.codes`` uint8 [B, S, H], ``act_quant.scales``
    uint8 [B, S, H/16] and ``act_quant.global_decode`` fp32 0-d; ``dequant`` fp32 [q+2kv, H]
    (= code*scale*global), ``proj`` fp32 [B, S, q+2kv], ``qk_norm`` and ``rope`` fp32
    [B, S, q+kv], ``layout`` bf16 [B, Hq+2Hkv, S, D]. ``override={stage: tensor}`` replaces
    a stage's output and continues from it: an ``act_quant`` x_hat is divided by this x's
    global decode scale and rounded to bf16 (which gives back xs exactly when x_hat is the
    oracle's), an overridden ``dequant`` is used as a bf16 weight whose global scale is 1,
    proj/qk_norm/rope are read as fp32, layout as bf16. ``activations="bf16"``: the
    ``w4a16`` variant (:func:`forward_w4a16`), without the ``act_quant`` stage."""
    inputs = tuple(storage_views(inputs))      # packed FP4 as uint8 or float4_e2m1fn_x2
    if activations not in ("nvfp4", "bf16"):
        raise ValueError(f"{NAME}: activations must be 'nvfp4' or 'bf16', got {activations!r}")
    stages = STAGES if activations == "nvfp4" else STAGES_W4A16
    override = dict(override or {})
    unknown = sorted(set(override) - set(stages))
    if unknown:
        raise ValueError(f"{NAME}: unknown stage(s) {unknown} in override; stages: {', '.join(stages)}")
    table = as_table(config)
    bound = bind(inputs, False)
    inputs = [t.contiguous() if isinstance(t, torch.Tensor) else t for t in inputs]
    (x, cos, sin, wq, sq, gq, wk, sk, gk, wv, sv, gv, qn, kn, eps) = inputs
    b, s, hidden = bound["batch_size"], bound["seq_len"], bound["hidden_size"]
    hq, hkv, d = bound["num_attention_heads"], bound["num_key_value_heads"], bound["head_dim"]
    m, n, nqk = b * s, (hq + 2 * hkv) * d, (hq + hkv) * d
    dev = x.device

    def emit(name, value):
        if taps is not None:
            taps[name] = value

    # 1. act_quant (W4A4 only)
    act = _act_quant_stage(x, (gq, gk, gv), override, emit) if activations == "nvfp4" else None

    # 2. dequant
    w_dense = None
    if "dequant" in override:
        w_dense = _override(override, "dequant", (n, hidden), torch.bfloat16, dev)
        emit("dequant", w_dense)
    elif taps is not None:
        emit("dequant", _dequantized(((wq, sq, gq), (wk, sk, gk), (wv, sv, gv)), hidden))

    # 3. proj (the fused kernel's own K loop, stopped before the epilogue)
    if "proj" in override:
        proj = _override(override, "proj", (b, s, n), torch.float32, dev).view(m, n)
    else:
        gemm_act = None
        if act is not None:
            # the quantized activations; with a dense weight only x's global scale remains
            xs, gs, g_dec = act
            gemm_act = (xs, gs if w_dense is None else g_dec.reshape(1).expand(3).contiguous())
        proj = gemm(inputs, mode=K.MODE_PROJ, table=table, w_dense=w_dense, act=gemm_act)
    emit("proj", proj.view(b, s, n))

    hp = _pow2_at_least(d // 2, 8)
    bm = 32
    grid = (triton.cdiv(m, bm) * (hq + hkv),)

    def head_stage(src, src_stride, op):
        dst = torch.empty((m, nqk), dtype=torch.float32, device=dev)
        if m:
            K._head_stage_kernel[grid](src, dst, cos, sin, qn, kn,
                                     float(eps), m, src_stride, nqk,
                                     HQ=hq, HKV=hkv, D=d, HP=hp, BM=bm, OP=op)
        return dst

    # 4. qk_norm, 5. rope
    if "qk_norm" in override:
        normed = _override(override, "qk_norm", (b, s, nqk), torch.float32, dev).view(m, nqk)
    else:
        normed = head_stage(proj, n, 0)
    emit("qk_norm", normed.view(b, s, nqk))
    if "rope" in override:
        roped = _override(override, "rope", (b, s, nqk), torch.float32, dev).view(m, nqk)
    else:
        roped = head_stage(normed, nqk, 1)
    emit("rope", roped.view(b, s, nqk))

    # 6. layout: [B, S, h, D] -> [B, h, S, D], bf16
    if "layout" in override:
        layout = _override(override, "layout", (b, hq + 2 * hkv, s, d), torch.bfloat16, dev)
    else:
        layout = torch.cat([roped.view(b, s, hq + hkv, d), proj[:, nqk:].reshape(b, s, hkv, d)],
                           dim=2).transpose(1, 2).to(torch.bfloat16).contiguous()
    emit("layout", layout)
    return tuple(t.contiguous() for t in torch.split(layout, [hq, hkv, hkv], dim=1))
