"""Input generation for any operator definition.

Two modes:

* ``"benchmark"`` mirrors how SOL-ExecBench draws random inputs (SPEC.md), by its generic
  rules unless the operator's spec names a ``benchmark`` input hook
  (``OperatorSpec.inputs``; ``hook(defn, axes, seed, device=)``: a problem with a custom input
  generator, e.g. Quant/028). The generic rules: floats are
  ``randn``; ``*norm_weight`` / ``*layernorm_weight`` are ones; weight matrices are
  ``randn / sqrt(last dim)``; other biases ``randn``; ``cos`` = cos(clamp(randn, -pi, pi)),
  ``sin`` = sin of an independent draw; fp8 tensors clamp(randn, -2, 2) rounded to e4m3;
  fp4 tensors randn rounded to the e2m1 grid (ties to even), packed in pairs; bool
  ``randint(0, 2)``, int8 ``randint(-128, 128)``, other integers ``randint(-1024, 1024)``;
  fp8 e5m2 clamp(randn, -2, 2) cast to the format. A ``shape: []`` input is a 0-d tensor
  drawn by the same rules.
* ``"realistic"`` is what a real model feeds the operator: cos/sin from position ids
  (rope_theta from the definition; three position axes t, h, w for multimodal RoPE),
  norm weights near 1, and NVFP4 weights quantized from a Gaussian weight matrix with the
  standard global/block scale recipe. An operator may refine it with a ``realistic`` input
  hook in its spec.

Every input is drawn from its own generator seeded from (seed, input name), *on the
device the inputs are asked for* (a CPU draw of full-size weights would dominate a GPU
check's time: docs/inputs.md). The guarantee:

* the same (seed, case, input) gives the same tensor on every run on the same kind of
  device (for CUDA: the same GPU model, since torch's Philox kernels size their grid by
  the SM count), and an input's value does not depend on the shapes of the others
  (weights are identical across cases for one seed);
* draws on different devices are statistically the same distribution, not the same bits;
* ``save_inputs`` / ``load_inputs`` keep a draw (tensors with their devices and dtypes,
  scalars as they are) so that a failure seen on one machine replays exactly.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, Collection, Mapping

import torch

from .definitions import Definition, TensorSpec
from .refimpl import nvfp4

__all__ = ["generate_inputs", "DrawnInputs", "draw_inputs", "generic_benchmark_inputs", "TORCH_DTYPES", "INTEGER_RANGES",
           "exact_dtype", "dtype_rule", "input_generator",
           "positions_to_cos_sin", "save_inputs", "load_inputs"]

# dtype names of the definitions -> the torch storage dtype implementations receive
TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "float4_e2m1fn_x2": torch.uint8,   # two e2m1 codes per byte, low nibble = even column
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "bool": torch.bool,
}

# integer dtypes: the benchmark's generic rule draws randint over these ranges [lo, hi)
INTEGER_RANGES: dict[str, tuple[int, int]] = {"int8": (-128, 128), "int16": (-1024, 1024),
                                              "int32": (-1024, 1024), "int64": (-1024, 1024)}


_EXACT = (torch.bool, torch.int8, torch.int16, torch.int32, torch.int64)


def exact_dtype(dtype: str | torch.dtype) -> bool:
    """Whether values of ``dtype`` (a definition name or a torch dtype) are compared exactly:
    signed integers and bool, which have no rounding error to allow for (uint8 is fuseval's
    storage of packed fp4 codes, compared as before)."""
    t = TORCH_DTYPES.get(dtype) if isinstance(dtype, str) else dtype
    return t in _EXACT

MODES = ("benchmark", "realistic")


def input_generator(seed: int, name: str, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator on ``device`` for one input, seeded from (seed, name)."""
    digest = hashlib.sha256(f"{int(seed)}/{name}".encode()).digest()
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return g


def _randn(shape, g) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float32, device=g.device)


def dtype_rule(dtype: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor | None:
    """The benchmark's generic draw by dtype alone (its io.py), for a definition dtype name:
    bool ``randint(0, 2)``; integers ``randint`` over :data:`INTEGER_RANGES`; fp8
    ``clamp(randn, -2, 2)`` in the format (e4m3 by the exact codec, round to nearest even);
    fp4 ``randn`` rounded onto the e2m1 grid and packed in pairs (uint8, fuseval's storage;
    ``shape`` is the packed one). None for the other float dtypes, which name rules draw.
    Shared by the built-in generic rules and the problem folders' inputs
    (:mod:`fuseval.interop.workload_inputs`)."""
    if dtype == "bool":
        return torch.randint(0, 2, shape, generator=g, device=g.device).bool()
    if dtype in INTEGER_RANGES:
        lo, hi = INTEGER_RANGES[dtype]
        return torch.randint(lo, hi, shape, generator=g, device=g.device, dtype=TORCH_DTYPES[dtype])
    if dtype == "float8_e5m2":
        return _randn(shape, g).clamp(-2, 2).to(torch.float8_e5m2)
    if dtype == "float4_e2m1fn_x2":
        # packed shape [rows, K/2]: draw [rows, K] and round each value onto the e2m1 grid
        full = _randn(tuple(shape[:-1]) + (shape[-1] * 2,), g)
        return nvfp4.pack_fp4(nvfp4.encode_e2m1(full))
    if dtype == "float8_e4m3fn":
        return nvfp4.encode_e4m3fn(_randn(shape, g).clamp(-2, 2)).view(torch.float8_e4m3fn)
    return None


def _benchmark_tensor(spec: TensorSpec, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    name, dtype = spec.name, spec.dtype
    by_dtype = dtype_rule(dtype, shape, g)
    if by_dtype is not None:
        return by_dtype
    if name.endswith("norm_weight"):
        t = torch.ones(shape, device=g.device)
    elif name.endswith("cos"):
        t = torch.cos(_randn(shape, g).clamp(-math.pi, math.pi))
    elif name.endswith("sin"):
        t = torch.sin(_randn(shape, g).clamp(-math.pi, math.pi))
    elif name.endswith("_weight") and len(shape) == 2:
        t = _randn(shape, g) / math.sqrt(shape[-1])
    else:  # activations, biases
        t = _randn(shape, g)
    return t.to(TORCH_DTYPES[dtype])


def positions_to_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """HF-style rotary tables: angle[..., i] = pos * theta^(-2i/D) for i < D/2, repeated
    for the second half (rotate_half layout). positions: any shape -> [..., D] float32."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return torch.cos(angles).float(), torch.sin(angles).float()


def default_realistic_inputs(defn: Definition, axes: Mapping[str, int], seed: int,
                             device: str | torch.device = "cpu") -> dict[str, Any]:
    """Realistic-mode inputs by name: NVFP4 weights quantized from a Gaussian matrix with the
    standard recipe, [B, S, D] cos/sin from positions 0..S-1, norm weights 1 + 0.1 randn,
    everything else as in benchmark mode. Operator modules refine it (op A's mRoPE)."""
    out: dict[str, Any] = {}
    theta = float(defn.realistic.get("rope_theta", 10000.0))
    specs = {s.name: s for s in defn.inputs}
    for spec in defn.inputs:
        if spec.name in out:
            continue
        g = input_generator(seed, spec.name, device)
        shape = defn.shape_of(spec, axes)
        if spec.is_scalar:
            out[spec.name] = _scalar(spec, g)
            continue
        if spec.dtype == "float4_e2m1fn_x2":
            # quantize a Gaussian weight [rows, K] with the standard recipe
            prefix = spec.name[: -len("weight_fp4")]
            w = _randn(shape[:-1] + (shape[-1] * 2,), g) / math.sqrt(shape[-1] * 2)
            packed, scales, gs = nvfp4.quantize_nvfp4(w)
            out[spec.name] = packed
            out[prefix + "scale"] = scales
            out[prefix + "global_decode_scale"] = float(gs)
            continue
        if spec.name in ("cos", "sin") and len(shape) == 3:
            b, s, d = shape
            pos = torch.arange(s).expand(b, s)
            cos, sin = positions_to_cos_sin(pos, d, theta)
            out["cos"] = cos.to(device=device, dtype=TORCH_DTYPES[specs["cos"].dtype])
            out["sin"] = sin.to(device=device, dtype=TORCH_DTYPES[specs["sin"].dtype])
            continue
        if spec.name.endswith("norm_weight"):
            out[spec.name] = (1.0 + 0.1 * _randn(shape, g)).to(TORCH_DTYPES[spec.dtype])
        else:
            out[spec.name] = _benchmark_tensor(spec, shape, g)
    return out


def _scalar(spec: TensorSpec, g: torch.Generator) -> float:
    if spec.value is not None:
        return float(spec.value)
    x = _randn((), g)
    init = spec.init or {}
    if init.get("kind") == "abs_randn":
        # |randn| * scale: a positive scale of a given order of magnitude (see SPEC notes in docs)
        return float((x.abs() * float(init["scale"])).float())
    # a free fp32 scalar is drawn like any float input (randn), rounded to fp32
    return float(x)


def generic_benchmark_inputs(defn: Definition, axes: Mapping[str, int], seed: int,
                             device: str | torch.device = "cpu", names: Collection[str] | None = None
                             ) -> dict[str, Any]:
    """Inputs by name under SOL-ExecBench's generic rules (the module docstring), one
    generator per input on ``device``; ``axes``: the full binding; ``names``: draw only these
    (each input's own generator makes a subset the same values as a full draw)."""
    values: dict[str, Any] = {}
    for spec in defn.inputs:
        if names is not None and spec.name not in names:
            continue
        g = input_generator(seed, spec.name, device)
        if spec.is_scalar:
            values[spec.name] = _scalar(spec, g)
        else:
            values[spec.name] = _benchmark_tensor(spec, defn.shape_of(spec, axes), g)
    return values


def draw_inputs(defn: Definition, var_axes: Mapping[str, int], *, seed: int = 0, mode: str = "benchmark",
                device: str | torch.device = "cpu", names: Collection[str] | None = None) -> dict[str, Any]:
    """Inputs by name for one binding of the var axes: every input, or only ``names``.

    Under the generic benchmark rules only the named inputs are drawn; an operator's own
    input hook and the realistic mode draw inputs together (a scale with its weights), so
    there everything is drawn and the rest dropped. Tensors come back contiguous on
    ``device``; scalar inputs are Python floats."""
    if mode not in MODES:
        raise ValueError(f"input mode must be one of {MODES}, got {mode!r}")
    unknown = sorted(set(names or ()) - set(defn.input_names))
    if unknown:
        raise ValueError(f"{defn.name}: names: {unknown} are not inputs (inputs: {defn.input_names})")
    axes = defn.resolve_axes(var_axes)
    # an operator may draw its inputs itself (its record's ``inputs`` hooks): the realistic
    # mode, or the benchmark mode where the benchmark uses a custom generator of its own
    hook = defn.operator.input_hook(mode)
    device = torch.device(device)
    if hook is not None:
        values = hook(defn, axes, seed, device=device)
    elif mode == "realistic":
        values = default_realistic_inputs(defn, axes, seed, device)
    else:
        values = generic_benchmark_inputs(defn, axes, seed, device, names)
    wanted = defn.input_names if names is None else [n for n in defn.input_names if n in names]
    return {n: values[n].to(device).contiguous() if isinstance(values[n], torch.Tensor) else values[n]
            for n in wanted}


class DrawnInputs(list):
    """Inputs in definition order, with the binding of the var axes they were drawn for
    (``axes``): :func:`fuseval.validate.bind_axes` reads from it the axes no input's shape
    shows (one that sizes only an output, or is passed as a plain number)."""

    def __init__(self, values, axes: Mapping[str, int]):
        super().__init__(values)
        self.axes = dict(axes)


def generate_inputs(defn: Definition, var_axes: Mapping[str, int], *, seed: int = 0,
                    mode: str = "benchmark", device: str | torch.device = "cpu") -> DrawnInputs:
    """Inputs in definition order for one binding of the var axes (see :func:`draw_inputs`)."""
    values = draw_inputs(defn, var_axes, seed=seed, mode=mode, device=device)
    return DrawnInputs([values[name] for name in defn.input_names], var_axes)


def save_inputs(path: str, defn: Definition, inputs: list[Any], **meta: Any) -> str:
    """Keep one draw of ``defn``'s inputs (definition order) in a file, with ``meta`` (e.g.
    seed, case, mode): ``load_inputs`` gives them back bit for bit, on their devices."""
    if len(inputs) != len(defn.inputs):
        raise ValueError(f"{defn.name}: expected {len(defn.inputs)} inputs, got {len(inputs)}")
    torch.save({"op": defn.name, "config": defn.config, "names": defn.input_names,
                "inputs": list(inputs), "meta": dict(meta)}, path)
    return path


def load_inputs(path: str, defn: Definition | None = None, device: str | torch.device | None = None):
    """(inputs in definition order, meta) from a file of ``save_inputs``; ``defn`` checks that
    the file holds that operator's inputs; ``device`` moves the tensors (default: as saved)."""
    try:
        doc = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ValueError(f"inputs file {path!r}: cannot be read ({type(exc).__name__}: {exc})") from exc
    if not isinstance(doc, dict) or "inputs" not in doc or "names" not in doc:
        raise ValueError(f"inputs file {path!r}: not written by fuseval.inputs.save_inputs")
    if defn is not None and (doc.get("op") != defn.name or doc["names"] != defn.input_names):
        raise ValueError(f"inputs file {path!r} holds inputs of {doc.get('op')!r} "
                         f"({', '.join(doc['names'])}), expected {defn.name!r}")
    return list(doc["inputs"]), dict(doc.get("meta", {}))
