"""Two implementations of the benchmark's NVFP4 activation quantizer (SPEC.md, op B
``act_quant``), written apart from ``fuseval.refimpl.nvfp4.quantize_activations`` so that
the tests compare three different spellings of one definition:

* ``quantize_loops``: plain Python, one element at a time, numpy float32 scalars for every
  arithmetic step, the thresholds spelled out as SPEC.md lists them, and the e4m3 rounding
  done by searching all 256 codes for the nearest value (ties to the even code);
* ``quantize_ml_dtypes``: vectorized numpy float32 with ml_dtypes' float8_e4m3fn and
  float4_e2m1fn casts (single round-to-nearest-even from float32).

Both return (codes uint8 [M, K], scale bits uint8 [M, K/16], global_decode np.float32).
The block amax is divided by 6 as the benchmark's torch does on the GPU: a multiply by the
float32 reciprocal (SPEC.md's "block amax / 6", measured on an H200).
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

F32 = np.float32
F32_MAX = np.finfo(np.float32).max


def _e4m3_value(byte: int) -> float:
    e, m = (byte >> 3) & 15, byte & 7
    if e == 15 and m == 7:
        return math.nan
    mag = (m / 8.0) * 2.0 ** -6 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return -mag if byte & 0x80 else mag


_E4M3_TABLE = [(b, _e4m3_value(b)) for b in range(256) if not math.isnan(_e4m3_value(b))]


def e4m3_nearest(v: float) -> int:
    """The e4m3fn code nearest to a finite v in [-448, 448], ties to the even code; the
    sign of zero kept."""
    if v == 0:
        return 0x80 if math.copysign(1.0, v) < 0 else 0
    best = min(_E4M3_TABLE, key=lambda bv: (abs(bv[1] - v), bv[0] & 1, bv[0]))
    return best[0]


def e2m1_by_thresholds(y: float) -> int:
    """SPEC.md's threshold table, literally."""
    a = abs(y)
    if a <= 0.25 or math.isnan(y):
        mag = 0
    elif a < 0.75:
        mag = 1
    elif a <= 1.25:
        mag = 2
    elif a < 1.75:
        mag = 3
    elif a <= 2.5:
        mag = 4
    elif a < 3.5:
        mag = 5
    elif a <= 5.0:
        mag = 6
    else:
        mag = 7
    return mag | (8 if y < 0 else 0)


def quantize_loops(x):
    """x: array-like [M, K] of floats (converted to float32)."""
    xf = np.asarray(x, dtype=np.float32)
    m, k = xf.shape
    amax = F32(0)
    for v in xf.flat:
        amax = max(amax, abs(F32(v)))
    with np.errstate(divide="ignore", over="ignore"):
        ge = F32(2688.0) / amax
    ge = min(ge, F32_MAX)
    if ge == 0:
        ge = F32(1.0)
    gd = F32(1.0) / ge
    codes = np.zeros((m, k), dtype=np.uint8)
    scales = np.zeros((m, k // 16), dtype=np.uint8)
    for r in range(m):
        for blk in range(k // 16):
            vals = [F32(v) for v in xf[r, 16 * blk:16 * blk + 16]]
            bmax = F32(0)
            for v in vals:
                bmax = max(bmax, abs(v))
            s = F32(bmax * F32(1.0 / 6.0)) * ge      # the GPU's division by 6: times fl32(1/6)
            s = F32(min(max(s, F32(-448.0)), F32(448.0)))
            bits = e4m3_nearest(float(s))
            scales[r, blk] = bits
            with np.errstate(divide="ignore", over="ignore"):
                enc = F32(1.0) / (F32(_e4m3_value(bits)) * gd)
            enc = min(enc, F32_MAX)
            for j, v in enumerate(vals):
                with np.errstate(over="ignore"):
                    y = F32(v * enc)
                y = F32(min(max(y, F32(-6.0)), F32(6.0))) if not math.isnan(y) else y
                codes[r, 16 * blk + j] = e2m1_by_thresholds(float(y))
    return codes, scales, gd


def quantize_ml_dtypes(x):
    """x: array-like [M, K]; vectorized numpy float32 and ml_dtypes casts."""
    xf = np.asarray(x, dtype=np.float32)
    m, k = xf.shape
    amax = np.abs(xf).max()
    with np.errstate(divide="ignore", over="ignore"):
        ge = np.minimum(np.float32(2688.0) / amax, F32_MAX).astype(np.float32)
    ge = np.float32(1.0) if ge == 0 else ge
    gd = np.float32(1.0) / ge
    blocks = xf.reshape(m, k // 16, 16)
    s = (np.abs(blocks).max(axis=-1) * np.float32(1.0 / 6.0)).astype(np.float32) * ge
    s = np.clip(s, np.float32(-448.0), np.float32(448.0)).astype(np.float32)
    s8 = s.astype(ml_dtypes.float8_e4m3fn)
    with np.errstate(divide="ignore", over="ignore"):
        enc = np.minimum(np.float32(1.0) / (s8.astype(np.float32) * gd), F32_MAX).astype(np.float32)
        y = np.clip(blocks * enc[..., None], np.float32(-6.0), np.float32(6.0)).astype(np.float32)
    codes = y.astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    # the benchmark's sign rule is "y < 0", not the sign bit: -0.0 (and NaN) give code 0
    codes = np.where((y == 0) | np.isnan(y), np.where(y < 0, 8, 0), codes).astype(np.uint8)
    return codes.reshape(m, k), s8.view(np.uint8), gd
