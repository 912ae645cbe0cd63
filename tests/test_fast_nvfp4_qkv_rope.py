"""The fused Triton path of op B (nvfp4_qkv_rope), checked against the float64 oracle.

On the CPU the kernel runs through the Triton interpreter (tests/conftest.py), on the
scaled-down configurations; the ``gpu`` tests run the seed sizes compiled. Every check
draws fresh inputs and goes through fuseval.check (NaN-poisoned outputs on CUDA), and
each kind of bug the issue names has a mutant of the kernel that the check must reject.
"""
from __future__ import annotations

import functools

import pytest
import torch

from fuseval.check import check, compare, run_case
from fuseval.definitions import Case, load
from fuseval.fast import nvfp4_qkv_rope as fast
from fuseval.inputs import generate_inputs
from fuseval.refimpl import nvfp4_qkv_rope as ref

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
def test_fast_is_the_oracle_rounded_once_on_ragged_sizes(config, axes):
    """Decode and products are exact and the norm/RoPE run in fp32 on the fp32 accumulator,
    so every element is the oracle rounded to bf16 (not merely inside the 0.5% tolerance).
    The tiny configuration (head_dim 8) pads each RoPE half to 8 tile columns."""
    defn = load(OP, config)
    inputs = generate_inputs(defn, axes, seed=5)
    outs = fast.forward(*inputs)
    refs = ref.reference(*inputs)
    for spec, o, r in zip(defn.outputs, outs, refs):
        assert o.dtype == torch.bfloat16 and o.shape == r.shape, spec.name
        ok = _within_rounding(o, r)
        assert bool(ok.all()), f"{spec.name}: {int((~ok).sum())} elements off by more than rounding"
    result = run_case(defn, fast.forward, Case(0, axes), seed=8, device=CPU)
    assert result.passed, result.messages


@pytest.mark.parametrize("config", ["16,64,4,1,h2", "32,32,4,1,a,h2", "16,64,4,1,a"])
def test_tile_variants_compute_the_same_function(config):
    """Two heads per tile (h2) and the transposed product (a, decoded W as the dot's first
    operand) are the GPU's variants; the interpreter checks their indexing."""
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=12)
    outs = fast.forward(*inputs, config=config)
    for o, r in zip(outs, ref.reference(*inputs)):
        assert bool(_within_rounding(o, r).all())
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


def test_global_scales_may_be_zero_dim_tensors():
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=3)
    as_tensors = list(inputs)
    for i in (5, 8, 11):
        as_tensors[i] = torch.tensor(inputs[i], dtype=torch.float32)
    a, b = fast.forward(*inputs), fast.forward(*as_tensors)
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


# --------------------------------------------------------------------------- mutants
@pytest.mark.parametrize("name", sorted(fast.MUTANTS))
def test_the_check_rejects_each_mutant_of_the_kernel(name):
    """Swapped nibbles, a scale from the wrong 16-block, no global scale, the norm over the
    wrong axis, RoPE halves swapped, [B,S,h,D] layout, kv heads shifted: each fails."""
    defn = load(OP, "small")
    mutant = functools.partial(fast.forward, _mutant=fast.MUTANTS[name])
    result = run_case(defn, mutant, Case(0, RAGGED), seed=13, device=CPU, hygiene=False)
    assert not result.passed, f"mutant {name} passed the check"
    assert {"tolerance", "max_abs"} & set(result.violations), result.violations


def test_mutant_flags_leave_the_production_kernel_alone():
    defn = load(OP, "small")
    result = run_case(defn, functools.partial(fast.forward, _mutant=0), Case(0, RAGGED), seed=13,
                      device=CPU, hygiene=False)
    assert result.passed


# --------------------------------------------------------------------------- stage taps
def test_staged_taps_match_the_oracle_stage_by_stage():
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=4)
    taps, oracle = {}, {}
    outs = fast.forward.staged(*inputs, taps=taps)
    ref.reference(*inputs, taps=oracle)
    assert set(taps) == set(oracle) == set(defn.stage_names)
    for name in oracle:
        assert taps[name].shape == oracle[name].shape, name
    # dequant: one fp32 rounding of the exact code*scale*global product (a flushed
    # subnormal nibble or a wrong scale bit would break this equality)
    assert torch.equal(taps["dequant"].double(), oracle["dequant"].float().double())
    for name, rel in (("proj", 1e-5), ("qk_norm", 1e-5), ("rope", 1e-5)):
        err = (taps[name].double() - oracle[name]).abs().max() / oracle[name].abs().max()
        assert err < rel, (name, float(err))
    assert bool(_within_rounding(taps["layout"], oracle["layout"]).all())
    for a, b in zip(outs, fast.forward(*inputs)):
        assert torch.equal(a, b)


def test_staged_override_continues_from_the_given_stage():
    defn = load(OP, "small")
    inputs = generate_inputs(defn, RAGGED, seed=6)
    oracle = {}
    refs = ref.reference(*inputs, taps=oracle)
    # the oracle's own projection fed in: outputs are the oracle rounded once
    outs = fast.forward.staged(*inputs, override={"proj": oracle["proj"]})
    for o, r in zip(outs, refs):
        assert bool(_within_rounding(o, r).all())
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


def test_kernel_config_parsing():
    assert fast.KernelConfig.parse("128,64,8,3,a") == fast.KernelConfig(128, 64, 8, 3, True)
    assert fast.KernelConfig.parse("64, 128, 4, 4").w_as_a is False
    assert fast.KernelConfig.parse("128,64,8,3,h2").heads_per_tile == 2
    with pytest.raises(ValueError):
        fast.KernelConfig.parse("128,64,8,3,x")
    with pytest.raises(ValueError, match="BM,BK,WARPS,STAGES"):
        fast.KernelConfig.parse("128,64")
    table = fast.parse_table("inf:128,64,8,3,a;1024:64,64,4,4")
    assert [m for m, _ in table] == [1024, 1 << 62]
    cfg = fast.pick_config(100, 4096, 128, CPU)
    assert cfg.block_m == 32 and cfg.block_k == 64


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
@pytest.mark.parametrize("config", ["256,64,8,4,a,g", "256,64,8,5,g", "128,64,8,5,g,h2"])
def test_gpu_gluon_kernel_is_the_oracle_rounded_once(config):
    """The Hopper Gluon kernel (fast/_nvfp4_gluon.py) on a ragged 3 x 333 batch and on the
    seed cases: every element within rounding of the float64 oracle, and the full check
    (NaN-poisoned outputs, hygiene rules) passes."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel targets sm_90")
    defn = load(OP, "seed")
    inputs = generate_inputs(defn, {"seq_len": 333, "batch_size": 3}, seed=19, device="cuda")
    cfg = fast.KernelConfig.parse(config)
    assert fast._plan(inputs, 0, cfg, 0, False, False).gluon == cfg      # the Gluon path is taken
    for o, r in zip(fast.forward(*inputs, config=cfg), ref.reference(*inputs)):
        assert bool(_within_rounding(o, r, 1e-5).all())
    report = check(OP, functools.partial(fast.forward, config=cfg), config="seed", cases="0,9",
                   device="cuda", seed=5)
    assert report.passed, [c.messages for c in report.cases]
