"""The one precision table: floating-point formats by name, their unit roundoffs and ulps,
and rounding float32 values to them.

Precisions are named, not torch dtypes, because "tf32" (10 explicit mantissa bits and
fp32's exponent range: what tensor cores read of an fp32 operand) has no torch dtype.
The budget, the property bounds and the fast paths' torch emulations all read this table.
"""
from __future__ import annotations

import math

import torch

__all__ = ["PRECISIONS", "ALIASES", "canonical", "check_precision", "unit_roundoff", "ulp", "finer",
           "dtype_precision", "round_to", "round_tf32"]

# name -> (explicit mantissa bits, smallest normal exponent)
PRECISIONS: dict[str, tuple[int, int]] = {
    "float64": (52, -1022),
    "float32": (23, -126),
    "tf32": (10, -126),
    "float16": (10, -14),
    "bfloat16": (7, -126),
}

# short names accepted wherever a precision is named
ALIASES = {"fp64": "float64", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def canonical(name: str) -> str:
    """The table's name for ``name`` (``"bf16"`` -> ``"bfloat16"``); unknown names unchanged."""
    return ALIASES.get(name, name)


def check_precision(name: str, where: str = "precision") -> str:
    """``name`` in the table's spelling; a ValueError naming ``where`` otherwise."""
    full = canonical(name)
    if full not in PRECISIONS:
        raise ValueError(f"{where}: unknown precision {name!r}; expected one of "
                         f"{sorted(PRECISIONS)} (or {sorted(ALIASES)})")
    return full


def unit_roundoff(precision: str) -> float:
    """Half an ulp of 1: the relative error bound of one rounding to nearest in ``precision``."""
    return 2.0 ** -(PRECISIONS[check_precision(precision)][0] + 1)


def ulp(magnitude: torch.Tensor | float, precision: str) -> torch.Tensor | float:
    """The spacing of ``precision`` numbers at |x| (2^(floor(log2|x|) - mantissa bits),
    the subnormal spacing below the smallest normal, so never 0)."""
    mant, emin = PRECISIONS[check_precision(precision)]
    if not isinstance(magnitude, torch.Tensor):
        m = abs(float(magnitude))
        e = math.frexp(m)[1] - 1 if m > 0 and math.isfinite(m) else emin
        return math.ldexp(1.0, max(e, emin) - mant)
    a = magnitude.abs().to(torch.float64)
    _, e = torch.frexp(a)                      # a = f * 2^e, f in [0.5, 1)  ->  floor(log2 a) = e - 1
    e = torch.where(a > 0, e - 1, torch.full_like(e, emin)).clamp_min(emin)
    return torch.ldexp(torch.ones_like(a), (e - mant).to(torch.float64))


def finer(a: str, b: str) -> str:
    """The finer of two precisions (more mantissa bits; ``b`` on a tie)."""
    return a if PRECISIONS[check_precision(a)][0] > PRECISIONS[check_precision(b)][0] else b


_TORCH_PRECISION = {torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16",
                    torch.float16: "float16"}


def dtype_precision(dtype: torch.dtype) -> str:
    """The precision name of a floating-point torch dtype (ValueError for any other)."""
    name = _TORCH_PRECISION.get(dtype)
    if name is None:
        raise ValueError(f"expected a floating-point dtype (float64/32, bfloat16, float16), got {dtype}")
    return name


def round_tf32(t: torch.Tensor, ties: str = "even") -> torch.Tensor:
    """float32 values rounded to 10 explicit mantissa bits. ``ties="even"``: nearest-even
    (cuBLAS's conversion of an fp32 operand); ``ties="away"``: nearest, ties away from zero
    (Triton's ``cvt.rna.tf32.f32``, what fuseval's kernels round with). NaN and Inf unchanged."""
    x = t.to(torch.float32).contiguous()
    bits = x.view(torch.int32)
    if ties == "even":
        rounded = ((bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF).view(torch.float32)
    elif ties == "away":
        rounded = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    else:
        raise ValueError(f"ties: expected 'even' or 'away', got {ties!r}")
    return torch.where(torch.isfinite(x), rounded, x)


def round_to(t: torch.Tensor, precision: str | None) -> torch.Tensor:
    """``t`` rounded to ``precision`` (nearest-even) and returned in float32 (float64 for
    "float64"). ``None`` leaves the values alone."""
    if precision is None:
        return t
    precision = check_precision(precision)
    if precision == "float64":
        return t.to(torch.float64)
    if precision == "float32":
        return t.to(torch.float32)
    if precision == "tf32":
        return round_tf32(t)
    return t.to({"bfloat16": torch.bfloat16, "float16": torch.float16}[precision]).to(torch.float32)
