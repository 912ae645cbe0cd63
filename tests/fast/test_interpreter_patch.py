"""The interpreter shortcut (fuseval/fast/_interpreter.py) changes how fast the Triton
interpreter runs, never what it computes: both fast paths give bit-identical outputs with
it and with the plain interpreter (a fresh process with FUSEVAL_PLAIN_INTERPRETER=1)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available(),
                                reason="the shortcut applies to the Triton interpreter only")

_RUN = r'''
import os, sys, torch
import fuseval.fast
from fuseval.fast import _interpreter
from fuseval.operators import implementations as ops
from fuseval.inputs import draw_inputs
out = {"installed": _interpreter.installed()}
for op, cases in (("qwen2vl_decoder_layer", (0, 9, 13)), ("nvfp4_qkv_rope", (2, 9, 13))):
    operator = ops.get(op, "small", None)
    defn = operator.definition
    impl = operator.implementation("fast")
    for case in defn.cases(list(cases)):
        inp = draw_inputs(defn, case.axes, seed=40 + case.index, mode="benchmark", device=torch.device("cpu"))
        res = impl(*[inp[s.name] for s in defn.inputs])
        res = (res,) if isinstance(res, torch.Tensor) else tuple(res)
        out[(op, case.index)] = [r.contiguous().view(torch.uint8).clone() for r in res]
# errors for shapes Triton refuses stay Triton's own (the shape shortcuts fall back to it)
import triton, triton.language as tl

@triton.jit
def _odd_block(x_ptr, N: tl.constexpr):
    tl.store(x_ptr, tl.sum(tl.zeros([N], tl.float32) + 1.0, axis=0))

@triton.jit
def _reshaped(x_ptr, A: tl.constexpr, B: tl.constexpr):
    v = tl.reshape(tl.arange(0, A * B).to(tl.float32), (A, B))
    tl.store(x_ptr + tl.arange(0, A)[:, None] * B + tl.arange(0, B)[None, :], v * 2.0)

errors = []
for n in (3, 12, 4, 3):
    try:
        _odd_block[(1,)](torch.empty(16), N=n)
        errors.append("ok")
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
y = torch.empty(4, 8)
_reshaped[(1,)](y, A=4, B=8)
out["errors"], out["reshaped"] = errors, y
torch.save(out, sys.argv[1])
'''


def _run(tmp_path, name: str, plain: bool) -> dict:
    path = tmp_path / f"{name}.pt"
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    if plain:
        env["FUSEVAL_PLAIN_INTERPRETER"] = "1"
    else:
        env.pop("FUSEVAL_PLAIN_INTERPRETER", None)
    subprocess.run([sys.executable, "-c", _RUN, str(path)], check=True, env=env, timeout=600)
    return torch.load(path)


def test_the_shortcut_computes_what_the_plain_interpreter_computes(tmp_path):
    fast, plain = _run(tmp_path, "fast", False), _run(tmp_path, "plain", True)
    assert fast.pop("installed") is True and plain.pop("installed") is False
    assert fast.pop("errors") == plain.pop("errors")
    assert torch.equal(fast.pop("reshaped"), plain.pop("reshaped"))
    assert fast.keys() == plain.keys() and len(fast) == 6
    for key in fast:
        assert all(torch.equal(a, b) for a, b in zip(fast[key], plain[key])), key
