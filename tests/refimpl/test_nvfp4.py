"""Tests for fuseval.refimpl.nvfp4 (bit-level NVFP4 reference).

The independent oracle is ml_dtypes (float4_e2m1fn / float8_e4m3fn).  Known
ml_dtypes behaviours these tests rely on, pinned in ``test_ml_dtypes_behaviour``:
  * before 0.7 its casts *from float64* round through float32 first (double
    rounding: float64 nextafter(0.25, 1) -> e2m1 0.0, although it is above the
    tie; 0.7 rounds once), so the oracle is only fed float32 values, where a
    float32 -> fp4/fp8 cast is a single correct RNE.  float64 near-ties are
    checked with hand-written expected codes instead;
  * float8_e4m3fn overflow gives NaN (keeping the sign: 0x7F/0xFF), so
    encode_e4m3fn is compared with saturate=False there;
  * 464 (the midpoint between 448 and the unrepresentable 480) rounds to 448;
  * float4_e2m1fn saturates at +-6 (inf too).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fuseval.refimpl.nvfp4 import (
    BLOCK_SIZE,
    E2M1_MAX,
    E4M3_MAX,
    decode_e2m1,
    decode_e4m3fn,
    dequantize_nvfp4,
    encode_e2m1,
    encode_e4m3fn,
    pack_fp4,
    quantize_nvfp4,
    round_to_e2m1_grid,
    unpack_fp4,
)

F4 = ml_dtypes.float4_e2m1fn
F8 = ml_dtypes.float8_e4m3fn


# ---------------------------------------------------------------- oracles


def ml_e2m1_decode(codes: np.ndarray) -> np.ndarray:
    return np.asarray(codes, dtype=np.uint8).view(F4).astype(np.float64)


def ml_e4m3_decode(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint8).view(F8).astype(np.float64)


def _as_f32_exact(x) -> np.ndarray:
    # ml_dtypes double-rounds float64 inputs through float32, so only exact
    # float32 values may be given to the oracle.
    x = np.asarray(x)
    x32 = x.astype(np.float32)
    with np.errstate(invalid="ignore"):
        same = (x32.astype(np.float64) == x.astype(np.float64)) | np.isnan(x)
    assert same.all(), "oracle input must be exactly representable in float32"
    return x32


def ml_e2m1_encode(x) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _as_f32_exact(x).astype(F4).view(np.uint8)


def ml_e4m3_encode(x) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _as_f32_exact(x).astype(F8).view(np.uint8)


def t64(a) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float64).copy())


def assert_same_floats(got: np.ndarray, want: np.ndarray) -> None:
    """Bit-level float comparison: equal values, same NaN positions, same zero signs."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok])
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))


E2M1_POS_GRID = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float64)


def e4m3_positive_finite() -> np.ndarray:
    vals = ml_e4m3_decode(np.arange(0x7F, dtype=np.uint8))  # 0x00..0x7E
    assert np.all(np.diff(vals) > 0)
    return vals


def probe_values(grid: np.ndarray, rng: np.random.Generator, lo_exp: float, hi_exp: float, n: int):
    """float32 probes: grid points, exact midpoints (ties), midpoints +- 1 float32 ulp,
    and random magnitudes; both signs."""
    grid = grid.astype(np.float32)
    mids = (grid[:-1] + grid[1:]) / np.float32(2)  # exact: few significant bits
    inf32 = np.float32(np.inf)
    parts = [
        grid,
        mids,
        np.nextafter(mids, inf32),
        np.nextafter(mids, -inf32),
        (np.exp2(rng.uniform(lo_exp, hi_exp, n)) * rng.uniform(1, 2, n)).astype(np.float32),
        (rng.standard_normal(n) * 3).astype(np.float32),
        np.zeros(1, np.float32),
    ]
    pos = np.abs(np.concatenate(parts))
    return np.concatenate([pos, -pos])


# ---------------------------------------------------------------- ml_dtypes itself


def test_ml_dtypes_behaviour():
    # Pin the oracle behaviours documented in the module docstring.
    up64 = np.nextafter(np.array([0.25]), 1.0)  # just above the 0 / 0.5 tie
    up32 = np.nextafter(np.array([0.25], np.float32), np.float32(1))
    # ml_dtypes before 0.7 casts float64 through float32 (double rounding: code 0); 0.7 rounds
    # the float64 value once (code 1). The comparisons below feed it float32 values only.
    version = tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2])
    assert up64.astype(F4).view(np.uint8).tolist() == ([0] if version < (0, 7) else [1])
    assert up32.astype(F4).view(np.uint8).tolist() == [1]  # correct from float32
    assert encode_e2m1(t64(up64)).tolist() == [1]  # we round the float64 value once
    above_464 = np.nextafter(np.float32(464), np.float32(np.inf))
    assert list(ml_e4m3_encode(np.array([448.0, 460.0, 464.0, above_464, 500.0, -500.0]))) == [
        0x7E, 0x7E, 0x7E, 0x7F, 0x7F, 0xFF,
    ]
    assert list(ml_e2m1_encode(np.array([7.0, 100.0, np.inf, -np.inf]))) == [7, 7, 7, 15]


# ---------------------------------------------------------------- e2m1


def test_decode_e2m1_all_codes_match_ml_dtypes():
    codes = np.arange(16, dtype=np.uint8)
    got = decode_e2m1(torch.from_numpy(codes)).numpy()
    assert_same_floats(got, ml_e2m1_decode(codes))
    assert list(got[:8]) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert got[7] == E2M1_MAX and got[15] == -E2M1_MAX
    assert got[8] == 0 and np.signbit(got[8])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_decode_e2m1_dtype(dtype):
    codes = torch.arange(16, dtype=torch.uint8)
    got = decode_e2m1(codes, dtype=dtype)
    assert got.dtype == dtype
    assert torch.equal(got.double(), decode_e2m1(codes))


def test_decode_e2m1_rejects_out_of_range():
    with pytest.raises(ValueError, match="codes"):
        decode_e2m1(torch.tensor([3, 16], dtype=torch.uint8))
    with pytest.raises(ValueError, match="codes"):
        decode_e2m1(torch.tensor([1.0]))


@pytest.mark.parametrize(
    "x, want",
    [
        (0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0),
        (0.2499, 0.0), (0.2501, 0.5), (5.0001, 6.0), (6.0, 6.0), (7.0, 6.0), (1e30, 6.0),
        (float("inf"), 6.0),
    ],
)
def test_encode_e2m1_ties_and_saturation(x, want):
    for sign in (1.0, -1.0):
        got = decode_e2m1(encode_e2m1(torch.tensor([sign * x], dtype=torch.float64)))
        assert got.item() == sign * want
        assert bool(torch.signbit(got)) == (sign < 0)


def test_encode_e2m1_float64_near_ties():
    # float64 values one ulp off a tie: rounded once, in float64 (the oracle can't do this).
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    below = encode_e2m1(t64(np.nextafter(ties, 0.0))).tolist()
    above = encode_e2m1(t64(np.nextafter(ties, 9.0))).tolist()
    assert below == [0, 1, 2, 3, 4, 5, 6]
    assert above == [1, 2, 3, 4, 5, 6, 7]


def test_encode_e4m3fn_float64_near_ties():
    grid = e4m3_positive_finite()
    mids = (grid[:-1] + grid[1:]) / 2
    codes = np.arange(0x7E)
    assert encode_e4m3fn(t64(np.nextafter(mids, 0.0))).tolist() == codes.tolist()
    assert encode_e4m3fn(t64(np.nextafter(mids, 1e9))).tolist() == (codes + 1).tolist()
    assert encode_e4m3fn(t64([np.nextafter(464.0, 1e9)]), saturate=False).tolist() == [0x7F]


def test_encode_e2m1_signed_zero():
    codes = encode_e2m1(torch.tensor([0.0, -0.0, -0.1, 0.1], dtype=torch.float64))
    assert codes.tolist() == [0, 8, 8, 0]


def test_encode_e2m1_matches_ml_dtypes():
    rng = np.random.default_rng(0)
    x = probe_values(E2M1_POS_GRID, rng, -6, 4, 5000)
    x = np.concatenate([x, np.array([7.0, -7.0, 1e30, -1e30, np.inf, -np.inf], np.float32)])
    got = encode_e2m1(t64(x)).numpy()
    np.testing.assert_array_equal(got, ml_e2m1_encode(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_encode_e2m1_low_precision_inputs(dtype):
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    got = encode_e2m1(x).numpy()
    np.testing.assert_array_equal(got, ml_e2m1_encode(x.double().numpy()))


def test_encode_e2m1_nan_raises():
    with pytest.raises(ValueError, match="NaN"):
        encode_e2m1(torch.tensor([1.0, float("nan")]))


def test_e2m1_round_trip_all_codes():
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(encode_e2m1(decode_e2m1(codes)), codes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_round_to_e2m1_grid(dtype):
    x = (torch.randn(1000, generator=torch.Generator().manual_seed(2)) * 4).to(dtype)
    r = round_to_e2m1_grid(x)
    assert r.dtype == dtype and r.shape == x.shape
    assert torch.equal(r, decode_e2m1(encode_e2m1(x), dtype=dtype))
    assert set(r.abs().double().unique().tolist()) <= set(E2M1_POS_GRID.tolist())
    # idempotent
    assert torch.equal(round_to_e2m1_grid(r), r)


# ---------------------------------------------------------------- e4m3fn


def test_decode_e4m3fn_all_codes_match_ml_dtypes():
    bits = np.arange(256, dtype=np.uint8)
    want = ml_e4m3_decode(bits)
    got = decode_e4m3fn(torch.from_numpy(bits)).numpy()
    assert_same_floats(got, want)
    assert np.flatnonzero(np.isnan(got)).tolist() == [0x7F, 0xFF]
    assert got[0x7E] == E4M3_MAX and got[0xFE] == -E4M3_MAX
    assert got[0x01] == 2.0**-9 and got[0x07] == 7 * 2.0**-9 and got[0x08] == 2.0**-6
    assert got[0x80] == 0 and np.signbit(got[0x80])
    # float8_e4m3fn input is reinterpreted bit-for-bit
    got_f8 = decode_e4m3fn(torch.from_numpy(bits).view(torch.float8_e4m3fn)).numpy()
    assert_same_floats(got_f8, want)


def test_decode_e4m3fn_dtype_and_errors():
    bits = torch.arange(256, dtype=torch.uint8)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        got = decode_e4m3fn(bits, dtype=dtype)
        assert got.dtype == dtype
        assert_same_floats(got.double().numpy(), decode_e4m3fn(bits).numpy())
    with pytest.raises(ValueError, match="bits"):
        decode_e4m3fn(torch.tensor([256], dtype=torch.int32))
    with pytest.raises(ValueError, match="bits"):
        decode_e4m3fn(torch.tensor([1.0]))


def test_encode_e4m3fn_matches_ml_dtypes_nonsaturating():
    rng = np.random.default_rng(3)
    grid = e4m3_positive_finite()
    x = probe_values(grid, rng, -14, 10, 20000)
    # Overflow region and specials: ml_dtypes gives NaN on overflow.
    above_464 = np.nextafter(np.float32(464), np.float32(np.inf))
    special = np.array([448, 460, 464, above_464, 479, 480, 500, 1e6, 1e30, np.inf], np.float32)
    tiny = (2.0 ** -np.arange(8, 12, 0.25)).astype(np.float32)
    x = np.concatenate([x, special, -special, tiny, -tiny, np.array([np.nan], np.float32)])
    got = encode_e4m3fn(t64(x), saturate=False).numpy()
    want = ml_e4m3_encode(x)
    want_nan = np.isnan(want.view(F8).astype(np.float64))
    got_nan = np.isnan(decode_e4m3fn(torch.from_numpy(got)).numpy())
    np.testing.assert_array_equal(got_nan, want_nan)
    # Non-NaN inputs: identical bits (overflow NaNs keep the sign in both).
    ok = ~np.isnan(x)
    np.testing.assert_array_equal(got[ok], want[ok])
    assert got[np.isnan(x)].tolist() == [0x7F]


def test_encode_e4m3fn_saturating():
    x = torch.tensor([448.0, 460.0, 464.0, 464.001, 479.0, 480.0, 1e6, float("inf")], dtype=torch.float64)
    assert encode_e4m3fn(x).tolist() == [0x7E] * 8
    assert encode_e4m3fn(-x).tolist() == [0xFE] * 8
    assert encode_e4m3fn(torch.tensor([float("nan")])).tolist() == [0x7F]
    # 464 is a tie that RNE sends to 448 (even mantissa), not an overflow
    assert encode_e4m3fn(torch.tensor([464.0]), saturate=False).tolist() == [0x7E]
    assert encode_e4m3fn(torch.tensor([464.001]), saturate=False).tolist() == [0x7F]
    # Below the overflow threshold saturate=True agrees with ml_dtypes exactly.
    rng = np.random.default_rng(4)
    v = rng.uniform(-464, 464, 10000).astype(np.float32)
    np.testing.assert_array_equal(encode_e4m3fn(t64(v), saturate=True).numpy(), ml_e4m3_encode(v))


def test_encode_e4m3fn_ties_and_subnormals():
    cases = {
        2.0**-10: 0x00,  # half the smallest subnormal: tie -> 0 (even)
        3 * 2.0**-10: 0x02,  # between 1 and 2 (x 2^-9): tie -> 2 (even)
        5 * 2.0**-10: 0x02,  # between 2 and 3: tie -> 2
        15 * 2.0**-10: 0x08,  # between 7 * 2^-9 and 2^-6: carries into the first normal
        1.0 + 2.0**-4: 0x38,  # midpoint 1 .. 1.125: tie -> 1.0
        1.0 + 3 * 2.0**-4: 0x3A,  # midpoint 1.125 .. 1.25: tie -> 1.25
        1.9375: 0x40,  # midpoint 1.875 .. 2: tie -> 2 (exponent carry)
        2.0**-11: 0x00,
    }
    x = torch.tensor(list(cases), dtype=torch.float64)
    assert encode_e4m3fn(x).tolist() == list(cases.values())
    assert encode_e4m3fn(-x).tolist() == [c | 0x80 for c in cases.values()]


def test_encode_e4m3fn_low_precision_inputs_and_torch_cast():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4096, generator=g, dtype=torch.float32) * torch.exp2(
        torch.randint(-12, 8, (4096,), generator=g).float()
    )
    got = encode_e4m3fn(x)
    np.testing.assert_array_equal(got.numpy(), ml_e4m3_encode(x.double().numpy()))
    # A second oracle (only for finite, in-range values): torch's own cast.
    inrange = x.abs() <= E4M3_MAX
    assert torch.equal(got[inrange], x[inrange].to(torch.float8_e4m3fn).view(torch.uint8))


def test_e4m3fn_round_trip_all_codes():
    bits = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    assert torch.equal(encode_e4m3fn(decode_e4m3fn(bits)), bits)
    assert torch.equal(encode_e4m3fn(decode_e4m3fn(bits), saturate=False), bits)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, width=32), min_size=1, max_size=32))
def test_encode_e4m3fn_hypothesis(values):
    x = np.array(values, dtype=np.float64)
    np.testing.assert_array_equal(encode_e4m3fn(t64(x), saturate=False).numpy(), ml_e4m3_encode(x))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, width=32), min_size=1, max_size=32))
def test_encode_e2m1_hypothesis(values):
    x = np.array(values, dtype=np.float64)
    np.testing.assert_array_equal(encode_e2m1(t64(x)).numpy(), ml_e2m1_encode(x))


# ---------------------------------------------------------------- packing


def test_pack_nibble_order_hand_built():
    codes = torch.tensor([[1, 2, 3, 4], [15, 0, 8, 7]], dtype=torch.uint8)
    packed = pack_fp4(codes)
    # low nibble = even column
    assert packed.tolist() == [[0x21, 0x43], [0x0F, 0x78]]
    assert torch.equal(unpack_fp4(packed), codes)


def test_pack_unpack_round_trip():
    g = torch.Generator().manual_seed(6)
    for shape in [(2,), (3, 8), (2, 3, 32)]:
        codes = torch.randint(0, 16, shape, generator=g, dtype=torch.uint8)
        packed = pack_fp4(codes)
        assert packed.shape == (*shape[:-1], shape[-1] // 2)
        assert torch.equal(unpack_fp4(packed), codes)
    all_bytes = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(pack_fp4(unpack_fp4(all_bytes)), all_bytes)


def test_pack_errors():
    with pytest.raises(ValueError, match=r"\(2, 3\)"):
        pack_fp4(torch.zeros(2, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="codes"):
        pack_fp4(torch.zeros(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="codes"):
        pack_fp4(torch.full((2,), 16, dtype=torch.uint8))
    with pytest.raises(ValueError, match="packed"):
        unpack_fp4(torch.zeros(2, 4, dtype=torch.int64))


# ---------------------------------------------------------------- dequantize


def naive_dequantize(packed: torch.Tensor, scale_bits: torch.Tensor, g: float) -> np.ndarray:
    """Element-by-element reference written straight from the spec, decoding via ml_dtypes."""
    p = packed.numpy()
    s = scale_bits.numpy()
    n_rows, half_k = p.shape
    out = np.empty((n_rows, 2 * half_k), dtype=np.float64)
    for n in range(n_rows):
        for k in range(2 * half_k):
            byte = int(p[n, k // 2])
            code = (byte >> 4) if k % 2 else (byte & 0xF)
            out[n, k] = (
                ml_e2m1_decode(np.array([code]))[0] * ml_e4m3_decode(np.array([s[n, k // 16]]))[0] * g
            )
    return out


def random_nvfp4(seed: int, n: int = 4, k: int = 64, allow_nan_scales: bool = False):
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(0, 256, (n, k // 16), generator=g, dtype=torch.uint8)
    if not allow_nan_scales:
        scales = torch.where((scales & 0x7F) == 0x7F, scales - 1, scales)
    return packed, scales


def test_dequantize_matches_naive_reference():
    packed, scales = random_nvfp4(7)
    gs = 0.3125
    want = naive_dequantize(packed, scales, gs)
    got = dequantize_nvfp4(packed, scales, gs)
    assert got.dtype == torch.float64
    assert_same_floats(got.numpy(), want)
    # same result with float8 scales, a 0-d or 1-element tensor global scale
    assert_same_floats(dequantize_nvfp4(packed, scales.view(torch.float8_e4m3fn), gs).numpy(), want)
    assert_same_floats(dequantize_nvfp4(packed, scales, torch.tensor(gs)).numpy(), want)
    assert_same_floats(dequantize_nvfp4(packed, scales, torch.tensor([gs])).numpy(), want)
    # dtype argument: one rounding from the exact float64 result
    got32 = dequantize_nvfp4(packed, scales, gs, dtype=torch.float32)
    assert got32.dtype == torch.float32 and torch.equal(got32, got.float())


def test_negative_scale_flips_sign():
    packed = pack_fp4(torch.arange(16, dtype=torch.uint8).reshape(1, 16))
    pos = dequantize_nvfp4(packed, torch.tensor([[0x38]], dtype=torch.uint8), 1.0)  # +1.0
    neg = dequantize_nvfp4(packed, torch.tensor([[0xB8]], dtype=torch.uint8), 1.0)  # -1.0
    assert torch.equal(neg, -pos)
    assert pos[0].tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6]


@pytest.mark.parametrize("nan_code", [0x7F, 0xFF])
def test_nan_scale_poisons_exactly_its_block(nan_code):
    packed, scales = random_nvfp4(8, n=5, k=96)
    row, blk = 3, 2
    scales[row, blk] = nan_code
    out = dequantize_nvfp4(packed, scales, 1.0)
    expect = torch.zeros_like(out, dtype=torch.bool)
    expect[row, blk * 16 : (blk + 1) * 16] = True
    assert torch.equal(torch.isnan(out), expect)


def test_dequantize_validation_errors():
    packed, scales = random_nvfp4(9, n=2, k=32)
    with pytest.raises(ValueError, match="packed"):
        dequantize_nvfp4(packed.to(torch.int32), scales, 1.0)
    with pytest.raises(ValueError, match="packed"):
        dequantize_nvfp4(packed.float(), scales, 1.0)
    with pytest.raises(ValueError, match="scales"):
        dequantize_nvfp4(packed, scales.float(), 1.0)
    with pytest.raises(ValueError, match=r"scales: expected shape \(2, 2\).*got \(2, 3\)"):
        dequantize_nvfp4(packed, torch.zeros(2, 3, dtype=torch.uint8), 1.0)
    with pytest.raises(ValueError, match=r"scales.*\(2, 2\).*\(2, 2, 1\)"):
        dequantize_nvfp4(packed, scales.unsqueeze(-1), 1.0)
    with pytest.raises(ValueError, match="packed"):  # K = 2 * 7 = 14 is not a multiple of 16
        dequantize_nvfp4(torch.zeros(2, 7, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.uint8), 1.0)
    with pytest.raises(ValueError, match="global_decode_scale"):
        dequantize_nvfp4(packed, scales, torch.ones(2))
    with pytest.raises(ValueError, match="global_decode_scale"):
        dequantize_nvfp4(packed, scales, "1.0")


# ---------------------------------------------------------------- mutants


def mutant_swapped_nibbles(packed, scales, gs):
    codes = torch.stack((packed >> 4, packed & 0xF), dim=-1).reshape(packed.shape[0], -1)
    vals = decode_e2m1(codes) * torch.repeat_interleave(decode_e4m3fn(scales), 16, dim=-1)
    return vals * gs


def mutant_scale_block_off_by_one(packed, scales, gs):
    codes = unpack_fp4(packed)
    k = codes.shape[-1]
    nb = scales.shape[-1]
    idx = (torch.arange(k) // 16 + 1) % nb  # uses block k//16 + 1
    vals = decode_e2m1(codes) * decode_e4m3fn(scales)[:, idx]
    return vals * gs


@pytest.mark.parametrize("mutant", [mutant_swapped_nibbles, mutant_scale_block_off_by_one])
def test_tests_detect_mutants(mutant):
    packed, scales = random_nvfp4(10)
    gs = 0.75
    ref = naive_dequantize(packed, scales, gs)
    good = dequantize_nvfp4(packed, scales, gs).numpy()
    bad = mutant(packed, scales, gs).numpy()
    assert_same_floats(good, ref)
    with pytest.raises(AssertionError):
        assert_same_floats(bad, ref)


# ---------------------------------------------------------------- quantize


@pytest.mark.parametrize("gs", [float(torch.tensor(0.0371, dtype=torch.float32)), 3 * 2.0**-6])
def test_quantize_exact_on_representable_values(gs):
    g = torch.Generator().manual_seed(11)
    n, k = 8, 128
    nb = k // BLOCK_SIZE
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    # Force one +-6 per block so the block amax is exactly 6 * scale * gs and the
    # recipe recovers the chosen scale exactly.
    blocks = codes.view(n, nb, BLOCK_SIZE)
    blocks[:, :, 0] = torch.where(torch.rand(n, nb, generator=g) < 0.5, 7, 15).to(torch.uint8)
    # Positive, finite, nonzero e4m3 scales including subnormals and 448.
    scale_bits = torch.randint(1, 0x7F, (n, nb), generator=g, dtype=torch.uint8)
    scale_bits[0, 0] = 0x01
    scale_bits[0, 1] = 0x7E
    w = decode_e2m1(codes) * torch.repeat_interleave(decode_e4m3fn(scale_bits), 16, dim=-1) * gs

    packed, scales, gsq = quantize_nvfp4(w, global_decode_scale=gs)
    assert gsq.dtype == torch.float32 and gsq.dim() == 0 and gsq.item() == gs
    assert scales.dtype == torch.float8_e4m3fn and scales.shape == (n, nb)
    assert torch.equal(scales.view(torch.uint8), scale_bits)
    assert torch.equal(unpack_fp4(packed), codes)  # including -0 (code 8)
    assert_same_floats(dequantize_nvfp4(packed, scales, gsq).numpy(), w.numpy())
    # Same result from a float32 copy of w whenever w is exactly representable in fp32
    # (w needs 2 + 4 + bits(gs) significant bits, so it is for gs = 3 * 2^-6).
    if torch.equal(w.float().double(), w):
        p32, s32, _ = quantize_nvfp4(w.float(), global_decode_scale=gs)
        assert torch.equal(p32, packed) and torch.equal(s32.view(torch.uint8), scale_bits)


def step_e2m1(t: torch.Tensor) -> torch.Tensor:
    """Spacing of the e2m1 grid interval containing t in [0, 6]."""
    return torch.where(t < 2, 0.5, torch.where(t < 4, 1.0, 2.0)).to(torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_quantize_error_bound_randn(dtype):
    g = torch.Generator().manual_seed(12)
    w = (torch.randn(64, 256, generator=g, dtype=torch.float64) * 2.5).to(dtype)
    packed, scales, gs32 = quantize_nvfp4(w)
    w64 = w.double()
    deq = dequantize_nvfp4(packed, scales, gs32)
    gs = gs32.double()

    # Recipe for the global scale.
    assert gs32.item() == torch.tensor(w64.abs().max().item() / (448 * 6), dtype=torch.float32).item()

    # Block scales are the nearest e4m3 value to the exact target amax / (6 * gs).
    # (target is a float64 value, which ml_dtypes would double-round; check nearness directly.)
    target = w64.view(64, -1, 16).abs().amax(-1) / (6 * gs)
    bits = scales.view(torch.uint8).to(torch.int32)
    s_q = decode_e4m3fn(scales)
    for nb_bits in (bits - 1, torch.clamp(bits + 1, max=0x7E)):
        neighbour = decode_e4m3fn(nb_bits.to(torch.uint8))
        assert bool(((target - s_q).abs() <= (target - neighbour).abs()).all())
    # The bound below needs normal block scales (true for this data).
    assert bool((s_q >= 2.0**-6).all())
    # Normal e4m3 RNE: |s - s_q| <= half an ulp = 2^-4 * (s_q's binade) <= 2^-4 * s_q.
    assert bool(((target - s_q).abs() <= s_q / 16).all())

    # Error bound.  Let u = s_q * gs (the unit of the block) and x = |w| / u.
    #  * If x <= 6, the code is the RNE of x on the e2m1 grid, so the error is at most
    #    half the width of the grid interval containing x: 0.5 * step(x) * u.
    #  * x > 6 happens only because s_q was rounded below the target s: then
    #    x <= amax / u = 6 * s / s_q <= 6 * (1 + 2^-4) = 6.375, the code saturates
    #    to 6 and the error is (x - 6) * u <= 0.375 * u < 0.5 * step(6) * u = u.
    # Hence for every element: |deq - w| <= 0.5 * step(min(x, 6)) * s_q * gs.
    # (In terms of the unrounded scale s, u <= s * gs / (1 - 2^-4), which is the
    # extra factor the block-scale rounding costs.)
    u = torch.repeat_interleave(s_q, 16, dim=-1) * gs
    x = w64.abs() / u
    bound = 0.5 * step_e2m1(torch.clamp(x, max=6)) * u
    err = (deq - w64).abs()
    assert bool((err <= bound).all()), float((err - bound).max())
    # And the a-priori form with the unrounded block scale.
    s_full = torch.repeat_interleave(target, 16, dim=-1)
    assert bool((err <= 0.5 * step_e2m1(torch.clamp(x, max=6)) * s_full * gs / (1 - 2.0**-4)).all())
    # The global-amax element is reproduced with scale 448 and code +-6 up to fp32 rounding of gs.
    assert s_q.max().item() == E4M3_MAX


def test_quantize_zero_block_and_zero_tensor():
    w = torch.randn(2, 48, generator=torch.Generator().manual_seed(13))
    w[1, 16:32] = 0.0
    packed, scales, gs = quantize_nvfp4(w)
    assert scales.view(torch.uint8)[1, 1].item() == 0
    assert bool((unpack_fp4(packed)[1, 16:32] == 0).all())
    deq = dequantize_nvfp4(packed, scales, gs)
    assert bool(torch.isfinite(deq).all()) and bool((deq[1, 16:32] == 0).all())

    z = torch.zeros(3, 32)
    packed, scales, gs = quantize_nvfp4(z)
    assert gs.item() == 1.0 and gs.dtype == torch.float32
    assert bool((packed == 0).all()) and bool((scales.view(torch.uint8) == 0).all())
    assert bool((dequantize_nvfp4(packed, scales, gs) == 0).all())


def test_quantize_saturation_with_small_global_scale():
    # A too-small override saturates the block scale at 448 and codes at +-6.
    w = torch.tensor([[1000.0, -1000.0] + [0.0] * 14], dtype=torch.float64)
    packed, scales, gs = quantize_nvfp4(w, global_decode_scale=0.125)
    assert scales.view(torch.uint8).tolist() == [[0x7E]]
    deq = dequantize_nvfp4(packed, scales, gs)
    assert deq[0, :2].tolist() == [6 * 448 * 0.125, -6 * 448 * 0.125]


def test_quantize_validation_errors():
    with pytest.raises(ValueError, match=r"w: .*\(4, 24\)"):
        quantize_nvfp4(torch.randn(4, 24))
    with pytest.raises(ValueError, match="w"):
        quantize_nvfp4(torch.ones(4, 16, dtype=torch.int32))
    with pytest.raises(ValueError, match="w"):
        quantize_nvfp4(torch.full((1, 16), float("nan")))
    with pytest.raises(ValueError, match="global_decode_scale"):
        quantize_nvfp4(torch.randn(1, 16), global_decode_scale=0.0)
