"""Bit-level reference implementation of NVFP4 (block-scaled FP4) weights.

This module is the *oracle* for NVFP4 data: every function here is written
for clarity and exactness rather than speed, decodes numbers from their bit
fields with integer operations, and never relies on torch's float8 casts.
All functions take and return torch tensors and work on any device.

Formats
-------
e2m1 (FP4, ``float4_e2m1fn``)
    A 4-bit code ``s ee m``: bit 3 is the sign, bits 2-1 the exponent (bias
    1), bit 0 the mantissa.  Exponent 0 is subnormal (value ``m * 0.5``);
    otherwise the value is ``(1 + m/2) * 2**(e - 1)``.  Codes 0..7 are the
    magnitudes ``0, 0.5, 1, 1.5, 2, 3, 4, 6``; codes 8..15 are their
    negatives (code 8 is -0).  There is no inf and no NaN; encoding
    saturates at +-6.

Packing (``float4_e2m1fn_x2``)
    Two codes per ``uint8``: ``byte = code[..., 2j] | (code[..., 2j+1] << 4)``,
    i.e. the low nibble holds the even column.

e4m3fn (FP8 block scale, ``float8_e4m3fn``)
    An 8-bit code ``s eeee mmm`` with exponent bias 7.  Exponent 0 is
    subnormal (value ``m/8 * 2**-6``, smallest ``2**-9``); otherwise
    ``(1 + m/8) * 2**(e - 7)``.  There are no infinities; the only NaNs are
    ``s 1111 111`` (0x7F and 0xFF), so the largest finite value is
    ``1.75 * 2**8 = 448`` (code 0x7E).  Scales may be negative.

NVFP4 block scaling
    A weight matrix ``W[N, K]`` (``K % 16 == 0``) is stored as packed e2m1
    codes ``[N, K/2]``, e4m3fn block scales ``[N, K/16]`` and one fp32
    ``global_decode_scale``::

        W[n, k] = e2m1(code[n, k]) * e4m3(scale[n, k // 16]) * global_decode_scale

Quantization recipe (used to produce test inputs)
    * ``global_decode_scale = amax(|W|) / (448 * 6)``, rounded to fp32, so
      that the largest block scale lands at the top of the e4m3 range.
      An all-zero ``W`` (or an amax so tiny that this underflows to 0 in
      fp32) gets ``global_decode_scale = 1.0``; its codes and scales are
      then all zero (documented choice: any positive value would do, 1.0 is
      the neutral one and never produces inf/NaN).
    * per 16-element block: ``scale = amax(|block|) / 6 / global_decode_scale``
      rounded to e4m3 (round-to-nearest-even, saturating at 448).
    * ``codes = RNE(W / (scale_decoded * global_decode_scale))`` onto the
      e2m1 grid, saturating at +-6.  A block whose decoded scale is 0 (an
      all-zero block, or one whose scale underflows e4m3) gets codes 0.

Activation quantizer (SOL-ExecBench Quant/028, ``quantize_activations``)
    The benchmark quantizes the activations of its W4A4 GEMM with a quantizer
    of its own whose scale arithmetic is float32; it is part of the operator's
    definition, so it is reproduced here exactly, step by step (SPEC.md,
    op B ``act_quant``): a per-tensor ``global_encode = 2688 / amax`` (fp32),
    per-block ``s = e4m3((block_amax / 6) * global_encode)``, ``encode =
    1 / (s * global_decode)`` and codes from thresholds on ``|x * encode|``.
    Unlike ``quantize_nvfp4`` (float64, exact) every step rounds to float32.

Rounding note
    ``encode_e4m3fn(464.0)`` returns 448 (0x7E), not an overflow: 464 is the
    exact midpoint between 448 (mantissa 110, even) and the next value the
    exponent field could express, 480 (mantissa 111, odd, which is the NaN
    pattern).  Round-to-nearest-even picks 448, and ml_dtypes agrees.  Only
    magnitudes strictly greater than 464 overflow (saturate to 448, or
    become NaN with ``saturate=False``).
"""

from __future__ import annotations

import torch

__all__ = [
    "E2M1_MAX",
    "E4M3_MAX",
    "BLOCK_SIZE",
    "decode_e2m1",
    "encode_e2m1",
    "decode_e4m3fn",
    "encode_e4m3fn",
    "pack_fp4",
    "unpack_fp4",
    "round_to_e2m1_grid",
    "dequantize_nvfp4",
    "quantize_nvfp4",
    "E2M1_THRESHOLDS",
    "ActivationQuant",
    "quantize_activations",
]

E2M1_MAX = 6.0
E4M3_MAX = 448.0
BLOCK_SIZE = 16

# Largest e4m3fn magnitude code (0x7E = 448) and the canonical NaN code.
_E4M3_MAX_CODE = 0x7E
_E4M3_NAN_CODE = 0x7F
# e4m3fn field layout: bias 7, minimum normal exponent 1 - 7 = -6, 3 mantissa bits.
_E4M3_MIN_NORMAL_EXP = -6
_E4M3_MANT_BITS = 3


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _check_integer_codes(name: str, t: torch.Tensor, max_code: int) -> torch.Tensor:
    """Validate an integer code tensor with values in [0, max_code]; return it as int32.

    int32 is used for the bit arithmetic so that shifts and negative checks
    behave the same for every integer input dtype.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer (uint8) code tensor, got dtype {t.dtype}")
    if t.numel() > 0:
        lo = int(t.min())
        hi = int(t.max())
        if lo < 0 or hi > max_code:
            raise ValueError(
                f"{name} must hold codes in 0..{max_code}, got values in [{lo}, {hi}]"
            )
    return t.to(torch.int32)


def _as_float64(name: str, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype.is_complex:
        raise ValueError(f"{name} must be real, got dtype {x.dtype}")
    # Every float format torch has (fp16, bf16, fp32, fp8) converts to float64
    # exactly, so all rounding below happens exactly once, on the true value.
    return x.to(torch.float64)


def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(a)) for finite a >= 0 (int32), computed exactly via frexp.

    frexp writes a = mant * 2**exp with mant in [0.5, 1), hence
    floor(log2(a)) = exp - 1.  frexp(0) reports exp 0, which would place 0
    in the binade [0.5, 1); zero is instead given a very small exponent so
    that callers' clamps put it in the subnormal range (code 0), like every
    other tiny value.
    """
    _, exp = torch.frexp(a)
    e = exp.to(torch.int32) - 1
    return torch.where(a == 0, torch.full_like(e, -1024), e)


# --------------------------------------------------------------------------
# e2m1
# --------------------------------------------------------------------------


def decode_e2m1(codes: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Decode e2m1 codes (integers in 0..15) to floats of ``dtype``.

    Values are decoded from the sign/exponent/mantissa fields.  Code 8
    decodes to -0.0.  Codes outside 0..15 raise ValueError.
    """
    c = _check_integer_codes("codes", codes, 15)
    sign = (c >> 3) & 1
    exp = (c >> 1) & 3
    mant = (c & 1).to(torch.float64)
    # Subnormal (exp == 0): m * 0.5.  Normal: (1 + m/2) * 2**(exp - 1),
    # written as (2 + m) * 2**(exp - 2) so it is one exact ldexp.
    subnormal = mant * 0.5
    normal = torch.ldexp(2.0 + mant, exp - 2)
    mag = torch.where(exp == 0, subnormal, normal)
    # Negate (rather than multiply by a sign factor) so that code 8 gives -0.0.
    value = torch.where(sign == 1, -mag, mag)
    # All e2m1 values are exact in every float dtype, so this cast is exact.
    return value.to(dtype)


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round ``x`` to the nearest e2m1 value (ties to even mantissa) and return uint8 codes.

    Magnitudes above 6 (including inf) saturate to 6.  The sign is kept even
    when the result is zero (``-0.0`` and ``-0.1`` both give code 8).  NaN
    raises ValueError because e2m1 has no NaN encoding.
    """
    x64 = _as_float64("x", x)
    if bool(torch.isnan(x64).any()):
        raise ValueError("encode_e2m1: x contains NaN, which e2m1 cannot represent")
    sign = torch.signbit(x64).to(torch.int32)
    # Saturate first: everything at or beyond 6 maps to the top code, and the
    # clamp also turns inf into a finite number for frexp.
    a = torch.clamp(x64.abs(), max=E2M1_MAX)

    # Binade exponent, clamped to the smallest normal exponent (0): below 1.0
    # the subnormal range has the same spacing (0.5) as the binade [1, 2).
    e = torch.clamp(_floor_log2(a), min=0)
    # One mantissa bit, so the grid spacing inside the binade is 2**(e - 1).
    # Dividing by a power of two is exact; torch.round rounds half to even,
    # and an even multiple of the spacing is exactly an even mantissa bit.
    n = torch.round(torch.ldexp(a, 1 - e)).to(torch.int32)
    # For normal numbers n is 2 + m (hidden bit + mantissa), and the code is
    # (biased exponent << 1) | m = 2*(e + 1) + (n - 2) = 2*e + n.  With the
    # clamp (e = 0) the same formula gives n = code for subnormals.  When
    # rounding carries n up to 4 the formula rolls over into the next
    # binade's code automatically (e.g. 1.75 -> n=4 -> code 4 = 2.0).
    mag_code = 2 * e + n
    return (mag_code | (sign << 3)).to(torch.uint8)


def round_to_e2m1_grid(x: torch.Tensor) -> torch.Tensor:
    """Round ``x`` onto the e2m1 grid (RNE, saturating at +-6), keeping x's float dtype.

    Equivalent to ``decode_e2m1(encode_e2m1(x))``; used to generate
    "fp4 random inputs" such as ``round_to_e2m1_grid(torch.randn(...))``.
    Non-float inputs come back as float64.
    """
    dtype = x.dtype if x.dtype.is_floating_point else torch.float64
    return decode_e2m1(encode_e2m1(x), dtype=dtype)


# --------------------------------------------------------------------------
# e4m3fn
# --------------------------------------------------------------------------


def decode_e4m3fn(bits: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Decode e4m3fn bit patterns to floats of ``dtype``.

    ``bits`` is a uint8 tensor (any integer dtype with values in 0..255 is
    accepted) or a ``torch.float8_e4m3fn`` tensor, which is reinterpreted as
    its uint8 bits (never converted through torch's float8 cast).  0x7F and
    0xFF decode to NaN; 0x80 decodes to -0.0.
    """
    if isinstance(bits, torch.Tensor) and bits.dtype == torch.float8_e4m3fn:
        bits = bits.view(torch.uint8)
    b = _check_integer_codes("bits", bits, 255)
    sign = (b >> 7) & 1
    exp = (b >> 3) & 0xF
    mant = (b & 0x7).to(torch.float64)
    # Subnormal: m/8 * 2**-6 = m * 2**-9.  Normal: (1 + m/8) * 2**(e - 7)
    # = (8 + m) * 2**(e - 10).  Both products are exact in float64.
    subnormal = torch.ldexp(mant, torch.full_like(exp, -9))
    normal = torch.ldexp(8.0 + mant, exp - 10)
    mag = torch.where(exp == 0, subnormal, normal)
    # e4m3fn spends the all-ones exponent on normal numbers; only the
    # all-ones exponent *and* mantissa pattern is NaN.
    mag = torch.where((b & 0x7F) == _E4M3_NAN_CODE, torch.full_like(mag, float("nan")), mag)
    value = torch.where(sign == 1, -mag, mag)
    # e4m3 values need 4 significant bits and exponents down to 2**-9, which
    # every torch float dtype (fp16, bf16, fp32, fp64) holds exactly.
    return value.to(dtype)


def encode_e4m3fn(x: torch.Tensor, saturate: bool = True) -> torch.Tensor:
    """Round ``x`` to e4m3fn (round-to-nearest-even, with subnormals) and return uint8 bits.

    Magnitudes that round above 448 (i.e. strictly greater than 464, plus
    inf) become +-448 if ``saturate`` else the NaN code with x's sign
    (0x7F / 0xFF).  NaN inputs give 0x7F.  Zero results keep the sign of x.
    """
    x64 = _as_float64("x", x)
    is_nan = torch.isnan(x64)
    sign = torch.signbit(x64).to(torch.int32)
    # Any magnitude >= 480 is an overflow whatever the rounding, so clamping
    # to 1024 changes no result but keeps inf/huge values away from frexp
    # and the int32 conversion below.  NaN is replaced by 0 and patched last.
    a = torch.clamp(torch.where(is_nan, torch.zeros_like(x64), x64.abs()), max=1024.0)

    # Binade exponent, clamped to the minimum normal exponent (-6): the
    # subnormal range [0, 2**-6) shares its spacing 2**-9 with [2**-6, 2**-5).
    e = torch.clamp(_floor_log2(a), min=_E4M3_MIN_NORMAL_EXP)
    # Three mantissa bits -> spacing 2**(e - 3).  Scaling by a power of two
    # is exact, and torch.round is round-half-to-even on the exact quotient,
    # which is exactly RNE on the mantissa (even n <=> even last mantissa bit).
    n = torch.round(torch.ldexp(a, _E4M3_MANT_BITS - e)).to(torch.int32)
    # Normal: n = 8 + m and code = (e + 7) << 3 | m = 8*(e + 6) + n.
    # Subnormal (e clamped to -6): code = n (= m, or 8 = smallest normal
    # when rounding carries).  A carry out of the mantissa (n == 16) also
    # rolls over into the next exponent automatically.
    mag_code = 8 * (e - _E4M3_MIN_NORMAL_EXP) + n
    # Codes above 0x7E are either the NaN pattern (value 480 after rounding)
    # or beyond the exponent field: both are overflows.
    overflow = mag_code > _E4M3_MAX_CODE
    overflow_code = _E4M3_MAX_CODE if saturate else _E4M3_NAN_CODE
    mag_code = torch.where(overflow, torch.full_like(mag_code, overflow_code), mag_code)
    code = mag_code | (sign << 7)
    code = torch.where(is_nan, torch.full_like(code, _E4M3_NAN_CODE), code)
    return code.to(torch.uint8)


# --------------------------------------------------------------------------
# packing
# --------------------------------------------------------------------------


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack e2m1 codes ``[..., 2K]`` (uint8, 0..15) into bytes ``[..., K]``.

    ``byte = codes[..., 2j] | (codes[..., 2j+1] << 4)``: the even column goes
    into the low nibble (the float4_e2m1fn_x2 layout).
    """
    if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
        got = codes.dtype if isinstance(codes, torch.Tensor) else type(codes).__name__
        raise ValueError(f"pack_fp4: codes must be a uint8 tensor, got {got}")
    if codes.dim() == 0 or codes.shape[-1] % 2 != 0:
        raise ValueError(
            f"pack_fp4: codes must have an even last dimension, got shape {tuple(codes.shape)}"
        )
    _check_integer_codes("codes", codes, 15)
    lo = codes[..., 0::2]
    hi = codes[..., 1::2]
    return lo | (hi << 4)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Unpack bytes ``[..., K]`` into e2m1 codes ``[..., 2K]`` (inverse of pack_fp4)."""
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        got = packed.dtype if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise ValueError(f"unpack_fp4: packed must be a uint8 tensor, got {got}")
    if packed.dim() == 0:
        raise ValueError("unpack_fp4: packed must have at least one dimension, got shape ()")
    lo = packed & 0xF
    hi = packed >> 4
    # Interleave: stack on a new last axis then merge, giving lo0, hi0, lo1, hi1, ...
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], 2 * packed.shape[-1])


# --------------------------------------------------------------------------
# NVFP4 block scaling
# --------------------------------------------------------------------------


def _global_scale_tensor(global_decode_scale, device: torch.device) -> torch.Tensor:
    """Turn a python number or a 0-d/1-element tensor into a 0-d float64 tensor."""
    if isinstance(global_decode_scale, torch.Tensor):
        if global_decode_scale.numel() != 1:
            raise ValueError(
                "global_decode_scale must be a python float or a 0-d/1-element tensor, "
                f"got a tensor of shape {tuple(global_decode_scale.shape)}"
            )
        return global_decode_scale.detach().to(device=device, dtype=torch.float64).reshape(())
    if isinstance(global_decode_scale, (int, float)) and not isinstance(global_decode_scale, bool):
        return torch.tensor(float(global_decode_scale), dtype=torch.float64, device=device)
    raise ValueError(
        "global_decode_scale must be a python float or a 0-d/1-element tensor, "
        f"got {type(global_decode_scale).__name__}"
    )


def dequantize_nvfp4(
    packed: torch.Tensor,
    scales: torch.Tensor,
    global_decode_scale,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Reconstruct ``W[N, K]`` from packed e2m1 codes, e4m3fn block scales and a global scale.

    ``packed`` is uint8 ``[N, K/2]`` (leading batch dims are allowed:
    ``[..., K/2]``), ``scales`` is uint8 bits or ``torch.float8_e4m3fn`` of
    shape ``[N, K/16]``, ``global_decode_scale`` a python float or a
    0-d/1-element tensor.  ``W[n, k] = e2m1(code[n, k]) * e4m3(scale[n, k//16])
    * global_decode_scale``, returned in ``dtype``.  A NaN scale code makes
    exactly its 16 outputs NaN.
    """
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.uint8:
        got = packed.dtype if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise ValueError(f"packed: expected dtype torch.uint8, got {got}")
    if not isinstance(scales, torch.Tensor) or scales.dtype not in (torch.uint8, torch.float8_e4m3fn):
        got = scales.dtype if isinstance(scales, torch.Tensor) else type(scales).__name__
        raise ValueError(f"scales: expected dtype torch.uint8 or torch.float8_e4m3fn, got {got}")
    if packed.dim() == 0:
        raise ValueError("packed: expected shape [N, K/2], got a 0-d tensor")
    k = 2 * packed.shape[-1]
    if k % BLOCK_SIZE != 0:
        raise ValueError(
            f"packed: expected last dimension K/2 with K a multiple of {BLOCK_SIZE}, "
            f"got shape {tuple(packed.shape)} (K = {k})"
        )
    expected = tuple(packed.shape[:-1]) + (k // BLOCK_SIZE,)
    if tuple(scales.shape) != expected:
        raise ValueError(
            f"scales: expected shape {expected} (one scale per {BLOCK_SIZE} columns of "
            f"packed {tuple(packed.shape)}), got {tuple(scales.shape)}"
        )
    g = _global_scale_tensor(global_decode_scale, packed.device)

    values = decode_e2m1(unpack_fp4(packed), dtype=torch.float64)
    block_scales = decode_e4m3fn(scales, dtype=torch.float64)
    # Column k uses block k // 16: repeat each scale 16 times along the last axis.
    per_column = torch.repeat_interleave(block_scales, BLOCK_SIZE, dim=-1)
    # The product is exact in float64: e2m1 has 2 significant bits, e4m3 has
    # 4 and an fp32 global scale 24, so at most 30 bits, far below 53 (and
    # the exponent range is nowhere near float64's limits).  The only
    # rounding is therefore the final cast to ``dtype``.
    return (values * per_column * g).to(dtype)


def quantize_nvfp4(
    w: torch.Tensor, global_decode_scale=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize ``w [N, K]`` (K % 16 == 0) to NVFP4 with the recipe in the module docstring.

    Returns ``(packed, scales, global_decode_scale)``: packed uint8
    ``[N, K/2]``, scales ``torch.float8_e4m3fn [N, K/16]`` (built from uint8
    bits by a view, no float8 cast), and the fp32 0-d global decode scale.
    ``global_decode_scale`` overrides the recipe's value; it is rounded to
    fp32 first (that is what is returned and what is used), and must be
    finite and > 0.  Leading batch dims (``[..., K]``) are accepted too.
    All arithmetic is done in float64.
    """
    if not isinstance(w, torch.Tensor) or not w.dtype.is_floating_point:
        got = w.dtype if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"w: expected a floating-point tensor of shape [N, K], got {got}")
    if w.dim() == 0 or w.shape[-1] % BLOCK_SIZE != 0:
        raise ValueError(
            f"w: expected shape [N, K] with K a multiple of {BLOCK_SIZE}, got shape {tuple(w.shape)}"
        )
    w64 = w.detach().to(torch.float64)
    if not bool(torch.isfinite(w64).all()):
        raise ValueError("w: contains NaN or inf, which NVFP4 cannot represent")

    if global_decode_scale is None:
        amax = w64.abs().max() if w64.numel() > 0 else torch.zeros((), dtype=torch.float64)
        g32 = (amax / (E4M3_MAX * E2M1_MAX)).to(torch.float32)
        # All-zero w (or an fp32 underflow of a denormally tiny amax): any
        # positive scale would do; 1.0 is the documented choice.
        g32 = torch.where(g32 > 0, g32, torch.ones_like(g32))
        if not bool(torch.isfinite(g32)):
            raise ValueError(
                f"w: amax(|w|) = {float(amax)!r} is too large for an fp32 global_decode_scale"
            )
    else:
        g32 = _global_scale_tensor(global_decode_scale, w.device).to(torch.float32)
        if not (bool(torch.isfinite(g32)) and float(g32) > 0):
            raise ValueError(
                f"global_decode_scale: expected a finite value > 0 (after rounding to fp32), "
                f"got {float(g32)!r}"
            )
    g32 = g32.to(w.device).reshape(())
    g = g32.to(torch.float64)

    blocks = w64.reshape(*w64.shape[:-1], w64.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    block_amax = blocks.abs().amax(dim=-1)
    # amax / 6 / g written as amax / (6 * g): 6 * g is exact in float64, so
    # the target scale is rounded once in float64 and once to e4m3.
    scale_bits = encode_e4m3fn(block_amax / (E2M1_MAX * g), saturate=True)
    scale_dec = decode_e4m3fn(scale_bits)  # >= 0 and finite by construction

    # scale_dec * g is exact in float64 (4 + 24 significant bits), so the
    # element is rounded once in float64 and once onto the e2m1 grid.  A zero
    # decoded scale (zero block, or a block scale that underflows e4m3)
    # would divide by zero: use 1 there and force those codes to 0 below.
    zero_scale = (scale_dec == 0).unsqueeze(-1)
    denom = torch.where(zero_scale, torch.ones_like(blocks), (scale_dec * g).unsqueeze(-1))
    codes = encode_e2m1(blocks / denom)
    codes = torch.where(zero_scale, torch.zeros_like(codes), codes)
    codes = codes.reshape(w64.shape)

    packed = pack_fp4(codes)
    scales = scale_bits.view(torch.float8_e4m3fn)
    return packed, scales, g32


# --------------------------------------------------------------------------
# the benchmark's activation quantizer (float32 scale arithmetic)
# --------------------------------------------------------------------------

# (boundary, tie goes up): |y| > b (or >= b where the tie goes up) adds one to the
# magnitude code. The ties are those of round-to-nearest-even on the e2m1 grid:
# 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
E2M1_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True),
                   (2.5, False), (3.5, True), (5.0, False))

_F32_MAX = torch.finfo(torch.float32).max


class ActivationQuant:
    """The output of :func:`quantize_activations` for ``x [..., K]``.

    ``codes``: uint8 e2m1 codes ``[..., K]`` (unpacked; ``packed`` packs them),
    ``scales``: uint8 e4m3fn bits ``[..., K/16]``, ``global_decode`` and
    ``global_encode``: 0-d float32 tensors."""

    def __init__(self, codes, scales, global_decode, global_encode):
        self.codes, self.scales = codes, scales
        self.global_decode, self.global_encode = global_decode, global_encode

    @property
    def packed(self) -> torch.Tensor:
        return pack_fp4(self.codes)

    def dequantize(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """x_hat = e2m1(code) * e4m3(scale) * global_decode, exact in float64, then ``dtype``."""
        g = self.global_decode.to(torch.float64)
        return (self.scaled_codes() * (g if g.dim() == 0 else g.reshape(*g.shape[:-1], 1))).to(dtype)

    def scaled_codes(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """e2m1(code) * e4m3(scale) without the global scale (exact in bf16 and wider:
        at most 6 significant bits, magnitudes in [2^-10, 2688])."""
        return dequantize_nvfp4(self.packed, self.scales, 1.0, dtype)


def _f32(value, device) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=device)


def quantize_activations(x: torch.Tensor, *, amax_over: str = "tensor") -> ActivationQuant:
    """The benchmark's NVFP4 activation quantizer (SPEC.md, op B stage ``act_quant``).

    ``x [..., K]`` (any float dtype, K % 16 == 0) is taken as float32; every step
    below is one float32 operation, rounded as IEEE float32 rounds it:

    1. ``amax = max |x|`` over the whole tensor;
    2. ``global_encode = 2688 / amax`` clamped to the float32 max, 1.0 if it is 0;
       ``global_decode = 1 / global_encode``;
    3. per block of 16: ``s = (block_amax / 6) * global_encode`` clamped to
       [-448, 448] and rounded to e4m3fn (nearest even). The division by 6 is computed
       as the benchmark computes it on the GPU, where it runs: torch's CUDA kernel divides
       a tensor by a Python number by multiplying with the float32 reciprocal, so
       ``block_amax * fl32(1/6)`` (on the CPU torch divides exactly; the two differ in
       about one block scale per million);
    4. ``encode = 1 / (e4m3(s) * global_decode)`` clamped to the float32 max;
    5. ``y = x * encode`` clamped to [-6, 6]; the magnitude code counts the
       thresholds of ``E2M1_THRESHOLDS`` that ``|y|`` passes, and ``y < 0`` sets
       the sign bit (so -0.0 gives code 0, y in [-0.25, 0) gives code 8, and a
       NaN gives code 0: every comparison with NaN is false).

    ``amax_over="token"`` is a deliberately wrong variant (an amax per row instead
    of per tensor) kept for mutation tests; it returns one global scale per row."""
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x: expected a floating-point tensor [..., K], got {got}")
    if x.dim() == 0 or x.shape[-1] % BLOCK_SIZE != 0:
        raise ValueError(f"x: expected shape [..., K] with K a multiple of {BLOCK_SIZE}, "
                         f"got shape {tuple(x.shape)}")
    if amax_over not in ("tensor", "token"):
        raise ValueError(f"amax_over: expected 'tensor' or 'token', got {amax_over!r}")
    dev = x.device
    xf = x.detach().to(torch.float32)
    f32_max = _f32(_F32_MAX, dev)

    # 1-2. the global scales (one per tensor; per row for the mutant)
    if amax_over == "tensor":
        amax = xf.abs().max() if xf.numel() else _f32(0.0, dev)
    else:
        amax = xf.abs().amax(dim=-1, keepdim=True)
    global_encode = torch.minimum(_f32(E4M3_MAX * E2M1_MAX, dev) / amax, f32_max)
    global_encode = torch.where(global_encode == 0, _f32(1.0, dev), global_encode)
    global_decode = _f32(1.0, dev) / global_encode

    # 3. block scales: two float32 roundings, then one to e4m3
    blocks = xf.reshape(*xf.shape[:-1], xf.shape[-1] // BLOCK_SIZE, BLOCK_SIZE)
    block_amax = blocks.abs().amax(dim=-1)
    s = (block_amax * _f32(1.0 / E2M1_MAX, dev)) * global_encode
    s = torch.clamp(s, -E4M3_MAX, E4M3_MAX)
    scale_bits = encode_e4m3fn(s, saturate=True)
    s_dec = decode_e4m3fn(scale_bits, dtype=torch.float32)

    # 4. encode scale: the product rounded to float32, then its reciprocal (1/0 = inf -> max)
    encode = torch.minimum(_f32(1.0, dev) / (s_dec * global_decode), f32_max)

    # 5. codes by thresholds on |y|
    y = torch.clamp(blocks * encode.unsqueeze(-1), -E2M1_MAX, E2M1_MAX)
    a = y.abs()
    mag = torch.zeros(y.shape, dtype=torch.uint8, device=dev)
    for boundary, tie_up in E2M1_THRESHOLDS:
        mag += (a >= boundary if tie_up else a > boundary).to(torch.uint8)
    codes = mag | ((y < 0).to(torch.uint8) << 3)
    return ActivationQuant(codes.reshape(xf.shape), scale_bits, global_decode, global_encode)
