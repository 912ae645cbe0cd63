"""Op B fast path: ``nvfp4_qkv_rope`` as an activation quantizer and one fused GEMM kernel.

The benchmark's semantics are W4A4 (SPEC.md, op B, stage ``act_quant``): :func:`forward`
first quantizes x with the benchmark's own float32 NVFP4 quantizer (``_quant.py``: two
launches, bit for bit ``refimpl.nvfp4.quantize_activations``), then runs the fused kernel on
the quantized activations xs = e2m1(code) * e4m3(scale), exact in bf16, with
gs[p] = global_decode_p(weights) * global_decode(x) applied to the fp32 accumulator.
:func:`forward_w4a16` (the operator's ``w4a16`` variant) runs the same fused kernel on the
bf16 activations as given.

The fused kernel (``_kernels.py`` in Triton, ``_gluon.py`` on Hopper) multiplies the
activations by the FP4 weights decoded exactly to bf16 code * scale, accumulates in fp32,
and applies the global scale, the q/k RMS norm and RoPE and the [B, heads, S, D] layout in
its epilogue; one launch covers all 48 heads. ``_launch.py`` picks the tiles (``options()``
reports the tables in force) and launches; ``_staged.py`` exposes every SPEC stage
(``forward.staged``) for the error budget.

Mutants: :func:`variant` returns the fast path with one planted bug of :data:`MUTANTS`, for
the tests that prove each check catches its kind of bug.

Measured and explained in docs/design/nvfp4_qkv_rope.md.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...fast._graphs import GraphCache, tensor_key
from . import _kernels as K
from . import _launch
from ._launch import H200_TABLE, UNBOUNDED, KernelConfig, as_table, gemm, pick_config, predecode_weights
from ._quant import DEFAULT_QUANT_CONFIG, ActQuant, QuantConfig, act_quant
from ...validate import storage_views
from ._staged import STAGES, STAGES_W4A16, forward_staged
from ...bench.parts import Part
from . import reference

NAME = "nvfp4_qkv_rope"

__all__ = ["forward", "forward_staged", "forward_w4a16", "forward_w4a16_staged", "variant", "options", "parts",
           "act_quant", "ActQuant", "QuantConfig", "DEFAULT_QUANT_CONFIG", "KernelConfig", "pick_config",
           "predecode_weights",
           "MUTANTS", "STAGES", "STAGES_W4A16", "H200_TABLE", "UNBOUNDED", "GRAPHS", "GRAPH_MAX_TOKENS"]

# The planted bugs of :func:`variant`: name -> what it breaks. Each breaks exactly one thing
# the SPEC fixes; the first seven live in the fused GEMM kernel, the last two in the
# activation quantizer (the GEMM then runs unchanged).
MUTANTS: dict[str, str] = {
    "swapped_nibbles": "the high nibble of each weight byte taken as the even column",
    "scale_wrong_block": "weight element k scaled by block k // 16 + 1 instead of k // 16",
    "no_global_scale": "the fp32 global decode scales never applied",
    "norm_wrong_axis": "the q/k RMS norm over the tile's tokens instead of head_dim",
    "rope_halves_swapped": "rotate_half(t) = concat(t2, -t1) instead of concat(-t2, t1)",
    "layout_bshd": "outputs written [B, S, h, D] instead of [B, h, S, D]",
    "gqa_head_shift": "k head i computed from the weights of k head i + 1",
    "weight_only_activations": "x not quantized: the bf16 activations multiplied as given",
    "per_token_amax": "the activation quantizer's amax (global scale) per token, not per tensor",
}
_QUANT_MODES = {"weight_only_activations": None, "per_token_amax": "token"}   # quantizer mutants

# Calls of at most this many tokens are replayed from CUDA graphs (fuseval.fast._graphs):
# up to there the launches' host work exceeds their GPU time; beyond, the replay's copy of
# the outputs costs what it saves (docs/design/nvfp4_qkv_rope.md#host-side-and-small-calls).
GRAPH_MAX_TOKENS = 2048
GRAPHS = GraphCache(capacity=4)


def options() -> dict:
    """The fast path's options in force, JSON-able (``fuseval bench`` records them): the
    tile table on CUDA, the Triton configs that stand in for Gluon ones where those cannot
    run, the interpreter's tiles, the quantizer's launch parameters and the CUDA-graph limit."""
    return {
        "activations": "nvfp4 (W4A4: the benchmark's float32 quantizer, then the fused GEMM)",
        "tile_table": _launch.table_to_json(_launch.H200_TABLE),
        "triton_for_gluon": {str(bm): cfg.to_dict() for bm, cfg in _launch.TRITON_FOR_GLUON.items()},
        "interpreter_tiles": {"rule": "block_m: half the tokens rounded up to a power of two, in [16, 256]; "
                                      "block_k: min(64, hidden_size rounded up to a power of two); two heads "
                                      "per tile",
                              **{f"{m} tokens": _launch.interpreter_config(m, 64).to_dict() for m in (8, 64, 512)}},
        "quantizer": DEFAULT_QUANT_CONFIG.to_dict(),
        "graph_max_tokens": GRAPH_MAX_TOKENS,
    }


def parts(*inputs, config=None, quant_config: QuantConfig | None = None) -> dict:
    """The production W4A4 call on ``inputs`` as its two pieces of GPU work, for the bench
    (``fuseval.bench.parts.Part``: each timed apart, against its own floor): ``act_quant`` (the
    quantizer's two launches, the weights' predecode riding in the first) and ``gemm`` (the
    fused GEMM with its norm/RoPE epilogue, on that quantizer's xs and decoded weights).
    Both run the production launch code with the tables in force."""
    quant_config = quant_config or DEFAULT_QUANT_CONFIG
    table = as_table(config)
    p = _launch.plan(inputs, K.MODE_FULL, table, 0, False, False)
    act, predecoded = _launch.quantize(inputs, p, "tensor", quant_config)
    cost = reference.cost_model({"batch_size": p.b, "seq_len": p.s, "hidden_size": p.hidden, "head_dim": p.d,
                                 "num_attention_heads": p.hq, "num_key_value_heads": p.hkv})
    n = (p.hq + 2 * p.hkv) * p.d
    x_bytes = 2 * p.m * p.hidden
    w_bytes = n * p.hidden // 2 + n * p.hidden // 16              # packed codes and e4m3 scales
    dense = 2 * n * p.hidden if predecoded is not None else 0    # the bf16 predecode, written then read
    return {
        "act_quant": Part(lambda: _launch.quantize(inputs, p, "tensor", quant_config), flops=0.0,
                          bytes=3 * x_bytes + (w_bytes + dense if predecoded is not None else 0),
                          what="amax pass over x, quantizer pass (x read, xs written)"
                               + (", the weights' predecode (codes read, bf16 written)" if dense else "")),
        "gemm": Part(lambda: _launch.gemm(inputs, mode=K.MODE_FULL, table=table, act=act, predecoded=predecoded),
                     flops=float(cost["flops"]), bytes=float(cost["bytes"]) + (dense - w_bytes if dense else 0),
                     matmul_dtype="bf16", what="fused GEMM + q/k norm + RoPE on xs and the decoded weights"),
    }


def _check_mutant(mutant: str | None) -> None:
    if mutant is not None and mutant not in MUTANTS:
        raise ValueError(f"{NAME}: unknown mutant {mutant!r}; known: {', '.join(MUTANTS)}")


def _run(inputs, *, activations: str, config, check_values: bool, mutant: str | None,
         quant_config: QuantConfig, graph_max_tokens: int = GRAPH_MAX_TOKENS):
    """The fused call: quantizer (W4A4) and GEMM; calls of few tokens replay a CUDA graph.
    Packed FP4 weights may come as uint8 or as the benchmark's ``torch.float4_e2m1fn_x2``."""
    inputs = tuple(storage_views(inputs))
    quant = "tensor" if activations == "nvfp4" else None
    if mutant in _QUANT_MODES:
        quant = _QUANT_MODES[mutant] if activations == "nvfp4" else None
    code = K.GEMM_MUTANT_CODES.get(mutant, 0)
    table = as_table(config)

    def run():
        return gemm(inputs, mode=K.MODE_FULL, table=table, mutant=code, check_values=check_values,
                    quant=quant, quant_config=quant_config)
    x = inputs[0]
    if (activations == "nvfp4" and mutant is None and not check_values and isinstance(x, torch.Tensor)
            and x.dim() == 3 and x.shape[0] * x.shape[1] <= graph_max_tokens):
        return GRAPHS((tensor_key(inputs), table, quant_config), x.device, run)
    return run()


def forward(hidden_states, cos, sin,
            q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
            k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
            v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
            q_norm_weight, k_norm_weight, rms_norm_eps, *,
            check_values: bool = False, config=None, quant_config: QuantConfig | None = None):
    """The fused NVFP4 QKV projection + q/k RMSNorm + RoPE with the benchmark's semantics
    (W4A4): x quantized to NVFP4 by the benchmark's quantizer (:func:`act_quant`), then the
    GEMM kernel multiplies xs by the decoded weights and applies both global decode scales
    to its fp32 accumulator.

    Inputs in definition order (SPEC.md op B); global decode scales and eps may be Python
    floats or one-element tensors. Returns (query_states, key_states, value_states), bf16
    [B, heads, S, D]. Shapes, dtypes and devices are validated (``ValueError`` naming the
    input); ``check_values=True`` also rejects NaN/Inf inputs (a full scan, off by default).
    ``config``: a :class:`KernelConfig` (or dict of its fields, or its label) or a tile table
    replacing the one in force (see ``_launch.as_table``); ``quant_config``: the quantizer's
    launch parameters."""
    inputs = (hidden_states, cos, sin, q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
              k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
              v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
              q_norm_weight, k_norm_weight, rms_norm_eps)
    return _run(inputs, activations="nvfp4", config=config, check_values=check_values, mutant=None,
                quant_config=quant_config or DEFAULT_QUANT_CONFIG)


def forward_w4a16(hidden_states, cos, sin,
                  q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
                  k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
                  v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
                  q_norm_weight, k_norm_weight, rms_norm_eps, *,
                  check_values: bool = False, config=None):
    """The operator's ``w4a16`` variant: the same fused kernel on the bf16 activations as
    they are (weight-only quantization, what Hopper serving kernels usually do). Same
    signature and outputs as :func:`forward`, without the quantizer."""
    inputs = (hidden_states, cos, sin, q_proj_weight_fp4, q_proj_scale, q_proj_global_decode_scale,
              k_proj_weight_fp4, k_proj_scale, k_proj_global_decode_scale,
              v_proj_weight_fp4, v_proj_scale, v_proj_global_decode_scale,
              q_norm_weight, k_norm_weight, rms_norm_eps)
    return _run(inputs, activations="bf16", config=config, check_values=check_values, mutant=None,
                quant_config=DEFAULT_QUANT_CONFIG)


def forward_w4a16_staged(*inputs, taps=None, override=None, config=None):
    """The stage-tap protocol of :func:`forward_w4a16` (``forward_staged`` without act_quant)."""
    return forward_staged(*inputs, taps=taps, override=override, config=config, activations="bf16")


forward.staged = forward_staged
forward_w4a16.staged = forward_w4a16_staged

_VARIANT_OPTIONS = ("activations", "config", "check_values", "quant_config", "graph_max_tokens")


def variant(mutant: str | None = None, **options) -> Callable:
    """The fast path as a callable of the definition's inputs, with one planted bug
    (``mutant``, a key of :data:`MUTANTS`; None: the production path) and ``options``:
    ``activations`` ("nvfp4": :func:`forward`, the default; "bf16": :func:`forward_w4a16`,
    where the quantizer mutants do nothing), ``config`` (a kernel config or tile table),
    ``check_values``, ``quant_config``, ``graph_max_tokens`` (W4A4 calls of at most this
    many tokens replay CUDA graphs; default :data:`GRAPH_MAX_TOKENS`). Mutated calls never
    replay CUDA graphs.

    The callable carries ``.staged``, the stage-tap protocol with the same options. The
    planted bugs live in the fused kernels only, so ``.staged`` is the production
    arithmetic: a mutant shows as a disagreement between the fused call and its stages."""
    _check_mutant(mutant)
    unknown = sorted(set(options) - set(_VARIANT_OPTIONS))
    if unknown:
        raise ValueError(f"{NAME}: unknown variant option(s) {unknown}; options: {', '.join(_VARIANT_OPTIONS)}")
    activations = options.get("activations", "nvfp4")
    if activations not in ("nvfp4", "bf16"):
        raise ValueError(f"{NAME}: activations must be 'nvfp4' or 'bf16', got {activations!r}")
    config = options.get("config")
    as_table(config)                       # a bad config fails here, not at the first call
    check_values = bool(options.get("check_values", False))
    quant_config = options.get("quant_config") or DEFAULT_QUANT_CONFIG
    graph_max_tokens = int(options.get("graph_max_tokens", GRAPH_MAX_TOKENS))

    def fn(*inputs):
        return _run(inputs, activations=activations, config=config, check_values=check_values,
                    mutant=mutant, quant_config=quant_config, graph_max_tokens=graph_max_tokens)

    def staged(*inputs, taps=None, override=None):
        return forward_staged(*inputs, taps=taps, override=override, config=config, activations=activations)

    fn.staged = staged
    fn.__name__ = fn.__qualname__ = f"{NAME}.fast.variant({mutant or 'production'})"
    fn.mutant = mutant
    return fn
