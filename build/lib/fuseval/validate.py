"""Input validation against an operator definition.

``bind_axes(defn, inputs)`` reads every axis off the inputs' shapes (const axes too, so a
scaled-down configuration is recognised from the tensors alone), checks that each input
agrees with the others, with the definition's dtypes and with its constraints, and
returns the full axis binding. Every error is a ``ValueError`` that names the input, what
was expected and what was given.
"""
from __future__ import annotations

import ast
import math
from collections import Counter
from typing import Any, Mapping, Sequence

import torch

from .definitions import Definition, evaluate_expression
from .inputs import TORCH_DTYPES

__all__ = ["bind_axes", "check_outputs_shape"]

# dtypes whose non-finite values are legal input (an e4m3 NaN scale code is a value of the format)
_NONFINITE_ALLOWED = {"float8_e4m3fn", "float4_e2m1fn_x2"}


def _solve(expression: str, target: int, bound: Mapping[str, int]) -> tuple[str, int] | None:
    """Solve ``expression == target`` for its single unbound name when the expression
    is a product or floor-quotient of names and constants (e.g. num_heads * head_dim)."""
    tree = ast.parse(expression, mode="eval").body
    names = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)]
    unknown = [n for n in set(names) if n not in bound]
    if len(unknown) != 1 or names.count(unknown[0]) != 1:
        return None
    x = unknown[0]
    if isinstance(tree, ast.BinOp) and isinstance(tree.op, ast.Mult):
        other = tree.right if isinstance(tree.left, ast.Name) and tree.left.id == x else tree.left
        if not (isinstance(tree.left, ast.Name) and tree.left.id == x) and not (
                isinstance(tree.right, ast.Name) and tree.right.id == x):
            return None
        k = evaluate_expression(ast.unparse(other), bound)
        if k == 0 or target % k:
            return None
        return x, target // k
    if isinstance(tree, ast.BinOp) and isinstance(tree.op, ast.FloorDiv) and \
            isinstance(tree.left, ast.Name) and tree.left.id == x:
        k = evaluate_expression(ast.unparse(tree.right), bound)
        return x, target * k
    return None


def bind_axes(defn: Definition, inputs: Sequence[Any], *, check_values: bool = True,
              expect_consts: bool = False) -> dict[str, int]:
    """Validate ``inputs`` (definition order) and return the full axis binding.

    ``expect_consts``: also require the const axes to equal the definition's (the
    configuration named by ``defn.config``); otherwise they are read off the shapes.
    ``check_values``: reject NaN/Inf in float inputs where the format does not allow them."""
    if len(inputs) != len(defn.inputs):
        raise ValueError(f"{defn.name}: expected {len(defn.inputs)} inputs "
                         f"({', '.join(defn.input_names)}), got {len(inputs)}")
    bound: dict[str, int] = dict(defn.const_axes) if expect_consts else {}
    first_seen: dict[str, str] = {k: f"the {defn.config} configuration" for k in bound}
    exprs = {a.name: a.expression for a in defn.axes.values() if a.kind == "expr"}
    pending: list[tuple[str, int, str]] = []   # (expression axis, observed, input name)
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
        want = TORCH_DTYPES[spec.dtype]
        if value.dtype != want:
            raise ValueError(f"{defn.name}: input {spec.name!r} must have dtype {want} "
                             f"({spec.dtype}), got {value.dtype}")
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

    # expression axes: solve for const axes that appear only inside expressions, then check.
    # Solve from the value most inputs agree on (e.g. qkv_dim seen by q_proj_weight, q_proj_bias
    # and o_proj_weight), so the error below names the odd input out, not its neighbours.
    votes = Counter((axis, observed) for axis, observed, _ in pending)
    solve_order = sorted(pending, key=lambda p: -votes[(p[0], p[1])])
    progress = True
    while progress:
        progress = False
        for axis, observed, name in solve_order:
            if axis not in bound:
                try:
                    bound[axis] = int(evaluate_expression(exprs[axis], bound))
                    progress = True
                except KeyError:
                    solved = _solve(exprs[axis], observed, bound)
                    if solved:
                        bound[solved[0]] = solved[1]
                        first_seen.setdefault(solved[0], repr(name))
                        progress = True
    for axis, observed, name in pending:
        if axis not in bound:
            raise ValueError(f"{defn.name}: cannot infer axis {axis!r} = {exprs[axis]} from input {name!r}")
        if bound[axis] != observed:
            raise ValueError(
                f"{defn.name}: input {name!r} has {axis} = {observed}, expected "
                f"{exprs[axis]} = {bound[axis]} (with "
                + ", ".join(f"{n}={bound[n]}" for n in sorted(bound) if n in exprs[axis]) + ")")
    _complete(defn, bound)
    missing = [a for a in defn.axes if a not in bound]
    if missing:
        raise ValueError(f"{defn.name}: axes {missing} cannot be read off the inputs")
    defn.check_constraints(bound)
    return bound


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
