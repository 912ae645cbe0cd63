"""The "naive implementation in the same precision" that relative budgets compare against.

A budget names, per stage, the precision a straightforward implementation would use:

* ``dtype``: the precision the stage's output is stored in (the naive rounds its output
  to it, and reads earlier stages' outputs rounded to theirs);
* ``operand_dtype``: the precision matmul operands are read in (``tf32`` is what tensor
  cores read of fp32 data, ``bfloat16`` what a bf16 GEMM reads); accumulation is fp32.

The naive is the float32 reference (``reference(dtype=float32)``, the same formulas in
the same order as the oracle) run one stage at a time with a stage-function namespace
whose matmuls round their operands to ``operand_dtype``; so its error is the error that
precision inherently costs on these inputs, with no algorithmic cleverness in either
direction. This module holds those namespaces; the rounding is :func:`fuseval.precision.round_to`
(TF32 with ties to even, as cuBLAS converts an fp32 operand).
"""
from __future__ import annotations

import functools
import math
import types

import torch

from ..precision import check_precision, round_to
from ..refimpl import stages as reference_stages

__all__ = ["emulated_stages"]


def _linear(x, weight, bias=None, *, operand: str):
    """x W^T (+ b) with both operands rounded to ``operand``, fp32 accumulation; the
    bias is added in fp32 (an epilogue add)."""
    y = round_to(x, operand) @ round_to(weight, operand).transpose(-1, -2)
    return y if bias is None else y + bias


def _causal_gqa_attention(q, k, v, query_chunk: int = 2048, *, operand: str):
    """refimpl.stages.causal_gqa_attention with the two matmuls' operands rounded to
    ``operand``: S = q k^T reads q, k in it; the softmax is fp32; P V reads P (the
    probabilities, as a flash kernel stores them for its second matmul) and V in it."""
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d)
    q, k, v = (round_to(t, operand) for t in (q, k, v))
    out = torch.empty_like(q)
    for kv_head in range(hkv):
        heads = slice(kv_head * group, (kv_head + 1) * group)
        k_h, v_h = k[:, kv_head:kv_head + 1], v[:, kv_head:kv_head + 1]
        for start in range(0, s, query_chunk):
            stop = min(s, start + query_chunk)
            scores = (q[:, heads, start:stop] @ k_h[:, :, :stop].transpose(-1, -2)) * scale
            rows = torch.arange(start, stop, device=q.device)[:, None]
            cols = torch.arange(stop, device=q.device)[None, :]
            p = torch.softmax(scores.masked_fill(cols > rows, float("-inf")), dim=-1)
            out[:, heads, start:stop] = round_to(p, operand) @ v_h[:, :, :stop]
    return out


@functools.lru_cache(maxsize=None)
def emulated_stages(operand: str | None) -> types.SimpleNamespace:
    """A stage namespace (for ``reference(stages=...)``) whose matmuls read operands in
    ``operand`` precision. ``None``, "float32" and "float64" give the plain stages."""
    ns = types.SimpleNamespace(**{n: getattr(reference_stages, n) for n in reference_stages.__all__})
    if operand is not None:
        operand = check_precision(operand, "operand precision")
    if operand not in (None, "float32", "float64"):
        ns.linear = functools.partial(_linear, operand=operand)
        ns.causal_gqa_attention = functools.partial(_causal_gqa_attention, operand=operand)
    return ns
