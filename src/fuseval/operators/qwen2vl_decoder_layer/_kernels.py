"""Triton kernels of the Qwen2-VL decoder-layer fast path (op A): RMSNorm, the GEMMs
(residual, gate/up, persistent) and QKV with the mRoPE epilogue; the attention kernel is
in ``_attention.py``, the launchers in ``_launch.py``.

Tensors are row-major; inputs, weights, residuals and outputs are float32, the
activations that only feed products are float32 or, under the "fp16" policy, float16
(the kernels read the element type off the pointers). All matrix products are "NT": both
operands are read along their contiguous K axis (activations [M, K], nn.Linear weights
[N, K]). That is also the only operand order Hopper's tensor cores accept for 32-bit
(TF32) inputs, which is why the QKV kernel writes V transposed for the attention kernel.

``PREC`` is the product's operand precision (``_mma``): "tf32" (TF32 tensor cores),
"fp16" (both operands converted to fp16, round to nearest even, fp32 accumulation),
"tf32x3" (three TF32 products, about fp32 accuracy) or "ieee" (exact fp32 FMA). Under the
Triton interpreter an fp32 dot is exact whatever ``PREC`` says; fp16 operands are
rounded there as on the GPU.

``WATCH`` (the "fp16" policy): the kernel sets ``flag_ptr[0]`` to 1 when a value it
stores as fp16 is NaN or beyond fp16's range, or when an fp32 result of fp16 operands is
not finite (an operand overflowed in its conversion). The launcher then recomputes the
call under "tf32" (fast.py), so no overflow reaches the output.

Flags whose names start with ``MUT_`` plant a known bug (the tests' mutants); the
production launchers always pass False.
"""
from __future__ import annotations

from ... import fast as _kernel_runtime  # noqa: F401  (before triton: selects the interpreter on CPU-only machines)
import triton
import triton.language as tl


@triton.jit
def _round_tf32(x):
    """Round fp32 to the nearest TF32 value (10-bit mantissa, ties away from zero), kept
    in fp32. Tensor cores read a fp32 operand by dropping its 13 low mantissa bits, which
    shrinks every operand towards zero and biases each product by about -7e-4 relative;
    operands rounded beforehand are exact in TF32, so the hardware then adds no error.
    Integer bit arithmetic (not cvt.rna) so that the interpreter runs it too."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x1000) & -8192
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _mma(a, b, acc, PREC: tl.constexpr):
    """acc + a b^T: ``a`` [m, k], ``b`` [n, k]. Under "fp16" both operands are converted
    to fp16 here (the weights arrive as fp32 tiles; activations are fp16 already)."""
    if PREC == "fp16":
        acc = tl.dot(a.to(tl.float16), tl.trans(b.to(tl.float16)), acc)
    else:
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PREC)
    return acc


@triton.jit
def _mm(a, b, PREC: tl.constexpr):
    """a b^T in fp32, operands as in ``_mma``."""
    if PREC == "fp16":
        return tl.dot(a.to(tl.float16), tl.trans(b.to(tl.float16)))
    else:
        return tl.dot(a, tl.trans(b), input_precision=PREC)


@triton.jit
def _watch(v, mask, flag_ptr, out_ptr, WATCH: tl.constexpr):
    """When WATCH: flag (``flag_ptr[0] = 1``) a masked element of ``v`` that ``out_ptr``'s
    element type cannot hold: NaN, or beyond 65504 for fp16, or not finite for fp32.
    Only programs that find one store (no atomics, no traffic otherwise)."""
    if WATCH:
        if out_ptr.dtype.element_ty == tl.float16:
            limit = 65504.0
        else:
            limit = 3.4028234663852886e38
        bad = mask & ((tl.abs(v) > limit) | (v != v))
        if tl.sum(bad.to(tl.int32)) > 0:
            tl.store(flag_ptr, 1)


@triton.jit
def _swiglu(g, u, MUT_SILU_ON_UP: tl.constexpr):
    """silu(g) * u, SwiGLU's activation (the mutant applies silu to the up branch)."""
    if MUT_SILU_ON_UP:
        return g * (u / (1.0 + tl.exp(-u)))
    return (g / (1.0 + tl.exp(-g))) * u


@triton.jit
def _stored(v, out_ptr):
    """``v`` in the element type of ``out_ptr`` (fp32 -> fp16 rounds to nearest even)."""
    return v.to(out_ptr.dtype.element_ty)


# --------------------------------------------------------------------------- RMSNorm
@triton.jit(do_not_specialize=["M"])
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, flag_ptr, M, H, stride_x, stride_out, eps,
                    BLOCK_H: tl.constexpr, ROWS: tl.constexpr, ROUND_OUT: tl.constexpr,
                    WATCH: tl.constexpr, MUT_EPS_OUTSIDE: tl.constexpr):
    """out = x * rsqrt(mean(x^2) + eps) * w for ``ROWS`` whole rows (H <= BLOCK_H) held in
    registers: one read and one write of [M, H], in fp32; stored in ``out_ptr``'s type.
    ROUND_OUT: store TF32-rounded values (the output only ever feeds a TF32 product)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    mask = (rows[:, None] < M) & (cols[None, :] < H)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    mean_sq = tl.sum(x * x, axis=1) / H
    if MUT_EPS_OUTSIDE:
        scale = 1.0 / (tl.sqrt(mean_sq) + eps)
    else:
        scale = tl.rsqrt(mean_sq + eps)
    w = tl.load(w_ptr + cols, mask=cols < H, other=0.0)
    h = x * scale[:, None] * w[None, :]
    if ROUND_OUT:
        h = _round_tf32(h)
    _watch(h, mask, flag_ptr, out_ptr, WATCH)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], _stored(h, out_ptr), mask=mask)


# --------------------------------------------------------------------------- fp16 weights
@triton.jit
def to_fp16_kernel(src_ptr, dst_ptr, flag_ptr, n, BLOCK: tl.constexpr, WATCH: tl.constexpr):
    """dst = src rounded to nearest-even fp16, BLOCK elements per program (a flat copy of
    one weight). The "fp16" policy's large calls convert every GEMM weight once per call
    with it, so that the GEMMs take fp16 tiles from shared memory straight into the tensor
    cores (see ``Plan.fp16_weights``). WATCH: a weight beyond fp16 range sets the flag."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    w = tl.load(src_ptr + offs, mask=mask, other=0.0)
    _watch(w, mask, flag_ptr, dst_ptr, WATCH)
    tl.store(dst_ptr + offs, w.to(tl.float16), mask=mask)


# --------------------------------------------------------------------------- GEMM pieces
@triton.jit
def _tile_coords(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row-tiles walk the N tiles together, so a weight tile
    is fetched from DRAM once and re-read from L2 by the neighbouring row-tiles."""
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    per_group = GROUP_M * num_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def _mainloop_ptr(a_ptr, a_rows, stride_a, b1_ptr, b1_rows, b2_ptr, b2_rows, stride_b, k_lo, k_hi,
                  acc1, acc2, BK: tl.constexpr, EVEN_K: tl.constexpr, PREC: tl.constexpr,
                  TWO: tl.constexpr, ROUND_B: tl.constexpr):
    """acc1 += A[a_rows] B1[b1_rows]^T (and acc2 += A B2^T when TWO) over K columns
    [k_lo, k_hi) in BK steps (k_lo is a multiple of BK; a split-K slice or all of K).

    Row indices come in already clamped into range (out-of-range rows of a ragged tile
    read a valid row; their results are never stored), so only K needs a mask, and only
    when BK does not divide the slice (EVEN_K False). Sharing one A tile between two
    products is how the gate and up projections run in one pass over A."""
    offs_k = k_lo + tl.arange(0, BK)
    a_ptrs = a_ptr + a_rows[:, None] * stride_a + offs_k[None, :]
    b1_ptrs = b1_ptr + b1_rows[:, None] * stride_b + offs_k[None, :]
    b2_ptrs = b2_ptr + b2_rows[:, None] * stride_b + offs_k[None, :]
    for k in range(k_lo, k_hi, BK):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b1 = tl.load(b1_ptrs)
        else:
            kmask = offs_k[None, :] < k_hi - (k - k_lo)
            a = tl.load(a_ptrs, mask=kmask, other=0.0)
            b1 = tl.load(b1_ptrs, mask=kmask, other=0.0)
        if ROUND_B:
            b1 = _round_tf32(b1)
        acc1 = _mma(a, b1, acc1, PREC)
        if TWO:
            if EVEN_K:
                b2 = tl.load(b2_ptrs)
            else:
                b2 = tl.load(b2_ptrs, mask=offs_k[None, :] < k_hi - (k - k_lo), other=0.0)
            if ROUND_B:
                b2 = _round_tf32(b2)
            acc2 = _mma(a, b2, acc2, PREC)
        a_ptrs += BK
        b1_ptrs += BK
        b2_ptrs += BK
    return acc1, acc2


@triton.jit
def _mainloop_tma(a_desc, off_m, b1_desc, off_n1, b2_desc, off_n2, k_lo, k_hi, acc1, acc2,
                  BK: tl.constexpr, PREC: tl.constexpr, TWO: tl.constexpr, ROUND_B: tl.constexpr):
    """The same products with tiles fetched by the tensor-memory-accelerator (host-made
    descriptors); out-of-range rows and K columns arrive as zeros."""
    for k in range(k_lo, k_hi, BK):
        a = a_desc.load([off_m, k])
        b1 = b1_desc.load([off_n1, k])
        if ROUND_B:
            b1 = _round_tf32(b1)
        acc1 = _mma(a, b1, acc1, PREC)
        if TWO:
            b2 = b2_desc.load([off_n2, k])
            if ROUND_B:
                b2 = _round_tf32(b2)
            acc2 = _mma(a, b2, acc2, PREC)
    return acc1, acc2


@triton.jit
def _mainloop(a, off_m, a_rows, stride_a, b, off_n, b_rows, stride_b, k_lo, k_hi, acc,
              BK: tl.constexpr, EVEN_K: tl.constexpr, PREC: tl.constexpr, USE_TMA: tl.constexpr,
              ROUND_B: tl.constexpr):
    """acc += A B^T over K columns [k_lo, k_hi): ``a``/``b`` are TMA descriptors when
    USE_TMA (then the tile offsets are used), pointers otherwise (then the row indices)."""
    if USE_TMA:
        acc, _unused = _mainloop_tma(a, off_m, b, off_n, b, off_n, k_lo, k_hi, acc, acc, BK, PREC,
                                     False, ROUND_B)
    else:
        acc, _unused = _mainloop_ptr(a, a_rows, stride_a, b, b_rows, b, b_rows, stride_b, k_lo, k_hi,
                                     acc, acc, BK, EVEN_K, PREC, False, ROUND_B)
    return acc


# --------------------------------------------------------------------------- residual GEMM
@triton.jit(do_not_specialize=["M"])
def gemm_residual_kernel(a, w, res_ptr, out_ptr, flag_ptr, M, N, K, stride_a, stride_w, stride_res, stride_out,
                         k_per_split,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                         EVEN_K: tl.constexpr, PREC: tl.constexpr, USE_TMA: tl.constexpr,
                         ROUND_B: tl.constexpr, ADD_RESIDUAL: tl.constexpr, WATCH: tl.constexpr):
    """out = res + A W^T (O projection: res = x; down projection: res = x1).
    ``a``/``w`` are pointers, or TMA descriptors when USE_TMA.

    Split-K (program axis 1 > 1): program k sums K columns [k * k_per_split, ...) and
    writes its partial product to slice k of ``out`` ([splits, M, N]); splitk_reduce_kernel
    adds the slices and the residual. It gives small-M calls (128 tokens: 112 tiles of
    64 x 64 for 132 SMs, each a 18944-long K loop) enough programs to pull the weights
    at full bandwidth."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BM, BN, GROUP_M)
    pid_k = tl.program_id(1)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    off_m = pid_m * BM
    off_n = pid_n * BN
    rows = off_m + tl.arange(0, BM)
    cols = off_n + tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    acc = _mainloop(a, off_m, rows % M, stride_a, w, off_n, cols % N, stride_w, k_lo, k_hi, acc,
                    BK, EVEN_K, PREC, USE_TMA, ROUND_B)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    _watch(acc, mask, flag_ptr, out_ptr, WATCH)
    if ADD_RESIDUAL:
        acc += tl.load(res_ptr + rows[:, None] * stride_res + cols[None, :], mask=mask, other=0.0)
    out_ptr += pid_k.to(tl.int64) * M * N
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], acc, mask=mask)


@triton.jit(do_not_specialize=["M"])
def splitk_reduce_kernel(part_ptr, res_ptr, out_ptr, M, N, SPLITS: tl.constexpr, BLOCK: tl.constexpr,
                         ADD_RESIDUAL: tl.constexpr):
    """out = res + sum of the SPLITS partial products ([SPLITS, M, N], contiguous), added in
    a fixed order so that the result does not depend on scheduling."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for k in tl.static_range(1, SPLITS):
        acc += tl.load(part_ptr + k * M * N + offs, mask=mask, other=0.0)
    if ADD_RESIDUAL:
        acc += tl.load(res_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc, mask=mask)


# --------------------------------------------------------------------------- gate + up GEMM
@triton.jit(do_not_specialize=["M"])
def gate_up_kernel(a, wg, wu, out_ptr, flag_ptr, M, N, K, stride_a, stride_w, stride_out,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                   EVEN_K: tl.constexpr, PREC: tl.constexpr, USE_TMA: tl.constexpr,
                   ROUND_B: tl.constexpr, FUSE_ACT: tl.constexpr, ROUND_OUT: tl.constexpr,
                   WATCH: tl.constexpr, MUT_SILU_ON_UP: tl.constexpr):
    """g = A Wg^T and u = A Wu^T over one shared A tile; FUSE_ACT: out = silu(g) * u
    ([M, N]); otherwise out = [g | u] ([M, 2N], the ``gate_up`` tap)."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BM, BN, GROUP_M)
    off_m = pid_m * BM
    off_n = pid_n * BN
    rows = off_m + tl.arange(0, BM)
    cols = off_n + tl.arange(0, BN)
    acc_g = tl.zeros([BM, BN], dtype=tl.float32)
    acc_u = tl.zeros([BM, BN], dtype=tl.float32)
    if USE_TMA:
        acc_g, acc_u = _mainloop_tma(a, off_m, wg, off_n, wu, off_n, 0, K, acc_g, acc_u, BK, PREC, True,
                                     ROUND_B)
    else:
        acc_g, acc_u = _mainloop_ptr(a, rows % M, stride_a, wg, cols % N, wu, cols % N, stride_w, 0, K,
                                     acc_g, acc_u, BK, EVEN_K, PREC, True, ROUND_B)
    _gate_up_epilogue(acc_g, acc_u, out_ptr, flag_ptr, rows, cols, M, N, stride_out, FUSE_ACT, ROUND_OUT, WATCH,
                      MUT_SILU_ON_UP)


@triton.jit
def _gate_up_epilogue(acc_g, acc_u, out_ptr, flag_ptr, rows, cols, M, N, stride_out, FUSE_ACT: tl.constexpr,
                      ROUND_OUT: tl.constexpr, WATCH: tl.constexpr, MUT_SILU_ON_UP: tl.constexpr):
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    out_ptrs = out_ptr + rows[:, None] * stride_out + cols[None, :]
    if FUSE_ACT:
        act = _swiglu(acc_g, acc_u, MUT_SILU_ON_UP)
        if ROUND_OUT:
            act = _round_tf32(act)
        _watch(act, mask, flag_ptr, out_ptr, WATCH)
        tl.store(out_ptrs, _stored(act, out_ptr), mask=mask)
    else:
        _watch(acc_g, mask, flag_ptr, out_ptr, WATCH)
        _watch(acc_u, mask, flag_ptr, out_ptr, WATCH)
        tl.store(out_ptrs, acc_g, mask=mask)
        tl.store(out_ptrs + N, acc_u, mask=mask)


# --------------------------------------------------------------------------- fp16: weights as A
@triton.jit(do_not_specialize=["M"])
def gemm_weights_as_a_kernel(a_desc, w1_desc, w2_desc, res_ptr, out_ptr, flag_ptr, M, N, K, stride_res,
                             stride_out, k_per_split,
                             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                             GATE_UP: tl.constexpr, ADD_RESIDUAL: tl.constexpr, ROUND_OUT: tl.constexpr,
                             WATCH: tl.constexpr, MUT_SILU_ON_UP: tl.constexpr):
    """The "fp16" policy's GEMMs with the weights as the tensor cores' A operand:
    acc^T [BN, BM] = W X^T over the K columns of this program's split (program axis 1).

    The fp32 weight tile is converted to fp16 in registers, and wgmma takes its A operand
    from registers: the converted tile feeds the tensor cores directly. As the B operand
    (``_mma``) it would go back through shared memory every K step, which is slower
    (docs/design/qwen2vl_decoder_layer.md#the-fp16-policy-the-default).
    The activations X (fp16, [M, K]) arrive by TMA as the B operand.
    GATE_UP: out = silu(X W1^T) * (X W2^T); else out = (res +) X W1^T, or with split-K
    (axis 1 > 1) slice k of the partial products ([splits, M, N], splitk_reduce_kernel
    adds them and the residual)."""
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BM, BN, GROUP_M)
    pid_k = tl.program_id(1)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    off_m = pid_m * BM
    off_n = pid_n * BN
    acc1 = tl.zeros([BN, BM], dtype=tl.float32)
    acc2 = tl.zeros([BN, BM], dtype=tl.float32)
    for k in range(k_lo, k_hi, BK):
        x = a_desc.load([off_m, k]).to(tl.float16)
        acc1 = tl.dot(w1_desc.load([off_n, k]).to(tl.float16), x.T, acc1)
        if GATE_UP:
            acc2 = tl.dot(w2_desc.load([off_n, k]).to(tl.float16), x.T, acc2)
    rows = off_m + tl.arange(0, BM)
    cols = off_n + tl.arange(0, BN)
    if GATE_UP:
        _gate_up_epilogue(tl.trans(acc1), tl.trans(acc2), out_ptr, flag_ptr, rows, cols, M, N, stride_out, True,
                          ROUND_OUT, WATCH, MUT_SILU_ON_UP)
    else:
        acc = tl.trans(acc1)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        _watch(acc, mask, flag_ptr, out_ptr, WATCH)
        if ADD_RESIDUAL:
            acc += tl.load(res_ptr + rows[:, None] * stride_res + cols[None, :], mask=mask, other=0.0)
        out_ptr += pid_k.to(tl.int64) * M * N
        tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], acc, mask=mask)


# --------------------------------------------------------------------------- persistent GEMM
@triton.jit(do_not_specialize=["M", "num_programs"])
def gemm_persistent_kernel(a_desc, b1_desc, b2_desc, res_ptr, out_ptr, flag_ptr, M, N, K, stride_res,
                           stride_out, num_programs,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                           PREC: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
                           GATE_UP: tl.constexpr, ROUND_B: tl.constexpr, ADD_RESIDUAL: tl.constexpr,
                           ROUND_OUT: tl.constexpr, WATCH: tl.constexpr, MUT_SILU_ON_UP: tl.constexpr):
    """The residual GEMM (GATE_UP False: out = res + A B1^T) or the fused gate/up GEMM
    (GATE_UP: out = silu(A B1^T) * (A B2^T)) as a persistent kernel: one program per SM
    walks the tiles, so the loads of the next tile overlap the epilogue of this one, and
    WARP_SPECIALIZE lets Triton split TMA producer and tensor-core consumer warps."""
    num_tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    for tile in tl.range(tl.program_id(0), num_tiles, num_programs, flatten=False,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = _tile_coords(tile, M, N, BM, BN, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc1 = tl.zeros([BM, BN], dtype=tl.float32)
        acc2 = tl.zeros([BM, BN], dtype=tl.float32)
        acc1, acc2 = _mainloop_tma(a_desc, off_m, b1_desc, off_n, b2_desc, off_n, 0, K, acc1, acc2, BK,
                                   PREC, GATE_UP, ROUND_B)
        rows = off_m + tl.arange(0, BM)
        cols = off_n + tl.arange(0, BN)
        if GATE_UP:
            _gate_up_epilogue(acc1, acc2, out_ptr, flag_ptr, rows, cols, M, N, stride_out, True, ROUND_OUT,
                              WATCH, MUT_SILU_ON_UP)
        else:
            mask = (rows[:, None] < M) & (cols[None, :] < N)
            _watch(acc1, mask, flag_ptr, out_ptr, WATCH)
            if ADD_RESIDUAL:
                acc1 += tl.load(res_ptr + rows[:, None] * stride_res + cols[None, :], mask=mask, other=0.0)
            tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], acc1, mask=mask)


@triton.jit(do_not_specialize=["M"])
def swiglu_kernel(gu_ptr, out_ptr, flag_ptr, M, N, stride_gu, stride_out, BM: tl.constexpr, BN: tl.constexpr,
                  ROUND_OUT: tl.constexpr, WATCH: tl.constexpr, MUT_SILU_ON_UP: tl.constexpr):
    """The unfused ``act`` stage (staged path only): out = silu(g) * u from [g | u]."""
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    g = tl.load(gu_ptr + rows[:, None] * stride_gu + cols[None, :], mask=mask, other=0.0)
    u = tl.load(gu_ptr + rows[:, None] * stride_gu + N + cols[None, :], mask=mask, other=0.0)
    act = _swiglu(g, u, MUT_SILU_ON_UP)
    if ROUND_OUT:
        act = _round_tf32(act)
    _watch(act, mask, flag_ptr, out_ptr, WATCH)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], _stored(act, out_ptr), mask=mask)


# --------------------------------------------------------------------------- QKV + bias + mRoPE
@triton.jit
def _mrope_axes(j, D: tl.constexpr, HF_LAYOUT: tl.constexpr, MUT_WRONG_AXIS: tl.constexpr):
    """Position axes (t=0, h=1, w=2) whose cos/sin head-dim columns ``j`` (< D/2, the lo
    half of a head) and j + D/2 (the hi half) use.

    Qwen2-VL's section is (D/8, 3D/16, 3D/16) ((16, 24, 24) at D=128). The benchmark's
    layout (HF_LAYOUT False) doubles it element-wise: one contiguous chunk per axis,
    [0, D/4) from t, [D/4, 5D/8) from h, [5D/8, D) from w, so the lo half spans t and h
    and the hi half h and w. HF's layout repeats the section for the two rotate_half
    halves: column j and j + D/2 use the same axis. Both are computed from j directly,
    without a modulo: Triton then still sees runs of 4 contiguous columns in the table
    offsets and emits 16-byte loads (through a modulo it loses that and loads scalars)."""
    HALF: tl.constexpr = D // 2
    s0: tl.constexpr = D // 8
    s1: tl.constexpr = 3 * D // 16
    if HF_LAYOUT:
        axis_lo = tl.where(j < s0, 0, tl.where(j < s0 + s1, 1, 2))
        axis_hi = axis_lo
    else:
        axis_lo = tl.where(j < 2 * s0, 0, 1)
        axis_hi = tl.where(j < 2 * (s0 + s1) - HALF, 1, 2)
    if MUT_WRONG_AXIS:
        axis_lo = (axis_lo + 1) % 3
        axis_hi = (axis_hi + 1) % 3
    return axis_lo, axis_hi


@triton.jit
def _mrope_row_offsets(rows, S, cos_stride_b, D: tl.constexpr, MUT_LAST_ROWS: tl.constexpr):
    """Offsets of the cos/sin rows of tokens ``rows`` (b * S + s) in a contiguous
    [3, B, kv_seq_len, D] table: token s of sequence b reads row s of batch b. The table
    may hold more rows than this call's tokens (kv_seq_len >= S, ``cos_stride_b`` =
    kv_seq_len * D); the layer uses its first S rows. MUT_LAST_ROWS: the last S rows
    instead (a planted bug, visible only when kv_seq_len > S)."""
    b = rows // S
    s = rows % S
    if MUT_LAST_ROWS:
        s += cos_stride_b // D - S
    return b * cos_stride_b + s * D


@triton.jit
def _mrope_rotate(lo, hi, row_off, j, cos_ptr, sin_ptr, cos_stride_axis, mask, D: tl.constexpr,
                  HF_LAYOUT: tl.constexpr, ROUND_OUT: tl.constexpr, MUT_WRONG_AXIS: tl.constexpr):
    """Multimodal RoPE of the two halves of head rows: ``lo``/``hi`` [BM, n] hold columns
    ``j`` and j + D/2 (j < D/2) of the tokens whose table rows start at ``row_off``
    (_mrope_row_offsets); cos/sin of each column come from the position axis of its index
    (_mrope_axes: under the benchmark's layout the two halves use different axes). Returns
    (lo cos_lo - hi sin_lo, hi cos_hi + lo sin_hi), rounded to TF32 when ROUND_OUT (they
    only feed TF32 products)."""
    HALF: tl.constexpr = D // 2
    axis_lo, axis_hi = _mrope_axes(j, D, HF_LAYOUT, MUT_WRONG_AXIS)
    off_lo = row_off[:, None] + (axis_lo * cos_stride_axis + j)[None, :]
    if HF_LAYOUT:
        off_hi = off_lo + HALF
    else:
        off_hi = row_off[:, None] + (axis_hi * cos_stride_axis + j + HALF)[None, :]
    cos_lo = tl.load(cos_ptr + off_lo, mask=mask, other=0.0)
    cos_hi = tl.load(cos_ptr + off_hi, mask=mask, other=0.0)
    sin_lo = tl.load(sin_ptr + off_lo, mask=mask, other=0.0)
    sin_hi = tl.load(sin_ptr + off_hi, mask=mask, other=0.0)
    rot_lo = lo * cos_lo - hi * sin_lo
    rot_hi = hi * cos_hi + lo * sin_hi
    if ROUND_OUT:
        rot_lo = _round_tf32(rot_lo)
        rot_hi = _round_tf32(rot_hi)
    return rot_lo, rot_hi


@triton.jit(do_not_specialize=["M", "S"])
def qkv_rope_kernel(x, wq, wk, wv, bq_ptr, bk_ptr, bv_ptr, cos_ptr, sin_ptr,
                    qk_ptr, vt_ptr, flag_ptr, M, S, K, stride_x, stride_qk, cos_stride_axis, cos_stride_b,
                    vt_stride_b, vt_stride_h, vt_stride_d,
                    QD: tl.constexpr, KD: tl.constexpr, D: tl.constexpr, HPT: tl.constexpr,
                    BM: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                    EVEN_K: tl.constexpr, PREC: tl.constexpr, USE_TMA: tl.constexpr, ROUND_B: tl.constexpr,
                    FUSED: tl.constexpr, ROUND_OUT: tl.constexpr, HF_LAYOUT: tl.constexpr,
                    WATCH: tl.constexpr, MUT_WRONG_AXIS: tl.constexpr, MUT_LAST_ROWS: tl.constexpr):
    """[q | k | v] = h [Wq | Wk | Wv]^T + b for one tile of BM tokens x ``HPT`` whole heads.

    The main loop is a plain GEMM tile (BN = HPT * D columns of one of the three weights,
    TMA descriptors when USE_TMA, pointers otherwise): tiles never straddle q/k/v, so the
    weight is picked once per program. RoPE pairs column d with d + D/2 of the same head;
    the epilogue views the accumulator as [BM, HPT, 2, D/2] and splits off the two halves
    (one register shuffle per tile, after the K loop), so that
    q' = [lo*cos_lo - hi*sin_lo | hi*cos_hi + lo*sin_hi] is element-wise. cos/sin
    ([3, B, kv_seq_len, D], first S rows used) follow the benchmark's chunk layout, or
    HF's when HF_LAYOUT (_mrope_axes).

    FUSED: write RoPE'd q and k into ``qk_ptr`` ([M, QD+KD], the ``mrope`` layout) and v
    transposed into ``vt_ptr`` ([B, Hkv, D, S_pad]: keys contiguous, the operand order
    the PV product needs). Not FUSED: write plain [q | k | v] ([M, QD+2KD], the
    ``qkv_proj`` tap) into ``qk_ptr``. ROUND_OUT (FUSED only): store q', k', v rounded to
    TF32, since they only feed the attention's TF32 products; under the "fp16" policy
    ``qk_ptr``/``vt_ptr`` are fp16 buffers (the attention's fp16 operands)."""
    HALF: tl.constexpr = D // 2
    BN: tl.constexpr = HPT * D
    N: tl.constexpr = QD + 2 * KD
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BM, BN, GROUP_M)
    off_m = pid_m * BM
    n0 = pid_n * BN                          # first column of the tile in [q | k | v]
    rows = off_m + tl.arange(0, BM)
    c = tl.arange(0, BN)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    # pick the weight of the tile's third (q, k or v) once; one main loop for all three
    if n0 < QD:
        w = wq
        b_ptr = bq_ptr
        nloc = n0
    elif n0 < QD + KD:
        w = wk
        b_ptr = bk_ptr
        nloc = n0 - QD
    else:
        w = wv
        b_ptr = bv_ptr
        nloc = n0 - QD - KD
    acc = _mainloop(x, off_m, rows % M, stride_x, w, nloc, nloc + c, stride_x, 0, K, acc,
                    BK, EVEN_K, PREC, USE_TMA, ROUND_B)
    acc += tl.load(b_ptr + nloc + c)[None, :]

    row_ok = rows[:, None] < M
    if not FUSED:
        _watch(acc, row_ok, flag_ptr, qk_ptr, WATCH)
        tl.store(qk_ptr + rows[:, None] * stride_qk + (n0 + c)[None, :], acc, mask=row_ok)
    elif n0 < QD + KD:
        halves = tl.permute(tl.reshape(acc, [BM, HPT, 2, HALF]), (0, 1, 3, 2))
        lo, hi = tl.split(halves)            # [BM, HPT, HALF] each
        lo = tl.reshape(lo, [BM, HPT * HALF])
        hi = tl.reshape(hi, [BM, HPT * HALF])
        i = tl.arange(0, HPT * HALF)
        j = i % HALF                         # index within the first half of the head
        out_cols = n0 + (i // HALF) * D + j  # column of the lo half in [q' | k']
        row_off = _mrope_row_offsets(rows, S, cos_stride_b, D, MUT_LAST_ROWS)
        rot_lo, rot_hi = _mrope_rotate(lo, hi, row_off, j, cos_ptr, sin_ptr, cos_stride_axis, row_ok, D,
                                       HF_LAYOUT, ROUND_OUT, MUT_WRONG_AXIS)
        _watch(rot_lo, row_ok, flag_ptr, qk_ptr, WATCH)
        _watch(rot_hi, row_ok, flag_ptr, qk_ptr, WATCH)
        qk_ptrs = qk_ptr + rows[:, None] * stride_qk + out_cols[None, :]
        tl.store(qk_ptrs, _stored(rot_lo, qk_ptr), mask=row_ok)
        tl.store(qk_ptrs + HALF, _stored(rot_hi, qk_ptr), mask=row_ok)
    else:
        if ROUND_OUT:
            acc = _round_tf32(acc)
        _watch(acc, row_ok, flag_ptr, vt_ptr, WATCH)
        b = rows // S
        s = rows % S
        kv_head = nloc // D + c // D
        vt_ptrs = vt_ptr + b[:, None] * vt_stride_b + kv_head[None, :] * vt_stride_h \
            + (c % D)[None, :] * vt_stride_d + s[:, None]
        tl.store(vt_ptrs, _stored(acc, vt_ptr), mask=row_ok)


@triton.jit(do_not_specialize=["M", "S"])
def mrope_kernel(qkv_ptr, cos_ptr, sin_ptr, out_ptr, flag_ptr, M, S, stride_qkv, stride_out, cos_stride_axis,
                 cos_stride_b, D: tl.constexpr, BM: tl.constexpr, ROUND_OUT: tl.constexpr,
                 HF_LAYOUT: tl.constexpr, WATCH: tl.constexpr, MUT_WRONG_AXIS: tl.constexpr,
                 MUT_LAST_ROWS: tl.constexpr):
    """The unfused ``mrope`` stage (staged path only): one head (program axis 1) of q or k
    for BM tokens, read from [q | k | v] and written to [q' | k']."""
    HALF: tl.constexpr = D // 2
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    col0 = tl.program_id(1) * D
    j = tl.arange(0, HALF)
    mask = (rows[:, None] < M) & (j[None, :] < HALF)
    src = qkv_ptr + rows[:, None] * stride_qkv + col0 + j[None, :]
    lo = tl.load(src, mask=mask, other=0.0)
    hi = tl.load(src + HALF, mask=mask, other=0.0)
    row_off = _mrope_row_offsets(rows, S, cos_stride_b, D, MUT_LAST_ROWS)
    rot_lo, rot_hi = _mrope_rotate(lo, hi, row_off, j, cos_ptr, sin_ptr, cos_stride_axis, mask, D, HF_LAYOUT,
                                   ROUND_OUT, MUT_WRONG_AXIS)
    _watch(rot_lo, mask, flag_ptr, out_ptr, WATCH)
    _watch(rot_hi, mask, flag_ptr, out_ptr, WATCH)
    dst = out_ptr + rows[:, None] * stride_out + col0 + j[None, :]
    tl.store(dst, _stored(rot_lo, out_ptr), mask=mask)
    tl.store(dst + HALF, _stored(rot_hi, out_ptr), mask=mask)
