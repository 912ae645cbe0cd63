"""The fused Triton path of op B (nvfp4_qkv_rope), checked against the float64 oracle.

On the CPU the kernel runs through the Triton interpreter (tests/conftest.py), on the
scaled-down configurations; the ``gpu`` tests run the seed sizes compiled. Every check
draws fresh inputs and goes through fuseval.check (NaN-poisoned outputs on CUDA), and
each kind of bug the issue names has a mutant of the kernel that the check must reject.

``forward`` has the benchmark's W4A4 semantics (the activations quantized by the
benchmark's float32 quantizer, ``act_quant``): the quantizer kernel is compared bit for
bit with ``fuseval.refimpl.nvfp4.quantize_activations`` on random and adversarial
inputs. ``forward_w4a16`` is the ``w4a16`` variant (bf16 activations as given).
"""
from __future__ import annotations

import functools
import json
import zlib

import pytest
import torch

from fuseval.check import check, compare, run_case
from fuseval.definitions import Case
from fuseval.operators import load
from fuseval.inputs import generate_inputs
from fuseval.operators.nvfp4_qkv_rope import _launch
from fuseval.operators.nvfp4_qkv_rope import fast as fast
from fuseval.operators.nvfp4_qkv_rope import reference as ref
from fuseval.refimpl.nvfp4 import decode_e2m1, decode_e4m3fn, encode_e4m3fn, quantize_activations

OP = "nvfp4_qkv_rope"
CPU = torch.device("cpu")
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# ragged: B*S = 39 tokens is no multiple of the interpreter's 16/32-token tiles, and tiles
# straddle batch boundaries
RAGGED = {"seq_len": 13, "batch_size": 3}


def _within_rounding(out: torch.Tensor, oracle: torch.Tensor, slack: float = 1e-6) -> torch.Tensor:
    """Elements of a bf16 output within half an ulp (<= 2^-8 |ref|) of the float64 oracle,
    with a hair of slack for the fp32 arithmetic before the rounding."""
    o, r = out.double(), oracle.double()
    return (o - r).abs() <= r.abs() * 2.0 ** -8 * 1.001 + slack


# --------------------------------------------------------------------------- correctness
def test_fast_passes_the_check_on_small_cases():
    report = check(OP, "fast", config="small", cases="0,9", device="cpu", seed=11)
    assert report.passed, [c.messages for c in report.cases]


@pytest.mark.parametrize("config,axes", [("small", RAGGED), ("tiny", {"seq_len": 7, "batch_size": 5})])
@pytest.mark.parametrize("variant", ["sol", "w4a16"])
def test_fast_is_the_oracle_rounded_once_on_ragged_sizes(config, axes, variant):
    """The quantizer is bit-exact, decode and products are exact and the norm/RoPE run in
    fp32 on the fp32 accumulator, so every element is the oracle rounded to bf16 (not
    merely inside the tolerance), for the benchmark's W4A4 semantics (forward) and the
    w4a16 variant (forward_w4a16). The tiny configuration (head_dim 8) pads each RoPE
    half to 8 tile columns."""
    defn = load(OP, config).with_variant(variant)
    inputs = generate_inputs(defn, axes, seed=5)
    impl, oracle = ((fast.forward, ref.reference) if variant == "sol"
                    else (fast.forward_w4a16, ref.reference_w4a16))
    outs = impl(*inputs)
    refs = oracle(*inputs)
    for spec, o, r in zip(defn.outputs, outs, refs):
        assert o.dtype == torch.bfloat16 and o.shape == r.shape, spec.name
        ok = _within_rounding(o, r)
        assert bool(ok.all()), f"{spec.name}: {int((~ok).sum())} elements off by more than rounding"
    result = run_case(defn, impl, Case(0, axes), seed=8, device=CPU)
    assert result.passed, result.messages


def test_w4a16_variant_passes_the_check_and_differs_from_w4a4():
    report = check(OP, "fast", config="small", cases="0", device="cpu", seed=11, variant="w4a16")
    assert report.passed, [c.messages for c in report.cases]
    # the two semantics are different functions: W4A16 outputs fail the W4A4 oracle
    defn = load(OP, "small")
    result = run_case(defn, fast.forward_w4a16, Case(0, RAGGED), seed=13, device=CPU, hygiene=False)
    assert not result.passed


@pytest.mark.parametrize("config", ["16,64,4,1,h2", "32,32,4,1,a,h2", "16,64,4,1,a", "16,64,4,1,p",
                                    "32,32,4,1,a,h2,p"])
def test_tile_variants_compute_the_same_function(config):
    """Two heads per tile (h2), the transposed product (a, decoded W as the dot's first
    operand) and predecoded weights (p: decoded once per call into a bf16 copy that the
    GEMM reads as a dense operand) are the GPU's variants; the interpreter checks their
    indexing."""
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=12)
    outs = fast.forward(*inputs, config=config)
    for o, r in zip(outs, ref.reference(*inputs)):
        assert bool(_within_rounding(o, r).all())
    if config.endswith(",p"):
        # the predecode in the quantizer's amax launch or in a launch of its own: the same weights
        unfused = fast.forward(*inputs, config=config, quant_config=fast.QuantConfig(fuse_predecode=False))
        assert all(torch.equal(a, b) for a, b in zip(outs, unfused))
    taps = {}
    staged = fast.forward.staged(*inputs, taps=taps, config=config)
    for a, b in zip(outs, staged):
        assert torch.equal(a, b)


def test_k_loop_tail_when_block_k_does_not_divide_hidden():
    """hidden 48 with 32-wide K tiles: the second tile holds one 16-block and the rest is masked."""
    defn = load(OP, {"hidden_size": 48, "num_attention_heads": 2, "num_key_value_heads": 1,
                     "head_dim": 16})
    inputs = generate_inputs(defn, {"seq_len": 5, "batch_size": 2}, seed=2)
    outs = fast.forward(*inputs, config="16,32,4,1")
    for o, r in zip(outs, ref.reference(*inputs)):
        assert bool(_within_rounding(o, r).all())


@pytest.mark.parametrize("impl", [fast.forward, fast.forward_w4a16])
def test_global_scales_may_be_zero_dim_tensors(impl):
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=3)
    as_tensors = list(inputs)
    for i in (5, 8, 11):
        as_tensors[i] = torch.tensor(inputs[i], dtype=torch.float32)
    a, b = impl(*inputs), impl(*as_tensors)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_fast_is_no_less_accurate_than_the_bf16_torch_paths():
    """The issue's accuracy target: per output, max abs error no larger and matched ratio no
    smaller than the plain bf16 torch paths' (dequantize per call, and cached bf16 weights)."""
    defn = load(OP, "small")
    case = defn.cases("9")[0]      # 128 tokens, 16k elements per q output
    inputs = generate_inputs(defn, case.axes, seed=21)
    refs = ref.reference(*inputs)
    mine = [compare(o, r, defn.tolerance, s.name)
            for o, r, s in zip(fast.forward(*inputs), refs, defn.outputs)]
    for baseline in (ref.torch_eager, ref.torch_cached_bf16):
        theirs = [compare(o, r, defn.tolerance, s.name)
                  for o, r, s in zip(baseline(*inputs), refs, defn.outputs)]
        for m, t in zip(mine, theirs):
            assert m.max_abs <= t.max_abs, (baseline.__name__, m.name, m.max_abs, t.max_abs)
            assert m.matched_ratio >= t.matched_ratio, (baseline.__name__, m.name)


# --------------------------------------------------------------------------- act_quant kernel
# weight scales with a rounding in gs = fl32(g * global_decode) (3.0) and exact ones
_GW = (0.5, 2.0 ** -14, 3.0)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Element-wise equal (floats compared as float64, NaN equal to NaN)."""
    if a.shape != b.shape:
        return False
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    a, b = a.double(), b.double()
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def _assert_quantizer_is_the_oracle(x: torch.Tensor, per_token: bool = False):
    """The kernel's codes, block scale bits, global decode scale, xs and gs against
    ``quantize_activations`` (the oracle's float32 quantizer), bit for bit."""
    got = fast.act_quant(x, _GW, codes=True, per_token=per_token)
    want = quantize_activations(x, amax_over="token" if per_token else "tensor")
    bad = got.codes != want.codes
    assert not bad.any(), f"{int(bad.sum())} codes differ, first at {bad.nonzero()[0].tolist()}"
    bad = got.scales != want.scales
    assert not bad.any(), f"{int(bad.sum())} block scales differ, first at {bad.nonzero()[0].tolist()}"
    assert _same(got.global_decode, want.global_decode), (got.global_decode, want.global_decode)
    gd = want.global_decode
    if per_token:
        # the mutant folds its row's decode scale into xs (fp32 product, then bf16)
        xs = (want.scaled_codes(torch.float64) * gd.double()).float().to(torch.bfloat16)
        gs = torch.tensor(_GW, dtype=torch.float32)
    else:
        xs = want.scaled_codes(torch.float64)
        gs = torch.tensor(_GW, dtype=torch.float32, device=gd.device) * gd
    assert got.xs.dtype == torch.bfloat16 and _same(got.xs, xs)
    assert _same(got.gs.cpu(), gs.cpu()), (got.gs, gs)
    if not per_token:
        assert _same(got.dequantize(), want.dequantize())       # x_hat, exact in float64


@pytest.mark.parametrize("shape,scale,per_token", [
    ((3, 13, 64), 1.0, False), ((2, 5, 48), 1e-3, False), ((1, 7, 4096), 30.0, False),
    ((39, 64), "mixed", False), ((3, 13, 64), 1.0, True), ((39, 64), "mixed", True)])
def test_act_quant_kernel_is_the_oracle_bit_for_bit_on_random_inputs(shape, scale, per_token):
    """randn activations, plain or with rows of very different magnitudes (2^-24 .. 2^24,
    so that many blocks of the small rows get scales that underflow e4m3); the per-token
    mutant has its own oracle (``amax_over="token"``)."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((shape, scale)).encode()))   # repeatable
    x = torch.randn(shape, generator=g)
    if scale == "mixed":
        x = x * 2.0 ** torch.randint(-24, 25, shape[:-1] + (1,), generator=g).double()
    else:
        x = x * scale
    _assert_quantizer_is_the_oracle(x.to(torch.bfloat16), per_token)


def _bf16_neighbours(values) -> list[float]:
    """Each value and its two bf16 neighbours (one ulp below and above)."""
    b = torch.tensor(values, dtype=torch.bfloat16).view(torch.int16)
    out = torch.stack([b - 1, b, b + 1], -1).view(torch.bfloat16).flatten()
    return out.float().tolist()


def _adversarial_tensors() -> dict[str, torch.Tensor]:
    """Inputs that land on every decision of the quantizer. With the global amax 2688 the
    global encode scale is 1 and a block of amax 6s (s an e4m3 value) gets the scale s and
    the encode scale 1/s exactly, so its values divided by s are y exactly."""
    thr = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    sub = 2.0 ** -9                                     # smallest e4m3 subnormal
    blocks = [
        # global amax: scale 448; thresholds times 448 (1/448 is inexact: off-tie rounding)
        [2688.0] + [448 * t for t in thr] + [-448 * t for t in thr] + [1.0],
        # scale 1: every threshold exactly, both signs, and -0.0
        [6.0] + thr + [-t for t in thr] + [-0.0],
        # scale 2: thresholds (times 2) one bf16 ulp either side, and a tiny negative (code 8)
        [12.0] + _bf16_neighbours([2 * t for t in (0.25, 1.25, 2.5, 5.0)])[:12] + [-0.1, -0.5, 0.0],
        [12.0] + _bf16_neighbours([2 * t for t in (0.75, 1.75, 3.5)]) + [-0.49, -0.51, 1e-3, -1e-3, 11.9, -12.0],
        # e4m3 ties in the normal range: s = 1.0625 -> 1 (even), 1.1875 -> 1.25; 1.125 exact
        [6.375] + [0.3 * i for i in range(15)],
        [7.125] + [-0.4 * i for i in range(15)],
        [6.75] + [0.25 * i for i in range(15)],
        # e4m3 subnormal ties: s = 1.5, 2.5, 3.5 (x 2^-9) -> 2, 2, 4 (x 2^-9)
        [9 * sub] + [sub * t for t in thr] + [-sub * t for t in thr] + [0.0],
        [15 * sub] + [2.5 * sub * t for t in thr] + [-2.5 * sub * t for t in thr] + [-0.0],
        [21 * sub] + [0.0] * 15,
        # s = 2^-10, the tie between 0 and the smallest subnormal (-> 0), and just above it
        [3 * sub] + [sub] * 15,
        _bf16_neighbours([3 * sub])[2:] + [-sub] * 15,
        # scale underflows to 0: encode = 1/0 -> fp32 max, every non-zero value saturates
        [2.0 ** -12, -2.0 ** -13, 2.0 ** -20, -2.0 ** -30, 2.0 ** -126, -2.0 ** -133] + [0.0] * 10,
        # a zero block (signed zeros)
        [0.0, -0.0] * 8,
        # y in [-0.25, 0): -0 (code 8)
        [6.0] + _bf16_neighbours([-0.25]) + [-0.1, -1e-3, -1e-30, 0.1, 1e-30] + [-0.0] * 7,
        # huge and tiny neighbours inside one block
        [6.0, 1e-38, -1e-38, 1e-20, 3e-39] + [0.0] * 11,
    ]
    assert [len(b) for b in blocks] == [16] * len(blocks), [len(b) for b in blocks]
    row = torch.tensor(blocks, dtype=torch.float32).flatten()
    base = torch.stack([row, -row, row.flip(0)]).to(torch.bfloat16)
    assert float(base.float().abs().max()) == 2688.0 and bool(torch.equal(base.float().flatten()[:16],
                                                                          torch.tensor(blocks[0])))
    g = torch.Generator().manual_seed(0)
    big = torch.finfo(torch.bfloat16).max
    out = {"thresholds": base,
           # the amax block's scale rounds above 448 before the clamp (fl(fl(a/6) * fl(2688/a)))
           "clamp_448": torch.tensor([[0.5234375] + [0.01 * i for i in range(31)]]).to(torch.bfloat16),
           "zeros": torch.zeros(2, 32, dtype=torch.bfloat16),
           "signed_zeros": -torch.zeros(2, 32, dtype=torch.bfloat16),
           # bf16 subnormals only: encode 2688/amax overflows to the fp32 max, decode subnormal
           "tiny": (torch.randint(-8, 9, (2, 48), generator=g) * 2.0 ** -133).to(torch.bfloat16),
           "huge": torch.cat([torch.full((1, 16), big), torch.randn(1, 16, generator=g) * 1e38,
                              torch.randn(1, 16, generator=g) * 1e-30], 1).to(torch.bfloat16),
           "inf": torch.tensor([[float("inf"), 1.0, -2.0] + [0.5] * 13 + [float("-inf")] + [3.0] * 15])
           .to(torch.bfloat16),
           "nan": torch.tensor([[float("nan"), 1.0] + [0.5] * 30]).to(torch.bfloat16),
           # block amaxes whose scale lands on an e4m3 tie with the exact "/ 6" but just above
           # it with the benchmark's "* fl32(1/6)" (global amax 4.375: encode 614.4)
           "reciprocal_sixth": torch.tensor([[4.375] + [0.1] * 15 + [2.265625] + [0.3] * 15 + [0.56640625]
                                             + [-0.2] * 15 + [0.0177001953125] + [1e-3] * 15]).to(torch.bfloat16)}
    assert float(out["clamp_448"].float().abs().max()) == 0.5234375
    return out


@pytest.mark.parametrize("per_token", [False, True])
def test_act_quant_kernel_is_the_oracle_bit_for_bit_on_adversarial_inputs(per_token):
    for name, x in _adversarial_tensors().items():
        try:
            _assert_quantizer_is_the_oracle(x, per_token)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


def test_adversarial_inputs_reach_the_decisions_they_are_meant_to():
    """The adversarial set covers what it claims: every magnitude code and sign, e4m3
    scale 448 and 0, subnormal and normal scales, a zero global decode denominator."""
    t = _adversarial_tensors()
    aq = quantize_activations(t["thresholds"])
    assert set(aq.codes.unique().tolist()) == set(range(16))
    s = aq.scales[0].reshape(-1).tolist()
    assert s[0] == 0x7E and s[1] == 0x38 and s[2] == 0x40                 # 448, 1, 2
    assert s[4] == 0x38 and s[5] == 0x3A and s[6] == 0x39                 # 1.0625->1, 1.1875->1.25, 1.125
    assert s[7:13] == [2, 2, 4, 0, 1, 0]                                  # subnormal ties, 2^-10 tie
    assert float(quantize_activations(t["tiny"]).global_decode) < torch.finfo(torch.float32).tiny
    # "/ 6" as a product with fl32(1/6): an exact division would round these scales down
    aq = quantize_activations(t["reciprocal_sixth"])
    bamax = t["reciprocal_sixth"].float().reshape(-1, 16).abs().amax(-1)
    exact = encode_e4m3fn((bamax / torch.tensor(6.0)) * aq.global_encode)
    assert (exact != aq.scales.reshape(-1))[1:].all()


def test_act_quant_launcher_rejects_bad_inputs():
    with pytest.raises(ValueError, match="multiple of 16"):
        fast.act_quant(torch.zeros(2, 24))
    with pytest.raises(ValueError, match="floating-point"):
        fast.act_quant(torch.zeros(2, 32, dtype=torch.int32))


def test_quantizer_mutants_are_what_they_claim():
    """The two quantizer mutants break exactly one thing: without quantization forward is
    the w4a16 path, and the per-token kernel is the per-token oracle (tested above), while
    the production forward is neither."""
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=16)
    w4a16 = fast.forward_w4a16(*inputs)
    weight_only = fast.variant("weight_only_activations")(*inputs)
    production = fast.forward(*inputs)
    per_token = fast.variant("per_token_amax")(*inputs)
    for a, b, c, d in zip(w4a16, weight_only, production, per_token):
        assert torch.equal(a, b)
        assert not torch.equal(a, c) and not torch.equal(c, d)


# --------------------------------------------------------------------------- mutants
@pytest.mark.parametrize("name", sorted(fast.MUTANTS))
def test_the_check_rejects_each_mutant_of_the_kernel(name):
    """Swapped nibbles, a scale from the wrong 16-block, no global scale, the norm over the
    wrong axis, RoPE halves swapped, [B,S,h,D] layout, kv heads shifted, activations not
    quantized, the quantizer's amax per token: each fails against the W4A4 oracle."""
    defn = load(OP, "small")
    result = run_case(defn, fast.variant(name), Case(0, RAGGED), seed=13, device=CPU, hygiene=False)
    assert not result.passed, f"mutant {name} passed the check"
    assert {"tolerance", "max_abs"} & set(result.violations), result.violations


def test_the_production_variant_is_forward():
    """variant() without a mutant is the production path, bit for bit, and its stages are
    forward's; a mutant's .staged is the production arithmetic too (the bugs live in the
    fused kernels), so the stages and the fused call disagree."""
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=13)
    production = fast.variant()
    assert production.mutant is None and callable(production.staged)
    for a, b in zip(production(*inputs), fast.forward(*inputs)):
        assert torch.equal(a, b)
    broken = fast.variant("rope_halves_swapped")
    for a, b in zip(broken.staged(*inputs), fast.forward.staged(*inputs)):
        assert torch.equal(a, b)
    assert not torch.equal(broken(*inputs)[0], broken.staged(*inputs)[0])
    w4a16 = fast.variant(activations="bf16")
    for a, b in zip(w4a16(*inputs), fast.forward_w4a16(*inputs)):
        assert torch.equal(a, b)
    result = run_case(defn, production, Case(0, RAGGED), seed=13, device=CPU, hygiene=False)
    assert result.passed


def test_mutant_catalogue_and_bad_variant_requests():
    assert all(isinstance(k, str) and isinstance(v, str) and v for k, v in fast.MUTANTS.items())
    assert len(fast.MUTANTS) == 9
    with pytest.raises(ValueError, match="unknown mutant 'not_a_bug'.*swapped_nibbles"):
        fast.variant("not_a_bug")
    with pytest.raises(ValueError, match="unknown variant option.*'tiles'"):
        fast.variant(tiles="256")
    with pytest.raises(ValueError, match="activations must be"):
        fast.variant(activations="fp8")
    with pytest.raises(ValueError, match="BM,BK,WARPS,STAGES"):
        fast.variant(config="256,64")


# --------------------------------------------------------------------------- stage taps
def test_staged_taps_match_the_oracle_stage_by_stage():
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=4)
    taps, oracle = {}, {}
    outs = fast.forward.staged(*inputs, taps=taps)
    ref.reference(*inputs, taps=oracle)
    assert set(taps) == set(oracle) and set(defn.stage_names) <= set(taps)
    assert list(fast.STAGES) == defn.stage_names
    for name in oracle:
        assert taps[name].shape == oracle[name].shape, name
    # act_quant: the quantizer bit for bit, x_hat exact
    for name in ("act_quant", "act_quant.codes", "act_quant.scales", "act_quant.global_decode"):
        assert taps[name].dtype == oracle[name].dtype and torch.equal(taps[name], oracle[name]), name
    # dequant: one fp32 rounding of the exact code*scale*global product (a flushed
    # subnormal nibble or a wrong scale bit would break this equality)
    assert torch.equal(taps["dequant"].double(), oracle["dequant"].float().double())
    for name, rel in (("proj", 1e-5), ("qk_norm", 1e-5), ("rope", 1e-5)):
        err = (taps[name].double() - oracle[name]).abs().max() / oracle[name].abs().max()
        assert err < rel, (name, float(err))
    assert bool(_within_rounding(taps["layout"], oracle["layout"]).all())
    for a, b in zip(outs, fast.forward(*inputs)):
        assert torch.equal(a, b)


def test_w4a16_staged_taps_match_its_oracle():
    defn = load(OP, "small").with_variant("w4a16")
    inputs = generate_inputs(defn, RAGGED, seed=4)
    taps, oracle = {}, {}
    outs = fast.forward_w4a16.staged(*inputs, taps=taps)
    ref.reference_w4a16(*inputs, taps=oracle)
    assert set(taps) == set(oracle) == set(defn.stage_names) == set(fast.STAGES_W4A16)
    assert torch.equal(taps["dequant"].double(), oracle["dequant"].float().double())
    err = (taps["proj"].double() - oracle["proj"]).abs().max() / oracle["proj"].abs().max()
    assert err < 1e-5
    for a, b in zip(outs, fast.forward_w4a16(*inputs)):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="unknown stage"):
        fast.forward_w4a16.staged(*inputs, override={"act_quant": oracle["dequant"]})


def test_staged_override_continues_from_the_given_stage():
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=6)
    oracle = {}
    refs = ref.reference(*inputs, taps=oracle)
    # the oracle's own projection fed in: outputs are the oracle rounded once
    outs = fast.forward.staged(*inputs, override={"proj": oracle["proj"]})
    for o, r in zip(outs, refs):
        assert bool(_within_rounding(o, r).all())
    # the oracle's x_hat (float64 or rounded to fp32) gives back xs exactly: the outputs
    # are the staged path's own; an x_hat of zeros zeroes v
    taps = {}
    own = fast.forward.staged(*inputs, taps=taps)
    for x_hat in (oracle["act_quant"], oracle["act_quant"].float()):
        fed = {}
        outs = fast.forward.staged(*inputs, taps=fed, override={"act_quant": x_hat})
        assert torch.equal(fed["act_quant"], oracle["act_quant"])
        for o, r in zip(outs, own):
            assert torch.equal(o, r)
    _, _, v = fast.forward.staged(*inputs, override={"act_quant": torch.zeros_like(oracle["act_quant"])})
    assert not v.any()
    # dequant and act_quant both overridden: both global scales still applied once
    outs = fast.forward.staged(*inputs, override={"act_quant": oracle["act_quant"],
                                                  "dequant": oracle["dequant"]})
    for o, r, s in zip(outs, refs, defn.outputs):
        assert compare(o, r, defn.tolerance, s.name).passed
    # a dense (overridden) weight runs through the same GEMM kernel
    outs = fast.forward.staged(*inputs, override={"dequant": oracle["dequant"]})
    for o, r, s in zip(outs, refs, defn.outputs):
        assert compare(o, r, defn.tolerance, s.name).passed
    # zero RoPE output: q and k are zero, v untouched
    zeros = torch.zeros_like(oracle["rope"])
    q, k, v = fast.forward.staged(*inputs, override={"rope": zeros})
    assert not q.any() and not k.any()
    assert torch.equal(v, fast.forward(*inputs)[2])
    with pytest.raises(ValueError, match="unknown stage"):
        fast.forward.staged(*inputs, override={"attention": zeros})
    with pytest.raises(ValueError, match="override\\['proj'\\]"):
        fast.forward.staged(*inputs, override={"proj": zeros})


# --------------------------------------------------------------------------- inputs, configs
def test_bad_inputs_raise_value_errors_naming_the_input():
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=1)
    bad = list(inputs)
    bad[0] = inputs[0].float()
    with pytest.raises(ValueError, match="hidden_states"):
        fast.forward(*bad)
    bad = list(inputs)
    bad[7] = inputs[7][:, :-1]
    with pytest.raises(ValueError, match="k_proj_scale"):
        fast.forward(*bad)
    bad = list(inputs)
    bad[0] = inputs[0].clone()
    bad[0][0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="hidden_states"):
        fast.forward(*bad, check_values=True)


def test_kernel_configs_and_tile_tables():
    KC = fast.KernelConfig
    assert KC.parse("128,64,8,3,a") == KC(128, 64, 8, 3, True)
    assert KC.parse("64, 128, 4, 4").w_as_a is False
    assert KC.parse("128,64,8,3,h2").heads_per_tile == 2
    assert KC.parse("256,64,8,4,a,g,p") == KC(256, 64, 8, 4, True, gluon=True, predecode=True)
    for label in ("256,64,8,4,a,h2,g,p", "16,32,4,1"):
        assert KC.parse(label).label() == label
        assert KC.from_dict(json.loads(json.dumps(KC.parse(label).to_dict()))) == KC.parse(label)
    with pytest.raises(ValueError):
        KC.parse("128,64,8,3,x")
    with pytest.raises(ValueError, match="BM,BK,WARPS,STAGES"):
        KC.parse("128,64")
    with pytest.raises(ValueError, match="multiple of 16"):
        KC(128, 40)
    with pytest.raises(ValueError, match="unknown field.*'tile'"):
        KC.from_dict({"block_m": 128, "block_k": 64, "tile": 3})
    # tables: rows as pairs or JSON dicts, sorted by their bound, None = unbounded
    table = _launch.as_table([{"max_tokens": None, "config": "128,64,8,3,a"},
                              (1024, {"block_m": 64, "block_k": 64, "num_warps": 4, "num_stages": 4})])
    assert [m for m, _ in table] == [1024, fast.UNBOUNDED]
    assert _launch.as_table(_launch.table_to_json(table)) == table
    cuda = torch.device("cuda")        # only its type is read: no GPU needed
    assert fast.pick_config(1024, 4096, cuda, table).block_m == 64
    assert fast.pick_config(1025, 4096, cuda, table) == KC(128, 64, 8, 3, True)
    cfg = fast.pick_config(100, 4096, CPU)
    assert cfg.block_m == 64 and cfg.block_k == 64 and cfg.heads_per_tile == 2
    # the interpreter's tiles: every call of more than 16 tokens runs two or more row tiles
    for m in range(1, 700):
        bm = fast.pick_config(m, 64, CPU).block_m
        assert 16 <= bm <= 256 and (m <= 16 or -(-m // bm) >= 2), (m, bm)
    with pytest.raises(ValueError, match="tile table row"):
        _launch.as_table([(1, 2, 3)])


def test_options_report_the_tables_in_force(monkeypatch):
    """options() is JSON and names the config pick_config takes at every bound of the
    table; a table swapped in the launcher shows in options (it is read, not copied)."""
    opts = json.loads(json.dumps(fast.options()))
    cuda = torch.device("cuda")
    for row in opts["tile_table"]:
        bound = row["max_tokens"] or 1 << 40
        assert fast.pick_config(bound, 4096, cuda) == fast.KernelConfig.from_dict(row["config"])
    assert opts["quantizer"] == fast.DEFAULT_QUANT_CONFIG.to_dict()
    other = ((fast.UNBOUNDED, fast.KernelConfig(128, 64, 8, 5, True, gluon=True, predecode=True)),)
    monkeypatch.setattr(_launch, "H200_TABLE", other)
    assert fast.options()["tile_table"] == _launch.table_to_json(other) != opts["tile_table"]
    assert fast.pick_config(4096, 4096, cuda) == other[0][1]


def test_predecoded_weights_are_the_oracles_dequant_exactly():
    """The predecode kernel writes bf16 code * scale: times the global scale it is the
    oracle's dequant stage exactly (at most 6 + 24 significant bits, exact in float64)."""
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=15)
    oracle = {}
    ref.reference(*inputs, taps=oracle)
    (x, cos, sin, wq, sq, gq, wk, sk, gk, wv, sv, gv, qn, kn, eps) = inputs
    w = _launch.predecode_weights(wq, sq, wk, sk, wv, sv, x.shape[-1])
    assert w.dtype == torch.bfloat16 and tuple(w.shape) == tuple(oracle["dequant"].shape)
    g = torch.tensor([float(gq)] * wq.shape[0] + [float(gk)] * wk.shape[0] + [float(gv)] * wv.shape[0],
                     dtype=torch.float64)[:, None]
    assert torch.equal(w.double() * g, oracle["dequant"])


def test_strided_and_misaligned_inputs_give_the_same_outputs():
    """A non-contiguous activation and packed weights starting at an odd byte (the kernel
    reads codes as 4-byte words) are copied by the launcher, not misread."""
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=14)
    odd = list(inputs)
    x = inputs[0]
    odd[0] = x.transpose(1, 2).contiguous().transpose(1, 2)          # same values, strided
    assert not odd[0].is_contiguous()
    w = inputs[3]
    buf = torch.empty(w.numel() + 1, dtype=torch.uint8)
    odd[3] = buf[1:].view(w.shape)
    odd[3].copy_(w)
    assert odd[3].data_ptr() % 4
    for a, b in zip(fast.forward(*inputs), fast.forward(*odd)):
        assert torch.equal(a, b)


def test_empty_batch_returns_empty_outputs():
    defn = load(OP, "small")
    inputs = generate_inputs(defn, {"seq_len": 0, "batch_size": 2}, seed=1)
    q, k, v = fast.forward(*inputs)
    assert q.shape == (2, 4, 0, 16) and k.shape == v.shape == (2, 2, 0, 16)


# --------------------------------------------------------------------------- GPU
@gpu
@needs_cuda
def test_gpu_fast_passes_seed_cases():
    report = check(OP, "fast", config="seed", cases="0,5", device="cuda", seed=31)
    assert report.passed, [c.messages for c in report.cases]


@gpu
@needs_cuda
def test_gpu_ragged_tokens_and_exact_decode():
    defn = load(OP, "seed")
    axes = {"seq_len": 333, "batch_size": 3}
    inputs = generate_inputs(defn, axes, seed=9, device="cuda")
    taps, oracle = {}, {}
    outs = fast.forward.staged(*inputs, taps=taps)
    refs = ref.reference(*inputs, taps=oracle)
    assert torch.equal(taps["dequant"].double(), oracle["dequant"].float().double())
    # K = 4096 fp32 accumulation in the tensor cores: 1e-5 absolute slack on O(1) q/k values
    for o, staged, r in zip(fast.forward(*inputs), outs, refs):
        assert bool(_within_rounding(o, r, 1e-5).all())
        assert bool(_within_rounding(staged, r, 1e-5).all())


@gpu
@needs_cuda
@pytest.mark.parametrize("config", ["256,64,8,4,a,g", "256,64,8,5,g", "128,64,8,5,g,h2", "256,64,8,4,a,g,p",
                                    "128,64,8,4,a,g,p"])
def test_gpu_gluon_kernel_is_the_oracle_rounded_once(config):
    """The Hopper Gluon kernel (operators/nvfp4_qkv_rope/_gluon.py) on a ragged 3 x 333 batch and on the
    seed cases: every element within rounding of the float64 oracle, and the full check
    (NaN-poisoned outputs, hygiene rules) passes."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel targets sm_90")
    defn = load(OP, "seed")
    inputs = generate_inputs(defn, {"seq_len": 333, "batch_size": 3}, seed=19, device="cuda")
    cfg = fast.KernelConfig.parse(config)
    plan = _launch.plan(inputs, 0, _launch.as_table(cfg), 0, False, False)
    assert plan.gluon == cfg and plan.predecode == cfg.predecode        # the Gluon path is taken
    for o, r in zip(fast.forward(*inputs, config=cfg), ref.reference(*inputs)):
        assert bool(_within_rounding(o, r, 1e-5).all())
    report = check(OP, functools.partial(fast.forward, config=cfg), config="seed", cases="0,9",
                   device="cuda", seed=5)
    assert report.passed, [c.messages for c in report.cases]


@gpu
@needs_cuda
def test_gpu_w4a16_variant_passes_seed_cases():
    report = check(OP, "fast", config="seed", cases="0,5", device="cuda", seed=31, variant="w4a16")
    assert report.passed, [c.messages for c in report.cases]


@gpu
@needs_cuda
def test_gpu_act_quant_is_bit_exact_on_the_benchmark_shapes():
    """The compiled quantizer (fp32 divisions by div_rn, no FMA contraction, subnormals
    kept) against the oracle's quantizer on the GPU, on the 16 benchmark cases' shapes
    (B x S tokens of hidden 4096), on randn activations as the benchmark draws them."""
    defn = load(OP, "seed")
    g = torch.Generator(device="cuda").manual_seed(0)
    for case in defn.cases():
        b, s = case.axes["batch_size"], case.axes["seq_len"]
        x = torch.randn((b, s, 4096), generator=g, device="cuda").to(torch.bfloat16)
        try:
            _assert_quantizer_is_the_oracle(x)
        except AssertionError as exc:
            raise AssertionError(f"case {case.index} (B={b}, S={s}): {exc}") from exc


@gpu
@needs_cuda
@pytest.mark.parametrize("per_token", [False, True])
def test_gpu_act_quant_is_bit_exact_on_adversarial_inputs(per_token):
    for name, x in _adversarial_tensors().items():
        try:
            _assert_quantizer_is_the_oracle(x.cuda(), per_token)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc
    # mixed magnitudes over whole hidden rows
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn((333, 4096), generator=g, device="cuda")
    x = x * 2.0 ** torch.randint(-40, 41, (333, 1), generator=g, device="cuda").float()
    _assert_quantizer_is_the_oracle(x.to(torch.bfloat16), per_token)


# --------------------------------------------------------------------------- CUDA graph replay
def _graph_replay_properties() -> dict[str, bool]:
    """Calls of at most GRAPH_MAX_TOKENS go through fast.GRAPHS: eager, then captured, then
    replayed. Returns which of the replay's promises held."""
    defn = load(OP)
    case = defn.cases("0")[0]
    assert case.axes["batch_size"] * case.axes["seq_len"] <= fast.GRAPH_MAX_TOKENS
    inputs = generate_inputs(defn, case.axes, seed=8, device="cuda")
    fast.GRAPHS.clear()
    first = fast.forward(*inputs)
    captures = fast.GRAPHS.captures
    second = fast.forward(*inputs)
    third = fast.forward(*inputs)
    kept = [t.clone() for t in third]
    inputs[0].mul_(-0.5)                                   # changed in place: same address
    changed = fast.forward(*inputs)
    other = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    other[0].normal_()                                     # a new tensor of the same shape
    fresh = fast.forward(*other)
    fast.GRAPHS.clear()

    def ok(out, ins):
        return all(compare(o, r, defn.tolerance).passed for o, r in zip(out, ref.reference(*ins)))
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(a, b))    # noqa: E731
    return {
        "captured_once": fast.GRAPHS.captures == captures + 1,
        "replay_equals_eager": same(first, second) and same(second, third),
        "earlier_result_kept": same(third, kept),
        "reads_changed_input": ok(changed, inputs),
        "reads_other_input": ok(fresh, other),
    }


@gpu
@needs_cuda
def test_graph_replay_is_the_eager_computation():
    assert _graph_replay_properties() == dict.fromkeys(
        ["captured_once", "replay_equals_eager", "earlier_result_kept", "reads_changed_input",
         "reads_other_input"], True)


@gpu
@needs_cuda
def test_graph_replay_mutants_are_caught(monkeypatch):
    """Mutants: outputs returned without a clone (the next replay overwrites a kept result),
    and a key without addresses (a replay reads the tensors of the captured call)."""
    from fuseval.fast._graphs import GraphCache
    monkeypatch.setattr(fast, "GRAPHS", GraphCache(clone_outputs=False))
    assert not _graph_replay_properties()["earlier_result_kept"]
    monkeypatch.setattr(fast, "GRAPHS", GraphCache())
    monkeypatch.setattr(fast, "tensor_key", lambda ts: tuple(getattr(t, "shape", t) for t in ts))
    assert not _graph_replay_properties()["reads_other_input"]


def test_parts_are_the_production_call_in_two_pieces():
    """fast.parts: the quantizer part returns the production quantizer's xs, and the GEMM
    part on it gives the production call's outputs bit for bit; fed another call's
    quantizer output (a broken part), the GEMM part differs."""
    defn = load(OP, "small")
    inputs = generate_inputs(defn, {"seq_len": 24, "batch_size": 2}, seed=3)
    other = generate_inputs(defn, {"seq_len": 24, "batch_size": 2}, seed=4)
    parts = fast.parts(*inputs)
    assert list(parts) == ["act_quant", "gemm"]
    assert parts["gemm"].flops == ref.cost_model(defn.resolve_axes({"seq_len": 24, "batch_size": 2}))["flops"]
    assert parts["act_quant"].flops == 0 and parts["act_quant"].bytes >= 3 * 2 * 48 * 64
    (xs, _), _ = parts["act_quant"].run()
    q = quantize_activations(inputs[0].reshape(-1, 64))
    want = decode_e2m1(q.codes) * decode_e4m3fn(q.scales).repeat_interleave(16, -1)
    assert torch.equal(xs.double().view(-1, 64), want)
    got = parts["gemm"].run()
    for o, w in zip(got, fast.forward(*inputs)):
        assert torch.equal(o.view(torch.int16), w.view(torch.int16))
    p = _launch.plan(inputs, 0, None, 0, False, False)
    act_other, _ = _launch.quantize(other, p, "tensor")
    broken = _launch.gemm(inputs, mode=0, table=None, act=act_other)
    assert not torch.equal(broken[0].view(torch.int16), got[0].view(torch.int16))


@gpu
@needs_cuda
def test_gpu_bench_times_the_parts():
    """fuseval bench times op B's parts apart (graph replays), each against its own floor."""
    from fuseval.bench import run_bench
    report = run_bench(OP, ["fast"], cases="0", min_reps=3, max_reps=5, rep_ms=5, warmup_ms=2,
                       monitor_clocks=False)
    parts = report.cases[0].parts
    assert set(parts) == {"act_quant", "gemm"}
    for name, p in parts.items():
        assert p["error"] is None and p["median_ms"] > 0 and p["floor_ms"] > 0, (name, p)
    assert parts["act_quant"]["bound"] == "memory"          # no FLOPs of a matrix product
    # the GEMM's bound depends on the card (compute-bound on an H200's rates, memory-bound on
    # some H100s'): it must be the larger term at this card's measured copy bandwidth
    gemm = parts["gemm"]
    memory_ms = gemm["bytes"] / report.ceilings["copy_bytes_per_s"] * 1e3
    if gemm["bound"] == "memory":
        assert gemm["floor_ms"] == pytest.approx(memory_ms, rel=1e-9)
    else:
        assert gemm["bound"] == "compute" and gemm["floor_ms"] >= memory_ms
