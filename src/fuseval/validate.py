"""Input validation against an operator definition.

``bind_axes(defn, inputs)`` reads every axis off the inputs' shapes (const axes too, so a
scaled-down configuration is recognised from the tensors alone), checks that each input
agrees with the others, with the definition's dtypes and with its constraints, and
returns the full axis binding. Every error is a ``ValueError`` that names the input, what
was expected and what was given.
"""
from __future__ import annotations

import functools
import math
from collections import Counter
from typing import Any, Mapping, Sequence

import torch

from .definitions.axes import AxisUndetermined, Equation, names_in, solve
from .definitions import Definition, evaluate_expression
from .inputs import TORCH_DTYPES

__all__ = ["bind_axes", "check_outputs_shape", "ACCEPTED_DTYPES", "storage_views", "accepts_benchmark_dtypes"]

# definition dtype -> the torch dtypes an input of it may arrive in: fuseval's storage
# (TORCH_DTYPES, first) and the benchmark's (packed FP4 as torch.float4_e2m1fn_x2, the bytes
# the evaluator hands; same layout, two e2m1 codes a byte)
ACCEPTED_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "float4_e2m1fn_x2": (torch.uint8,) + ((torch.float4_e2m1fn_x2,) if hasattr(torch, "float4_e2m1fn_x2") else ()),
}

# dtypes whose non-finite values are legal input (an e4m3 NaN scale code is a value of the format)
_NONFINITE_ALLOWED = {"float8_e4m3fn", "float4_e2m1fn_x2"}


_FP4 = getattr(torch, "float4_e2m1fn_x2", None)


def storage_views(values: Sequence[Any]) -> list[Any]:
    """``values`` in fuseval's storage dtypes: a tensor of ``torch.float4_e2m1fn_x2`` (how
    the benchmark hands packed FP4) viewed as its uint8 bytes, the layout fuseval's code
    reads (the same memory, no copy); every other value as given."""
    return [v.view(torch.uint8) if _FP4 is not None and isinstance(v, torch.Tensor) and v.dtype == _FP4 else v
            for v in values]


def accepts_benchmark_dtypes(fn):
    """Decorator: ``fn`` (an implementation taking the inputs in definition order) takes
    them in the benchmark's dtypes too (:func:`storage_views` on its positional and keyword
    arguments); attributes set on the result (``.staged``) stay on it."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*storage_views(args), **dict(zip(kwargs, storage_views(list(kwargs.values())))))
    return wrapper


def bind_axes(defn: Definition, inputs: Sequence[Any], *, check_values: bool = True,
              expect_consts: bool = False, known: Mapping[str, int] | None = None) -> dict[str, int]:
    """Validate ``inputs`` (definition order) and return the full axis binding.

    ``expect_consts``: also require the const axes to equal the definition's (the
    configuration named by ``defn.config``); otherwise they are read off the shapes, and
    a const axis the shapes leave open takes the definition's value.
    ``check_values``: reject NaN/Inf in float inputs where the format does not allow them.
    ``known``: var axes the caller knows (the binding the inputs were drawn for; default:
    ``inputs.axes`` of a :class:`fuseval.inputs.DrawnInputs`), used only for the axes the
    shapes do not determine, such as one that sizes only an output.
    An input may be of its dtype's storage in fuseval or in the benchmark
    (:data:`ACCEPTED_DTYPES`: packed FP4 as uint8 or ``torch.float4_e2m1fn_x2``)."""
    if len(inputs) != len(defn.inputs):
        raise ValueError(f"{defn.name}: expected {len(defn.inputs)} inputs "
                         f"({', '.join(defn.input_names)}), got {len(inputs)}")
    bound: dict[str, int] = dict(defn.const_axes) if expect_consts else {}
    first_seen: dict[str, str] = {k: f"the {defn.config} configuration" for k in bound}
    exprs = {a.name: a.expression for a in defn.axes.values() if a.kind == "expr"}
    pending: list[tuple[str, int, str]] = []   # (expression axis, observed, input name)
    if known is None:
        known = getattr(inputs, "axes", None) or {}
    device = None

    for spec, value in zip(defn.inputs, inputs):
        if spec.is_scalar:
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"{defn.name}: input {spec.name!r} must be a scalar "
                                     f"(Python float or one-element tensor), got a tensor of shape {tuple(value.shape)}")
                value = float(value)
            if not isinstance(value, (int, float)):
                raise ValueError(f"{defn.name}: input {spec.name!r} must be a scalar float, "
                                 f"got {type(value).__name__}")
            if check_values and not math.isfinite(value):
                raise ValueError(f"{defn.name}: input {spec.name!r} must be finite, got {value}")
            continue
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{defn.name}: input {spec.name!r} must be a torch.Tensor "
                             f"of dtype {spec.dtype}, got {type(value).__name__}")
        accepted = ACCEPTED_DTYPES.get(spec.dtype, (TORCH_DTYPES[spec.dtype],))
        if value.dtype not in accepted:
            raise ValueError(f"{defn.name}: input {spec.name!r} must have dtype "
                             f"{' or '.join(map(str, accepted))} ({spec.dtype}), got {value.dtype}")
        if device is None:
            device, device_from = value.device, spec.name
        elif value.device != device:
            raise ValueError(f"{defn.name}: input {spec.name!r} is on {value.device} but "
                             f"{device_from!r} is on {device}: all inputs must share one device")
        if value.dim() != len(spec.shape):
            raise ValueError(f"{defn.name}: input {spec.name!r} must have {len(spec.shape)} dims "
                             f"[{', '.join(spec.shape)}], got shape {tuple(value.shape)}")
        for dim, (axis, size) in enumerate(zip(spec.shape, value.shape)):
            size = int(size)
            if axis in exprs:
                pending.append((axis, size, spec.name))
                continue
            if axis in bound and bound[axis] != size:
                raise ValueError(
                    f"{defn.name}: input {spec.name!r} dim {dim} ({axis}) must be {bound[axis]} "
                    f"(from {first_seen[axis]}), got {size} (shape {tuple(value.shape)})")
            bound.setdefault(axis, size)
            first_seen.setdefault(axis, repr(spec.name))
        if check_values and spec.dtype not in _NONFINITE_ALLOWED and value.is_floating_point():
            if not bool(torch.isfinite(value).all()):
                n = int((~torch.isfinite(value)).sum())
                raise ValueError(f"{defn.name}: input {spec.name!r} must be finite, "
                                 f"got {n} NaN/Inf element(s)")

    _bind_expressions(defn, bound, pending, known)
    _complete(defn, bound)
    missing = [a for a in defn.axes if a not in bound]
    if missing:
        raise ValueError(f"{defn.name}: axes {missing} cannot be read off the inputs")
    defn.check_constraints(bound)
    return bound


def _bind_expressions(defn: Definition, bound: dict[str, int], pending: list[tuple[str, int, str]],
                      known: Mapping[str, int]) -> None:
    """Bind the axes the expression-named dimensions determine and check every one of them.

    Each expression axis takes the value most of its inputs show (so the error names the odd
    input out, not its neighbours: e.g. qkv_dim seen by q_proj_weight, q_proj_bias and
    o_proj_weight); each observation is an equation (:mod:`fuseval.definitions.axes`), solved
    with the definition's const values and the ``known`` var axes where the shapes leave an
    axis open."""
    exprs = {a.name: a.expression for a in defn.axes.values() if a.kind == "expr"}
    votes = Counter((axis, observed) for axis, observed, _ in pending)
    for (axis, observed), _ in sorted(votes.items(), key=lambda kv: -kv[1]):
        bound.setdefault(axis, observed)
    sources = {axis: name for axis, observed, name in reversed(pending) if bound[axis] == observed}
    equations = [Equation(exprs[axis], bound[axis], sources[axis]) for axis in dict.fromkeys(a for a, _, _ in pending)]
    given = {a.name: int(a.value) for a in defn.axes.values() if a.kind == "const"}
    given.update({k: int(v) for k, v in known.items() if k in defn.axes and defn.axes[k].kind == "var"})
    unobserved = {a: e for a, e in exprs.items() if a not in bound}
    try:
        solve(equations, bound, given, unobserved)
    except AxisUndetermined as exc:
        raise ValueError(f"{defn.name}: {exc}") from None
    for axis, observed, name in pending:
        value = int(evaluate_expression(exprs[axis], bound))
        if observed != bound[axis] or value != observed:
            shown = bound[axis] if observed != bound[axis] else value
            raise ValueError(
                f"{defn.name}: input {name!r} has {axis} = {observed}, expected "
                f"{exprs[axis]} = {shown} (with "
                + ", ".join(f"{n}={bound[n]}" for n in sorted(names_in(exprs[axis]))) + ")")


def _complete(defn: Definition, bound: dict[str, int]) -> None:
    """Bind the axes no input shape shows: a const axis (one that only sizes an output, or a
    parameter such as a RoPE theta written as an axis) can only be the definition's own
    value; expression axes follow from the others."""
    for a in defn.axes.values():
        if a.name not in bound and a.kind == "const":
            bound[a.name] = int(a.value)
    for _ in range(len(defn.axes)):
        for a in defn.axes.values():
            if a.name not in bound and a.kind == "expr":
                try:
                    bound[a.name] = int(evaluate_expression(a.expression, bound))
                except KeyError:
                    pass


def expected_outputs(defn: Definition, bound: Mapping[str, int]) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """(shape, dtype) of each output the definition gives for the bound axes: what an
    answer is checked against and what bounds the buffers fuseval allocates for it."""
    return [(defn.shape_of(s, bound), TORCH_DTYPES[s.dtype]) for s in defn.outputs]


def check_outputs_shape(defn: Definition, outputs: Any, bound: Mapping[str, int]) -> list[str]:
    """Problems with an implementation's outputs (count, type, shape, dtype), as messages."""
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    if not isinstance(outputs, (tuple, list)):
        return [f"implementation returned {type(outputs).__name__}, expected a tuple of "
                f"{len(defn.outputs)} tensors ({', '.join(defn.output_names)})"]
    if len(outputs) != len(defn.outputs):
        return [f"implementation returned {len(outputs)} outputs, expected {len(defn.outputs)} "
                f"({', '.join(defn.output_names)})"]
    problems = []
    for spec, out in zip(defn.outputs, outputs):
        if not isinstance(out, torch.Tensor):
            problems.append(f"output {spec.name!r} is {type(out).__name__}, expected a tensor")
            continue
        want_shape = defn.shape_of(spec, bound)
        if tuple(out.shape) != want_shape:
            problems.append(f"output {spec.name!r} has shape {tuple(out.shape)}, expected {want_shape}")
        if out.dtype != TORCH_DTYPES[spec.dtype]:
            problems.append(f"output {spec.name!r} has dtype {out.dtype}, expected {TORCH_DTYPES[spec.dtype]}")
    return problems
