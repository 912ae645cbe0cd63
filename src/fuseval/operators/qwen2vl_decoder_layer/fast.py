"""Fast path for op A (``qwen2vl_decoder_layer``): float32 in and out, Triton kernels.

The production ``forward`` runs seven kernels, after the weights' conversion where the
plan has one (``_kernels.py``, ``_attention.py``, ``_gluon.py``; launched by ``_launch.py``
with the tiles of ``_plans.py``):

==========  ==========================================================================
kernel      what it fuses
==========  ==========================================================================
to_fp16     "fp16" calls of 512 tokens or more: each GEMM weight converted to fp16
            (seven launches, one per weight, before the layer's own kernels)
norm        input RMSNorm: one read of x, one write of h (a whole row per program)
qkv         h [Wq|Wk|Wv]^T + bias, multimodal RoPE of q and k in the epilogue; writes
            [q'|k'] and v transposed (keys contiguous) for the PV product
attention   causal GQA flash attention; each kv head's K/V tiles serve its 7 query
            heads (stacked in the tile's rows); fully masked tiles are never visited
o_proj      x1 = x + attn Wo^T (residual in the epilogue)
norm        post-attention RMSNorm of x1
gate_up     one pass over h2 for gate and up, silu(g) * u in the epilogue
down        out = x1 + act Wd^T (residual in the epilogue)
==========  ==========================================================================

Why the RMSNorm weight is not folded into the GEMMs: it scales the K axis of the
product, so it cannot move to the epilogue the way the row scale could; scaling the A
tile on the fly would push the operand through registers, and pre-scaling the weights
would rewrite 0.5 GB of weights every call. The row pass costs one extra read and write
of [M, H], small against the layer's floor.

Precision policies (``precision=``; ``attention_precision=`` overrides it for the
attention kernel alone):

* "fp16" (default): the activations that feed products are produced in fp16 by the
  previous kernel's epilogue (round to nearest even), the weights are converted to fp16
  (round to nearest even), fp32 accumulation; flash attention with fp16 q'/k'/v and P
  and fp32 scores and softmax statistics; residual adds and norms in fp32. Where the
  weights are converted depends on the call's size (the table's ``fp16_weights_from``,
  ``Plan.fp16_weights``): from 512 tokens up, one pass at the start of the call writes
  fp16 copies of the seven GEMM weights (made in every call, freed with it: nothing is
  kept across calls), so that the GEMMs feed fp16 tiles from shared memory to the tensor
  cores; below, the GEMMs convert fp32 weight tiles in registers, since the pass would
  cost more than they do.
  Values beyond fp16's range cannot be stored: the kernels watch for them (a
  one-element flag, ``_kernels._watch``; the conversion pass watches the weights) and the
  call is then recomputed under "tf32" (``FP16_FALLBACK``), so an overflow never reaches
  the output. The flag costs one device-to-host read per call.
  Why it is the default, with its speed and errors against "tf32" and torch eager fp16:
  docs/design/qwen2vl_decoder_layer.md, section 2.8.
* "tf32": TF32 tensor cores, like torch's TF32 matmuls. A Hopper tensor core reads a
  fp32 operand as TF32 by dropping its 13 low mantissa bits (truncation): every operand
  shrinks towards zero and the bias adds up coherently over K (with both operands
  truncated the layer fails the benchmark's tolerance). So every activation that
  feeds a product is stored already rounded to nearest TF32 by the kernel producing it
  (norm outputs, q'/k'/v, attention output, SiLU*up, and P inside attention); the weights
  are inputs and stay truncated by the hardware (``round_b`` tiles round them in the
  kernel, at a cost that keeps it off: design section 2.2). The "fp16" policy's fallback.
* "tf32x3" (three TF32 products per dot, about fp32 accuracy) and "ieee" (exact fp32
  FMA, slow): the accuracy references.

Tile tables (``_plans.Tables``) are options, not code paths: ``options()`` gives the
tables and the policy in force (``fuseval bench`` records them), ``variant(tables=...)``
and ``with_tables(...)`` time another table, ``plan=`` passes a whole plan.

Multimodal RoPE. cos/sin are [3, B, kv_seq_len, D] with kv_seq_len >= seq_len; token s
of sequence b reads row s of its batch (the first seq_len rows). ``forward`` uses the
benchmark's chunk layout (head-dim index d from position axis 0 for d < D/4, 1 below
5D/8, 2 above; SOL-ExecBench L2/019); ``forward_hf_mrope`` uses HF Qwen2-VL's (the
section (D/8, 3D/16, 3D/16) repeated for the two rotate_half halves, the operator's
"hf_mrope" variant). One constexpr of the RoPE code picks the layout.

``forward.staged`` implements the stage-tap protocol (docs/developing.md): the same
kernels, unfused where a stage boundary falls inside a fused kernel (plain QKV, then a
RoPE kernel; gate/up, then a SwiGLU kernel), so every SPEC stage can be read or
overridden. ``variant(mutant=name)`` builds the deliberately broken versions of
``MUTANTS`` for the tests.

On the CPU the kernels run under the Triton interpreter (set TRITON_INTERPRET=1 before
triton is imported); there every fp32 dot is exact, and fp16 operands are rounded as on
the GPU.
"""
from __future__ import annotations

import contextlib
import functools
import json
from typing import Any, Callable, Iterator, Mapping, MutableMapping, Sequence

import torch

from ...fast._graphs import GraphCache, tensor_key
from ...precision import round_tf32
from . import _plans
from ._launch import (compile_only, interpreting, launch_attention, launch_gate_up, launch_mrope,
                      launch_norm, launch_qkv, launch_residual_gemm, launch_swiglu, launch_to_fp16)
from ._plans import (MROPE_LAYOUTS, NAME, PRECISIONS, AttnConfig, GemmConfig, Plan, Shape, Tables,
                     check_choice, plan_for)
from .. import load
from ...validate import bind_axes

__all__ = ["forward", "forward_staged", "forward_hf_mrope", "forward_hf_mrope_staged", "variant", "MUTANTS",
           "PRECISIONS", "DEFAULT_PRECISION", "MROPE_LAYOUTS", "STAGES", "options", "with_tables", "tables",
           "tables_from_json", "shape_of", "plan_for", "compile_only", "Shape", "Plan", "GemmConfig",
           "AttnConfig", "Tables", "launch_norm", "launch_qkv", "launch_mrope", "launch_attention",
           "launch_residual_gemm", "launch_gate_up", "launch_swiglu", "launch_to_fp16", "FP16_FALLBACK",
           "forward_fp16", "forward_tf32", "forward_hf_mrope_fp16", "forward_hf_mrope_tf32"]

DEFAULT_PRECISION = "fp16"

# Deliberately broken variants (tests): name -> the one bug it plants.
MUTANTS: dict[str, str] = {
    "noncausal_attention": "attention sees future keys",
    "kv_head_mod": "query head i reads kv head i % Hkv instead of i // G",
    "mrope_wrong_axis": "cos/sin chunks taken from the next position axis",
    "mrope_layout_swapped": "the other chunk layout: HF's under forward, the benchmark's under forward_hf_mrope",
    "mrope_last_rows": "the last seq_len rows of cos/sin instead of the first (visible when kv_seq_len > seq_len)",
    "missing_residual": "x1 = attn Wo^T (x not added)",
    "missing_final_residual": "out = m (x1 not added)",
    "eps_outside_sqrt": "x / (sqrt(mean x^2) + eps) in both norms (visible when mean x^2 is near eps)",
    "silu_on_up": "g * silu(u) instead of silu(g) * u",
    "fp16_overflow_kept": "fp16 policy: values beyond fp16 range are kept (inf), no TF32 recomputation "
                          "(visible only with such values under precision='fp16')",
}
STAGES = ("input_norm", "qkv_proj", "mrope", "attention", "o_proj", "post_norm", "gate_up", "act",
          "down", "residual")
FP16_MAX = 65504.0


class _Fallbacks:
    """How many fp16 calls were recomputed under TF32 (out-of-range values seen)."""

    def __init__(self):
        self.count = 0


FP16_FALLBACK = _Fallbacks()


# --------------------------------------------------------------------------- options
def options() -> dict[str, Any]:
    """The options in force, JSON-able (``fuseval bench`` records them): the default
    precision policy, the policies, the tile tables of the "tf32" and "fp16" policies
    (``with_tables`` changes them), the CUDA-graph threshold, what happens to values
    beyond fp16 range, and how many calls took that fallback so far."""
    return {
        "precision": DEFAULT_PRECISION,
        "attention_precision": DEFAULT_PRECISION,
        "precisions": list(PRECISIONS),
        "tables": {p: {"source": tables(p).source, **tables(p).to_json()} for p in ("tf32", "fp16")},
        "tables_other_policies": "tf32x3 and ieee: the tf32 table's sizes with small tiles (GPU_SAFE)",
        "graph_max_tokens": GRAPH_MAX_TOKENS,
        "fp16_out_of_range": "the call is recomputed under tf32",
        "fp16_fallback_calls": FP16_FALLBACK.count,
    }


def tables(precision: str = "tf32") -> Tables:
    """The tile tables in force for policy "tf32" or "fp16" (``with_tables`` replaces them)."""
    check_choice("precision", precision, ("tf32", "fp16"))
    return _plans.IN_FORCE.get(precision)


def tables_from_json(source: str | Mapping[str, Any]) -> Tables:
    """Tables from the JSON that ``Tables.to_json`` (and benchmarks/qwen2vl_breakdown.py)
    writes: a dict, or the path of a file holding one."""
    if isinstance(source, Mapping):
        return Tables.from_json(source)
    with open(source) as f:
        return Tables.from_json(json.load(f), source=str(source))


@contextlib.contextmanager
def with_tables(tables: Tables | Mapping[str, Any] | str, precision: str = "tf32") -> Iterator[Tables]:
    """Within the block, calls under policy ``precision`` that name no tables use
    ``tables`` (a Tables, its JSON dict or a JSON file's path)."""
    check_choice("precision", precision, ("tf32", "fp16"))
    chosen = tables if isinstance(tables, Tables) else tables_from_json(tables)
    before = _plans.IN_FORCE.by_policy.get(precision)
    _plans.IN_FORCE.by_policy[precision] = chosen
    try:
        yield chosen
    finally:
        if before is None:
            _plans.IN_FORCE.by_policy.pop(precision, None)
        else:
            _plans.IN_FORCE.by_policy[precision] = before


# --------------------------------------------------------------------------- inputs
@functools.lru_cache(maxsize=1)
def _definition():
    return load(NAME)


_SHAPES: dict[tuple, Shape] = {}


def _signature(inputs: Sequence[Any]) -> tuple:
    return tuple((tuple(v.shape), v.dtype, v.device) if isinstance(v, torch.Tensor) else type(v)
                 for v in inputs)


def shape_of(inputs: Sequence[Any]) -> Shape:
    """The axes of a call, validated against the operator's definition by
    ``fuseval.validate.bind_axes`` (shapes, dtypes, devices, constraints; values are not
    scanned), once per signature (shapes, dtypes and devices of the 16 inputs)."""
    key = _signature(inputs)
    sh = _SHAPES.get(key)
    if sh is None:
        a = bind_axes(_definition(), inputs, check_values=False)
        D = a["head_dim"]
        if D < 16 or D & (D - 1):
            raise ValueError(f"{NAME} (fast): input 'rope_cos' must have a head_dim (last dim) that is a power "
                             f"of two >= 16 for this fast path, got {D}")
        sh = Shape(a["batch_size"], a["seq_len"], a["hidden_size"], a["num_heads"], a["num_kv_heads"], D,
                   a["intermediate_size"])
        if len(_SHAPES) >= 256:
            _SHAPES.clear()
        _SHAPES[key] = sh
    return sh


def _prepare(inputs: Sequence[Any]):
    sh = shape_of(inputs)
    if inputs[0].device.type == "cpu" and not interpreting():
        raise ValueError(f"{NAME} (fast): inputs are on the CPU but Triton is not in interpreter mode; "
                         "set TRITON_INTERPRET=1 before triton is imported, or pass CUDA tensors")
    return sh, [t.contiguous() for t in inputs[:-1]], float(inputs[-1])


def _plan(sh: Shape, device: torch.device, opts: Mapping[str, Any]) -> Plan:
    if opts.get("plan") is not None:
        return opts["plan"]
    return plan_for(sh, device, opts["precision"], opts["attention_precision"], opts["tuning"],
                    opts["mrope_layout"], tables=opts["tables"], compiled=not interpreting())


def _tf32_fallback(plan: Plan, sh: Shape, device: torch.device) -> Plan:
    """The plan an fp16 call is recomputed with: "fp16" parts under "tf32", same layout."""
    swap = lambda p: "tf32" if p == "fp16" else p
    return plan_for(sh, device, swap(plan.precision), swap(plan.attention_precision),
                    mrope_layout=plan.mrope_layout, compiled=not interpreting())


# --------------------------------------------------------------------------- the layer
# Calls of at most this many tokens are replayed from CUDA graphs (fuseval.fast._graphs):
# for small calls the host's launch work exceeds the kernels' time, and under "fp16" each
# call ends with the host reading the range flag, so the next call's launches cannot
# overlap this call's kernels (docs/design/qwen2vl_decoder_layer.md#small-calls-cuda-graphs).
# Up to 2048 tokens a graph's private memory holds under 0.7 GB (the fp16 weight copies
# included); the cache keeps 4 graphs.
GRAPH_MAX_TOKENS = 2048
GRAPHS = GraphCache(capacity=4)


def _run(inputs: Sequence[Any], **opts) -> tuple[torch.Tensor]:
    """The fused production pipeline (7 launches, and 7 weight conversions under
    ``plan.fp16_weights``; calls of up to GRAPH_MAX_TOKENS replayed from a CUDA graph)."""
    sh, t, eps = _prepare(inputs)
    dev = t[0].device
    plan = _plan(sh, dev, opts)
    mutant = opts["mutant"]
    result = _fused(sh, t, eps, plan, mutant)
    if not plan.uses_fp16:
        return result
    out, flag = result
    if mutant != "fp16_overflow_kept" and bool(flag.item()):
        FP16_FALLBACK.count += 1
        return _fused(sh, t, eps, _tf32_fallback(plan, sh, dev), mutant)
    return (out,)


def _fused(sh: Shape, t: Sequence[torch.Tensor], eps: float, plan: Plan, mutant: str | None) -> tuple:
    launch = functools.partial(_launch_layer, sh, t, eps, plan, mutant)
    if sh.M > GRAPH_MAX_TOKENS or interpreting():
        return launch()
    return GRAPHS((tensor_key(t), eps, plan, mutant), t[0].device, launch)


def _new_flag(plan: Plan, device: torch.device) -> torch.Tensor | None:
    return torch.zeros(1, dtype=torch.int32, device=device) if plan.uses_fp16 else None


def _launch_layer(sh: Shape, t: Sequence[torch.Tensor], eps: float, plan: Plan, mutant: str | None) -> tuple:
    """The seven launches; returns (out,), or (out, flag) when the plan watches fp16 ranges."""
    (x, w_in, wq, bq, wk, bk, wv, bv, wo, cos, sin, w_post, wg, wu, wd) = t
    dev = x.device
    precision = plan.precision
    M, H = sh.M, sh.H
    x2 = x.view(M, H)
    flag = _new_flag(plan, dev)
    wq, wk, wv, wo, wg, wu, wd = _gemm_weights(plan, (wq, wk, wv, wo, wg, wu, wd), flag)
    act = functools.partial(torch.empty, device=dev, dtype=plan.act_dtype)
    new = functools.partial(torch.empty, device=dev, dtype=torch.float32)

    h = launch_norm(x2, w_in, act(M, H), eps, plan, mutant, flag)
    qk = torch.empty(M, sh.QD + sh.KD, device=dev, dtype=plan.qkv_dtype)
    vt = torch.empty(sh.B, sh.Hkv, sh.D, sh.S_pad, device=dev, dtype=plan.qkv_dtype)
    launch_qkv(h, (wq, bq, wk, bk, wv, bv), cos, sin, sh, plan, qk, vt, fused=True, mutant=mutant, flag=flag)
    attn = launch_attention(qk, vt, act(M, sh.QD), sh, plan, mutant, flag)
    del qk, vt
    x1 = launch_residual_gemm(attn, wo, None if mutant == "missing_residual" else x2, new(M, H),
                              plan.o_proj, precision, flag)
    del attn
    h2 = launch_norm(x1, w_post, h, eps, plan, mutant, flag)          # reuses h's buffer
    a = launch_gate_up(h2, wg, wu, act(M, sh.I), plan.gate_up, precision, fuse_act=True,
                       round_out=plan.round_act, mutant=mutant, flag=flag)
    out = launch_residual_gemm(a, wd, None if mutant == "missing_final_residual" else x1, new(M, H),
                               plan.down, precision, flag)
    out = out.view(sh.B, sh.S, H)
    return (out,) if flag is None else (out, flag)


def _gemm_weights(plan: Plan, weights: Sequence[torch.Tensor], flag: torch.Tensor | None) -> tuple:
    """The GEMM weights as the plan's kernels read them: fp16 copies made in this call
    (``plan.fp16_weights``; nothing outlives the call), else the fp32 inputs."""
    if not plan.fp16_weights:
        return tuple(weights)
    return tuple(launch_to_fp16(w, flag) for w in weights)


def _run_staged(inputs: Sequence[Any], *, taps: MutableMapping[str, torch.Tensor] | None = None,
                override: Mapping[str, torch.Tensor] | None = None, **opts) -> tuple[torch.Tensor]:
    """Stage by stage with the same kernels; taps in the reference's layouts ([B, S, ...]),
    as float32. Under "fp16" an out-of-range value recomputes the stages under "tf32"."""
    sh, t, eps = _prepare(inputs)
    unknown = set(override or {}) - set(STAGES)
    if unknown:
        raise ValueError(f"{NAME} (fast): override names unknown stages {sorted(unknown)}; "
                         f"stages: {', '.join(STAGES)}")
    plan = _plan(sh, t[0].device, opts)
    flag = _new_flag(plan, t[0].device)
    out = _staged_layer(sh, t, eps, plan, opts["mutant"], taps, dict(override or {}), flag)
    if flag is not None and opts["mutant"] != "fp16_overflow_kept" and bool(flag.item()):
        FP16_FALLBACK.count += 1
        out = _staged_layer(sh, t, eps, _tf32_fallback(plan, sh, t[0].device), opts["mutant"], taps,
                            dict(override or {}), None)
    return (out,)


def _watch_conversion(value: torch.Tensor, dtype: torch.dtype, flag: torch.Tensor | None) -> None:
    """The torch side of ``_kernels._watch``: flag values that ``dtype`` (fp16) cannot hold."""
    if flag is not None and dtype == torch.float16:
        flag += (~(value.abs() <= FP16_MAX)).any().to(torch.int32)


def _staged_layer(sh: Shape, t, eps: float, plan: Plan, mutant: str | None, taps, override, flag) -> torch.Tensor:
    (x, w_in, wq, bq, wk, bk, wv, bv, wo, cos, sin, w_post, wg, wu, wd) = t
    dev = x.device
    M, H, B, S, QD, KD, I = sh.M, sh.H, sh.B, sh.S, sh.QD, sh.KD, sh.I
    precision = plan.precision
    x2 = x.view(M, H)
    wq, wk, wv, wo, wg, wu, wd = _gemm_weights(plan, (wq, wk, wv, wo, wg, wu, wd), flag)
    t = (x, w_in, wq, bq, wk, bk, wv, bv, wo, cos, sin, w_post, wg, wu, wd)

    def new(cols: int, dtype=torch.float32) -> torch.Tensor:
        return torch.empty(M, cols, device=dev, dtype=dtype)

    def stage(name: str, cols: int, compute: Callable[[], torch.Tensor], dtype=torch.float32) -> torch.Tensor:
        if name in override:
            value = override[name]
            if value.numel() != M * cols:
                raise ValueError(f"{NAME} (fast): override[{name!r}] must have {M * cols} elements "
                                 f"([{B}, {S}, {cols}]), got shape {tuple(value.shape)}")
            value = value.detach().to(device=dev, dtype=torch.float32).reshape(M, cols)
            _watch_conversion(value, dtype, flag)
            value = value.to(dtype).contiguous()
        else:
            value = compute()
        if taps is not None:
            taps[name] = value.view(B, S, cols).float()
        return value

    act, qkv_dtype = plan.act_dtype, plan.qkv_dtype
    h = stage("input_norm", H, lambda: launch_norm(x2, w_in, new(H, act), eps, plan, mutant, flag), act)
    qkv = stage("qkv_proj", QD + 2 * KD, lambda: _plain_qkv(h, t, sh, plan, new(QD + 2 * KD), mutant, flag))
    qk = stage("mrope", QD + KD, lambda: launch_mrope(qkv, cos, sin, sh, new(QD + KD, qkv_dtype), plan, mutant,
                                                      flag), qkv_dtype)
    v = qkv[:, QD + KD:]
    if plan.round_attn:
        v = round_tf32(v, ties="away")
    _watch_conversion(v, qkv_dtype, flag)
    vt = torch.zeros(B, sh.Hkv, sh.D, sh.S_pad, device=dev, dtype=qkv_dtype)
    vt[..., :S] = v.reshape(B, S, sh.Hkv, sh.D).permute(0, 2, 3, 1)
    attn = stage("attention", QD, lambda: launch_attention(qk, vt, new(QD, act), sh, plan, mutant, flag), act)
    x1 = stage("o_proj", H, lambda: launch_residual_gemm(
        attn, wo, None if mutant == "missing_residual" else x2, new(H), plan.o_proj, precision, flag))
    h2 = stage("post_norm", H, lambda: launch_norm(x1, w_post, new(H, act), eps, plan, mutant, flag), act)
    gu = stage("gate_up", 2 * I, lambda: launch_gate_up(h2, wg, wu, new(2 * I), plan.gate_up, precision,
                                                       fuse_act=False, mutant=mutant, flag=flag))
    a = stage("act", I, lambda: launch_swiglu(gu, new(I, act), plan, mutant, flag), act)
    m = stage("down", H, lambda: launch_residual_gemm(a, wd, None, new(H), plan.down, precision, flag))
    out = stage("residual", H, lambda: m.clone() if mutant == "missing_final_residual" else x1 + m)
    return out.view(B, S, H)


def _plain_qkv(h, t, sh: Shape, plan: Plan, out: torch.Tensor, mutant, flag) -> torch.Tensor:
    (_, _, wq, bq, wk, bk, wv, bv, _, cos, sin, *_) = t
    launch_qkv(h, (wq, bq, wk, bk, wv, bv), cos, sin, sh, plan, out, None, fused=False, mutant=mutant, flag=flag)
    return out


# --------------------------------------------------------------------------- public entry points
def variant(mutant: str | None = None, *, precision: str = DEFAULT_PRECISION, attention_precision: str | None = None,
            tuning: Mapping[str, Any] | None = None, tables: Tables | None = None, plan: Plan | None = None,
            mrope_layout: str = "sol") -> Callable[..., tuple[torch.Tensor]]:
    """A forward with fixed options (and optionally the planted bug ``mutant``, a key of
    MUTANTS), carrying ``.staged``. ``tables``: tile tables for this forward; ``tuning``:
    single plan entries over them; ``plan``: a whole plan (its precision fields decide
    the policy). ``mrope_layout="hf"``: ``forward_hf_mrope``'s layout."""
    check_choice("mrope_layout", mrope_layout, MROPE_LAYOUTS)
    if mutant is not None and mutant not in MUTANTS:
        raise ValueError(f"{NAME} (fast): mutant must be one of {sorted(MUTANTS)} or None, got {mutant!r}")
    check_choice("precision", precision, PRECISIONS)
    if attention_precision is not None:
        check_choice("attention_precision", attention_precision, PRECISIONS)
    if tables is not None and not isinstance(tables, Tables):
        tables = tables_from_json(tables)
    opts = dict(precision=precision, attention_precision=attention_precision, mutant=mutant, tuning=tuning,
                tables=tables, plan=plan, mrope_layout=mrope_layout)

    def fn(*inputs):
        return _run(inputs, **opts)

    def staged(*inputs, taps=None, override=None):
        return _run_staged(inputs, taps=taps, override=override, **opts)

    fn.staged = staged
    policy = plan.precision if plan is not None else precision
    tags = [policy] + (["hf_mrope"] if mrope_layout == "hf" else []) + ([mutant] if mutant else [])
    fn.__name__ = fn.__qualname__ = f"forward[{', '.join(tags)}]"
    return fn


def _options(precision, attention_precision, tables, plan, mrope_layout="sol") -> dict:
    return dict(precision=precision, attention_precision=attention_precision, mutant=None, tuning=None,
                tables=tables, plan=plan, mrope_layout=mrope_layout)


def forward(hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias, k_proj_weight,
            k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight, rope_cos, rope_sin,
            post_attention_layernorm_weight, gate_proj_weight, up_proj_weight, down_proj_weight,
            rms_norm_eps, *, precision: str = DEFAULT_PRECISION, attention_precision: str | None = None,
            tables: Tables | None = None, plan: Plan | None = None):
    """The fused Triton decoder layer with the benchmark's mRoPE layout (SOL-ExecBench
    L2/019); returns ``(output,)`` float32 [B, S, H]."""
    return _run((hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias, k_proj_weight,
                 k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight, rope_cos, rope_sin,
                 post_attention_layernorm_weight, gate_proj_weight, up_proj_weight, down_proj_weight,
                 rms_norm_eps), **_options(precision, attention_precision, tables, plan))


def forward_staged(*inputs, taps: MutableMapping[str, torch.Tensor] | None = None,
                   override: Mapping[str, torch.Tensor] | None = None, precision: str = DEFAULT_PRECISION,
                   attention_precision: str | None = None, tables: Tables | None = None, plan: Plan | None = None):
    """Stage-tap protocol: same outputs as ``forward`` (same kernels, stage boundaries
    materialised), every SPEC stage stored in ``taps``, ``override`` replaces a stage.

    Taps hold the values as the kernels store them, as float32: under "tf32" the stages
    that only feed tensor-core products (input_norm, mrope, attention, post_norm, act) are
    TF32-rounded, under "fp16" they are fp16 values; qkv_proj, gate_up, o_proj, down and
    residual are plain fp32 accumulations."""
    return _run_staged(inputs, taps=taps, override=override,
                       **_options(precision, attention_precision, tables, plan))


forward.staged = forward_staged


def forward_hf_mrope(hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias, k_proj_weight,
                     k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight, rope_cos, rope_sin,
                     post_attention_layernorm_weight, gate_proj_weight, up_proj_weight, down_proj_weight,
                     rms_norm_eps, *, precision: str = DEFAULT_PRECISION, attention_precision: str | None = None,
                     tables: Tables | None = None, plan: Plan | None = None):
    """``forward`` with HF Qwen2-VL's mRoPE layout (the operator's "hf_mrope" variant): the
    section (D/8, 3D/16, 3D/16) from axes t, h, w, repeated for the two rotate_half halves."""
    return _run((hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias, k_proj_weight,
                 k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight, rope_cos, rope_sin,
                 post_attention_layernorm_weight, gate_proj_weight, up_proj_weight, down_proj_weight,
                 rms_norm_eps), **_options(precision, attention_precision, tables, plan, "hf"))


def forward_hf_mrope_staged(*inputs, taps: MutableMapping[str, torch.Tensor] | None = None,
                            override: Mapping[str, torch.Tensor] | None = None, precision: str = DEFAULT_PRECISION,
                            attention_precision: str | None = None, tables: Tables | None = None,
                            plan: Plan | None = None):
    """The stage-tap protocol of ``forward_hf_mrope`` (see ``forward_staged``)."""
    return _run_staged(inputs, taps=taps, override=override,
                       **_options(precision, attention_precision, tables, plan, "hf"))


forward_hf_mrope.staged = forward_hf_mrope_staged


# the policies by name, for the definition's implementation table (fast_fp16, fast_tf32)
forward_fp16 = variant(precision="fp16")
forward_tf32 = variant(precision="tf32")
forward_hf_mrope_fp16 = variant(precision="fp16", mrope_layout="hf")
forward_hf_mrope_tf32 = variant(precision="tf32", mrope_layout="hf")
