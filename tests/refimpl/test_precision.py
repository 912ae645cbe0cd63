"""The one precision table (fuseval.precision): TF32 rounding with both tie rules, ulps,
unit roundoffs and the other roundings, each against a computation that shares no code
with it.

The references here work on the float32 values, not their bits: numpy's exact float64
arithmetic on the scaled mantissa (every float32 times a power of two is exact in
float64) for the exhaustive sweeps, and Python's ``fractions`` for a second opinion on a
sample. Each check is also shown to reject a deliberately broken rounding or table."""
from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
import torch

from fuseval import precision as P

TF32_MANT, FP32_EMIN = 10, -126
TF32_SUBNORMAL_EXP = FP32_EMIN - TF32_MANT          # quantum below the smallest normal: 2^-136


# --------------------------------------------------------------------------- independent references
def tf32_numpy(x: np.ndarray, ties: str) -> np.ndarray:
    """float32 values rounded to TF32 in float64 arithmetic: each value divided by its
    TF32 quantum (2^(floor(log2|x|) - 10), 2^-136 below the smallest normal) is exact in
    float64 with its 13 dropped bits as the fraction; round that to an integer with the
    tie rule, multiply back, overflow past the largest TF32 value to infinity."""
    with np.errstate(invalid="ignore"):                      # signalling NaNs widen quietly
        v = x.astype(np.float64)
    finite = np.isfinite(v)
    safe = np.where(finite, v, 0.0)
    _, e = np.frexp(safe)                                    # |v| = m 2^e, m in [0.5, 1)
    q = np.maximum(e - 1 - TF32_MANT, TF32_SUBNORMAL_EXP)
    n = np.ldexp(safe, -q)
    if ties == "even":
        r = np.rint(n)                                       # IEEE rint: half to even
    else:
        r = np.copysign(np.floor(np.abs(n) + 0.5), n)       # half away from zero
    out = np.ldexp(r, q)
    out = np.where(np.abs(out) >= 2.0 ** 128, np.copysign(np.inf, out), out)
    with np.errstate(over="ignore"):
        return np.where(finite, out, v).astype(np.float32)


def tf32_fraction(x: float, ties: str) -> float:
    """One value rounded to TF32 in exact rational arithmetic."""
    if not math.isfinite(x):
        return x
    v = Fraction(x)
    if v == 0:
        return x
    e = math.floor(math.log2(abs(x)))
    while Fraction(2) ** e > abs(v):                          # make log2 exact near powers of two
        e -= 1
    while Fraction(2) ** (e + 1) <= abs(v):
        e += 1
    quantum = Fraction(2) ** max(e - TF32_MANT, TF32_SUBNORMAL_EXP)
    n = abs(v) / quantum
    low = math.floor(n)
    rest = n - low
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and (ties == "away" or low % 2 == 1)):
        low += 1
    mag = low * quantum
    if mag >= Fraction(2) ** 128:
        return math.copysign(math.inf, x)
    return math.copysign(float(mag), x)


def bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return bits.astype(np.uint32).view(np.float32)


def f32_bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


def sweep(exponent: int) -> np.ndarray:
    """Every pattern of the 13 bits TF32 drops, under three patterns of the 10 it keeps
    (0, all ones: the carry into the exponent, and alternating), both signs, at one
    biased exponent (0: zero and subnormals; 255: infinities and NaNs)."""
    low = np.arange(1 << 13, dtype=np.uint32)
    kept = np.array([0, 0x3FF, 0x155], dtype=np.uint32) << np.uint32(13)
    mags = (np.uint32(exponent) << np.uint32(23)) | (kept[:, None] | low[None, :]).ravel()
    return bits_to_f32(np.concatenate([mags, mags | np.uint32(0x80000000)]))


def _mismatch(rounded: np.ndarray, expected: np.ndarray, x: np.ndarray) -> str | None:
    """The first value where two roundings differ (bit for bit, NaNs compared as NaN)."""
    same = (f32_bits(rounded) == f32_bits(expected)) | (np.isnan(rounded) & np.isnan(expected))
    if same.all():
        return None
    i = int(np.argmin(same))
    return f"x={x[i]!r} (bits {f32_bits(x)[i]:#010x}): got {rounded[i]!r}, expected {expected[i]!r}"


def round_tf32_np(fn, x: np.ndarray, ties: str) -> np.ndarray:
    return fn(torch.from_numpy(x.copy()), ties=ties).numpy()


def first_tf32_mismatch(fn, ties: str) -> str | None:
    """Sweep every exponent; the first disagreement of ``fn`` with :func:`tf32_numpy`."""
    for exponent in range(256):
        x = sweep(exponent)
        problem = _mismatch(round_tf32_np(fn, x, ties), tf32_numpy(x, ties), x)
        if problem:
            return f"exponent field {exponent}: {problem}"
    return None


# --------------------------------------------------------------------------- broken roundings (mutants)
def tf32_truncating(t: torch.Tensor, ties: str = "even") -> torch.Tensor:
    """Drops the 13 bits instead of rounding (what a cast by masking does)."""
    x = t.to(torch.float32).contiguous()
    out = (x.view(torch.int32) & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(x), out, x)


def tf32_swapped_ties(t: torch.Tensor, ties: str = "even") -> torch.Tensor:
    """Right everywhere except exact ties, where it applies the other tie rule."""
    return P.round_tf32(t, "away" if ties == "even" else "even")


def tf32_nan_to_inf(t: torch.Tensor, ties: str = "even") -> torch.Tensor:
    """Rounds NaN's bits like a number (a NaN with a low payload becomes infinity)."""
    x = t.to(torch.float32).contiguous()
    return ((x.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


# --------------------------------------------------------------------------- round_tf32
@pytest.mark.parametrize("ties", ["even", "away"])
def test_round_tf32_matches_the_independent_rounding_on_every_exponent(ties):
    assert first_tf32_mismatch(P.round_tf32, ties) is None


@pytest.mark.parametrize("mutant", [tf32_truncating, tf32_swapped_ties, tf32_nan_to_inf])
@pytest.mark.parametrize("ties", ["even", "away"])
def test_the_sweep_rejects_broken_roundings(mutant, ties):
    assert first_tf32_mismatch(mutant, ties) is not None


def test_the_two_references_agree_on_a_sample():
    """numpy's scaled-mantissa reference and exact rationals, on random bit patterns and
    on the exact ties of every exponent."""
    rng = np.random.default_rng(15)
    bits = rng.integers(0, 1 << 32, 3000, dtype=np.uint64).astype(np.uint32)
    ties = ((np.arange(256, dtype=np.uint32) << np.uint32(23)) | np.uint32(0x1000)
            | (rng.integers(0, 1 << 10, 256, dtype=np.uint32) << np.uint32(13)))
    x = bits_to_f32(np.concatenate([bits, ties, ties | np.uint32(0x80000000)]))
    for rule in ("even", "away"):
        via_numpy = tf32_numpy(x, rule)
        via_fractions = np.array([tf32_fraction(float(v), rule) for v in x], dtype=np.float32)
        assert _mismatch(via_numpy, via_fractions, x) is None


@pytest.mark.parametrize("x, even, away", [
    (1 + 2 ** -11, 1.0, 1 + 2 ** -10),                       # tie, even neighbour below
    (1 + 3 * 2 ** -11, 1 + 2 ** -9, 1 + 2 ** -9),            # tie, even neighbour above
    (-(1 + 2 ** -11), -1.0, -(1 + 2 ** -10)),                # sign-symmetric
    (2 - 2 ** -11, 2.0, 2.0),                                # tie carrying into the exponent
    (1 + 2 ** -11 + 2 ** -23, 1 + 2 ** -10, 1 + 2 ** -10),  # just above a tie
    (1 + 2 ** -11 - 2 ** -23, 1.0, 1.0),                     # just below a tie
    ((2 - 2 ** -11) * 2.0 ** 127, math.inf, math.inf),       # tie above the largest TF32: overflow
    ((2 - 2 ** -10) * 2.0 ** 127, (2 - 2 ** -10) * 2.0 ** 127, (2 - 2 ** -10) * 2.0 ** 127),
    (2.0 ** -149, 0.0, 0.0),                                 # smallest subnormal: below half a quantum
    (2.0 ** -137, 0.0, 2.0 ** -136),                         # subnormal tie
    (3 * 2.0 ** -137, 2.0 ** -135, 2.0 ** -135),
    (2.0 ** -126 - 2.0 ** -149, 2.0 ** -126, 2.0 ** -126),   # largest subnormal carries to the smallest normal
])
def test_round_tf32_named_cases(x, even, away):
    t = torch.tensor([x], dtype=torch.float32)
    assert float(t[0]) == x                                  # the case is a float32 value
    assert P.round_tf32(t, "even").item() == even
    assert P.round_tf32(t, "away").item() == away


def test_round_tf32_keeps_nonfinite_values_and_signed_zeros():
    nan_payloads = bits_to_f32(np.array([0x7FC00000, 0x7F800001, 0xFFC00FFF, 0x7FBFFFFF], dtype=np.uint32))
    specials = np.concatenate([nan_payloads, np.array([np.inf, -np.inf, 0.0, -0.0], dtype=np.float32)])
    for ties in ("even", "away"):
        out = round_tf32_np(P.round_tf32, specials, ties)
        assert np.isnan(out[:4]).all()                       # a NaN stays a NaN, whatever its payload
        np.testing.assert_array_equal(f32_bits(out[4:]), f32_bits(specials[4:]))   # inf, -inf, +0, -0 bit for bit


def test_round_tf32_is_idempotent_and_reads_any_float_dtype():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(3))
    for ties in ("even", "away"):
        once = P.round_tf32(x, ties)
        assert torch.equal(P.round_tf32(once, ties), once)
        assert ((once.view(torch.int32) & 0x1FFF) == 0).all()
    assert P.round_tf32(x.double()).dtype == torch.float32
    assert torch.equal(P.round_tf32(x.double()), P.round_tf32(x))


def test_round_tf32_rejects_an_unknown_tie_rule():
    with pytest.raises(ValueError, match="ties: expected 'even' or 'away', got 'up'"):
        P.round_tf32(torch.ones(2), "up")


# --------------------------------------------------------------------------- round_to
def test_round_to_matches_numpy_and_ml_dtypes():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20000, generator=g) * 10.0 ** torch.randint(-6, 5, (20000,), generator=g)
    xn = x.numpy()
    np.testing.assert_array_equal(P.round_to(x, "tf32").numpy(), tf32_numpy(xn, "even"))
    np.testing.assert_array_equal(P.round_to(x, "bfloat16").numpy(),
                                  xn.astype(ml_dtypes.bfloat16).astype(np.float32))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(P.round_to(x, "float16").numpy(), xn.astype(np.float16).astype(np.float32))
    assert torch.equal(P.round_to(x, "float32"), x)
    assert P.round_to(x, "float64").dtype == torch.float64 and P.round_to(x.double(), "float32").dtype == torch.float32
    assert P.round_to(x, None) is x
    assert torch.equal(P.round_to(x, "bf16"), P.round_to(x, "bfloat16"))        # aliases name the same format
    with pytest.raises(ValueError, match="unknown precision 'fp12'"):
        P.round_to(x, "fp12")


# --------------------------------------------------------------------------- the table: ulp and unit roundoff
def reference_spacing(x: np.ndarray, name: str) -> np.ndarray:
    """Distance from |x| to the next larger number of the format, from numpy / ml_dtypes
    (TF32: float32's spacing times 2^13, the bits it does not keep)."""
    a = np.abs(x)
    if name == "float64":
        return np.spacing(a.astype(np.float64))
    if name == "float32":
        return np.spacing(a.astype(np.float32)).astype(np.float64)
    if name == "tf32":
        return np.spacing(a.astype(np.float32)).astype(np.float64) * 2.0 ** 13
    if name == "float16":
        return np.spacing(a.astype(np.float16)).astype(np.float64)
    # bfloat16: the gap to the next bit pattern
    b = a.astype(ml_dtypes.bfloat16)
    nxt = (b.view(np.uint16) + np.uint16(1)).view(ml_dtypes.bfloat16)
    return nxt.astype(np.float64) - b.astype(np.float64)


def format_values(name: str) -> np.ndarray:
    """Values of the format across its range: powers of two and their neighbours, the
    smallest normal, subnormals and zero."""
    mant, emin = P.PRECISIONS[name]
    top = {"float64": 1000, "float32": 120, "tf32": 120, "float16": 14, "bfloat16": 120}[name]
    exps = np.arange(emin - mant, top)
    pows = np.ldexp(1.0, exps)
    odd = pows * (1 + 2.0 ** -mant * 3)                     # a few last places above each power
    vals = np.concatenate([pows, odd, [0.0, np.ldexp(1.0, emin) * 0.75, 1.0, 1.5, 3.0, 0.3, 0.1, 0.01, 1e-3,
                                       1e-5, 1e-30, 1e-40, 6e4]])
    if name == "tf32":                                       # on the TF32 grid itself
        vals = tf32_numpy(vals.astype(np.float32), "even").astype(np.float64)
    elif name in ("float32", "float16", "bfloat16"):
        dtype = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[name]
        vals = vals.astype(dtype).astype(np.float64)
    return np.unique(vals[np.isfinite(vals)])


@pytest.mark.parametrize("name", sorted(P.PRECISIONS))
def test_ulp_is_the_spacing_of_the_format(name):
    vals = format_values(name)
    ours = P.ulp(torch.tensor(vals, dtype=torch.float64), name).numpy()
    np.testing.assert_array_equal(ours, reference_spacing(vals, name))
    scalar = [P.ulp(float(v), name) for v in vals[:: max(1, len(vals) // 50)]]
    assert scalar == list(ours[:: max(1, len(vals) // 50)])           # float and tensor paths agree
    assert P.ulp(-3.0, name) == P.ulp(3.0, name)
    mant, emin = P.PRECISIONS[name]
    assert P.ulp(0.0, name) == 2.0 ** (emin - mant)                   # never 0: the subnormal spacing
    assert P.ulp(math.inf, name) == 2.0 ** (emin - mant)


def test_the_spacing_check_rejects_a_table_with_the_wrong_exponent_range(monkeypatch):
    # tf32 given float16's exponent range: right at 1.0, wrong below 2^-14
    vals = format_values("tf32")
    monkeypatch.setitem(P.PRECISIONS, "tf32", (10, -14))
    ours = P.ulp(torch.tensor(vals, dtype=torch.float64), "tf32").numpy()
    assert P.ulp(1.0, "tf32") == 2.0 ** -10
    assert not np.array_equal(ours, reference_spacing(vals, "tf32"))


def _worst_relative_rounding_error(name: str) -> float:
    """max |round(x) - x| / |x| over dense values in [1, 2) and the format's exact ties
    nearest 1 (float64 inputs for float32, float32 inputs for the coarser formats)."""
    mant = P.PRECISIONS[name][0]
    g = torch.Generator().manual_seed(11)
    x = torch.cat([1 + torch.rand(200000, generator=g, dtype=torch.float64),
                   1 + (torch.arange(0, 1 << 12, dtype=torch.float64) + 0.5) * 2.0 ** -mant])
    x = x[x < 2]
    if name != "float32":
        x = x.to(torch.float32).to(torch.float64)            # the ties are float32 values: exact
    source = x if name == "float32" else x.to(torch.float32)
    rounded = P.round_to(source, name).to(torch.float64)
    return float(((rounded - x).abs() / x).max())


@pytest.mark.parametrize("name, finfo", [
    ("float64", np.finfo(np.float64)), ("float32", np.finfo(np.float32)), ("float16", np.finfo(np.float16)),
    ("bfloat16", ml_dtypes.finfo(ml_dtypes.bfloat16)), ("tf32", None)])
def test_unit_roundoff_is_half_an_ulp_of_one_and_bounds_the_rounding(name, finfo):
    u = P.unit_roundoff(name)
    assert u == P.ulp(1.0, name) / 2
    if finfo is not None:
        assert u == float(finfo.eps) / 2
    if name != "float64":
        worst = _worst_relative_rounding_error(name)
        # rounding to nearest errs by at most u, and ties come within a hair of it: a
        # table twice too large (TF32 as 2^-10) or too small fails one side
        assert 0.99 * u < worst <= u


def test_the_rounding_bound_rejects_a_table_twice_too_large(monkeypatch):
    worst = _worst_relative_rounding_error("tf32")
    monkeypatch.setitem(P.PRECISIONS, "tf32", (9, -126))    # TF32 as 2^-10, as a bound table once had it
    claimed = P.unit_roundoff("tf32")
    assert claimed == 2.0 ** -10 and not (0.99 * claimed < worst <= claimed)


def test_unit_roundoffs_in_order_and_aliases():
    assert [P.unit_roundoff(n) for n in ("float64", "float32", "tf32", "bfloat16")] == \
        [2.0 ** -53, 2.0 ** -24, 2.0 ** -11, 2.0 ** -8]
    assert P.unit_roundoff("fp16") == P.unit_roundoff("float16") == P.unit_roundoff("tf32")
    assert P.canonical("bf16") == "bfloat16" and P.canonical("tf32") == "tf32"
    with pytest.raises(ValueError, match="stage x: unknown precision 'fp8'"):
        P.check_precision("fp8", "stage x")


# --------------------------------------------------------------------------- finer, dtype_precision
def test_finer_and_dtype_precision():
    assert P.finer("bfloat16", "float32") == "float32" and P.finer("float32", "tf32") == "float32"
    assert P.finer("tf32", "float16") == "float16"            # equal mantissa bits: the second
    assert P.finer("float16", "tf32") == "tf32"
    assert P.finer("bf16", "fp32") == "fp32"
    for dtype, name in ((torch.float64, "float64"), (torch.float32, "float32"), (torch.float16, "float16"),
                        (torch.bfloat16, "bfloat16")):
        assert P.dtype_precision(dtype) == name
    with pytest.raises(ValueError, match="floating-point dtype.*torch.int32"):
        P.dtype_precision(torch.int32)
