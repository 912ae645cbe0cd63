"""``torch._scaled_mm`` computed by exact dequantization, for references that need a GPU
the machine does not have (an FP4 x FP4 block-scaled GEMM needs Blackwell's cuBLAS).

Both operands are decoded exactly to float64 (every fp8 and e2m1 value, and every e4m3
or float32 scale, is a float64 number), their scales applied exactly, and the product
accumulated in float64: one rounding, at the end, to the call's ``out_dtype`` (the
reference as written) or none (the lifted oracle). cuBLAS accumulates in float32 and
may round differently in the last bit of the output type.

Forms understood:

* fp8 operands (e4m3 / e5m2) with a scale per tensor (one element), per row of ``a``
  ``(M, 1)`` / per column of ``b`` ``(1, N)``, or per block (any scale shape dividing the
  operand's, e.g. ``(M, K/128)``);
* NVFP4 operands (``float4_e2m1fn_x2``, two codes a byte along K) with e4m3 scales of one
  per 16 elements along K, in cuBLAS's swizzled 128x4 layout (flat or 2-D, rows padded to
  128 and scale columns to 4), as ``torch._scaled_mm`` takes them.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..refimpl import nvfp4

__all__ = ["is_scaled_mm", "scaled_mm", "unswizzle_block_scales", "FP4", "QUANTIZED_DTYPES"]

FP4 = torch.float4_e2m1fn_x2
# formats whose values are codes of a quantizer (never lifted)
QUANTIZED_DTYPES = frozenset(d for d in (
    getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None),
    getattr(torch, "float8_e4m3fnuz", None), getattr(torch, "float8_e5m2fnuz", None),
    getattr(torch, "float8_e8m0fnu", None), FP4) if d is not None)

_PARAMS = ("self", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")


def is_scaled_mm(func: Any) -> bool:
    return func is getattr(torch, "_scaled_mm", None)


def _bind(args, kwargs) -> dict[str, Any]:
    bound = dict(zip(_PARAMS, args))
    for k, v in kwargs.items():
        if k not in _PARAMS or k in bound:
            raise TypeError(f"torch._scaled_mm emulation: unexpected argument {k!r}")
        bound[k] = v
    missing = [p for p in _PARAMS[:4] if p not in bound]
    if missing:
        raise TypeError(f"torch._scaled_mm emulation: missing arguments {missing}")
    return bound


def unswizzle_block_scales(scales: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The ``(rows, cols)`` scale matrix held in cuBLAS's swizzled block layout: tiles of
    128 rows x 4 columns, each tile stored as 32 groups of (4 row-quarters x 4 columns),
    rows padded to a multiple of 128 and columns to a multiple of 4."""
    prows, pcols = 128 * math.ceil(rows / 128), 4 * math.ceil(cols / 4)
    flat = scales.reshape(-1)
    if flat.numel() != prows * pcols:
        raise ValueError(f"block scales: expected {prows * pcols} elements for a ({rows}, {cols}) scale "
                         f"matrix in the swizzled 128x4 layout, got {flat.numel()} (shape {tuple(scales.shape)})")
    # position in the swizzled buffer of each element of the padded (prows, pcols) matrix
    r = torch.arange(prows, device=flat.device)[:, None]
    c = torch.arange(pcols, device=flat.device)[None, :]
    tile = (r // 128) * (pcols // 4) + c // 4
    within = (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4
    position = tile * 512 + within
    return flat[position.reshape(-1)].reshape(prows, pcols)[:rows, :cols]


def _block(n: int, k: int) -> int | None:
    """The block length along an axis of length ``n`` that ``k`` scales cover: the whole
    axis (k = 1), one element (k = n), or blocks of 16, 32 or 128 (the last cut short)."""
    if k == 1:
        return n
    if k == n:
        return 1
    return next((b for b in (16, 32, 128) if k == math.ceil(n / b)), None)


def _expand(scale: torch.Tensor, shape: tuple[int, int], what: str) -> torch.Tensor:
    """A float64 scale broadcast to an operand's (rows, cols): one per tensor, per row or
    column, or per block of 16, 32 or 128 elements along an axis."""
    s = scale.to(torch.float64)
    if s.numel() == 1:
        return s.reshape(1, 1)
    if s.dim() == 1 and s.numel() in shape:
        s = s.reshape(-1, 1) if s.numel() == shape[0] else s.reshape(1, -1)
    if s.dim() == 2:
        for candidate in (s, s.t()):
            blocks = [_block(n, k) for n, k in zip(shape, candidate.shape)]
            if None not in blocks:
                out = candidate
                for dim, (n, b) in enumerate(zip(shape, blocks)):
                    if b not in (1, n):
                        out = out.repeat_interleave(b, dim=dim).narrow(dim, 0, n)
                return out
    raise ValueError(f"torch._scaled_mm emulation: {what} of shape {tuple(scale.shape)} does not tile an "
                     f"operand of shape {shape} (per tensor, row, column, or blocks of 16, 32, 128)")


def _fp4_rows(packed_rows_by_k: torch.Tensor, scale: torch.Tensor, what: str) -> torch.Tensor:
    """(rows, K) float64 from NVFP4 codes packed along K, (rows, K/2), with swizzled e4m3
    scales of one per 16 elements along K."""
    codes = packed_rows_by_k.contiguous().view(torch.uint8)
    rows, k = codes.shape[0], 2 * codes.shape[1]
    if scale.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise ValueError(f"torch._scaled_mm emulation: {what} of an NVFP4 operand must be e4m3 "
                         f"(1x16 blocks), got {scale.dtype}")
    grid = unswizzle_block_scales(scale.contiguous().view(torch.uint8), rows, k // 16)
    # the 16 e2m1 values from the bit-exact codec, looked up per nibble (low nibble: even column)
    table = nvfp4.decode_e2m1(torch.arange(16, dtype=torch.uint8, device=codes.device))
    values = torch.stack((table[(codes & 0xF).long()], table[(codes >> 4).long()]), dim=-1).reshape(rows, k)
    block_scales = nvfp4.decode_e4m3fn(grid.contiguous(), torch.float64)
    return (values.view(rows, k // 16, 16) * block_scales[..., None]).reshape(rows, k)


def scaled_mm(args, kwargs, *, lifted: bool) -> torch.Tensor:
    """What ``torch._scaled_mm(*args, **kwargs)`` computes, by exact dequantization.
    ``lifted``: return the float64 product unrounded (the oracle); otherwise rounded to
    the call's ``out_dtype`` (default: the operands' dtype)."""
    p = _bind(args, kwargs)
    a, b = p["self"], p["mat2"]
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"torch._scaled_mm emulation: expected 2-D operands, got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    if (a.dtype == FP4) != (b.dtype == FP4):
        raise ValueError(f"torch._scaled_mm emulation: mixed operand formats {a.dtype} and {b.dtype}")
    if a.dtype == FP4:
        a64 = _fp4_rows(a, p["scale_a"], "scale_a")                  # (M, K)
        b64 = _fp4_rows(b.t(), p["scale_b"], "scale_b").t()          # b is (K/2, N): rows of b.t()
    else:
        a64 = a.to(torch.float64) * _expand(p["scale_a"], tuple(a.shape), "scale_a")
        b64 = b.to(torch.float64) * _expand(p["scale_b"], tuple(b.shape), "scale_b")
    if a64.shape[1] != b64.shape[0]:
        raise ValueError(f"torch._scaled_mm emulation: inner dimensions differ ({tuple(a64.shape)} x "
                         f"{tuple(b64.shape)})")
    out = a64 @ b64
    if p.get("scale_result") is not None:
        out = out * p["scale_result"].to(torch.float64)
    if p.get("bias") is not None:
        out = out + p["bias"].to(torch.float64)
    out_dtype = p.get("out_dtype") or a.dtype
    if lifted and out_dtype.is_floating_point and out_dtype not in QUANTIZED_DTYPES:
        return out
    return out.to(out_dtype)
