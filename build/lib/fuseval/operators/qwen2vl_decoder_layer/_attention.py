"""Op A's causal GQA flash attention in Triton (the Gluon twin is in ``_gluon.py``); the
launcher is ``_launch.launch_attention``. Operands and flags as in ``_kernels.py``."""
from __future__ import annotations

from ... import fast as _kernel_runtime  # noqa: F401  (before triton: selects the interpreter on CPU-only machines)
import triton
import triton.language as tl

from ._kernels import _mm, _mma, _round_tf32, _stored, _watch


@triton.jit
def _online_softmax(s, m_i, l_i):
    """One key tile's online-softmax step on scores ``s`` (log2 domain, masked keys
    -inf): the new running max, the factor alpha that rescales what was accumulated
    under the old max, p = 2^(s - max) and the new running sum. Shared by the Triton and
    the Gluon attention kernels, so both compute the same arithmetic."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - tl.expand_dims(m_new, 1))
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_i


@triton.jit
def _attention_tile(q, k_src, vt_src, k_row0, k_col, vt_row0, n, keys0, d, stride_qk, vt_stride_d, S,
                    tok_c, m_i, l_i, acc, qk_scale, MASKED: tl.constexpr, MUT_NONCAUSAL: tl.constexpr,
                    PREC: tl.constexpr, ROUND_P: tl.constexpr, USE_TMA: tl.constexpr):
    """One key tile of the online softmax: s = q k^T, rescale the running max / sum /
    output, acc += p v. MASKED: the tile holds keys past some row's token (the causal
    diagonal) or past S; those scores become -inf.

    With USE_TMA, ``k_src``/``vt_src`` are descriptors over [q'|k'] and over V^T seen as
    [B*Hkv*D, S] (row stride S_pad): keys past S arrive as zeros from the copy engine
    (never the unwritten padding of V^T), and keys of the next sequence in the batch are
    masked like any key >= S."""
    keys = n + keys0
    key_ok = keys < S
    if USE_TMA:
        k = k_src.load([k_row0 + n, k_col])
        vt = vt_src.load([vt_row0, n])
    elif MASKED:
        k = tl.load(k_src + keys[:, None] * stride_qk + d[None, :], mask=key_ok[:, None], other=0.0)
        vt = tl.load(vt_src + d[:, None] * vt_stride_d + keys[None, :], mask=key_ok[None, :], other=0.0)
    else:
        k = tl.load(k_src + keys[:, None] * stride_qk + d[None, :])
        vt = tl.load(vt_src + d[:, None] * vt_stride_d + keys[None, :])
    s = _mm(q, k, PREC) * qk_scale
    if MASKED:
        if MUT_NONCAUSAL:
            visible = key_ok[None, :] & (tok_c[:, None] >= 0)
        else:
            visible = key_ok[None, :] & (keys[None, :] <= tok_c[:, None])
        s = tl.where(visible, s, float("-inf"))
    p, alpha, m_new, l_i = _online_softmax(s, m_i, l_i)
    if ROUND_P:
        p = _round_tf32(p)
    acc = _mma(p, vt, acc * alpha[:, None], PREC)     # "fp16": P rounded to fp16 there
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["S"])
def attention_kernel(qk_ptr, k_src, vt_src, o_ptr, flag_ptr, S, stride_qk, stride_o, vt_stride_b, vt_stride_h,
                     vt_stride_d, qk_scale,
                     QD: tl.constexpr, G: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr, ROUND_P: tl.constexpr,
                     ROUND_OUT: tl.constexpr, WATCH: tl.constexpr, USE_TMA: tl.constexpr,
                     MUT_NONCAUSAL: tl.constexpr, MUT_KV_MOD: tl.constexpr):
    """Causal GQA flash attention for one (batch, kv head) and BM query rows.

    The rows of a tile are (token, head) pairs of the kv head's G query heads, token-major
    (row r: token r // G, head r % G): every K/V tile loaded serves all G heads, and a
    tile's rows span only BM / G tokens, so the causally masked fringe is small. Online
    softmax in fp32 with exp2 (``qk_scale`` = log2(e) / sqrt(D)); key tiles entirely
    below the tile's first token run unmasked, tiles beyond its last token are skipped.
    q and k are read from [q' | k'] ([M, QD+KD]), v from its transpose [B, Hkv, D, S_pad]
    (``k_src``/``vt_src``: pointers to them, or TMA descriptors when USE_TMA).
    ROUND_P: round P to TF32 before the PV product; ROUND_OUT: store the output rounded
    (it only feeds the O projection's TF32 product). PREC "fp16": q', k' and V^T are fp16
    buffers, the scores and the softmax statistics fp32, P rounded to fp16 for P V, the
    output stored in ``o_ptr``'s type."""
    pid_r = tl.num_programs(0) - 1 - tl.program_id(0)    # longest (latest) tiles first
    bh = tl.program_id(1)
    b = bh // HKV
    kvh = bh % HKV
    r = pid_r * BM + tl.arange(0, BM)
    tok = r // G
    g = r % G
    row_ok = tok < S
    tok_c = tl.where(row_ok, tok, S - 1)
    if MUT_KV_MOD:
        qhead = g * HKV + kvh                            # planted bug: kv head = i % Hkv
    else:
        qhead = kvh * G + g                              # kv head = i // G
    d = tl.arange(0, D)
    q_rows = b * S + tok_c
    q = tl.load(qk_ptr + q_rows[:, None] * stride_qk + qhead[:, None] * D + d[None, :])
    if USE_TMA:
        k_base = k_src
        vt_base = vt_src
    else:
        k_base = k_src + QD + kvh * D + (b * S) * stride_qk
        vt_base = vt_src + b * vt_stride_b + kvh * vt_stride_h
    k_row0 = b * S                                       # TMA coordinates of this (b, kv head)
    k_col = QD + kvh * D
    vt_row0 = bh * D

    t_first = (pid_r * BM) // G
    t_last = tl.minimum((pid_r * BM + BM - 1) // G, S - 1)
    if MUT_NONCAUSAL:
        n_full = (S // BN) * BN
        n_end = S
    else:
        n_full = ((t_first + 1) // BN) * BN              # keys < n_full are visible to every row
        n_end = t_last + 1

    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, D], dtype=tl.float32)
    keys0 = tl.arange(0, BN)
    for n in range(0, n_full, BN):
        m_i, l_i, acc = _attention_tile(q, k_base, vt_base, k_row0, k_col, vt_row0, n, keys0, d, stride_qk,
                                        vt_stride_d, S, tok_c, m_i, l_i, acc, qk_scale, False, MUT_NONCAUSAL,
                                        PREC, ROUND_P, USE_TMA)
    for n in range(n_full, n_end, BN):
        m_i, l_i, acc = _attention_tile(q, k_base, vt_base, k_row0, k_col, vt_row0, n, keys0, d, stride_qk,
                                        vt_stride_d, S, tok_c, m_i, l_i, acc, qk_scale, True, MUT_NONCAUSAL,
                                        PREC, ROUND_P, USE_TMA)
    acc = acc / l_i[:, None]
    if ROUND_OUT:
        acc = _round_tf32(acc)
    _watch(acc, row_ok[:, None], flag_ptr, o_ptr, WATCH)
    tl.store(o_ptr + q_rows[:, None] * stride_o + qhead[:, None] * D + d[None, :], _stored(acc, o_ptr),
             mask=row_ok[:, None])
