"""Inputs of an imported problem, drawn as SOL-ExecBench's evaluator draws them.

Per input descriptor of the workload:

* ``scalar``: the workload's value;
* ``custom``: the problem's ``custom_inputs_entrypoint(axes_and_scalars, device)``, called
  with torch's (and Python's and numpy's) global generators seeded from (seed, "custom")
  and restored afterwards, so a draw is reproducible and leaves no trace;
* ``random``: the evaluator's generic rules (its ``io.py``), by the input's name, shape,
  dtype and description, in this order: fp8 ``clamp(randn, -2, 2)`` cast to the format;
  fp4 randn rounded onto the e2m1 grid and packed (the defined packed shape; the
  evaluator's own rule gives half of it); norm weights ``ones`` and norm biases ``zeros``;
  a square causal attention mask (0 on and below the diagonal, the dtype's minimum above);
  binary masks ``randint(0, 2)``; RoPE tables ``cos``/``sin`` of ``clamp(randn, -pi, pi)``;
  ``rstd``/``std``/``var*`` tensors ``|randn| + 0.1``; SSM decays (``A_cumsum`` a cumulative
  sum of ``U(-0.1, 0)``, ``A_log`` ``U(-5, -1)``, ``A`` ``U(-1, -0.001)``, ``g`` ``U(-5, 0)``);
  softmax outputs (``attn_weights``...) a softmax of randn; weight matrices (names ending
  in ``_weight``, ``_proj``... with two or more dims) ``randn / sqrt(last dim)``; other
  floats randn; bool ``randint(0, 2)``; int8 ``randint(-128, 128)``, other integers
  ``randint(-1024, 1024)``; a sampling problem's ``probs`` a softmax. Scalars drawn this
  way are the first element of the same rule on shape ().

Each random input has its own generator seeded from (seed, input name) on the device the
inputs are drawn for (``fuseval.inputs.input_generator``), so a draw is reproducible and
an input does not depend on the others.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from ..inputs import input_generator
from .sol_problem import Problem, ProblemError, Workload
from ..definitions import evaluate_expression
from ..inputs import dtype_rule
from .blobs import read_tensor
from .problem_code import custom_inputs

__all__ = ["draw_inputs", "to_benchmark", "to_fuseval", "TORCH_DTYPES"]

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
    "float4_e2m1fn_x2": torch.float4_e2m1fn_x2, "int64": torch.int64, "int32": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "bool": torch.bool,
}
_WEIGHT_SUFFIXES = ("_weight", "_weights", "_proj", "_projs", "_proj_weight", "_proj_weights", "_weight_matrix")
_NORMS = ("_norm", "_layernorm", "layernorm")


def _strip_digits(name: str) -> str:
    return name.rstrip("0123456789")


def _is_norm_param(name: str, suffix: str) -> bool:
    if name == f"norm{suffix}":
        return True
    if not name.endswith(suffix):
        return False
    prefix = name[: -len(suffix)]
    return prefix.endswith(_NORMS) or _strip_digits(prefix).endswith(("norm", "layernorm"))


def _is_weight_matrix(name: str, shape: tuple[int, ...]) -> bool:
    if len(shape) < 2:
        return False
    stripped = _strip_digits(name)
    return name == "weight" or name.endswith(_WEIGHT_SUFFIXES) or stripped == "weight" \
        or stripped.endswith(_WEIGHT_SUFFIXES)


def _mentions(description: str, *words: str) -> bool:
    text = description.lower()
    return all(w in text for w in words)


def _randn(shape, g, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float32, device=g.device).to(dtype)


def _uniform(shape, g, lo, hi, dtype) -> torch.Tensor:
    return (torch.rand(shape, generator=g, dtype=torch.float32, device=g.device) * (hi - lo) + lo).to(dtype)


def _heuristic(name: str, shape: tuple[int, ...], dtype: torch.dtype, description: str,
               g: torch.Generator) -> torch.Tensor | None:
    """The evaluator's name rules for a float input, None where none applies."""
    device = g.device
    if _is_norm_param(name, "_weight"):
        return torch.ones(shape, dtype=dtype, device=device)
    if _is_norm_param(name, "_bias"):
        return torch.zeros(shape, dtype=dtype, device=device)
    square = len(shape) >= 2 and shape[-1] == shape[-2]
    if square and (name in ("attention_mask", "causal_mask") or _mentions(description, "attention mask", "causal")):
        above = torch.ones(shape[-1], shape[-1], device=device).triu(1).bool()
        return torch.zeros(shape, dtype=dtype, device=device).masked_fill(above, torch.finfo(dtype).min)
    binary_words = ("binary", "{0, 1}", "0 or 1", "1.0 for valid", "0.0 for masked")
    if name in ("x_mask", "text_mask", "aspect_ratio_mask", "drop_mask", "attention_mask") or \
            (name.endswith("_mask") and description and any(w in description.lower() for w in binary_words)):
        return torch.randint(0, 2, shape, generator=g, device=device).to(dtype)
    if name in ("cos", "cos_cached", "rope_cos"):
        return torch.cos(_randn(shape, g).clamp(-math.pi, math.pi)).to(dtype)
    if name in ("sin", "sin_cached", "rope_sin"):
        return torch.sin(_randn(shape, g).clamp(-math.pi, math.pi)).to(dtype)
    positive = ("rstd", "std", "variance", "var")
    base = _strip_digits(name)
    if name in positive or name.endswith(("_rstd", "_std", "_variance", "_var")) or base in positive \
            or base.endswith(("_rstd", "_std", "_var")):
        return (_randn(shape, g).abs() + 0.1).to(dtype)
    if name == "A_cumsum":
        return _uniform(shape, g, -0.1, 0.0, dtype).cumsum(dim=-1)
    decay = {"A_log": (-5.0, -1.0), "A": (-1.0, -0.001), "g": (-5.0, 0.0)}
    if name in decay:
        return _uniform(shape, g, *decay[name], dtype)
    if name in ("attn_weights", "attention_weights", "routing_weights") or _mentions(description, "softmax", "output"):
        return torch.softmax(_randn(shape, g), dim=-1).to(dtype)
    if _is_weight_matrix(name, shape):
        return (_randn(shape, g) / math.sqrt(shape[-1])).to(dtype)
    return None


_DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}


def _plain_random(dtype: torch.dtype, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor | None:
    """The evaluator's rule by dtype alone (:func:`fuseval.inputs.dtype_rule`; None for a
    float format it leaves to the name rules); packed fp4 comes back in torch's fp4 dtype."""
    value = dtype_rule(_DTYPE_NAMES[dtype], shape, g)
    if value is not None and dtype == torch.float4_e2m1fn_x2:
        value = value.view(torch.float4_e2m1fn_x2)
    return value


def _random_scalar(problem: Problem, name: str, g: torch.Generator) -> Any:
    """A random scalar input: the dtype's rule on shape () (no name rules), as a Python number."""
    dtype = TORCH_DTYPES[problem.inputs[name]["dtype"]]
    value = _plain_random(dtype, (), g)
    return (_randn((), g, dtype) if value is None else value).item()


def _random_tensor(problem: Problem, name: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    spec = problem.inputs[name]
    dtype = TORCH_DTYPES[spec["dtype"]]
    value = _plain_random(dtype, shape, g)
    if value is not None:
        return value
    value = _heuristic(name, shape, dtype, spec["description"], g)
    if value is None:
        if dtype == torch.float64:
            raise ProblemError(f"problem {problem.name!r}: input {name!r} is float64 and matches no name rule; "
                               "the evaluator's generic generator draws float32, float16 and bfloat16 only")
        value = _randn(shape, g, dtype)
    if problem.op_type == "sampling" and name == "probs":
        value = torch.softmax(value.float(), dim=-1).to(dtype)
    return value


def _shape(problem: Problem, name: str, axes: Mapping[str, int]) -> tuple[int, ...] | None:
    shape = problem.inputs[name]["shape"]
    return None if shape is None else tuple(int(evaluate_expression(d, axes)) for d in shape)


def _custom_inputs(problem: Problem, workload: Workload, axes: Mapping[str, int], seed: int,
                   device: torch.device) -> dict[str, Any]:
    scalars = {n: s["value"] for n, s in workload.inputs.items() if s.get("type") == "scalar"}
    values = custom_inputs(problem, {**axes, **scalars}, device, seed)
    where = f"problem {problem.name!r}: {problem.custom_inputs_entrypoint}()"
    wanted = [n for n, s in workload.inputs.items() if s.get("type") == "custom"]
    missing = [n for n in wanted if n not in values]
    if missing:
        raise ProblemError(f"{where} did not return the custom inputs {missing} (it returned {sorted(values)})")
    return {n: values[n] for n in wanted}


def draw_inputs(problem: Problem, workload: Workload, seed: int,
                device: str | torch.device = "cpu") -> dict[str, Any]:
    """One draw of ``workload``'s inputs by name, as the benchmark passes them (fp4 tensors
    as ``torch.float4_e2m1fn_x2``); custom inputs come from the problem's entry point
    (:func:`fuseval.interop.problem_code.custom_inputs`)."""
    device = torch.device(device)
    if workload.unsupported:
        raise ProblemError(f"problem {problem.name!r}, workload line {workload.line}: {workload.unsupported}")
    axes: dict[str, int] = {n: a["value"] for n, a in problem.axes.items() if a["type"] == "const"}
    axes.update(workload.extra_axes)
    axes.update(workload.axes)
    for n, a in problem.axes.items():
        if a["type"] == "expr":
            axes[n] = int(evaluate_expression(a["expression"], axes))
    custom = any(s.get("type") == "custom" for s in workload.inputs.values())
    values = _custom_inputs(problem, workload, axes, seed, device) if custom else {}
    for name, spec in workload.inputs.items():
        kind = spec["type"]
        if kind == "scalar":
            values[name] = spec["value"]
        elif kind == "safetensors":
            values[name] = _blob_tensor(problem, workload, name, spec, axes, device)
        elif kind == "random":
            g = input_generator(seed, name, device)
            shape = _shape(problem, name, axes)
            if shape is None:
                values[name] = _random_scalar(problem, name, g)
            else:
                values[name] = _random_tensor(problem, name, shape, g)
    out = {}
    for name in problem.inputs:
        v = values[name]
        out[name] = v.to(device).contiguous() if isinstance(v, torch.Tensor) else v
    return out


def _blob_tensor(problem: Problem, workload: Workload, name: str, spec: Mapping, axes: Mapping[str, int],
                 device: torch.device) -> torch.Tensor:
    """Input ``name`` read from its safetensors blob, checked against the definition's
    dtype and the workload's shape (the same tensor on every seed)."""
    t = read_tensor(problem.directory, name, spec, device)
    where = f"problem {problem.name!r}, workload line {workload.line}, input {name!r} ({spec['path']})"
    want = TORCH_DTYPES[problem.inputs[name]["dtype"]]
    if t.dtype != want:
        raise ProblemError(f"{where}: the blob holds dtype {t.dtype}, the definition says {want}")
    shape = _shape(problem, name, axes)
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ProblemError(f"{where}: the blob holds shape {tuple(t.shape)}, the workload's axes give {tuple(shape)}")
    return t


def to_fuseval(problem: Problem, values: Mapping[str, Any]) -> dict[str, Any]:
    """Benchmark-format inputs as fuseval holds them: fp4 tensors as their uint8 bytes."""
    return {n: v.view(torch.uint8) if isinstance(v, torch.Tensor) and v.dtype == torch.float4_e2m1fn_x2 else v
            for n, v in values.items()}


def to_benchmark(problem: Problem, inputs) -> list[Any]:
    """fuseval-format inputs (definition order) as the benchmark passes them: the bytes of
    an fp4 input viewed as ``torch.float4_e2m1fn_x2``, a 1-element tensor for a scalar
    turned back into a Python number."""
    out = []
    for (name, spec), v in zip(problem.inputs.items(), inputs):
        if isinstance(v, torch.Tensor) and spec["dtype"] == "float4_e2m1fn_x2" and v.dtype == torch.uint8:
            v = v.view(torch.float4_e2m1fn_x2)
        elif isinstance(v, torch.Tensor) and spec["shape"] is None:
            v = v.item()
        out.append(v)
    return out
