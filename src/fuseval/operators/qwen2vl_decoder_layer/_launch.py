"""Launchers of op A's kernels: each maps a plan entry and the tensors to one kernel's
arguments, nothing more. The layer (``fast.py``) decides what runs in which order.

``flag``: under the "fp16" policy a one-element int32 tensor that the kernels set to 1
when a value falls outside fp16's range (see ``_kernels._watch``); None elsewhere.
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Sequence

import torch
from ... import fast as _kernel_runtime  # noqa: F401  (before triton: selects the interpreter on CPU-only machines)
import triton

from . import _attention as A
from . import _kernels as K
from ._plans import NAME, AttnConfig, GemmConfig, Plan, Shape, sm_count
from . import _gluon

LOG2E = 1.4426950408889634


def interpreting() -> bool:
    """Whether Triton runs its CPU interpreter (TRITON_INTERPRET=1 before triton was imported)."""
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(K.rms_norm_kernel, InterpretedFunction)


_COMPILE_ONLY = [False]


@contextlib.contextmanager
def compile_only():
    """Inside this block the launchers compile their kernels (``kernel.warmup``) without
    running them: a benchmark can fill Triton's cache from several processes at once."""
    _COMPILE_ONLY[0] = True
    try:
        yield
    finally:
        _COMPILE_ONLY[0] = False


def _launch(kernel, grid, *args, **meta) -> None:
    if _COMPILE_ONLY[0]:
        kernel.warmup(*args, grid=grid, **meta)
    else:
        kernel[grid](*args, **meta)


def _descriptor(t: torch.Tensor, block: list[int]):
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor.from_tensor(t, block)


def _flag_arg(flag: torch.Tensor | None, fallback: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(the pointer the kernel's flag_ptr gets, WATCH)."""
    return (fallback, False) if flag is None else (flag, True)


def _persistent_programs(t: torch.Tensor) -> int:
    """How many programs a persistent kernel starts: one per SM on the GPU; a few under the
    interpreter, and in compile-only launches (where the grid does not enter the code)."""
    if t.device.type != "cuda":
        return 4
    return sm_count(t.device.index if t.device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _on_gpu_or_compiling(t: torch.Tensor) -> bool:
    """Whether a Gluon (sm_90) kernel may run: a compiled (not interpreted) launch on a
    Hopper GPU, or a compile-only one (which ``benchmarks/sm90_compile.py`` runs with CPU
    tensors on a machine without a GPU). Elsewhere the Triton kernels take the call."""
    if interpreting():
        return False
    if t.device.type == "cuda":
        return _capability(t.device.index if t.device.index is not None else torch.cuda.current_device())[0] == 9
    return _COMPILE_ONLY[0]


def gluon_applies(c: GemmConfig | AttnConfig, a: torch.Tensor, precision: str, mutant: str | None = None) -> bool:
    """The Gluon kernels (GEMM and attention) cover production TF32 calls on the GPU; the
    rest runs in Triton."""
    return c.gluon and precision == "tf32" and mutant is None and _on_gpu_or_compiling(a)


# --------------------------------------------------------------------------- row kernels
def launch_norm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, eps: float, plan: Plan,
                mutant: str | None = None, flag: torch.Tensor | None = None) -> torch.Tensor:
    M, H = x.shape
    rows = plan.norm_rows
    flag_ptr, watch = _flag_arg(flag, out)
    _launch(K.rms_norm_kernel, (triton.cdiv(M, rows),), x, w, out, flag_ptr, M, H, x.stride(0), out.stride(0),
            float(eps), BLOCK_H=triton.next_power_of_2(H), ROWS=rows, ROUND_OUT=plan.round_act, WATCH=watch,
            MUT_EPS_OUTSIDE=mutant == "eps_outside_sqrt", num_warps=plan.norm_warps)
    return out


def launch_swiglu(gu: torch.Tensor, out: torch.Tensor, plan: Plan, mutant: str | None = None,
                  flag: torch.Tensor | None = None) -> torch.Tensor:
    M, N = out.shape
    bm, bn = 32, 64
    flag_ptr, watch = _flag_arg(flag, out)
    _launch(K.swiglu_kernel, (triton.cdiv(M, bm), triton.cdiv(N, bn)), gu, out, flag_ptr, M, N, gu.stride(0),
            out.stride(0), BM=bm, BN=bn, ROUND_OUT=plan.round_act, WATCH=watch,
            MUT_SILU_ON_UP=mutant == "silu_on_up", num_warps=4)
    return out


def launch_to_fp16(w: torch.Tensor, flag: torch.Tensor | None = None) -> torch.Tensor:
    """A new fp16 copy of the contiguous weight ``w`` (round to nearest even); a value
    beyond fp16 range sets ``flag``."""
    if not w.is_contiguous():
        raise ValueError(f"{NAME} (fast): the weight converted to fp16 must be contiguous, got strides {w.stride()}")
    out = torch.empty(w.shape, device=w.device, dtype=torch.float16)
    n = w.numel()
    # the interpreter pays per program: few large blocks there
    block = 4096 if not interpreting() else min(1 << 16, triton.next_power_of_2(max(n, 1)))
    flag_ptr, watch = _flag_arg(flag, out)
    _launch(K.to_fp16_kernel, (triton.cdiv(n, block),), w, out, flag_ptr, n, BLOCK=block, WATCH=watch, num_warps=8)
    return out


# --------------------------------------------------------------------------- QKV and mRoPE
def _hf_layout(plan: Plan, mutant: str | None) -> bool:
    """The RoPE kernels' HF_LAYOUT flag: the plan's layout, swapped by the mutant."""
    return plan.hf_layout != (mutant == "mrope_layout_swapped")


def _rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> None:
    """The RoPE kernels index cos/sin as contiguous [3, B, kv_seq_len, D] tables of equal shape."""
    if not (cos.is_contiguous() and sin.is_contiguous() and cos.shape == sin.shape):
        raise ValueError(f"{NAME} (fast): rope_cos and rope_sin must be contiguous tables of one shape")


def launch_qkv(h: torch.Tensor, w: Sequence[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
               sh: Shape, plan: Plan, out: torch.Tensor, vt: torch.Tensor | None, *, fused: bool,
               mutant: str | None = None, flag: torch.Tensor | None = None) -> None:
    """fused: RoPE'd [q|k] into ``out`` ([M, QD+KD]) and v into ``vt``; else plain [q|k|v].
    cos/sin: [3, B, kv_seq_len >= S, D], contiguous; the first S rows are used."""
    _rope_tables(cos, sin)
    c, hpt = plan.qkv, plan.qkv_heads_per_tile
    wq, bq, wk, bk, wv, bv = w
    bn = hpt * sh.D
    if c.use_tma:
        x_arg = _descriptor(h, [c.BM, c.BK])
        wq, wk, wv = (_descriptor(t, [bn, c.BK]) for t in (wq, wk, wv))
    else:
        x_arg = h
    vt_arg = vt if vt is not None else out
    vs = vt.stride() if vt is not None else (0, 0, 0, 0)
    flag_ptr, watch = _flag_arg(flag, out)
    grid = (triton.cdiv(sh.M, c.BM) * ((sh.QD + 2 * sh.KD) // bn),)
    _launch(K.qkv_rope_kernel, grid, x_arg, wq, wk, wv, bq, bk, bv, cos, sin, out, vt_arg, flag_ptr, sh.M, sh.S,
            sh.H, h.stride(0), out.stride(0), cos.stride(0), cos.stride(1), vs[0], vs[1], vs[2],
            QD=sh.QD, KD=sh.KD, D=sh.D, HPT=hpt, BM=c.BM, BK=c.BK, GROUP_M=c.GROUP_M,
            EVEN_K=sh.H % c.BK == 0, PREC=plan.precision, USE_TMA=c.use_tma,
            ROUND_B=c.round_b and plan.round_act, FUSED=fused,
            ROUND_OUT=fused and plan.round_attn, HF_LAYOUT=_hf_layout(plan, mutant), WATCH=watch,
            MUT_WRONG_AXIS=mutant == "mrope_wrong_axis", MUT_LAST_ROWS=mutant == "mrope_last_rows",
            num_warps=c.num_warps, num_stages=c.num_stages)


def launch_mrope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sh: Shape, out: torch.Tensor,
                 plan: Plan, mutant: str | None = None, flag: torch.Tensor | None = None) -> torch.Tensor:
    _rope_tables(cos, sin)
    bm = 32
    flag_ptr, watch = _flag_arg(flag, out)
    _launch(K.mrope_kernel, (triton.cdiv(sh.M, bm), sh.Hq + sh.Hkv), qkv, cos, sin, out, flag_ptr, sh.M, sh.S,
            qkv.stride(0), out.stride(0), cos.stride(0), cos.stride(1), D=sh.D, BM=bm,
            ROUND_OUT=plan.round_attn, HF_LAYOUT=_hf_layout(plan, mutant), WATCH=watch,
            MUT_WRONG_AXIS=mutant == "mrope_wrong_axis", MUT_LAST_ROWS=mutant == "mrope_last_rows",
            num_warps=4)
    return out


# --------------------------------------------------------------------------- attention
def launch_attention(qk: torch.Tensor, vt: torch.Tensor, out: torch.Tensor, sh: Shape, plan: Plan,
                     mutant: str | None = None, flag: torch.Tensor | None = None) -> torch.Tensor:
    """out [M, QD] = causal GQA attention of q' (qk[:, :QD]) over k' (qk[:, QD:]) and V^T."""
    c = plan.attention
    if gluon_applies(c, qk, plan.attention_precision, mutant):
        from . import _gluon
        _gluon.launch_attention(qk, vt, out, S=sh.S, B=sh.B, HKV=sh.Hkv, G=sh.G, QD=sh.QD, D=sh.D,
                                qk_scale=LOG2E / math.sqrt(sh.D), block_m=c.BM, block_n=c.BN,
                                stages=c.num_stages, round_p=plan.round_attn, round_out=plan.round_act,
                                num_warps=c.num_warps, compile_only=_COMPILE_ONLY[0])
        return out
    grid = (triton.cdiv(sh.S * sh.G, c.BM), sh.B * sh.Hkv)
    if c.use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        k_src = TensorDescriptor.from_tensor(qk, [c.BN, sh.D])
        # V^T seen as [B*Hkv*D, S] with row stride S_pad: keys >= S read as zeros, never
        # the padding columns (which nobody writes)
        vt_src = TensorDescriptor(vt, [sh.B * sh.Hkv * sh.D, sh.S], [vt.stride(2), 1], [sh.D, c.BN])
    else:
        k_src, vt_src = qk, vt
    flag_ptr, watch = _flag_arg(flag, out)
    _launch(A.attention_kernel, grid, qk, k_src, vt_src, out, flag_ptr, sh.S, qk.stride(0), out.stride(0),
            vt.stride(0), vt.stride(1), vt.stride(2), LOG2E / math.sqrt(sh.D),
            QD=sh.QD, G=sh.G, HKV=sh.Hkv, D=sh.D, BM=c.BM, BN=c.BN, PREC=plan.attention_precision,
            ROUND_P=plan.round_attn, ROUND_OUT=plan.round_act, WATCH=watch, USE_TMA=c.use_tma,
            MUT_NONCAUSAL=mutant == "noncausal_attention", MUT_KV_MOD=mutant == "kv_head_mod",
            num_warps=c.num_warps, num_stages=c.num_stages)
    return out


# --------------------------------------------------------------------------- GEMMs
def _launch_persistent(a, b1, b2, res, out, c: GemmConfig, precision: str, *, gate_up: bool,
                       round_out: bool = False, mutant: str | None = None, flag=None) -> None:
    M, Kd = a.shape
    N = b1.shape[0]
    tiles = triton.cdiv(M, c.BM) * triton.cdiv(N, c.BN)
    n_prog = min(tiles, _persistent_programs(a))
    a_d, b1_d = _descriptor(a, [c.BM, c.BK]), _descriptor(b1, [c.BN, c.BK])
    b2_d = _descriptor(b2, [c.BN, c.BK]) if b2 is not None else b1_d
    res_arg = res if res is not None else out
    flag_ptr, watch = _flag_arg(flag, out)
    _launch(K.gemm_persistent_kernel, (n_prog,), a_d, b1_d, b2_d, res_arg, out, flag_ptr, M, N, Kd,
            res_arg.stride(0), out.stride(0), n_prog, BM=c.BM, BN=c.BN, BK=c.BK, GROUP_M=c.GROUP_M, PREC=precision,
            WARP_SPECIALIZE=c.warp_specialize, GATE_UP=gate_up, ROUND_B=c.round_b and precision == "tf32",
            ADD_RESIDUAL=res is not None, ROUND_OUT=round_out, WATCH=watch, MUT_SILU_ON_UP=mutant == "silu_on_up",
            num_warps=c.num_warps, num_stages=c.num_stages)


def _launch_gluon(a, b1, b2, res, out, c: GemmConfig, *, gate_up: bool, round_out: bool = False) -> None:
    _gluon.launch(a, b1, b2, res, out, block_m=c.BM, block_n=c.BN, block_k=c.BK, stages=c.num_stages,
                  group_m=c.GROUP_M, num_warps=c.num_warps, n_programs=_persistent_programs(a),
                  gate_up=gate_up, round_out=round_out, compile_only=_COMPILE_ONLY[0])


def launch_residual_gemm(a: torch.Tensor, w: torch.Tensor, res: torch.Tensor | None, out: torch.Tensor,
                         c: GemmConfig, precision: str, flag: torch.Tensor | None = None) -> torch.Tensor:
    """out = (res +) a w^T; with ``c.split_k`` > 1 the K axis is cut into that many slices
    whose partial products are summed (with the residual) by a second, small kernel."""
    if gluon_applies(c, a, precision):
        _launch_gluon(a, w, None, res, out, c, gate_up=False)
        return out
    if c.persistent:
        _launch_persistent(a, w, None, res, out, c, precision, gate_up=False, flag=flag)
        return out
    M, Kd = a.shape
    N = w.shape[0]
    weights_as_a = c.weights_as_a and precision == "fp16"
    if c.use_tma or weights_as_a:
        a_arg, w_arg = _descriptor(a, [c.BM, c.BK]), _descriptor(w, [c.BN, c.BK])
    else:
        a_arg, w_arg = a, w
    splits = max(1, min(c.split_k, triton.cdiv(Kd, c.BK)))
    k_per_split = triton.cdiv(triton.cdiv(Kd, splits), c.BK) * c.BK
    splits = triton.cdiv(Kd, k_per_split)
    if splits > 1 and ((res is not None and res.stride(0) != N) or out.stride(0) != N):
        raise ValueError(f"{NAME} (fast): split-K needs contiguous residual and output rows")
    part = out if splits == 1 else torch.empty(splits, M, N, device=out.device, dtype=torch.float32)
    res_arg = res if res is not None else out
    flag_ptr, watch = _flag_arg(flag, out)
    grid = (triton.cdiv(M, c.BM) * triton.cdiv(N, c.BN), splits)
    if weights_as_a:
        _launch(K.gemm_weights_as_a_kernel, grid, a_arg, w_arg, w_arg, res_arg, part, flag_ptr, M, N, Kd,
                res_arg.stride(0), N if splits > 1 else out.stride(0), k_per_split, BM=c.BM, BN=c.BN, BK=c.BK,
                GROUP_M=c.GROUP_M, GATE_UP=False, ADD_RESIDUAL=res is not None and splits == 1, ROUND_OUT=False,
                WATCH=watch, MUT_SILU_ON_UP=False, num_warps=c.num_warps, num_stages=c.num_stages)
    else:
        _launch(K.gemm_residual_kernel, grid, a_arg, w_arg, res_arg, part, flag_ptr, M, N, Kd, a.stride(0),
                w.stride(0), res_arg.stride(0), N if splits > 1 else out.stride(0), k_per_split,
                BM=c.BM, BN=c.BN, BK=c.BK, GROUP_M=c.GROUP_M, EVEN_K=Kd % c.BK == 0, PREC=precision,
                USE_TMA=c.use_tma, ROUND_B=c.round_b and precision == "tf32",
                ADD_RESIDUAL=res is not None and splits == 1, WATCH=watch, num_warps=c.num_warps,
                num_stages=c.num_stages)
    if splits > 1:
        block = 1024
        _launch(K.splitk_reduce_kernel, (triton.cdiv(M * N, block),), part, res_arg, out, M, N,
                SPLITS=splits, BLOCK=block, ADD_RESIDUAL=res is not None, num_warps=4)
    return out


def launch_gate_up(a: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, out: torch.Tensor, c: GemmConfig,
                   precision: str, *, fuse_act: bool, round_out: bool = False,
                   mutant: str | None = None, flag: torch.Tensor | None = None) -> torch.Tensor:
    """fuse_act: out = silu(a wg^T) * (a wu^T) ([M, I], in out's type; ``round_out``:
    TF32-rounded); otherwise out = [a wg^T | a wu^T] ([M, 2I], fp32)."""
    if fuse_act and gluon_applies(c, a, precision, mutant):
        _launch_gluon(a, wg, wu, None, out, c, gate_up=True, round_out=round_out)
        return out
    if c.persistent and fuse_act:
        _launch_persistent(a, wg, wu, None, out, c, precision, gate_up=True, round_out=round_out,
                           mutant=mutant, flag=flag)
        return out
    M, Kd = a.shape
    N = wg.shape[0]
    if fuse_act and c.weights_as_a and precision == "fp16":
        flag_ptr, watch = _flag_arg(flag, out)
        _launch(K.gemm_weights_as_a_kernel, (triton.cdiv(M, c.BM) * triton.cdiv(N, c.BN), 1),
                _descriptor(a, [c.BM, c.BK]), _descriptor(wg, [c.BN, c.BK]), _descriptor(wu, [c.BN, c.BK]), out,
                out, flag_ptr, M, N, Kd, out.stride(0), out.stride(0), Kd, BM=c.BM, BN=c.BN, BK=c.BK,
                GROUP_M=c.GROUP_M, GATE_UP=True, ADD_RESIDUAL=False, ROUND_OUT=round_out, WATCH=watch,
                MUT_SILU_ON_UP=mutant == "silu_on_up", num_warps=c.num_warps, num_stages=c.num_stages)
        return out
    if c.use_tma or c.persistent:
        a_arg = _descriptor(a, [c.BM, c.BK])
        g_arg, u_arg = _descriptor(wg, [c.BN, c.BK]), _descriptor(wu, [c.BN, c.BK])
    else:
        a_arg, g_arg, u_arg = a, wg, wu
    flag_ptr, watch = _flag_arg(flag, out)
    grid = (triton.cdiv(M, c.BM) * triton.cdiv(N, c.BN),)
    _launch(K.gate_up_kernel, grid, a_arg, g_arg, u_arg, out, flag_ptr, M, N, Kd, a.stride(0), wg.stride(0),
            out.stride(0), BM=c.BM, BN=c.BN, BK=c.BK, GROUP_M=c.GROUP_M, EVEN_K=Kd % c.BK == 0,
            PREC=precision, USE_TMA=c.use_tma or c.persistent, ROUND_B=c.round_b and precision == "tf32",
            FUSE_ACT=fuse_act, ROUND_OUT=round_out, WATCH=watch, MUT_SILU_ON_UP=mutant == "silu_on_up",
            num_warps=c.num_warps, num_stages=c.num_stages)
    return out
