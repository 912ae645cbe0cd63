"""Hypothesis strategies over each operator's axis space and input space.

What is drawn, and why it shrinks well
--------------------------------------
An :class:`Example` is four small, readable values: an axis :class:`Binding` (a
scaled-down const configuration plus the var axes), an input ``mode``, an input ``seed``
and, for adversarial inputs, a :class:`Recipe`. The tensors themselves are a pure
function of those values (:meth:`Example.tensors`), so

* a failing example prints as a few integers and names, never as a tensor dump;
* shrinking works on those values: seq_len and batch towards 1, the configuration towards
  the first (simplest) entry of each list, the seed towards 0 and every recipe field
  towards its plain default, so a counterexample keeps only the features that matter
  (e.g. ``Recipe(magnitude='tiny')`` alone);
* the same example is reproduced anywhere from one command line (see
  :meth:`Example.command`).

Modes
-----
``benchmark``  SOL-ExecBench's own distribution (``fuseval.inputs``).
``realistic``  cos/sin from real position ids, norm weights near 1, NVFP4 weights
               quantized with the standard recipe (``fuseval.inputs``).
``adversarial`` the benchmark draw, then reshaped by a :class:`Recipe`: huge, tiny or
               per-row mixed magnitudes, all-zero token rows (RMSNorm then returns
               0 * rsqrt(eps)), a drawn ``rms_norm_eps`` (1e-2 or 0.5 instead of 1e-6, so
               where eps sits in the formula changes the result), arbitrary cos/sin
               (independent, not on the unit circle, with exact zeros and +-1), norm weights
               away from 1 (N(1, 0.5), so a norm weight that is ignored or mixed up shows), every e2m1
               code (including -0), e4m3 block scales that are subnormal, negative, zero,
               +-448 or NaN (mixed, or every block subnormal so that their decoding is what
               decides the result), and non-contiguous input views.

Adversarial draws stay inside the range where the tolerance rule is meaningful for a
correct implementation in the output precision: op B's value_states pass the input
magnitude through x W^T, and a bf16 output of magnitude ~100 carries rounding errors
beyond the rule's absolute 5e-3 / max-abs 1.0, so the global decode scale of the v
weights is lowered by a power of two until the typical |v| is at most 1 (q and k are
normalised and need no such care). Documented in docs/properties.md.
"""
from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

import torch
from hypothesis import strategies as st

from ..definitions import Definition, load
from ..inputs import MODES, generate_inputs, input_generator
from ..refimpl import nvfp4
from .profiles import SPACES, Space

__all__ = ["OP_A", "OP_B", "OPS", "Binding", "Recipe", "Example", "axis_bindings", "recipes",
           "inputs", "examples", "make_inputs", "adversarial_inputs", "explicit_examples",
           "INPUT_MODES", "named_config"]

OP_A = "qwen2vl_decoder_layer"
OP_B = "nvfp4_qkv_rope"
OPS = (OP_A, OP_B)
INPUT_MODES = ("benchmark", "realistic", "adversarial")

# the const axes a binding draws, per operator (the rest are expressions)
_HEADS = {OP_A: ("num_heads", "num_kv_heads"), OP_B: ("num_attention_heads", "num_key_value_heads")}


def _space(space: Space | str) -> Space:
    return SPACES[space] if isinstance(space, str) else space


# --------------------------------------------------------------------------- bindings
@dataclass(frozen=True)
class Binding:
    """A full axis binding: the const configuration and the var axes."""
    op: str
    consts: tuple[tuple[str, int], ...]
    var: tuple[tuple[str, int], ...]

    @classmethod
    def make(cls, op: str, consts: Mapping[str, int], var: Mapping[str, int]) -> "Binding":
        return cls(op, tuple(sorted(consts.items())), tuple(var.items()))

    @property
    def config(self) -> dict[str, int]:
        return dict(self.consts)

    @property
    def axes(self) -> dict[str, int]:
        return dict(self.var)

    def definition(self) -> Definition:
        return load(self.op, named_config(self.op, self.config) or self.config)

    @property
    def config_arg(self) -> str:
        """A configuration name when the consts equal one, else a JSON mapping."""
        return named_config(self.op, self.config) or json.dumps(self.config, separators=(",", ":"))

    def __repr__(self) -> str:
        c = ", ".join(f"{k}={v}" for k, v in self.consts)
        v = ", ".join(f"{k}={v}" for k, v in self.var)
        return f"Binding({self.op}: {c}; {v})"

    def _repr_pretty_(self, printer, cycle) -> None:
        # Hypothesis prints falsifying examples with this (IPython's protocol)
        printer.text(repr(self))


def named_config(op: str, consts: Mapping[str, int]) -> str | None:
    """The name of the definition's configuration whose const axes equal ``consts``."""
    base = load(op)
    for name in base.configs:
        if base.with_config(name).const_axes == dict(consts):
            return name
    return None


@st.composite
def axis_bindings(draw, op: str, space: Space | str = "small") -> Binding:
    """Strategy: an axis binding of ``op``.

    Small spaces draw the const configuration too: head_dim from a few values, GQA ratios
    1, 2, 4, 7 over 1 or 2 kv heads, hidden sizes that are and are not multiples of the
    tile sizes; the ``full`` space keeps the seed configuration. seq_len starts at 1."""
    sp = _space(space)
    base = load(op)
    consts = dict(base.const_axes)
    if not sp.full:
        hq_name, hkv_name = _HEADS[op]
        kv = draw(st.sampled_from(sp.kv_heads))
        ratio = draw(st.sampled_from(sp.gqa_ratios))
        consts[hkv_name] = kv
        consts[hq_name] = kv * ratio
        consts["head_dim"] = draw(st.sampled_from(sp.head_dims[op]))
        consts["hidden_size"] = draw(st.sampled_from(sp.hidden_sizes[op]))
        if op == OP_A:
            consts["intermediate_size"] = draw(st.sampled_from(sp.intermediate_sizes))
    batch = draw(st.integers(*sp.batch))
    seq = draw(st.integers(*sp.seq_len))
    # op A: rope tables longer than the tokens too (kv_seq_len > seq_len; first rows used)
    extra = draw(st.sampled_from([0, 0, 1, 3])) if op == OP_A else 0
    return Binding.make(op, consts, _var(op, {"batch_size": batch, "seq_len": seq}, extra))


# --------------------------------------------------------------------------- recipes
@dataclass(frozen=True)
class Recipe:
    """How an adversarial draw departs from the benchmark draw. Every field's default is
    "no change", so shrinking a recipe strips the features a failure does not need."""
    magnitude: str = "unit"      # unit | tiny | huge | mixed (per token row)
    zero_rows: int = 0           # number of all-zero hidden_states rows
    eps: float | None = None     # rms_norm_eps; None keeps the definition's value
    rope: str = "benchmark"      # benchmark | arbitrary (independent cos, sin in [-1, 1], 0, +-1)
    noncontiguous: bool = False  # pass strided / column-major views instead of contiguous tensors
    norm_weights: str = "benchmark"  # benchmark (ones) | random (N(1, 0.5): some near 0 or negative)
    codes: str = "benchmark"     # op B: benchmark | every (uniform over all 16 e2m1 codes)
    scales: str = "benchmark"    # op B: benchmark | special (subnormal, zero, -0, +-448, negatives)
                                 #       | subnormal (every block scale subnormal, either sign)
    nan_scales: int = 0          # op B: number of NaN e4m3 scale codes

    def to_json(self) -> str:
        changed = {f.name: getattr(self, f.name) for f in fields(self)
                   if getattr(self, f.name) != f.default}
        return json.dumps(changed, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any] | None) -> "Recipe":
        if not text:
            return cls()
        data = json.loads(text) if isinstance(text, str) else dict(text)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"recipe: unknown fields {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    def __repr__(self) -> str:
        return f"Recipe({self.to_json()})"

    def _repr_pretty_(self, printer, cycle) -> None:
        # Hypothesis prints falsifying examples with this (IPython's protocol)
        printer.text(repr(self))


def recipes(op: str) -> st.SearchStrategy[Recipe]:
    """Strategy: an adversarial :class:`Recipe` for ``op`` (plain fields first, so they
    shrink to "no change")."""
    common = dict(
        magnitude=st.sampled_from(["unit", "tiny", "huge", "mixed"]),
        zero_rows=st.integers(0, 2),
        eps=st.sampled_from([None, 1e-2, 0.5]),
        rope=st.sampled_from(["benchmark", "arbitrary"]),
        noncontiguous=st.booleans(),
        norm_weights=st.sampled_from(["benchmark", "random"]),
    )
    if op == OP_B:
        common.update(codes=st.sampled_from(["benchmark", "every"]),
                      scales=st.sampled_from(["benchmark", "special", "subnormal"]),
                      nan_scales=st.integers(0, 2))
    return st.builds(Recipe, **common)


# --------------------------------------------------------------------------- examples
@dataclass(frozen=True)
class Example:
    """One drawn point of an operator's input space (tensors built on demand)."""
    binding: Binding
    mode: str
    seed: int
    recipe: Recipe | None = None

    @property
    def op(self) -> str:
        return self.binding.op

    @property
    def well_conditioned(self) -> bool:
        """Benchmark and realistic draws (the tighter bound applies to these)."""
        return self.mode != "adversarial"

    def definition(self) -> Definition:
        return self.binding.definition()

    def tensors(self, device: str | torch.device = "cpu") -> list[Any]:
        return make_inputs(self.binding, self.mode, self.seed, self.recipe, device=device)

    def describe(self) -> str:
        lines = [f"operator: {self.op}",
                 f"axis binding: {json.dumps(self.binding.config)} {json.dumps(self.binding.axes)}"
                 f" (config {self.binding.config_arg})",
                 f"input mode: {self.mode}" + (f", recipe {self.recipe.to_json()}" if self.recipe else ""),
                 f"seed: {self.seed}"]
        return "\n".join(lines)

    def command(self, impl: str, device: str = "cpu") -> str:
        """One shell command that reruns exactly this example."""
        parts = ["python", "-m", "fuseval.properties", "--op", self.op, "--impl", impl,
                 "--config", self.binding.config_arg, "--axes",
                 json.dumps(self.binding.axes, separators=(",", ":")),
                 "--mode", self.mode, "--seed", str(self.seed)]
        if self.recipe is not None and self.recipe != Recipe():
            parts += ["--recipe", self.recipe.to_json()]
        if device != "cpu":
            parts += ["--device", device]
        return " ".join(shlex.quote(p) for p in parts)

    def check_command(self, impl: str, device: str = "cpu") -> str:
        """The closest ``fuseval check`` command (same configuration, mode and seed, but on
        the configuration's benchmark cases rather than this example's var axes)."""
        mode = self.mode if self.mode in MODES else "benchmark"
        parts = ["fuseval", "check", "--op", self.op, "--impl", impl, "--config",
                 self.binding.config_arg, "--seed", str(self.seed), "--mode", mode]
        if device != "cpu":
            parts += ["--device", device]
        return " ".join(shlex.quote(p) for p in parts)

    def __repr__(self) -> str:
        r = f", recipe={self.recipe!r}" if self.recipe is not None else ""
        return f"Example({self.binding!r}, mode={self.mode!r}, seed={self.seed}{r})"

    def _repr_pretty_(self, printer, cycle) -> None:
        # Hypothesis prints falsifying examples with this (IPython's protocol)
        printer.text(repr(self))


def inputs(op: str, binding: Binding | None = None, mode: str | None = None, *,
           space: Space | str = "small") -> st.SearchStrategy[Example]:
    """Strategy: an :class:`Example` of ``op`` (call ``.tensors(device)`` for the inputs).

    ``binding`` / ``mode`` fix those parts; left out, they are drawn too."""
    b = st.just(binding) if binding is not None else axis_bindings(op, space)
    modes = [mode] if mode is not None else list(INPUT_MODES)
    for m in modes:
        if m not in INPUT_MODES:
            raise ValueError(f"input mode must be one of {INPUT_MODES}, got {m!r}")
    return examples(op, space=space, modes=modes, binding=b)


@st.composite
def examples(draw, op: str, space: Space | str = "small", modes: Sequence[str] = INPUT_MODES,
             binding: st.SearchStrategy[Binding] | None = None) -> Example:
    """Strategy: binding, mode, seed and (adversarial mode) recipe."""
    b = draw(binding if binding is not None else axis_bindings(op, space))
    mode = draw(st.sampled_from(list(modes)))
    recipe = draw(recipes(op)) if mode == "adversarial" else None
    seed = draw(st.integers(0, 2**31 - 1))
    return Example(b, mode, seed, recipe)


def explicit_examples(op: str, space: Space | str = "small") -> list[Example]:
    """Examples every property run starts with, whatever the seed: one per input mode and
    one per family of adversarial features, on bindings with GQA ratio 2 over 2 kv heads
    (where i // group and i % kv_heads differ) and ratio 7, and a hidden size that is not
    a multiple of 16 (op A). They make the suite's verdict on a broken implementation
    independent of the random draws."""
    sp = _space(space)
    if sp.full:
        base = load(op)
        var = [{"batch_size": 2, "seq_len": 131}, {"batch_size": 1, "seq_len": 64}]
        bindings = [Binding.make(op, base.const_axes, _var(op, v)) for v in var]
    elif op == OP_A:
        c1 = dict(hidden_size=40, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=48,
                  num_rope_dims=3)
        c2 = dict(hidden_size=72, num_heads=7, num_kv_heads=1, head_dim=32, intermediate_size=80,
                  num_rope_dims=3)
        bindings = [Binding.make(op, c1, _var(op, {"batch_size": 2, "seq_len": 6}, extra=3)),
                    Binding.make(op, c2, _var(op, {"batch_size": 1, "seq_len": 9}))]
    else:
        c1 = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        c2 = dict(hidden_size=80, num_attention_heads=14, num_key_value_heads=2, head_dim=8)
        bindings = [Binding.make(op, c1, _var(op, {"batch_size": 2, "seq_len": 5})),
                    Binding.make(op, c2, _var(op, {"batch_size": 1, "seq_len": 3}))]
    b1, b2 = bindings
    out = [Example(b1, "benchmark", 1), Example(b1, "realistic", 2), Example(b2, "benchmark", 3),
           Example(b1, "adversarial", 4, Recipe(magnitude="tiny", zero_rows=1)),
           Example(b1, "adversarial", 5, Recipe(magnitude="mixed", eps=0.5, rope="arbitrary",
                                                noncontiguous=True, norm_weights="random"))]
    if op == OP_B:
        out.append(Example(b2, "adversarial", 6, Recipe(codes="every", scales="special",
                                                        nan_scales=1, zero_rows=1)))
        out.append(Example(b1, "adversarial", 7, Recipe(scales="subnormal", magnitude="huge")))
    return out


def _var(op: str, v: Mapping[str, int], extra: int = 0) -> dict[str, int]:
    """The var axes of a binding: op A's kv_seq_len is seq_len + ``extra`` (the rope tables
    may be longer than the tokens: the definition's constraint kv_seq_len >= seq_len)."""
    v = dict(v)
    if op == OP_A:
        v["kv_seq_len"] = v["seq_len"] + extra
    return v


# --------------------------------------------------------------------------- tensors
def make_inputs(binding: Binding, mode: str, seed: int, recipe: Recipe | None = None, *,
                device: str | torch.device = "cpu") -> list[Any]:
    """The inputs (definition order) of one example; deterministic in its arguments."""
    defn = binding.definition()
    if mode in MODES:
        return generate_inputs(defn, binding.axes, seed=seed, mode=mode, device=device)
    if mode != "adversarial":
        raise ValueError(f"input mode must be one of {INPUT_MODES}, got {mode!r}")
    return adversarial_inputs(defn, binding.axes, seed=seed, recipe=recipe or Recipe(), device=device)


def _gen(seed: int, what: str) -> torch.Generator:
    return input_generator(seed, "adversarial/" + what)


# magnitudes as powers of two (exact in every float format, so scaling moves no bits).
# op A: "tiny" puts mean(x^2) ~ 6e-8 well below eps = 1e-6, so the norm is eps-dominated;
# "huge" 4096 is harmless to fp32. op B: "tiny" is relative to what the benchmark's NVFP4
# weights (randn * 0.02) make of x: 2^-10 gives q ~ 1e-4 at the small configs, so
# mean(q^2) << eps and v sits far under atol; "huge" 256 is what bf16 v outputs can carry
# once the v global scale is adapted (see module docstring).
_MAGNITUDES = {
    "qwen2vl_decoder_layer": {"tiny": -12, "huge": 12, "mixed": (-20, -10, 0, 6, 12)},
    "nvfp4_qkv_rope": {"tiny": -10, "huge": 8, "mixed": (-12, -6, 0, 4, 8)},
}


def _row_factors(op: str, magnitude: str, b: int, s: int, g: torch.Generator) -> torch.Tensor:
    table = _MAGNITUDES[op]
    if magnitude == "unit":
        return torch.ones(b, s, 1)
    if magnitude in ("tiny", "huge"):
        return torch.full((b, s, 1), 2.0 ** table[magnitude])
    if magnitude == "mixed":
        exps = torch.tensor(table["mixed"], dtype=torch.float64)
        pick = torch.randint(0, len(exps), (b, s), generator=g)
        return torch.pow(2.0, exps[pick]).unsqueeze(-1).float()
    raise ValueError(f"recipe magnitude must be unit, tiny, huge or mixed, got {magnitude!r}")


def _zero_rows(x: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    if n <= 0:
        return x
    b, s, _ = x.shape
    rows = torch.randperm(b * s, generator=g)[:n]
    x = x.clone()
    x.view(b * s, -1)[rows] = 0
    return x


def _arbitrary_table(shape, g: torch.Generator) -> torch.Tensor:
    """Independent values in [-1, 1], a fifth of them exactly 0, +1 or -1."""
    t = torch.rand(shape, generator=g, dtype=torch.float32) * 2 - 1
    special = torch.tensor([0.0, 1.0, -1.0])
    pick = torch.rand(shape, generator=g) < 0.2
    which = torch.randint(0, 3, shape, generator=g)
    return torch.where(pick, special[which], t)


def _noncontiguous(t: Any) -> Any:
    """The same values as a non-contiguous view: 2-D weights column-major, everything
    else strided (every other element of a twice-as-wide buffer along the last axis)."""
    if not isinstance(t, torch.Tensor) or t.dim() == 0:
        return t
    if t.dim() == 2 and t.shape[0] > 1 and t.shape[1] > 1:
        view = t.t().contiguous().t()
    else:
        buf = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device) \
            if t.dtype != torch.float8_e4m3fn else \
            torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=torch.uint8, device=t.device).view(t.dtype)
        view = buf[..., ::2]
        view.copy_(t)
    assert not view.is_contiguous() or t.numel() <= 1
    return view


# e4m3fn codes of the special block scales: +-subnormal (2^-9 .. 7 * 2^-9), +-0, +-448,
# negative normals; 0x7F / 0xFF are the NaN codes
_SPECIAL_SCALE_CODES = (0x01, 0x03, 0x07, 0x81, 0x85, 0x00, 0x80, 0x7E, 0xFE, 0xB8, 0xC4)
_NAN_CODES = (0x7F, 0xFF)


def adversarial_inputs(defn: Definition, var_axes: Mapping[str, int], *, seed: int,
                       recipe: Recipe, device: str | torch.device = "cpu") -> list[Any]:
    """Benchmark inputs reshaped by ``recipe`` (see the module docstring)."""
    axes = defn.resolve_axes(var_axes)
    values = dict(zip(defn.input_names, generate_inputs(defn, var_axes, seed=seed, mode="benchmark")))
    op = defn.name
    # one generator per feature: switching one feature on or off (as shrinking does) leaves
    # the values of the others unchanged
    b, s = axes["batch_size"], axes["seq_len"]

    x = values["hidden_states"]
    dtype = x.dtype
    x = (x.float() * _row_factors(op, recipe.magnitude, b, s, _gen(seed, "magnitude"))).to(dtype)
    values["hidden_states"] = _zero_rows(x, recipe.zero_rows, _gen(seed, "zero_rows"))
    if recipe.eps is not None:
        values["rms_norm_eps"] = float(recipe.eps)
    if recipe.rope == "arbitrary":
        names = ("rope_cos", "rope_sin") if op == OP_A else ("cos", "sin")
        g = _gen(seed, "rope")
        for n in names:
            values[n] = _arbitrary_table(values[n].shape, g).to(values[n].dtype)
    elif recipe.rope != "benchmark":
        raise ValueError(f"recipe rope must be benchmark or arbitrary, got {recipe.rope!r}")
    if recipe.norm_weights == "random":
        g = _gen(seed, "norm_weights")
        for spec in defn.inputs:
            if spec.name.endswith("norm_weight"):
                w = values[spec.name]
                values[spec.name] = (1 + 0.5 * torch.randn(w.shape, generator=g)).to(w.dtype)
    elif recipe.norm_weights != "benchmark":
        raise ValueError(f"recipe norm_weights must be benchmark or random, got {recipe.norm_weights!r}")

    if op == OP_B:
        _adversarial_nvfp4(values, recipe, seed)
    elif any((recipe.codes != "benchmark", recipe.scales != "benchmark", recipe.nan_scales)):
        raise ValueError(f"recipe fields codes/scales/nan_scales apply to {OP_B} only, got {recipe!r}")

    out = []
    for spec in defn.inputs:
        v = values[spec.name]
        if isinstance(v, torch.Tensor):
            v = v.to(device)
            if recipe.noncontiguous:
                v = _noncontiguous(v)
        out.append(v)
    return out


def _adversarial_nvfp4(values: dict[str, Any], recipe: Recipe, seed: int) -> None:
    """Weights of every e2m1 code, special and NaN block scales, and v's global scale
    lowered (by powers of two) until typical |v| <= 1."""
    projections = ("q", "k", "v")
    for p in projections:
        packed = values[f"{p}_proj_weight_fp4"]
        g = _gen(seed, f"codes/{p}")
        if recipe.codes == "every":
            values[f"{p}_proj_weight_fp4"] = torch.randint(0, 256, packed.shape, generator=g,
                                                           dtype=torch.int64).to(torch.uint8)
        elif recipe.codes != "benchmark":
            raise ValueError(f"recipe codes must be benchmark or every, got {recipe.codes!r}")
        scale = values[f"{p}_proj_scale"].view(torch.uint8).clone()
        g = _gen(seed, f"scales/{p}")
        if recipe.scales == "special":
            flat = scale.view(-1)
            specials = torch.tensor(_SPECIAL_SCALE_CODES, dtype=torch.uint8)
            # every special code at least once (when there is room), then half the rest
            order = torch.randperm(flat.numel(), generator=g)
            n_each = min(len(specials), flat.numel())
            flat[order[:n_each]] = specials[:n_each]
            rest = order[n_each:]
            pick = rest[torch.rand(rest.numel(), generator=g) < 0.5]
            flat[pick] = specials[torch.randint(0, len(specials), (pick.numel(),), generator=g)]
        elif recipe.scales == "subnormal":
            # mantissa 1..7 with exponent field 0, random sign: m/8 * 2^-6
            mant = torch.randint(1, 8, scale.shape, generator=g, dtype=torch.int64)
            sign = torch.randint(0, 2, scale.shape, generator=g, dtype=torch.int64) << 7
            scale = (mant | sign).to(torch.uint8)
        elif recipe.scales != "benchmark":
            raise ValueError(f"recipe scales must be benchmark, special or subnormal, got {recipe.scales!r}")
        values[f"{p}_proj_scale"] = scale
    g = _gen(seed, "nan_scales")
    for _ in range(recipe.nan_scales):
        p = projections[int(torch.randint(0, 3, (), generator=g))]
        scale = values[f"{p}_proj_scale"]
        r = int(torch.randint(0, scale.shape[0], (), generator=g))
        c = int(torch.randint(0, scale.shape[1], (), generator=g))
        scale[r, c] = _NAN_CODES[int(torch.randint(0, 2, (), generator=g))]
    for p in projections:
        values[f"{p}_proj_scale"] = values[f"{p}_proj_scale"].view(torch.float8_e4m3fn)

    # typical |v[n]| ~ sqrt(sum_k x_k^2 W_nk^2) (random signs); keep its max <= 1
    x = values["hidden_states"].to(torch.float64).reshape(-1, values["hidden_states"].shape[-1])
    w = nvfp4.dequantize_nvfp4(values["v_proj_weight_fp4"], values["v_proj_scale"],
                               float(values["v_proj_global_decode_scale"])).nan_to_num(0.0)
    typical = float(((x * x) @ (w * w).t()).max().sqrt()) if x.numel() else 0.0
    if typical > 1.0:
        shift = math.ceil(math.log2(typical))
        values["v_proj_global_decode_scale"] = float(
            torch.tensor(float(values["v_proj_global_decode_scale"]) * 2.0 ** -shift, dtype=torch.float32))
