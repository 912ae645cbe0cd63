"""The strategies of fuseval.properties: they reach the corners the issue lists, the
inputs they build are valid and deterministic, and counterexamples shrink to small,
readable examples."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import find, given, settings

from fuseval.operators import load
from fuseval.properties import profiles
from fuseval.properties import strategies as S
from fuseval.properties.hooks import hooks_of
from fuseval.refimpl import nvfp4
from fuseval.validate import bind_axes

OP_A, OP_B = "qwen2vl_decoder_layer", "nvfp4_qkv_rope"
OPS = (OP_A, OP_B)


def _collect(strategy, n=120):
    """n draws of a strategy (fixed Hypothesis seed, no shrinking needed)."""
    seen = []

    @settings(max_examples=n, database=None, derandomize=True, deadline=None)
    @given(strategy)
    def draw(x):
        seen.append(x)
    draw()
    return seen


@pytest.mark.parametrize("op", OPS)
def test_axis_bindings_cover_the_space(op):
    """GQA ratios 1, 2, 4, 7, several head_dims, hidden sizes that are and are not
    multiples of 32, seq_len 1 upward; every binding satisfies the definition."""
    hq, hkv = hooks_of(load(op)).gqa_axes
    seen = _collect(S.axis_bindings(op), n=150)
    ratios = {b.config[hq] // b.config[hkv] for b in seen}
    assert ratios == {1, 2, 4, 7}
    assert len({b.config["head_dim"] for b in seen}) >= 3
    hidden = {b.config["hidden_size"] for b in seen}
    assert any(h % 32 for h in hidden) and any(h % 32 == 0 for h in hidden)
    assert min(b.axes["seq_len"] for b in seen) == 1
    assert max(b.axes["seq_len"] for b in seen) > 4
    for b in seen:
        defn = b.definition()
        defn.resolve_axes(b.axes)            # constraints hold (kv_seq_len == seq_len, GQA, ...)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("mode", S.INPUT_MODES)
def test_inputs_are_valid_and_deterministic(op, mode):
    for ex in _collect(S.inputs(op, mode=mode), n=8):
        x1, x2 = ex.tensors(), ex.tensors()
        defn = ex.definition()
        bound = bind_axes(defn, x1, check_values=False)
        assert {k: bound[k] for k in ex.binding.axes} == ex.binding.axes
        for a, b in zip(x1, x2):
            if isinstance(a, torch.Tensor):
                assert torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                                   b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
            else:
                assert a == b


def _binding(op, **var):
    defn = load(op, "small")
    axes = {"batch_size": var.get("b", 2), "seq_len": var.get("s", 6)}
    if "kv_seq_len" in defn.var_axes:
        axes["kv_seq_len"] = axes["seq_len"]
    return S.Binding.make(op, defn.const_axes, axes)


def test_adversarial_nvfp4_features():
    """Every e2m1 code, special and NaN scale codes, zero rows, eps, non-contiguous views."""
    op = OP_B
    b = _binding(op, b=2, s=6)
    defn = b.definition()
    recipe = S.make_recipe(op, codes="every", scales="special", nan_scales=2, zero_rows=2, eps=0.5,
                           noncontiguous=True, rotary="arbitrary")
    x = dict(zip(defn.input_names, S.make_inputs(b, "adversarial", 3, recipe)))
    codes = torch.cat([nvfp4.unpack_fp4(x[f"{p}_proj_weight_fp4"].contiguous()).flatten() for p in "qkv"])
    assert set(codes.tolist()) == set(range(16))
    bits = torch.cat([x[f"{p}_proj_scale"].contiguous().view(torch.uint8).flatten() for p in "qkv"])
    present = set(bits.tolist())
    assert {0x00, 0x80, 0x7E, 0xFE} <= present                      # +-0, +-448
    assert any(1 <= c <= 7 for c in present) and any(0x81 <= c <= 0x87 for c in present)  # subnormals
    assert any(c & 0x80 and c not in (0x80, 0xFF) for c in present)  # negative
    assert int(((bits & 0x7F) == 0x7F).sum()) >= 1                   # NaN
    hs = x["hidden_states"].float()
    assert int((hs.abs().amax(-1) == 0).sum()) == 2
    assert x["rms_norm_eps"] == 0.5
    assert not x["hidden_states"].is_contiguous() and not x["q_proj_weight_fp4"].is_contiguous()
    cos, sin = x["cos"].float(), x["sin"].float()
    assert float((cos * cos + sin * sin - 1).abs().max()) > 0.1    # not on the unit circle
    assert bool((cos == 0).any()) and bool((cos.abs() == 1).any())
    subnormal = S.make_inputs(b, "adversarial", 3, S.make_recipe(op, scales="subnormal"))
    sb = subnormal[defn.input_index("k_proj_scale")].view(torch.uint8)
    assert bool((((sb >> 3) & 0xF) == 0).all()) and bool(((sb & 7) != 0).all())


def test_adversarial_magnitudes_reach_eps():
    """tiny rows put mean(x^2) below eps (op A) so eps decides the norm; huge rows are
    large; mixed rows span both."""
    op = OP_A
    b = _binding(op, b=2, s=8)
    defn = b.definition()
    idx = defn.input_index("hidden_states")
    eps = defn.inputs[defn.input_index("rms_norm_eps")].value
    tiny = S.make_inputs(b, "adversarial", 1, S.Recipe(magnitude="tiny"))[idx]
    assert float(tiny.pow(2).mean(-1).max()) < eps
    huge = S.make_inputs(b, "adversarial", 1, S.Recipe(magnitude="huge"))[idx]
    assert float(huge.abs().max()) > 1e3
    mixed = S.make_inputs(b, "adversarial", 1, S.Recipe(magnitude="mixed"))[idx]
    ms = mixed.pow(2).mean(-1)
    assert float(ms.max() / ms.min()) > 1e6


def test_adversarial_v_stays_in_tolerance_range():
    """op B: the v global scale is lowered so that typical |v| <= 1 even for huge inputs
    and 448 scales (the tolerance rule's absolute terms stay meaningful)."""
    from fuseval.operators.nvfp4_qkv_rope.reference import reference
    b = _binding(OP_B, b=2, s=6)
    for seed in range(4):
        x = S.make_inputs(b, "adversarial", seed, S.make_recipe(OP_B, magnitude="huge", scales="special",
                                                                codes="every"))
        v = reference(*x)[2]
        assert float(v.pow(2).mean().sqrt()) <= 1.0


def test_noncontiguous_views_keep_values():
    b = _binding(OP_A, b=2, s=3)
    plain = S.make_inputs(b, "adversarial", 2, S.Recipe(rotary="arbitrary"))
    strided = S.make_inputs(b, "adversarial", 2, S.Recipe(rotary="arbitrary", noncontiguous=True))
    for p, q in zip(plain, strided):
        if isinstance(p, torch.Tensor):
            assert torch.equal(p, q)
            assert q.numel() <= 1 or not q.is_contiguous()


def test_recipe_json_round_trip_and_errors():
    r = S.make_recipe(OP_B, magnitude="tiny", zero_rows=1, eps=0.5, nan_scales=2, codes="benchmark")
    assert r.features == (("nan_scales", 2),)          # an operator feature at its default is left out
    assert r.to_json() == '{"magnitude":"tiny","zero_rows":1,"eps":0.5,"nan_scales":2}'
    assert S.Recipe.from_json(r.to_json(), OP_B) == r
    assert S.Recipe().to_json() == "{}"
    with pytest.raises(ValueError, match="unknown fields"):
        S.Recipe.from_json('{"magnitud": "tiny"}')
    with pytest.raises(ValueError, match="unknown fields"):          # op B's own field, no operator named
        S.Recipe.from_json(r.to_json())
    with pytest.raises(ValueError, match="unknown fields.*of qwen2vl_decoder_layer"):
        S.make_recipe(OP_A, codes="every")
    with pytest.raises(ValueError, match="do not apply to qwen2vl_decoder_layer"):
        S.make_inputs(_binding(OP_A), "adversarial", 0, S.make_recipe(OP_B, codes="every"))
    with pytest.raises(ValueError, match="input mode"):
        S.make_inputs(_binding(OP_A), "weird", 0)


def test_shrinking_gives_small_readable_counterexamples():
    """A property that fails only for tiny magnitudes and GQA ratio 7 shrinks to the
    smallest such example: batch 1, seq_len 1, seed 0, a recipe with only the magnitude."""
    op = OP_A

    def fails(ex):
        return (ex.mode == "adversarial" and ex.recipe.magnitude == "tiny"
                and ex.binding.config["num_heads"] == 7 * ex.binding.config["num_kv_heads"])
    found = find(S.examples(op), fails, settings=settings(max_examples=2000, database=None, derandomize=True))
    assert found.binding.axes == {"batch_size": 1, "seq_len": 1, "kv_seq_len": 1}
    assert found.seed == 0
    assert found.recipe == S.Recipe(magnitude="tiny")
    assert found.binding.config["num_kv_heads"] == 1 and found.binding.config["head_dim"] == 16
    text = repr(found)
    assert len(text) < 300 and "tensor" not in text
    assert "magnitude" in text and "seq_len=1" in text


def test_example_command_and_config_arg():
    named = S.Example(_binding(OP_B), "benchmark", 7)
    assert named.binding.config_arg == "small"
    cmd = named.command("fast")
    assert cmd.startswith("fuseval property --op nvfp4_qkv_rope --impl fast --config small")
    assert "--seed 7" in cmd
    custom = S.Binding.make(OP_B, {**load(OP_B, "small").const_axes, "hidden_size": 48},
                            {"batch_size": 1, "seq_len": 2})
    ex = S.Example(custom, "adversarial", 3, S.Recipe(magnitude="tiny"))
    assert json.loads(custom.config_arg)["hidden_size"] == 48
    assert "--recipe" in ex.command("torch") and "fuseval check" in ex.check_command("torch")


def test_profiles_registered():
    profiles.register_profiles()
    for name in profiles.PROFILE_NAMES:
        s = profiles.profile_settings(name)
        assert s.deadline is None
    assert profiles.profile_settings("ci").database is None
    assert profiles.property_settings("ci").max_examples == profiles.PROPERTY_EXAMPLES["ci"]
    with pytest.raises(ValueError, match="unknown property profile"):
        profiles.profile_settings("nightly")
