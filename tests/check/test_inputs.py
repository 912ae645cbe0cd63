"""Tests for fuseval.inputs.generate_inputs: determinism, the benchmark-mode drawing rules
of SPEC.md ("How SOL-ExecBench generates random inputs") and the realistic mode.

Expected values come from SPEC.md and from probability facts about N(0, 1) draws (the
statistics use thousands of samples and loose bounds, so they are stable for any seed
yet fail for a wrong rule, e.g. a weight scaled by the wrong dimension). FP4 / FP8 values
are decoded here from their bit fields, not with fuseval's codec.
"""
from __future__ import annotations

import math

import pytest
import torch

from fuseval.operators import load
from fuseval.inputs import draw_inputs, generic_benchmark_inputs, generate_inputs

OP_A = "qwen2vl_decoder_layer"
OP_B = "nvfp4_qkv_rope"


CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu

# var axes used below (small configs: H=64; op A: 4 heads, 2 kv heads, D=16, I=96;
# op B: 4 heads, 2 kv heads, D=16)
AXES_A = {"batch_size": 2, "seq_len": 64, "kv_seq_len": 64}
AXES_B = {"batch_size": 2, "seq_len": 64}

# SPEC dtypes (torch storage): fp4 is uint8 packed, fp8 is float8_e4m3fn, scalars are floats
DTYPES_B = {"hidden_states": torch.bfloat16, "cos": torch.bfloat16, "sin": torch.bfloat16,
            "q_proj_weight_fp4": torch.uint8, "q_proj_scale": torch.float8_e4m3fn,
            "k_proj_weight_fp4": torch.uint8, "k_proj_scale": torch.float8_e4m3fn,
            "v_proj_weight_fp4": torch.uint8, "v_proj_scale": torch.float8_e4m3fn,
            "q_norm_weight": torch.bfloat16, "k_norm_weight": torch.bfloat16}
SCALARS_B = {"q_proj_global_decode_scale", "k_proj_global_decode_scale",
             "v_proj_global_decode_scale", "rms_norm_eps"}


def named(op, axes, **kw):
    d = load(op, "small")
    return d, dict(zip(d.input_names, generate_inputs(d, axes, **kw)))


def generic(op, axes, seed=0):
    """Inputs under SOL-ExecBench's generic rules, also for an operator (op B) that draws
    its benchmark inputs with a generator of its own."""
    d = load(op, "small")
    return d, generic_benchmark_inputs(d, d.resolve_axes(axes), seed)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of a tensor (so float8 and NaN compare bitwise)."""
    return t.contiguous().view(torch.uint8)


def e2m1_value(code: int) -> float:
    """SPEC: 4-bit s.ee.m, bias 1, exponent 0 subnormal (m * 0.5)."""
    sign = -1.0 if code & 0b1000 else 1.0
    e, m = (code >> 1) & 0b11, code & 1
    return sign * (m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1))


def e4m3_value(byte: int) -> float:
    """SPEC: s.eeee.mmm, bias 7, subnormals m/8 * 2^-6, NaN only at s.1111.111."""
    sign = -1.0 if byte & 0x80 else 1.0
    e, m = (byte >> 3) & 0xF, byte & 0x7
    if e == 15 and m == 7:
        return math.nan
    return sign * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


def decode_fp4_codes(packed: torch.Tensor) -> torch.Tensor:
    """Codes [N, 2K] from bytes [N, K]; low nibble = even column."""
    p = packed.to(torch.int64)
    return torch.stack([p & 0xF, p >> 4], dim=-1).flatten(-2)


def dequantize(packed, scale, gs) -> torch.Tensor:
    """W[n, k] = e2m1(code[n, k]) * e4m3(scale[n, k // 16]) * gs, in float64, via tables
    built from the bit rules above."""
    lut4 = torch.tensor([e2m1_value(c) for c in range(16)], dtype=torch.float64)
    lut8 = torch.tensor([e4m3_value(b) for b in range(256)], dtype=torch.float64)
    codes = decode_fp4_codes(packed)
    s = lut8[bits(scale).to(torch.int64)]
    return lut4[codes] * s.repeat_interleave(16, dim=-1) * gs


def normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


# ------------------------------------------------------------------ determinism
@pytest.mark.parametrize("op, axes", [(OP_A, AXES_A), (OP_B, AXES_B)])
@pytest.mark.parametrize("mode", ["benchmark", "realistic"])
def test_same_seed_gives_bitwise_identical_inputs(op, axes, mode):
    _, a = named(op, axes, seed=11, mode=mode)
    _, b = named(op, axes, seed=11, mode=mode)
    assert list(a) == list(b)
    for name in a:
        if isinstance(a[name], torch.Tensor):
            assert torch.equal(bits(a[name]), bits(b[name])), name
        else:
            assert a[name] == b[name], name


@pytest.mark.parametrize("op, axes", [(OP_A, AXES_A), (OP_B, AXES_B)])
@pytest.mark.parametrize("mode", ["benchmark", "realistic"])
def test_different_seed_gives_different_random_inputs(op, axes, mode):
    _, a = named(op, axes, seed=1, mode=mode)
    _, b = named(op, axes, seed=2, mode=mode)
    deterministic = {"rms_norm_eps"}
    if mode == "benchmark":
        deterministic |= {n for n in a if n.endswith("norm_weight")}   # ones
    else:
        deterministic |= {"rope_cos", "rope_sin", "cos", "sin"}        # from position ids
    for name in a:
        if name in deterministic:
            continue
        if isinstance(a[name], torch.Tensor):
            assert not torch.equal(bits(a[name]), bits(b[name])), name
        else:
            assert a[name] != b[name], name


def test_inputs_come_in_definition_order_with_spec_dtypes_and_shapes():
    d, x = named(OP_B, AXES_B, seed=0)
    assert list(x) == d.input_names
    for name, want in DTYPES_B.items():
        assert x[name].dtype == want, name
        assert x[name].is_contiguous() and x[name].device.type == "cpu"
    for name in SCALARS_B:
        assert type(x[name]) is float, name
    b, s, h, d_ = 2, 64, 64, 16
    assert x["hidden_states"].shape == (b, s, h)
    assert x["cos"].shape == (b, s, d_)
    assert x["q_proj_weight_fp4"].shape == (4 * 16, h // 2)
    assert x["k_proj_scale"].shape == (2 * 16, h // 16)
    _, y = named(OP_A, AXES_A, seed=0)
    assert all(t.dtype == torch.float32 for t in y.values() if isinstance(t, torch.Tensor))
    assert y["rope_cos"].shape == (3, 2, 64, 16)
    assert y["down_proj_weight"].shape == (64, 96)
    assert y["rms_norm_eps"] == 1e-6


def test_an_input_does_not_depend_on_the_other_axes():
    """Documented: each input has its own generator, so weights are the same for two cases
    of one seed (only activation shapes change)."""
    _, small = named(OP_A, {"batch_size": 1, "seq_len": 3, "kv_seq_len": 3}, seed=4)
    _, large = named(OP_A, {"batch_size": 2, "seq_len": 9, "kv_seq_len": 9}, seed=4)
    for name in ("q_proj_weight", "q_proj_bias", "down_proj_weight"):
        assert torch.equal(small[name], large[name])


@pytest.mark.parametrize("op, axes, mode", [(OP_A, AXES_A, "benchmark"), (OP_A, AXES_A, "realistic"),
                                            (OP_B, AXES_B, "benchmark"), (OP_B, AXES_B, "realistic")])
def test_a_subset_draw_gives_the_same_values_as_a_full_draw(op, axes, mode):
    d = load(op, "small")
    full = generate_inputs(d, axes, seed=3, mode=mode)
    names = {d.inputs[0].name, d.inputs[-2].name}
    part = draw_inputs(d, axes, seed=3, mode=mode, names=names)
    assert set(part) == names
    for name in names:
        a, b = part[name], full[d.input_index(name)]
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def test_a_subset_draw_draws_nothing_else_under_the_generic_rules(monkeypatch):
    from fuseval import inputs
    seen = []
    real = inputs.input_generator
    monkeypatch.setattr(inputs, "input_generator", lambda seed, name, device="cpu": seen.append(name) or
                        real(seed, name, device))
    draw_inputs(load(OP_A, "small"), AXES_A, seed=0, names={"q_proj_weight", "hidden_states"})
    assert sorted(seen) == ["hidden_states", "q_proj_weight"]


def test_a_subset_draw_names_an_unknown_input():
    with pytest.raises(ValueError) as e:
        draw_inputs(load(OP_A, "small"), AXES_A, names={"hidden_state"})
    assert "'hidden_state'" in str(e.value) and "hidden_states" in str(e.value)


def test_bad_mode_and_bad_axes_are_rejected():
    d = load(OP_A, "small")
    with pytest.raises(ValueError, match="noisy"):
        generate_inputs(d, {"batch_size": 1, "seq_len": 2, "kv_seq_len": 2}, mode="noisy")
    with pytest.raises(ValueError) as e:
        generate_inputs(d, {"batch_size": 1, "seq_len": 2, "kv_seq_len": 1})
    assert "kv_seq_len=1" in str(e.value) and "seq_len=2" in str(e.value)


# ------------------------------------------------------------------ benchmark mode
def test_benchmark_norm_weights_are_ones():
    _, a = named(OP_A, AXES_A)
    _, b = named(OP_B, AXES_B)
    for t in (a["input_layernorm_weight"], a["post_attention_layernorm_weight"],
              b["q_norm_weight"], b["k_norm_weight"]):
        assert torch.equal(t.float(), torch.ones_like(t, dtype=torch.float32))


@pytest.mark.parametrize("name, fan_in", [("q_proj_weight", 64), ("k_proj_weight", 64),
                                          ("o_proj_weight", 64), ("gate_proj_weight", 64),
                                          ("down_proj_weight", 96)])
def test_benchmark_weights_are_randn_over_sqrt_last_dim(name, fan_in):
    # down_proj [64, 96]: 1/sqrt(96) = 0.102 vs 1/sqrt(64) = 0.125 (the wrong axis) differ by 20%
    _, a = named(OP_A, AXES_A, seed=3)
    w = a[name].double()
    assert w.numel() >= 2048
    assert float(w.std()) == pytest.approx(1 / math.sqrt(fan_in), rel=0.08)
    assert abs(float(w.mean())) < 4 / math.sqrt(fan_in) / math.sqrt(w.numel())


@pytest.mark.parametrize("name", ["hidden_states", "q_proj_bias", "k_proj_bias", "v_proj_bias"])
def test_benchmark_activations_and_biases_are_standard_normal(name):
    _, a = named(OP_A, AXES_A, seed=3)
    t = a[name].double()
    n = t.numel()
    assert float(t.std()) == pytest.approx(1.0, abs=max(0.05, 5 / math.sqrt(n)))
    assert abs(float(t.mean())) < 5 / math.sqrt(n)


@pytest.mark.parametrize("op, axes, cos_name, sin_name", [(OP_A, AXES_A, "rope_cos", "rope_sin"),
                                                          (OP_B, AXES_B, "cos", "sin")])
def test_benchmark_cos_sin_are_bounded_independent_draws(op, axes, cos_name, sin_name):
    _, x = generic(op, axes, seed=5)
    c, s = x[cos_name].double(), x[sin_name].double()
    assert c.abs().max() <= 1 and s.abs().max() <= 1
    # cos(x) for x ~ N(0,1) has mean e^-1/2 = 0.607; sin(x) mean 0, std sqrt((1-e^-2)/2) = 0.658
    assert float(c.mean()) == pytest.approx(math.exp(-0.5), abs=0.03)
    assert float(s.mean()) == pytest.approx(0.0, abs=0.03)
    assert float(s.std()) == pytest.approx(math.sqrt((1 - math.exp(-2)) / 2), abs=0.03)
    # independent angles: cos^2 + sin^2 is not 1 (it would be for one shared angle)
    off_circle = ((c**2 + s**2 - 1).abs() > 0.05).double().mean()
    assert float(off_circle) > 0.5


def test_benchmark_fp8_scales_are_clamped_randn_on_the_e4m3_grid():
    _, x = generic(OP_B, AXES_B, seed=6)
    values = []
    for p in "qkv":
        t = x[f"{p}_proj_scale"]
        assert t.dtype == torch.float8_e4m3fn
        raw = bits(t).flatten().tolist()
        decoded = torch.tensor([e4m3_value(b) for b in raw], dtype=torch.float64)
        # the bit pattern is an e4m3 encoding of the value torch reads from it
        assert torch.equal(decoded, t.double().flatten())
        values.append(decoded)
    v = torch.cat(values)
    assert v.abs().max() <= 2.0 and torch.isfinite(v).all()
    # clamp(randn, -2, 2): P(|x| >= 2) = 4.6% lands exactly on +-2; scales are signed
    at_bound = float((v.abs() == 2).double().mean())
    assert 0.02 < at_bound < 0.08
    assert (v == 2).any() and (v == -2).any()
    assert 0.4 < float((v < 0).double().mean()) < 0.6


def test_benchmark_fp4_codes_are_randn_rounded_to_the_e2m1_grid():
    _, x = generic(OP_B, AXES_B, seed=7)
    codes = torch.cat([decode_fp4_codes(x[f"{p}_proj_weight_fp4"]).flatten() for p in "qkv"])
    assert codes.numel() == (64 + 32 + 32) * 64
    grid = torch.tensor([e2m1_value(c) for c in range(16)], dtype=torch.float64)
    values = grid[codes]
    # round-to-nearest onto {0, .5, 1, 1.5, 2, 3, 4, 6}: the mass of N(0,1) between midpoints
    edges = [0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, math.inf]
    for magnitude, lo, hi in zip([0, 0.5, 1, 1.5, 2, 3, 4, 6], edges[:-1], edges[1:]):
        lo_mass = 0.0 if lo == 0 else normal_cdf(lo)
        expected = 2 * (normal_cdf(hi) - (0.5 if lo == 0 else lo_mass))
        observed = float((values.abs() == magnitude).double().mean())
        assert observed == pytest.approx(expected, abs=0.025), magnitude
    assert 0.45 < float((values > 0).double().sum() / (values != 0).double().sum()) < 0.55


# ------------------------------------------------------------------ op B's own generator
def test_op_b_benchmark_cos_sin_and_activations_are_plain_randn_bf16():
    """Quant/028 draws hidden_states, cos and sin as randn in bf16: unbounded, independent."""
    _, x = named(OP_B, {"batch_size": 4, "seq_len": 64}, seed=5)
    for name in ("hidden_states", "cos", "sin"):
        t = x[name]
        assert t.dtype == torch.bfloat16
        t = t.double()
        assert float(t.mean()) == pytest.approx(0.0, abs=0.05)
        assert float(t.std()) == pytest.approx(1.0, abs=0.05)
    assert x["cos"].double().abs().max() > 2.5 and x["sin"].double().abs().max() > 2.5
    assert not torch.equal(x["cos"], x["sin"])


def test_op_b_benchmark_weights_are_randn_times_0_02_through_the_benchmarks_quantizer():
    """The weights: randn(float32) * 0.02 quantized by the activation quantizer (positive
    e4m3 block scales, global decode amax / 2688): decoded, they are about N(0, 0.02^2)."""
    from act_quant_independent import quantize_loops
    from fuseval.inputs import input_generator
    d, x = named(OP_B, AXES_B, seed=7)
    for p in "qkv":
        packed, scale, gd = x[f"{p}_proj_weight_fp4"], x[f"{p}_proj_scale"], x[f"{p}_proj_global_decode_scale"]
        assert scale.dtype == torch.float8_e4m3fn and (scale.float() >= 0).all()
        w = torch.randn(packed.shape[0], 2 * packed.shape[1], generator=input_generator(7, f"{p}_proj_weight_fp4"),
                        dtype=torch.float32) * 0.02
        codes, sbits, want_gd = quantize_loops(w)
        assert gd == float(want_gd) and gd == pytest.approx(float(w.abs().max()) / 2688, rel=1e-6)
        assert torch.equal(scale.view(torch.uint8), torch.from_numpy(sbits))
        assert torch.equal(decode_fp4_codes(packed), torch.from_numpy(codes).long())
    assert x["rms_norm_eps"] == 1e-6


def test_benchmark_global_decode_scales_are_positive():
    _, x = named(OP_B, AXES_B, seed=8)
    for p in "qkv":
        g = x[f"{p}_proj_global_decode_scale"]
        assert g > 0 and math.isfinite(g)
        # an fp32 scalar: representable in float32
        assert float(torch.tensor(g, dtype=torch.float32)) == g


# ------------------------------------------------------------------ realistic mode
def inv_freq(head_dim: int, theta: float = 1e6) -> torch.Tensor:
    """HF rotary frequencies theta^(-2i/D), i < D/2 (rotate_half layout: repeated twice)."""
    return torch.tensor([theta ** (-2 * i / head_dim) for i in range(head_dim // 2)],
                        dtype=torch.float64)


def test_realistic_op_b_cos_sin_come_from_positions():
    _, x = named(OP_B, AXES_B, seed=9, mode="realistic")
    c, s = x["cos"].double(), x["sin"].double()
    assert (c**2 + s**2 - 1).abs().max() < 2e-2          # on the unit circle up to bf16 rounding
    # token s is at position s (rope_theta 1e6): angle[s, i] = s * theta^(-2i/D), repeated halves
    pos = torch.arange(64, dtype=torch.float64)
    angles = pos[:, None] * inv_freq(16)
    angles = torch.cat([angles, angles], dim=-1)
    for b in range(2):
        assert torch.allclose(c[b], torch.cos(angles), atol=8e-3, rtol=0)
        assert torch.allclose(s[b], torch.sin(angles), atol=8e-3, rtol=0)


def test_realistic_norm_weights_are_near_one_but_not_ones():
    _, x = named(OP_B, AXES_B, seed=9, mode="realistic")
    _, y = named(OP_A, AXES_A, seed=9, mode="realistic")
    for t in (x["q_norm_weight"], x["k_norm_weight"], y["input_layernorm_weight"],
              y["post_attention_layernorm_weight"]):
        t = t.double()
        assert (t - 1).abs().max() < 0.6
        assert 0.03 < float(t.std()) < 0.3


def test_realistic_op_b_weights_are_quantized_with_the_recipe():
    """SPEC recipe: global = amax(W) / (448*6), block scale = e4m3(amax(block) / 6 / global).
    Hence the block holding amax(W) gets scale 448 exactly and a code of magnitude 6, so the
    largest dequantized magnitude is exactly 2688 * global; the weights are a Gaussian of std
    1/sqrt(K) (K = 64 here)."""
    _, x = named(OP_B, AXES_B, seed=10, mode="realistic")
    for p in "qkv":
        packed, scale, gs = x[f"{p}_proj_weight_fp4"], x[f"{p}_proj_scale"], x[f"{p}_proj_global_decode_scale"]
        assert scale.dtype == torch.float8_e4m3fn and packed.dtype == torch.uint8
        assert type(gs) is float and gs > 0
        scales = scale.double()
        assert float(scales.max()) == 448.0
        assert (scales >= 0).all()
        w = dequantize(packed, scale, gs)
        assert float(w.abs().max()) == 2688.0 * gs
        assert float(w.std()) == pytest.approx(1 / math.sqrt(64), rel=0.15)
        # every block uses its scale well: its largest code magnitude is at least 4
        codes = decode_fp4_codes(packed)
        mags = torch.tensor([abs(e2m1_value(c)) for c in range(16)])[codes]
        assert (mags.view(mags.shape[0], -1, 16).amax(-1) >= 4).all()


def test_realistic_op_a_cos_sin_are_multimodal_positions():
    axes = {"batch_size": 2, "seq_len": 40, "kv_seq_len": 40}
    _, x = named(OP_A, axes, seed=12, mode="realistic")
    c, s = x["rope_cos"].double(), x["rope_sin"].double()
    assert c.shape == (3, 2, 40, 16)
    assert (c**2 + s**2 - 1).abs().max() < 1e-6
    # recover positions from the slowest frequency (angle = pos * 1e6^(-14/16) << pi)
    freqs = inv_freq(16)
    pos = torch.atan2(s[..., 7], c[..., 7]) / freqs[-1]
    ids = pos.round()
    assert (pos - ids).abs().max() < 0.05                  # integer position ids
    # the whole table is cos/sin(pos_axis * theta^(-2i/D)), halves repeated
    angles = ids[..., None] * torch.cat([freqs, freqs])
    assert torch.allclose(c, torch.cos(angles), atol=1e-6, rtol=0)
    assert torch.allclose(s, torch.sin(angles), atol=1e-6, rtol=0)
    t, h, w = ids[0, 0], ids[1, 0], ids[2, 0]
    assert (t[0], h[0], w[0]) == (0, 0, 0)
    assert bool((t[1:] >= t[:-1]).all())                   # temporal ids never go back
    text = (t == h) & (h == w)
    image = ~text
    assert text[0] and image.any()                         # a text / image / text sequence
    assert len(set(t[image].tolist())) == 1                # an image sits at one time step
    assert len(set(h[image].tolist())) > 1 and len(set(w[image].tolist())) > 1   # 2-D grid
    # text after the image continues past every id used before it
    last = int(torch.nonzero(image).max())
    if last + 1 < 40:
        assert t[last + 1] > max(float(t[: last + 1].max()), float(h[: last + 1].max()),
                                 float(w[: last + 1].max()))
    assert torch.equal(ids[:, 0], ids[:, 1])               # same layout for every batch row


# ------------------------------------------------------------------ devices
@gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("op, axes", [(OP_A, AXES_A), (OP_B, AXES_B)])
@pytest.mark.parametrize("mode", ["benchmark", "realistic"])
def test_generation_on_cuda_is_reproducible_and_distributed_like_the_cpu_draw(op, axes, mode):
    """Drawn on the GPU itself: the same bits on every run there, the same distribution as
    the CPU draw (not the same bits), every tensor on the device and contiguous."""
    d = load(op, "small")
    axes = {**axes, "batch_size": 8} if op == OP_B else axes
    cpu = generate_inputs(d, axes, seed=13, mode=mode, device="cpu")
    dev = generate_inputs(d, axes, seed=13, mode=mode, device="cuda")
    again = generate_inputs(d, axes, seed=13, mode=mode, device="cuda")
    differ = 0
    for name, a, b, c in zip(d.input_names, cpu, dev, again):
        if isinstance(a, torch.Tensor):
            assert b.device.type == "cuda" and b.is_contiguous() and b.dtype == a.dtype, name
            assert torch.equal(bits(b), bits(c)), name
            differ += not torch.equal(bits(a), bits(b.cpu()))
            if a.is_floating_point() and a.numel() >= 1024 and a.dtype != torch.float8_e4m3fn:
                fa, fb = a.double(), b.double().cpu()
                assert float(fb.mean()) == pytest.approx(float(fa.mean()), abs=0.1 * float(fa.std()) + 1e-6), name
                assert float(fb.std()) == pytest.approx(float(fa.std()), rel=0.1, abs=1e-6), name
        elif name.endswith("global_decode_scale"):
            assert b == pytest.approx(a, rel=0.5), name
        else:
            assert a == b == c, name
    assert differ > 0                    # a GPU draw, not a CPU draw moved to the GPU


def test_saved_inputs_reload_bit_for_bit_and_name_a_wrong_operator(tmp_path):
    from fuseval.inputs import load_inputs, save_inputs
    d = load(OP_B, "small")
    x = generate_inputs(d, AXES_B, seed=3)
    path = save_inputs(str(tmp_path / "case.pt"), d, x, seed=3, case=0)
    y, meta = load_inputs(path, d)
    assert meta == {"seed": 3, "case": 0}
    for name, a, b in zip(d.input_names, x, y):
        assert (torch.equal(bits(a), bits(b)) and a.dtype == b.dtype) if isinstance(a, torch.Tensor) else a == b, name
    with pytest.raises(ValueError, match="qwen2vl_decoder_layer"):
        load_inputs(path, load(OP_A, "small"))
    (tmp_path / "junk.pt").write_text("not a tensor file")
    with pytest.raises(ValueError, match="junk.pt"):
        load_inputs(str(tmp_path / "junk.pt"))
