"""Op B's activation quantizer (SPEC.md op B, stage ``act_quant``): the benchmark's float32
NVFP4 quantizer on the device, bit for bit ``fuseval.refimpl.nvfp4.quantize_activations``.

Two launches and no host synchronisation: ``_amax_partials_kernel`` (max |x| per chunk, as
fp32 bit patterns) and ``_act_quant_kernel`` (whole rows per program: the global scales
from the partials, block scales, e2m1 codes, and the GEMM's activation operand
xs = e2m1(code) * e4m3(scale), exact in bf16). Every float step is one IEEE float32
operation: divisions go through ``tl.math.div_rn`` (Triton's ``/`` on fp32 is the
approximate ``div.full.f32`` in compiled code), and no product feeds an addition, so FMA
contraction has nothing to fuse. Magnitudes are compared and maximised as integers (the
bit patterns of non-negative floats order as their values), and the rounding to e4m3 is
integer arithmetic on the fp32 bits, so the interpreter and the compiled kernel run
literally the same operations.

The GEMM kernels read the per-projection products gs[p] = global_decode_p(weights) *
global_decode(x) from the device (fp32), so no host round trip separates the launches.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass

import numpy
import torch
from ... import fast as _kernel_runtime  # noqa: F401  (before triton: selects the interpreter on CPU-only machines)
import triton
import triton.language as tl

from ._kernels import _predecode_tile, _to_bf16

__all__ = ["act_quant", "ActQuant", "QuantConfig", "DEFAULT_QUANT_CONFIG"]

_F32_MAX = tl.constexpr(3.4028234663852886e38)   # largest finite float32
_AMAX_MAX_PARTIALS = 1024              # partial maxima the quantizer kernel reduces


@triton.jit
def _abs_bits(x):
    """|x| as the int32 bit pattern of its float32 value. For non-negative floats the bit
    patterns order as the values do, and a NaN (exponent all ones, mantissa non-zero) sorts
    above +inf, so an integer max of these is the float max that propagates NaN, as
    torch's amax does; it is exact whatever the input dtype (every one converts to fp32
    exactly)."""
    return x.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def _load_f32(x_ptr, offs, mask, X_BF16: tl.constexpr):
    """x as float32. bf16 arrives as its int16 bits and is widened by hand (bits << 16):
    exact, where the interpreter's own bf16 -> fp32 conversion flushes bf16 subnormals."""
    if X_BF16:
        raw = tl.load(x_ptr + offs, mask=mask, other=0)
        return (raw.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    return tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)


# The quantizer's small outputs share one int32 scratch tensor (fewer allocations per
# call): [0, 3) gs (fp32 bits), 3 the global decode scale, [4, ...) the amax partials
# (the per-token mutant: its decode scale per row instead).
_SCRATCH_GS = 0
_SCRATCH_GD = 3
_SCRATCH_PART = 4


@triton.jit
def _amax_partial(x_ptr, scratch_ptr, N, pid, CHUNK: tl.constexpr, BLOCK: tl.constexpr, X_BF16: tl.constexpr):
    """max |x| over elements [pid*CHUNK, (pid+1)*CHUNK) of the flat tensor, as the int32 bits
    of a float32 (see ``_abs_bits``), stored as partial ``pid``."""
    part_ptr = scratch_ptr + 4       # _SCRATCH_PART
    base = pid.to(tl.int64) * CHUNK
    best = tl.zeros([BLOCK], dtype=tl.int32)
    for i in tl.static_range(0, CHUNK, BLOCK):
        offs = base + i + tl.arange(0, BLOCK)
        best = tl.maximum(best, _abs_bits(_load_f32(x_ptr, offs, offs < N, X_BF16)))
    tl.store(part_ptr + pid, tl.max(best, 0))


@triton.jit
def _amax_partials_kernel(x_ptr, scratch_ptr, N, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                          X_BF16: tl.constexpr):
    """Pass 1: one partial maximum per program (``_amax_partial``). The quantizer kernel
    reduces the partials itself: no atomics, no memset, no host round trip."""
    _amax_partial(x_ptr, scratch_ptr, N, tl.program_id(0), CHUNK, BLOCK, X_BF16)


@triton.jit
def _amax_and_predecode_kernel(x_ptr, scratch_ptr, N, n_part,
                               wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr, w_out,
                               CHUNK: tl.constexpr, BLOCK: tl.constexpr, X_BF16: tl.constexpr,
                               NQ: tl.constexpr, NKV: tl.constexpr, K: tl.constexpr, BR: tl.constexpr,
                               BK: tl.constexpr):
    """Pass 1 and the weights' predecode in one launch: programs [0, n_part) compute the
    amax partials (first, since the quantizer pass waits for them), the others decode one
    [BR, BK] tile of the weights each (``_kernels._predecode_tile``). Both passes only
    stream memory and neither needs the other, so together they keep more bytes in
    flight than one after the other."""
    pid = tl.program_id(0)
    if pid < n_part:
        _amax_partial(x_ptr, scratch_ptr, N, pid, CHUNK, BLOCK, X_BF16)
    else:
        t = pid - n_part
        _predecode_tile(wq_ptr, sq_ptr, wk_ptr, sk_ptr, wv_ptr, sv_ptr, w_out, (t // (K // BK)) * BR,
                        (t % (K // BK)) * BK, NQ, NKV, K, BR, BK)


@triton.jit
def _e4m3_rne(s):
    """float32 -> e4m3fn code (int32), round to nearest even, by integer arithmetic on the
    fp32 bits; magnitudes that round above 448 saturate to 448 (0x7E), NaN gives 0x7F.

    Write |s| = Mant * 2^(Ee - 150) with the 24-bit significand Mant (hidden bit included
    unless s is an fp32 subnormal, whose Ee is 1). e4m3's binade exponent is
    ee = max(Ee - 127, -6) (its subnormals share the spacing of the lowest binade), its
    spacing 2^(ee - 3), so the rounded multiple of the spacing is n = RNE(Mant / 2^r) with
    r = ee + 147 - Ee >= 20 (capped at 25, where Mant < 2^24 rounds to 0 anyway). The code
    is 8 * (ee + 6) + n: for normals n = 8 + mantissa, for subnormals n = mantissa, and a
    carry out of the mantissa (n = 16) lands on the next binade's first code by itself."""
    bits = s.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    e_field = mag >> 23
    frac = mag & 0x7FFFFF
    mant = tl.where(e_field == 0, frac, frac | 0x800000)
    e_eff = tl.maximum(e_field, 1)
    ee = tl.maximum(e_eff - 127, -6)
    r = tl.minimum(ee + 147 - e_eff, 25)
    q = mant >> r
    rem = mant & ((1 << r) - 1)
    half = 1 << (r - 1)
    q += ((rem > half) | ((rem == half) & ((q & 1) == 1))).to(tl.int32)
    code = tl.minimum(8 * (ee + 6) + q, 0x7E)
    code = code | ((bits >> 24) & 0x80)                  # the sign (+-0 keep theirs)
    return tl.where(mag > 0x7F800000, 0x7F, code)        # NaN


@triton.jit
def _e4m3_value(code):
    """e4m3fn code (int32) -> its float32 value, exactly: normal codes s.eeee.mmm become the
    fp32 bits s.(eeee + 120).mmm0..., subnormals m * 2^-9; 0x7F / 0xFF are NaN."""
    e = (code >> 3) & 0xF
    m = code & 0x7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    v = tl.where((code & 0x80) != 0, -v, v)
    return tl.where((code & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def _act_quant_kernel(x_ptr, scratch_ptr, n_part, gw_ptr, g_q, g_k, g_v,
                      xs_ptr, codes_ptr, scales_ptr, M,
                      K: tl.constexpr, KP: tl.constexpr, BR: tl.constexpr, PP: tl.constexpr,
                      GW_FROM_PTR: tl.constexpr, WRITE_CODES: tl.constexpr, PER_TOKEN: tl.constexpr,
                      X_BF16: tl.constexpr, INTERP: tl.constexpr):
    """Pass 2: BR whole rows of x [M, K] per program (KP = K rounded up to a power of two).

    Writes xs = e2m1(code) * e4m3(scale) as bf16 [M, K] (exact: at most 6 significant
    bits), the GEMM's activation operand, and (program 0) the per-projection scales
    gs[p] = global_decode_p(weights) * global_decode(x) that the GEMM kernels apply to
    their fp32 accumulators; with WRITE_CODES also the codes [M, K] and block scale bits
    [M, K/16] (uint8), for the taps and tests. PER_TOKEN (mutant): the amax, and so the
    global scales, per row instead of per tensor; the row's global decode scale then goes
    into xs (rounded to bf16) and gs holds the weights' scales alone."""
    part_ptr = scratch_ptr + 4                                   # see _SCRATCH_*
    gs_ptr = scratch_ptr.to(tl.pointer_type(tl.float32))
    if PER_TOKEN:
        gd_ptr = gs_ptr + 4
    else:
        gd_ptr = gs_ptr + 3
    pid = tl.program_id(0)
    rows = pid * BR + tl.arange(0, BR)
    cols = tl.arange(0, KP)
    row_ok = rows < M
    mask = row_ok[:, None] & (cols < K)[None, :]
    offs = rows.to(tl.int64)[:, None] * K + cols[None, :]
    x = _load_f32(x_ptr, offs, mask, X_BF16)
    xa = _abs_bits(x)

    # ---- 1. amax over the whole tensor: the partial maxima of pass 1 (the mutant: the row's)
    if PER_TOKEN:
        amax = tl.max(xa, 1).to(tl.float32, bitcast=True)[:, None]         # [BR, 1]
    else:
        p = tl.arange(0, PP)
        amax = tl.max(tl.load(part_ptr + p, mask=p < n_part, other=0), 0).to(tl.float32, bitcast=True)

    # ---- 2. global scales: encode = 2688 / amax (fp32), clamped to the fp32 max (amax = 0
    # gives inf -> max); an encode of 0 (amax = inf) becomes 1. decode = 1 / encode.
    # The clamps are written as selects so that a NaN passes through, as in torch.
    g_enc = tl.math.div_rn(tl.full(amax.shape, 2688.0, tl.float32), amax)
    g_enc = tl.where(g_enc > _F32_MAX, _F32_MAX, g_enc)
    g_enc = tl.where(g_enc == 0.0, 1.0, g_enc)
    g_dec = tl.math.div_rn(tl.full(amax.shape, 1.0, tl.float32), g_enc)

    # ---- 3. block scales: s = (block amax / 6) * encode, two fp32 roundings, clamped to
    # +-448, then rounded to e4m3 (nearest even); s_dec is its exact fp32 value. The "/ 6"
    # is a product with fl32(1/6) (bits 0x3E2AAAAB), as the benchmark's torch code computes
    # it on the GPU (a tensor divided by a Python number: times the fp32 reciprocal)
    xa3 = tl.reshape(xa, [BR, KP // 16, 16])
    bamax = tl.max(xa3, 2).to(tl.float32, bitcast=True)                     # [BR, KP/16]
    sixth = tl.full(bamax.shape, 0x3E2AAAAB, tl.int32).to(tl.float32, bitcast=True)
    s = (bamax * sixth) * g_enc
    s = tl.where(s > 448.0, 448.0, tl.where(s < -448.0, -448.0, s))
    s_code = _e4m3_rne(s)
    s_dec = _e4m3_value(s_code)

    # ---- 4. the block's encode scale: 1 / (s_dec * decode), the product rounded to fp32
    # first (a division, so there is nothing to contract); a zero scale gives inf -> max
    b_enc = tl.math.div_rn(tl.full(s_dec.shape, 1.0, tl.float32), s_dec * g_dec)
    b_enc = tl.where(b_enc > _F32_MAX, _F32_MAX, b_enc)

    # ---- 5. y = x * encode, clamped to +-6, mapped to e2m1 codes by the thresholds of
    # round-to-nearest-even on the grid {0, .5, 1, 1.5, 2, 3, 4, 6}: a tie at .25, 1.25,
    # 2.5, 5 stays down (even code), at .75, 1.75, 3.5 goes up. y < 0 sets the sign bit,
    # so y in [-0.25, 0) is code 8 (-0) and y = -0.0 is code 0; NaN compares false: code 0.
    # The clamp is not computed: every |y| > 5 (clamped or not) is code 7, and a NaN stays
    # a NaN either way. The grid value is summed from the same comparisons (exact), so the
    # magnitude code itself is only built when it is stored.
    y = tl.reshape(x, [BR, KP // 16, 16]) * b_enc[:, :, None]
    a = tl.abs(y)
    c1 = a > 0.25
    c2 = a >= 0.75
    c3 = a > 1.25
    c4 = a >= 1.75
    c5 = a > 2.5
    c6 = a >= 3.5
    c7 = a > 5.0
    v = (tl.where(c1, 0.5, 0.0) + tl.where(c2, 0.5, 0.0) + tl.where(c3, 0.5, 0.0) + tl.where(c4, 0.5, 0.0)
         + tl.where(c5, 1.0, 0.0) + tl.where(c6, 1.0, 0.0) + tl.where(c7, 2.0, 0.0))
    neg = y < 0.0
    xs = tl.where(neg, -v, v) * s_dec[:, :, None]      # exact: 2 x 4 significant bits
    if PER_TOKEN:
        # mutant: the row's own global decode folded into the operand (rounded to bf16)
        xs = xs * g_dec[:, :, None]
    xs = tl.reshape(xs, [BR, KP])
    tl.store(xs_ptr + offs, _to_bf16(xs, INTERP), mask=mask)

    if WRITE_CODES:
        mag = (c1.to(tl.int32) + c2.to(tl.int32) + c3.to(tl.int32) + c4.to(tl.int32) + c5.to(tl.int32)
               + c6.to(tl.int32) + c7.to(tl.int32))
        code = tl.reshape(mag | (neg.to(tl.int32) << 3), [BR, KP])
        tl.store(codes_ptr + offs, code.to(tl.uint8), mask=mask)
        blk = tl.arange(0, KP // 16)
        s_offs = rows.to(tl.int64)[:, None] * (K // 16) + blk[None, :]
        tl.store(scales_ptr + s_offs, s_code.to(tl.uint8), mask=row_ok[:, None] & (blk < K // 16)[None, :])

    # ---- the scales the GEMM kernels read from their gs pointer: weights' x activations'
    if GW_FROM_PTR:
        gq = tl.load(gw_ptr)
        gk = tl.load(gw_ptr + 1)
        gv = tl.load(gw_ptr + 2)
    else:
        gq = g_q
        gk = g_k
        gv = g_v
    if PER_TOKEN:
        tl.store(gd_ptr + rows, tl.reshape(g_dec, [BR]), mask=row_ok)
        if pid == 0:
            tl.store(gs_ptr, gq * 1.0)
            tl.store(gs_ptr + 1, gk * 1.0)
            tl.store(gs_ptr + 2, gv * 1.0)
    elif pid == 0:
        tl.store(gd_ptr, g_dec)
        tl.store(gs_ptr, gq * g_dec)
        tl.store(gs_ptr + 1, gk * g_dec)
        tl.store(gs_ptr + 2, gv * g_dec)



@dataclass(frozen=True)
class QuantConfig:
    """Launch parameters of the quantizer: ``tile`` elements per program of the quantizer
    kernel (whole rows: tile // K rows), its ``warps``, ``amax_block`` elements per step of
    the amax kernel (8 warps), and whether a weight predecode of the same call runs in the
    amax launch (``fuse_predecode``) or as a launch of its own.

    The defaults are the ones the GPU tests ran; the other tiles and amax steps tried were
    within a few percent of them, all bit-exact (docs/design/nvfp4_qkv_rope.md#22-the-quantizer)."""
    tile: int = 8192
    warps: int = 8
    amax_block: int = 4096
    fuse_predecode: bool = True     # predecoded weights (KernelConfig.predecode) decoded in the amax launch

    def __post_init__(self):
        if not isinstance(self.fuse_predecode, bool):
            raise ValueError(f"QuantConfig.fuse_predecode: expected a bool, got {self.fuse_predecode!r}")
        for name in ("tile", "warps", "amax_block"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"QuantConfig.{name}: expected a power of two >= 1, got {v!r}")

    def to_dict(self) -> dict:
        return asdict(self)


DEFAULT_QUANT_CONFIG = QuantConfig()


@dataclass(frozen=True)
class ActQuant:
    """What :func:`act_quant` returns for x [..., K].

    ``xs``: bf16 [..., K] = e2m1(code) * e4m3(block scale), exact (at most 6 significant
    bits): the GEMM kernels' activation operand. ``gs``: fp32 [3], the q, k and v weights'
    global decode scales times x's, rounded to fp32: what the GEMM kernels read from their
    gs pointer. ``global_decode``: fp32 0-d (the per-token mutant: [..., 1], one per row).
    ``codes`` uint8 [..., K] and ``scales`` uint8 e4m3 bits [..., K/16] when asked for."""
    xs: torch.Tensor
    gs: torch.Tensor
    global_decode: torch.Tensor
    codes: torch.Tensor | None = None
    scales: torch.Tensor | None = None

    def dequantize(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """x_hat = xs * global_decode: exact in float64 (SPEC.md step 6)."""
        return (self.xs.to(torch.float64) * self.global_decode.to(torch.float64)).to(dtype)


@dataclass(frozen=True)
class _QuantPlan:
    chunk: int          # amax kernel: elements per program
    n_part: int         # amax kernel: programs (partial maxima)
    pp: int             # n_part rounded up to a power of two (the quantizer's reduction width)
    kp: int             # K rounded up to a power of two
    br: int             # quantizer: rows per program
    grid: int           # quantizer: programs


_QUANT_PLANS: dict[tuple, _QuantPlan] = {}


def _quant_plan(m: int, k: int, cfg: QuantConfig) -> _QuantPlan:
    key = (m, k, cfg)
    plan = _QUANT_PLANS.get(key)
    if plan is None:
        n = m * k
        chunk = cfg.amax_block
        while triton.cdiv(n, chunk) > _AMAX_MAX_PARTIALS:
            chunk *= 2
        n_part = max(1, triton.cdiv(n, chunk))
        kp = max(16, triton.next_power_of_2(k))
        br = max(1, cfg.tile // kp)
        plan = _QuantPlan(chunk, n_part, triton.next_power_of_2(n_part), kp, br, max(1, triton.cdiv(m, br)))
        if len(_QUANT_PLANS) > 256:
            _QUANT_PLANS.clear()
        _QUANT_PLANS[key] = plan
    return plan


def _quiet_numpy(interp: bool):
    if not interp:
        return contextlib.nullcontext()
    return numpy.errstate(divide="ignore", over="ignore", invalid="ignore")


def act_quant(x: torch.Tensor, weight_scales=(1.0, 1.0, 1.0), *, codes: bool = False,
              per_token: bool = False, config: QuantConfig | None = None) -> ActQuant:
    """The benchmark's NVFP4 activation quantizer (SPEC.md op B ``act_quant``) on the device,
    bit for bit ``fuseval.refimpl.nvfp4.quantize_activations(x)``.

    ``x`` [..., K] (any float dtype, K % 16 == 0) is viewed as [M, K]. Two launches and no
    host synchronisation: ``_amax_partials_kernel`` (max |x| per chunk), then
    ``_act_quant_kernel`` (global scales from the partials, block scales, codes, xs, and
    ``gs`` = ``weight_scales`` (three Python floats or one-element tensors) times the global
    decode scale). ``codes=True`` also returns the codes and block scale bits.
    ``per_token=True`` is the "per_token_amax" mutant (an amax per row). ``config``: the
    launch parameters (:class:`QuantConfig`; default :data:`DEFAULT_QUANT_CONFIG`)."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"act_quant: x must be a floating-point tensor [..., K], got {got}")
    if x.dim() == 0 or x.shape[-1] % 16:
        raise ValueError(f"act_quant: x must have shape [..., K] with K a multiple of 16, "
                         f"got {tuple(x.shape)}")
    k = x.shape[-1]
    x2 = x.detach().reshape(-1, k)
    if x2.dtype not in (torch.bfloat16, torch.float32):
        x2 = x2.to(torch.float32)                       # exact for every narrower float
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    x_bf16 = x2.dtype == torch.bfloat16
    if x_bf16:
        x2 = x2.view(torch.int16)                       # widened by hand (see _load_f32)
    m = x2.shape[0]
    xs, scratch, codes_t, scales_t = quantize_rows(x2, x_bf16, m, k, weight_scales, codes, per_token,
                                                   config or DEFAULT_QUANT_CONFIG)
    gs = scratch[_SCRATCH_GS:_SCRATCH_GS + 3]
    lead = tuple(x.shape[:-1])
    if per_token:
        gd = scratch[_SCRATCH_PART:_SCRATCH_PART + m].view(lead + (1,))
    else:
        gd = scratch[_SCRATCH_GD]
    return ActQuant(xs.view(x.shape), gs, gd, codes_t.view(x.shape) if codes else None,
                    scales_t.view(lead + (k // 16,)) if codes else None)


def quantize_rows(x2, x_bf16: bool, m: int, k: int, weight_scales, codes: bool, per_token: bool,
                  cfg: QuantConfig = DEFAULT_QUANT_CONFIG, predecode=None):
    """The two launches of :func:`act_quant` on x2 [M, K] (bf16 as int16 bits, or fp32).
    Returns (xs bf16 [M, K], the fp32 view of the scratch tensor (gs = [0:3]), codes or
    None, scales or None). ``predecode`` = (wq, sq, wk, sk, wv, sv, out, BR, BK): the weights'
    predecode into ``out`` runs in the amax launch (``_amax_and_predecode_kernel``)."""
    dev = x2.device
    plan = _quant_plan(m, k, cfg)
    interp = dev.type != "cuda"
    xs = torch.empty((m, k), dtype=torch.bfloat16, device=dev)
    scratch = torch.empty(_SCRATCH_PART + (m if per_token else plan.n_part), dtype=torch.int32, device=dev)
    codes_t = torch.empty((m, k), dtype=torch.uint8, device=dev) if codes else xs
    scales_t = torch.empty((m, k // 16), dtype=torch.uint8, device=dev) if codes else xs
    if any(isinstance(g, torch.Tensor) for g in weight_scales):
        gw = torch.stack([torch.as_tensor(g).reshape(()).to(device=dev, dtype=torch.float32)
                          for g in weight_scales])
        gw_args, gw_from_ptr = (gw, 1.0, 1.0, 1.0), True
    else:
        gw_args, gw_from_ptr = (scratch, *(float(g) for g in weight_scales)), False
    if predecode is not None and not per_token:
        *weights, w_out, br, bk = predecode
        tiles = (w_out.shape[0] // br) * (k // bk)
        _amax_and_predecode_kernel[(plan.n_part + tiles,)](
            x2, scratch, m * k, plan.n_part, *weights, w_out, CHUNK=plan.chunk, BLOCK=cfg.amax_block,
            X_BF16=x_bf16, NQ=weights[0].shape[0], NKV=weights[2].shape[0], K=k, BR=br, BK=bk, num_warps=8)
    elif not per_token:
        _amax_partials_kernel[(plan.n_part,)](x2, scratch, m * k, CHUNK=plan.chunk, BLOCK=cfg.amax_block,
                                              X_BF16=x_bf16, num_warps=8)
    with _quiet_numpy(interp):     # the interpreter's numpy warns of 1/0 (an intended inf)
        _act_quant_kernel[(plan.grid,)](
            x2, scratch, plan.n_part, *gw_args, xs, codes_t, scales_t, m,
            K=k, KP=plan.kp, BR=plan.br, PP=plan.pp, GW_FROM_PTR=gw_from_ptr, WRITE_CODES=codes,
            PER_TOKEN=per_token, X_BF16=x_bf16, INTERP=interp, num_warps=cfg.warps)
    return xs, scratch.view(torch.float32), (codes_t if codes else None), (scales_t if codes else None)

