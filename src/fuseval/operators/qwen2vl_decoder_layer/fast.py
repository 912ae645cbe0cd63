"""Fast path for op A (``qwen2vl_decoder_layer``): float32 in and out, Triton kernels.

The production ``forward`` runs seven kernels (``fuseval.operators.qwen2vl_decoder_layer._kernels``):

==========  ==========================================================================
kernel      what it fuses
==========  ==========================================================================
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
tile on the fly would push the TF32 operand through registers (Hopper's TF32 tensor-core
path wants both operands straight from shared memory), and pre-scaling the weights would
rewrite 0.5 GB of weights every call. The row pass costs one extra read and write of
[M, H] (about 1% of the layer's floor).

Precision policy (``precision=``): "tf32" (default; TF32 tensor cores, like torch's
TF32 matmuls), "tf32x3" (three TF32 products per dot, about fp32 accuracy, roughly 3x
the tensor work) or "ieee" (exact fp32 FMA, slow). ``attention_precision=`` overrides it
for the attention kernel alone.

TF32 rounding. A Hopper tensor core reads a fp32 operand as TF32 by dropping its 13 low
mantissa bits (truncation, not rounding): every operand shrinks towards zero, each
product is biased by about -7e-4 relative, and the bias adds up coherently over K. With
both operands truncated the layer missed the benchmark tolerance (max abs 1.3e-2, 88% of
elements inside the bound, on the H200). So under "tf32" every activation that feeds a
tensor-core product is stored already rounded to nearest TF32 by the kernel producing it
(norm outputs, q'/k'/v, attention output, SiLU*up, and P inside attention): those
operands are then exact in TF32 and carry an unbiased rounding error, which costs
nothing. The weights are inputs and stay truncated by the hardware unless a tile config
asks for ``round_b`` (rounding in the kernel: 1.7-2.2x slower at 8192 tokens, so off).

GPU tiles come from a table measured on the H200 (``GPU_TABLE``); see
benchmarks/notes_qwen2vl_decoder_layer.md for the numbers.

Multimodal RoPE. cos/sin are [3, B, kv_seq_len, D] with kv_seq_len >= seq_len; token s
of sequence b reads row s of its batch (the first seq_len rows: keys and values come only
from this call's tokens). ``forward`` uses the benchmark's chunk layout (head-dim index d
from position axis 0 for d < D/4, 1 below 5D/8, 2 above; SOL-ExecBench L2/019);
``forward_hf_mrope`` uses HF Qwen2-VL's (the section (D/8, 3D/16, 3D/16) repeated for the
two rotate_half halves, the operator's "hf_mrope" variant). One constexpr of the RoPE
code picks the layout; everything else is shared.

``forward.staged`` implements the stage-tap protocol (docs/developing.md): the
same kernels, unfused where a stage boundary falls inside a fused kernel (plain QKV,
then a RoPE kernel; gate/up, then a SwiGLU kernel), so every SPEC stage can be read or
overridden. ``variant(mutant=...)`` builds deliberately broken versions for the tests.

On the CPU the kernels run under the Triton interpreter (set TRITON_INTERPRET=1 before
triton is imported); there every dot is exact fp32.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, MutableMapping, Sequence

import torch
from ... import fast as _kernel_runtime  # noqa: F401  (before triton: selects the interpreter on CPU-only machines)
import triton

from . import _kernels as K
from ...fast._graphs import GraphCache, tensor_key

__all__ = ["forward", "forward_staged", "forward_hf_mrope", "forward_hf_mrope_staged", "variant", "PRECISIONS", "MROPE_LAYOUTS",
           "MUTANTS", "compile_only", "plan_for", "INPUT_NAMES"]

NAME = "qwen2vl_decoder_layer"
PRECISIONS = ("tf32", "tf32x3", "ieee")
# cos/sin chunk layouts: "sol" the benchmark's (forward), "hf" HF Qwen2-VL's (forward_hf_mrope)
MROPE_LAYOUTS = ("sol", "hf")
# Deliberately broken variants (tests): each plants one bug the check must catch.
MUTANTS = (
    "noncausal_attention",      # attention sees future keys
    "kv_head_mod",              # query head i reads kv head i % Hkv instead of i // G
    "mrope_wrong_axis",         # cos/sin chunks taken from the next position axis
    "mrope_layout_swapped",     # the other chunk layout: HF's under forward, the benchmark's under
                                # forward_hf_mrope
    "mrope_last_rows",          # the last seq_len rows of cos/sin instead of the first (visible only
                                # when kv_seq_len > seq_len)
    "missing_residual",         # x1 = attn Wo^T (x not added)
    "missing_final_residual",   # out = m (x1 not added)
    "eps_outside_sqrt",         # x / (sqrt(mean x^2) + eps) in both norms
    "silu_on_up",               # g * silu(u) instead of silu(g) * u
)
INPUT_NAMES = ("hidden_states", "input_layernorm_weight", "q_proj_weight", "q_proj_bias",
               "k_proj_weight", "k_proj_bias", "v_proj_weight", "v_proj_bias", "o_proj_weight",
               "rope_cos", "rope_sin", "post_attention_layernorm_weight", "gate_proj_weight",
               "up_proj_weight", "down_proj_weight", "rms_norm_eps")
LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------- input checks
@dataclass(frozen=True)
class Shape:
    B: int
    S: int
    H: int
    Hq: int
    Hkv: int
    D: int
    I: int

    @property
    def M(self) -> int:
        return self.B * self.S

    @property
    def QD(self) -> int:
        return self.Hq * self.D

    @property
    def KD(self) -> int:
        return self.Hkv * self.D

    @property
    def G(self) -> int:
        return self.Hq // self.Hkv

    @property
    def S_pad(self) -> int:
        """Row length of the transposed V buffer: a multiple of 16 keeps every row 64-byte aligned."""
        return -(-self.S // 16) * 16


def _fail(name: str, expected: str, got: Any) -> None:
    raise ValueError(f"{NAME} (fast): input {name!r} must be {expected}, got {got}")


def _shape_of(inputs: Sequence[Any]) -> Shape:
    """Validate the 16 inputs cheaply (this runs on every call) and read the axes."""
    if len(inputs) != len(INPUT_NAMES):
        raise ValueError(f"{NAME} (fast): expected {len(INPUT_NAMES)} inputs "
                         f"({', '.join(INPUT_NAMES)}), got {len(inputs)}")
    x = inputs[0]
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        _fail("hidden_states", "a 3-D tensor [batch_size, seq_len, hidden_size]",
              tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__)
    for name, t in zip(INPUT_NAMES[:-1], inputs[:-1]):
        if not isinstance(t, torch.Tensor):
            _fail(name, "a torch.Tensor", type(t).__name__)
        if t.dtype != torch.float32:
            _fail(name, "float32", t.dtype)
        if t.device != x.device:
            _fail(name, f"on {x.device} like hidden_states", t.device)
    eps = inputs[-1]
    if isinstance(eps, torch.Tensor):
        if eps.numel() != 1:
            _fail("rms_norm_eps", "a scalar", f"a tensor of shape {tuple(eps.shape)}")
    elif not isinstance(eps, (int, float)):
        _fail("rms_norm_eps", "a Python float", type(eps).__name__)
    B, S, H = x.shape
    cos, sin = inputs[9], inputs[10]
    if cos.dim() != 4 or cos.shape[0] != 3 or cos.shape[1] != B:
        _fail("rope_cos", f"[3, batch_size={B}, kv_seq_len, head_dim]", tuple(cos.shape))
    if cos.shape[2] < S:
        raise ValueError(f"{NAME} (fast): rope_cos has kv_seq_len={cos.shape[2]} rows, fewer than "
                         f"hidden_states' seq_len={S} (the layer uses the first seq_len rows)")
    D = cos.shape[3]
    if D < 16 or D & (D - 1):
        _fail("rope_cos", "a head_dim that is a power of two >= 16 (this fast path)", D)
    if tuple(sin.shape) != tuple(cos.shape):
        _fail("rope_sin", f"the shape of rope_cos {tuple(cos.shape)}", tuple(sin.shape))
    qw, kw = inputs[2], inputs[4]
    if qw.dim() != 2 or qw.shape[1] != H or qw.shape[0] % D:
        _fail("q_proj_weight", f"[num_heads*{D}, hidden_size={H}]", tuple(qw.shape))
    if kw.dim() != 2 or kw.shape[1] != H or kw.shape[0] % D:
        _fail("k_proj_weight", f"[num_kv_heads*{D}, hidden_size={H}]", tuple(kw.shape))
    Hq, Hkv = qw.shape[0] // D, kw.shape[0] // D
    if Hkv == 0 or Hq % Hkv:
        _fail("q_proj_weight", f"a number of heads divisible by num_kv_heads={Hkv}", Hq)
    I = inputs[12].shape[0] if inputs[12].dim() == 2 else -1
    QD, KD = Hq * D, Hkv * D
    expected = {
        "input_layernorm_weight": (H,), "q_proj_bias": (QD,), "k_proj_bias": (KD,),
        "v_proj_weight": (KD, H), "v_proj_bias": (KD,), "o_proj_weight": (H, QD),
        "post_attention_layernorm_weight": (H,), "gate_proj_weight": (I, H),
        "up_proj_weight": (I, H), "down_proj_weight": (H, I),
    }
    for name, t in zip(INPUT_NAMES, inputs):
        if name in expected and tuple(t.shape) != expected[name]:
            _fail(name, f"of shape {list(expected[name])}", list(t.shape))
    if I <= 0:
        _fail("gate_proj_weight", "[intermediate_size, hidden_size]", tuple(inputs[12].shape))
    return Shape(B, S, H, Hq, Hkv, D, I)


def _interpreting() -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(K.rms_norm_kernel, InterpretedFunction)


# --------------------------------------------------------------------------- launch configs
@dataclass(frozen=True)
class GemmConfig:
    BM: int
    BN: int          # per accumulator (gate_up: each of g and u; qkv: unused, heads per tile * head_dim)
    BK: int
    num_warps: int
    num_stages: int
    use_tma: bool = False          # tiles fetched by TMA descriptors instead of pointer loads
    persistent: bool = False       # one program per SM walking the tiles (implies TMA)
    warp_specialize: bool = False  # persistent only: Triton's producer/consumer warp split
    round_b: bool = False          # round the weight tiles to TF32 in the kernel (see _round_tf32)
    GROUP_M: int = 8
    split_k: int = 1               # residual GEMMs: K slices summed by a second kernel (small M)
    gluon: bool = False            # sm_90, "tf32": the warp-specialized Gluon kernel (operators/qwen2vl_decoder_layer/_gluon.py)


@dataclass(frozen=True)
class AttnConfig:
    BM: int
    BN: int
    num_warps: int
    num_stages: int
    use_tma: bool = False          # K and V tiles fetched by TMA descriptors
    gluon: bool = False            # sm_90, "tf32": the Gluon kernel (operators/qwen2vl_decoder_layer/_gluon.py), products
                                   # overlapped with the softmax


@dataclass(frozen=True)
class Plan:
    """Everything a call needs besides the tensors: tile shapes and precision."""
    qkv: GemmConfig
    qkv_heads_per_tile: int
    o_proj: GemmConfig
    gate_up: GemmConfig
    down: GemmConfig
    attention: AttnConfig
    norm_rows: int
    norm_warps: int
    precision: str
    attention_precision: str
    mrope_layout: str = "sol"

    @property
    def hf_layout(self) -> bool:
        """Whether the RoPE kernels use HF's cos/sin chunk layout (else the benchmark's)."""
        return self.mrope_layout == "hf"

    @property
    def round_act(self) -> bool:
        """Store GEMM input activations rounded to TF32 (only under the "tf32" policy)."""
        return self.precision == "tf32"

    @property
    def round_attn(self) -> bool:
        """Store q, k, v and round P to TF32 (only when attention runs in "tf32")."""
        return self.attention_precision == "tf32"


G = GemmConfig
# Measured on one H200 (benchmarks/qwen2vl_breakdown.py --phases explore, which writes this
# table as gpu_table.json; see benchmarks/notes_qwen2vl_decoder_layer.md): the fastest
# tile of each kernel at M = 128, 512, 1024, 2048, 3072, 4096 and 8192 tokens; a call
# takes the nearest size (log scale). Small M needs small tiles to occupy the 132 SMs
# (and split-K for the 18944-long K of the down projection at 128 tokens); large M wants
# 128 x 256 tiles with TMA. ``gluon=True`` rows run the warp-specialized Gluon kernel
# (operators/qwen2vl_decoder_layer/_gluon.py): it wins for the residual GEMMs from 1024-2048 tokens up (5-8%
# at 8192), while the Triton persistent kernel stays ahead for gate/up above 1024.
# QKV entries are (heads per tile, config): the tile is BM tokens x heads * head_dim.
GPU_TABLE: dict[str, dict[int, Any]] = {
    "qkv": {128: (1, G(64, 0, 32, 4, 4)), 512: (1, G(64, 0, 32, 4, 4, True)), 1024: (1, G(128, 0, 32, 8, 4, True)),
            2048: (2, G(128, 0, 32, 8, 4, True)), 3072: (1, G(128, 0, 32, 8, 4, True)),
            4096: (2, G(128, 0, 32, 8, 4, True)), 8192: (2, G(128, 0, 32, 8, 4, True))},
    "o_proj": {128: G(64, 64, 32, 4, 4, True, split_k=2), 512: G(64, 128, 32, 4, 4), 1024: G(128, 256, 32, 8, 4, True),
               **{m: G(128, 256, 32, 8, 3, GROUP_M=16, gluon=True) for m in (2048, 3072, 4096, 8192)}},
    "gate_up": {128: G(64, 128, 32, 4, 5, True), 512: G(128, 128, 32, 8, 4, GROUP_M=16, gluon=True),
                1024: G(128, 128, 32, 8, 4, GROUP_M=16, gluon=True),
                **{m: G(128, 128, 32, 8, 3, True, True, True, GROUP_M=16) for m in (2048, 3072, 4096, 8192)}},
    "down": {128: G(64, 128, 32, 4, 4, True, split_k=4), 512: G(128, 128, 32, 8, 4, GROUP_M=16, gluon=True),
             1024: G(128, 256, 32, 8, 3, GROUP_M=16, gluon=True), 2048: G(128, 256, 32, 8, 3, True, True, True),
             **{m: G(128, 256, 32, 8, 3, GROUP_M=16, gluon=True) for m in (3072, 4096, 8192)}},
}
# Attention by seq_len. The Gluon kernel (gluon=True) where it measured faster than Triton's
# in benchmarks/probe_qwen2vl_attention.py: 64 x 32 tiles at 64 x 128 tokens (0.118 vs
# 0.125 ms), 64 x 64 tiles with one K/V slot (two programs per SM) from 1571 tokens
# (8192: 1.819 vs 1.875 ms; 4096: 0.472 vs 0.498).
GPU_ATTENTION = {128: AttnConfig(64, 32, 4, 2, gluon=True), 373: AttnConfig(64, 32, 4, 2, True),
                 1571: AttnConfig(64, 64, 4, 1, gluon=True), 8192: AttnConfig(64, 64, 4, 1, gluon=True)}
TABLE_ENV = "FUSEVAL_QWEN2VL_TABLE"    # path of a JSON tile table (benchmarks/qwen2vl_breakdown.py writes one)


@functools.lru_cache(maxsize=4)
def _table_from_file(path: str) -> tuple[dict, dict]:
    """(GPU_TABLE, GPU_ATTENTION) from a JSON file {kind: {size: {"config": {...},
    "heads_per_tile": n}}}: sizes are token counts, for "attention" sequence lengths."""
    with open(path) as f:
        raw = json.load(f)
    table: dict[str, dict[int, Any]] = {}
    for kind, rows in raw.items():
        if kind == "attention":
            continue
        table[kind] = {}
        for size, entry in rows.items():
            cfg = GemmConfig(**entry["config"])
            table[kind][int(size)] = (entry["heads_per_tile"], cfg) if kind == "qkv" else cfg
    attention = {int(size): AttnConfig(**entry["config"]) for size, entry in raw.get("attention", {}).items()}
    missing = {"qkv", "o_proj", "gate_up", "down"} - set(table)
    if missing or not attention:
        raise ValueError(f"{NAME} (fast): {TABLE_ENV}={path} lacks {sorted(missing) or ['attention']}")
    return table, attention


def _gpu_tables() -> tuple[dict, dict]:
    path = os.environ.get(TABLE_ENV)
    return _table_from_file(path) if path else (GPU_TABLE, GPU_ATTENTION)


# Policies other than "tf32" need more shared memory per stage (tf32x3 splits operands)
# or run on CUDA cores (ieee): modest tiles that fit.
GPU_SAFE = dict(qkv=G(64, 64, 32, 4, 2), qkv_heads_per_tile=1, o_proj=G(64, 128, 32, 4, 2),
                gate_up=G(64, 64, 32, 4, 2), down=G(64, 128, 32, 4, 2),
                attention=AttnConfig(64, 32, 4, 1))
# Under the interpreter: few, small programs (CPU time is per program and per op).
CPU_GEMM = GemmConfig(32, 32, 32, 4, 1)
CPU_ATTENTION = AttnConfig(32, 16, 4, 1)
del G


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _persistent_programs(t: torch.Tensor) -> int:
    """How many programs a persistent kernel starts: one per SM on the GPU; a few under the
    interpreter, and in compile-only launches (where the grid does not enter the code)."""
    if t.device.type != "cuda":
        return 4
    return _sm_count(t.device.index if t.device.index is not None else torch.cuda.current_device())


def _nearest(table: Mapping[int, Any], size: int) -> Any:
    return table[min(table, key=lambda k: abs(math.log(k / max(size, 1))))]


def _heads_per_tile(sh: Shape, want: int) -> int:
    """Largest power of two <= want dividing both head counts (tiles never straddle q/k/v)."""
    hpt = 1
    while hpt * 2 <= want and sh.Hq % (hpt * 2) == 0 and sh.Hkv % (hpt * 2) == 0:
        hpt *= 2
    return hpt


def plan_for(sh: Shape, device: torch.device, precision: str = "tf32",
             attention_precision: str | None = None,
             tuning: Mapping[str, Any] | None = None, mrope_layout: str = "sol") -> Plan:
    """Tile shapes for one call. ``tuning`` overrides entries ({"o_proj": GemmConfig, ...,
    "qkv_heads_per_tile": int}); the benchmark uses it to time variants. ``mrope_layout``:
    one of MROPE_LAYOUTS (part of the plan, so CUDA graphs of the two layouts never mix)."""
    if mrope_layout not in MROPE_LAYOUTS:
        raise ValueError(f"{NAME} (fast): mrope_layout must be one of {MROPE_LAYOUTS}, got {mrope_layout!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"{NAME} (fast): precision must be one of {PRECISIONS}, got {precision!r}")
    attention_precision = attention_precision or precision
    if attention_precision not in PRECISIONS:
        raise ValueError(f"{NAME} (fast): attention_precision must be one of {PRECISIONS}, "
                         f"got {attention_precision!r}")
    M = sh.M
    if device.type == "cuda" and not _interpreting():
        table, attention = _gpu_tables()
        hpt, qkv = _nearest(table["qkv"], M)
        plan = dict(qkv=qkv, qkv_heads_per_tile=_heads_per_tile(sh, hpt),
                    o_proj=_nearest(table["o_proj"], M), gate_up=_nearest(table["gate_up"], M),
                    down=_nearest(table["down"], M), attention=_nearest(attention, sh.S),
                    norm_rows=1, norm_warps=8 if sh.H >= 2048 else 4)
        if precision != "tf32":
            plan.update({k: v for k, v in GPU_SAFE.items() if k != "attention"})
            plan["qkv_heads_per_tile"] = _heads_per_tile(sh, GPU_SAFE["qkv_heads_per_tile"])
        if attention_precision != "tf32":
            plan["attention"] = GPU_SAFE["attention"]
    else:
        plan = dict(qkv=CPU_GEMM, qkv_heads_per_tile=_heads_per_tile(sh, 2), o_proj=CPU_GEMM,
                    gate_up=CPU_GEMM, down=CPU_GEMM, attention=CPU_ATTENTION, norm_rows=16,
                    norm_warps=4)
    plan.update(tuning or {})
    plan["qkv_heads_per_tile"] = _heads_per_tile(sh, plan["qkv_heads_per_tile"])
    return Plan(precision=precision, attention_precision=attention_precision, mrope_layout=mrope_layout, **plan)


# --------------------------------------------------------------------------- launching
_COMPILE_ONLY = [False]


@contextlib.contextmanager
def compile_only():
    """Inside this block the launchers compile their kernels (``kernel.warmup``) without
    running them: a benchmark can fill Triton's cache from several processes at once."""
    _COMPILE_ONLY[0] = True
    try:
        yield
    finally:
        _COMPILE_ONLY[0] = False


def _launch(kernel, grid, *args, **meta) -> None:
    if _COMPILE_ONLY[0]:
        kernel.warmup(*args, grid=grid, **meta)
    else:
        kernel[grid](*args, **meta)


def _even(k: int, bk: int) -> bool:
    return k % bk == 0


def _descriptor(t: torch.Tensor, block: list[int]):
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor.from_tensor(t, block)


def launch_norm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, eps: float, plan: Plan,
                mutant: str | None = None) -> torch.Tensor:
    M, H = x.shape
    rows = plan.norm_rows
    _launch(K.rms_norm_kernel, (triton.cdiv(M, rows),), x, w, out, M, H, x.stride(0), out.stride(0),
            float(eps), BLOCK_H=triton.next_power_of_2(H), ROWS=rows, ROUND_OUT=plan.round_act,
            MUT_EPS_OUTSIDE=mutant == "eps_outside_sqrt", num_warps=plan.norm_warps)
    return out


def _hf_layout(plan: Plan, mutant: str | None) -> bool:
    """The RoPE kernels' HF_LAYOUT flag: the plan's layout, swapped by the mutant."""
    return plan.hf_layout != (mutant == "mrope_layout_swapped")


def _rope_tables(cos: torch.Tensor, sin: torch.Tensor) -> None:
    """The RoPE kernels index cos/sin as contiguous [3, B, kv_seq_len, D] tables of equal shape."""
    if not (cos.is_contiguous() and sin.is_contiguous() and cos.shape == sin.shape):
        raise ValueError(f"{NAME} (fast): rope_cos and rope_sin must be contiguous tables of one shape")


def launch_qkv(h: torch.Tensor, w: Sequence[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
               sh: Shape, plan: Plan, out: torch.Tensor, vt: torch.Tensor | None, *, fused: bool,
               mutant: str | None = None) -> None:
    """fused: RoPE'd [q|k] into ``out`` ([M, QD+KD]) and v into ``vt``; else plain [q|k|v].
    cos/sin: [3, B, kv_seq_len >= S, D], contiguous; the first S rows are used."""
    _rope_tables(cos, sin)
    c, hpt = plan.qkv, plan.qkv_heads_per_tile
    wq, bq, wk, bk, wv, bv = w
    M = sh.M
    bn = hpt * sh.D
    if c.use_tma:
        x_arg = _descriptor(h, [c.BM, c.BK])
        wq, wk, wv = (_descriptor(t, [bn, c.BK]) for t in (wq, wk, wv))
    else:
        x_arg = h
    vt_arg = vt if vt is not None else out
    vs = vt.stride() if vt is not None else (0, 0, 0, 0)
    grid = (triton.cdiv(M, c.BM) * ((sh.QD + 2 * sh.KD) // bn),)
    _launch(K.qkv_rope_kernel, grid, x_arg, wq, wk, wv, bq, bk, bv, cos, sin, out, vt_arg, M, sh.S, sh.H,
            h.stride(0), out.stride(0), cos.stride(0), cos.stride(1), vs[0], vs[1], vs[2],
            QD=sh.QD, KD=sh.KD, D=sh.D, HPT=hpt, BM=c.BM, BK=c.BK, GROUP_M=c.GROUP_M,
            EVEN_K=_even(sh.H, c.BK), PREC=plan.precision, USE_TMA=c.use_tma,
            ROUND_B=c.round_b and plan.round_act, FUSED=fused,
            ROUND_OUT=fused and plan.round_attn, HF_LAYOUT=_hf_layout(plan, mutant),
            MUT_WRONG_AXIS=mutant == "mrope_wrong_axis", MUT_LAST_ROWS=mutant == "mrope_last_rows",
            num_warps=c.num_warps, num_stages=c.num_stages)


def launch_mrope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sh: Shape, out: torch.Tensor,
                 plan: Plan, mutant: str | None = None) -> torch.Tensor:
    _rope_tables(cos, sin)
    bm = 32
    _launch(K.mrope_kernel, (triton.cdiv(sh.M, bm), sh.Hq + sh.Hkv), qkv, cos, sin, out, sh.M, sh.S,
            qkv.stride(0), out.stride(0), cos.stride(0), cos.stride(1), D=sh.D, BM=bm,
            ROUND_OUT=plan.round_attn, HF_LAYOUT=_hf_layout(plan, mutant),
            MUT_WRONG_AXIS=mutant == "mrope_wrong_axis", MUT_LAST_ROWS=mutant == "mrope_last_rows",
            num_warps=4)
    return out


def launch_attention(qk: torch.Tensor, vt: torch.Tensor, out: torch.Tensor, sh: Shape, plan: Plan,
                     mutant: str | None = None) -> torch.Tensor:
    c = plan.attention
    if _gluon_applies(c, qk, plan.attention_precision, mutant):
        from . import _gluon as _qwen2vl_gluon
        _qwen2vl_gluon.launch_attention(qk, vt, out, S=sh.S, B=sh.B, HKV=sh.Hkv, G=sh.G, QD=sh.QD, D=sh.D,
                                        qk_scale=LOG2E / math.sqrt(sh.D), block_m=c.BM, block_n=c.BN,
                                        stages=c.num_stages, round_p=plan.round_attn, round_out=plan.round_act,
                                        num_warps=c.num_warps, compile_only=_COMPILE_ONLY[0])
        return out
    grid = (triton.cdiv(sh.S * sh.G, c.BM), sh.B * sh.Hkv)
    if c.use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        k_src = TensorDescriptor.from_tensor(qk, [c.BN, sh.D])
        # V^T seen as [B*Hkv*D, S] with row stride S_pad: keys >= S read as zeros, never
        # the padding columns (which nobody writes)
        vt_src = TensorDescriptor(vt, [sh.B * sh.Hkv * sh.D, sh.S], [vt.stride(2), 1], [sh.D, c.BN])
    else:
        k_src, vt_src = qk, vt
    _launch(K.attention_kernel, grid, qk, k_src, vt_src, out, sh.S, qk.stride(0), out.stride(0), vt.stride(0),
            vt.stride(1), vt.stride(2), LOG2E / math.sqrt(sh.D),
            QD=sh.QD, G=sh.G, HKV=sh.Hkv, D=sh.D, BM=c.BM, BN=c.BN, PREC=plan.attention_precision,
            ROUND_P=plan.round_attn, ROUND_OUT=plan.round_act, USE_TMA=c.use_tma,
            MUT_NONCAUSAL=mutant == "noncausal_attention", MUT_KV_MOD=mutant == "kv_head_mod",
            num_warps=c.num_warps, num_stages=c.num_stages)
    return out


def _launch_persistent(a, b1, b2, res, out, c: GemmConfig, precision: str, *, gate_up: bool,
                       round_out: bool = False, mutant: str | None = None) -> None:
    M, Kd = a.shape
    N = b1.shape[0]
    tiles = triton.cdiv(M, c.BM) * triton.cdiv(N, c.BN)
    n_prog = min(tiles, _persistent_programs(a))
    a_d, b1_d = _descriptor(a, [c.BM, c.BK]), _descriptor(b1, [c.BN, c.BK])
    b2_d = _descriptor(b2, [c.BN, c.BK]) if b2 is not None else b1_d
    res_arg = res if res is not None else out
    _launch(K.gemm_persistent_kernel, (n_prog,), a_d, b1_d, b2_d, res_arg, out, M, N, Kd, res_arg.stride(0),
            out.stride(0), n_prog, BM=c.BM, BN=c.BN, BK=c.BK, GROUP_M=c.GROUP_M, PREC=precision,
            WARP_SPECIALIZE=c.warp_specialize, GATE_UP=gate_up, ROUND_B=c.round_b and precision == "tf32",
            ADD_RESIDUAL=res is not None, ROUND_OUT=round_out, MUT_SILU_ON_UP=mutant == "silu_on_up",
            num_warps=c.num_warps, num_stages=c.num_stages)


def _launch_gluon(a, b1, b2, res, out, c: GemmConfig, *, gate_up: bool, round_out: bool = False) -> None:
    from . import _gluon as _qwen2vl_gluon
    _qwen2vl_gluon.launch(a, b1, b2, res, out, block_m=c.BM, block_n=c.BN, block_k=c.BK, stages=c.num_stages,
                          group_m=c.GROUP_M, num_warps=c.num_warps, n_programs=_persistent_programs(a),
                          gate_up=gate_up, round_out=round_out, compile_only=_COMPILE_ONLY[0])


def _gluon_applies(c: GemmConfig | AttnConfig, a: torch.Tensor, precision: str, mutant: str | None = None) -> bool:
    """The Gluon kernels (GEMM and attention) cover production TF32 calls on the GPU; the
    rest runs in Triton."""
    return c.gluon and precision == "tf32" and mutant is None and _on_gpu_or_compiling(a)


def _on_gpu_or_compiling(t: torch.Tensor) -> bool:
    """Whether a Gluon (sm_90) kernel may run: a compiled (not interpreted) launch on a
    Hopper GPU, or a compile-only one (which ``benchmarks/sm90_compile.py`` runs with CPU
    tensors on a machine without a GPU). Elsewhere the Triton kernels take the call."""
    if _interpreting():
        return False
    if t.device.type == "cuda":
        return _capability(t.device.index if t.device.index is not None else torch.cuda.current_device())[0] == 9
    return _COMPILE_ONLY[0]


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def launch_residual_gemm(a: torch.Tensor, w: torch.Tensor, res: torch.Tensor | None, out: torch.Tensor,
                         c: GemmConfig, precision: str) -> torch.Tensor:
    """out = (res +) a w^T; with ``c.split_k`` > 1 the K axis is cut into that many slices
    whose partial products are summed (with the residual) by a second, small kernel."""
    if _gluon_applies(c, a, precision):
        _launch_gluon(a, w, None, res, out, c, gate_up=False)
        return out
    if c.persistent:
        _launch_persistent(a, w, None, res, out, c, precision, gate_up=False)
        return out
    M, Kd = a.shape
    N = w.shape[0]
    if c.use_tma:
        a_arg, w_arg = _descriptor(a, [c.BM, c.BK]), _descriptor(w, [c.BN, c.BK])
    else:
        a_arg, w_arg = a, w
    splits = max(1, min(c.split_k, triton.cdiv(Kd, c.BK)))
    k_per_split = triton.cdiv(triton.cdiv(Kd, splits), c.BK) * c.BK
    splits = triton.cdiv(Kd, k_per_split)
    if splits > 1 and ((res is not None and res.stride(0) != N) or out.stride(0) != N):
        raise ValueError(f"{NAME} (fast): split-K needs contiguous residual and output rows")
    part = out if splits == 1 else torch.empty(splits, M, N, device=out.device, dtype=torch.float32)
    res_arg = res if res is not None else out
    grid = (triton.cdiv(M, c.BM) * triton.cdiv(N, c.BN), splits)
    _launch(K.gemm_residual_kernel, grid, a_arg, w_arg, res_arg, part, M, N, Kd, a.stride(0), w.stride(0),
            res_arg.stride(0), N if splits > 1 else out.stride(0), k_per_split,
            BM=c.BM, BN=c.BN, BK=c.BK, GROUP_M=c.GROUP_M,
            EVEN_K=_even(Kd, c.BK), PREC=precision, USE_TMA=c.use_tma, ROUND_B=c.round_b and precision == "tf32",
            ADD_RESIDUAL=res is not None and splits == 1, num_warps=c.num_warps, num_stages=c.num_stages)
    if splits > 1:
        block = 1024
        _launch(K.splitk_reduce_kernel, (triton.cdiv(M * N, block),), part, res_arg, out, M, N,
                SPLITS=splits, BLOCK=block, ADD_RESIDUAL=res is not None, num_warps=4)
    return out


def launch_gate_up(a: torch.Tensor, wg: torch.Tensor, wu: torch.Tensor, out: torch.Tensor, c: GemmConfig,
                   precision: str, *, fuse_act: bool, round_out: bool = False,
                   mutant: str | None = None) -> torch.Tensor:
    """fuse_act: out = silu(a wg^T) * (a wu^T) ([M, I]; ``round_out``: TF32-rounded);
    otherwise out = [a wg^T | a wu^T] ([M, 2I])."""
    if fuse_act and _gluon_applies(c, a, precision, mutant):
        _launch_gluon(a, wg, wu, None, out, c, gate_up=True, round_out=round_out)
        return out
    if c.persistent and fuse_act:
        _launch_persistent(a, wg, wu, None, out, c, precision, gate_up=True, round_out=round_out,
                           mutant=mutant)
        return out
    M, Kd = a.shape
    N = wg.shape[0]
    if c.use_tma or c.persistent:
        a_arg = _descriptor(a, [c.BM, c.BK])
        g_arg, u_arg = _descriptor(wg, [c.BN, c.BK]), _descriptor(wu, [c.BN, c.BK])
    else:
        a_arg, g_arg, u_arg = a, wg, wu
    grid = (triton.cdiv(M, c.BM) * triton.cdiv(N, c.BN),)
    _launch(K.gate_up_kernel, grid, a_arg, g_arg, u_arg, out, M, N, Kd, a.stride(0), wg.stride(0),
            out.stride(0), BM=c.BM, BN=c.BN, BK=c.BK, GROUP_M=c.GROUP_M, EVEN_K=_even(Kd, c.BK),
            PREC=precision, USE_TMA=c.use_tma or c.persistent, ROUND_B=c.round_b and precision == "tf32",
            FUSE_ACT=fuse_act,
            ROUND_OUT=round_out, MUT_SILU_ON_UP=mutant == "silu_on_up",
            num_warps=c.num_warps, num_stages=c.num_stages)
    return out


def launch_swiglu(gu: torch.Tensor, out: torch.Tensor, plan: Plan, mutant: str | None = None) -> torch.Tensor:
    M, N = out.shape
    bm, bn = 32, 64
    _launch(K.swiglu_kernel, (triton.cdiv(M, bm), triton.cdiv(N, bn)), gu, out, M, N, gu.stride(0),
            out.stride(0), BM=bm, BN=bn, ROUND_OUT=plan.round_act, MUT_SILU_ON_UP=mutant == "silu_on_up",
            num_warps=4)
    return out


# --------------------------------------------------------------------------- the layer
def _prepare(inputs: Sequence[Any]):
    sh = _shape_of(inputs)
    x = inputs[0]
    if x.device.type == "cpu" and not _interpreting():
        raise ValueError(f"{NAME} (fast): inputs are on the CPU but Triton is not in interpreter mode; "
                         "set TRITON_INTERPRET=1 before triton is imported, or pass CUDA tensors")
    tensors = [t.contiguous() for t in inputs[:-1]]
    eps = float(inputs[-1])
    return sh, tensors, eps


# Calls of at most this many tokens are replayed from CUDA graphs (fuseval.fast._graphs):
# at 128 tokens the host needs about 0.6 ms to issue the launches of 0.4 ms of kernels.
# Up to 512 tokens a graph's private intermediates take under 60 MB.
GRAPH_MAX_TOKENS = 512
GRAPHS = GraphCache(capacity=4)


def _run(inputs: Sequence[Any], *, precision: str = "tf32", attention_precision: str | None = None,
         mutant: str | None = None, tuning: Mapping[str, Any] | None = None,
         mrope_layout: str = "sol") -> tuple[torch.Tensor]:
    """The fused production pipeline (7 launches; small calls replayed from a CUDA graph)."""
    sh, t, eps = _prepare(inputs)
    plan = plan_for(sh, t[0].device, precision, attention_precision, tuning, mrope_layout)
    launch = functools.partial(_launch_layer, sh, t, eps, plan, mutant)
    if sh.M > GRAPH_MAX_TOKENS or _interpreting():
        return launch()
    return GRAPHS((tensor_key(t), eps, plan, mutant), t[0].device, launch)


def _launch_layer(sh: Shape, t: Sequence[torch.Tensor], eps: float, plan: Plan,
                  mutant: str | None) -> tuple[torch.Tensor]:
    (x, w_in, wq, bq, wk, bk, wv, bv, wo, cos, sin, w_post, wg, wu, wd) = t
    dev = x.device
    precision = plan.precision
    M, H = sh.M, sh.H
    x2 = x.view(M, H)
    new = functools.partial(torch.empty, device=dev, dtype=torch.float32)

    h = launch_norm(x2, w_in, new(M, H), eps, plan, mutant)
    qk = new(M, sh.QD + sh.KD)
    vt = new(sh.B, sh.Hkv, sh.D, sh.S_pad)
    launch_qkv(h, (wq, bq, wk, bk, wv, bv), cos, sin, sh, plan, qk, vt, fused=True, mutant=mutant)
    attn = launch_attention(qk, vt, new(M, sh.QD), sh, plan, mutant)
    del qk, vt
    x1 = launch_residual_gemm(attn, wo, None if mutant == "missing_residual" else x2, new(M, H),
                              plan.o_proj, precision)
    del attn
    h2 = launch_norm(x1, w_post, h, eps, plan, mutant)          # reuses h's buffer
    act = launch_gate_up(h2, wg, wu, new(M, sh.I), plan.gate_up, precision, fuse_act=True,
                         round_out=plan.round_act, mutant=mutant)
    out = launch_residual_gemm(act, wd, None if mutant == "missing_final_residual" else x1, new(M, H),
                               plan.down, precision)
    return (out.view(sh.B, sh.S, H),)


def _run_staged(inputs: Sequence[Any], *, taps: MutableMapping[str, torch.Tensor] | None = None,
                override: Mapping[str, torch.Tensor] | None = None, precision: str = "tf32",
                attention_precision: str | None = None, mutant: str | None = None,
                tuning: Mapping[str, Any] | None = None, mrope_layout: str = "sol") -> tuple[torch.Tensor]:
    """Stage by stage with the same kernels; taps in the reference's layouts ([B, S, ...])."""
    sh, t, eps = _prepare(inputs)
    (x, w_in, wq, bq, wk, bk, wv, bv, wo, cos, sin, w_post, wg, wu, wd) = t
    dev = x.device
    plan = plan_for(sh, dev, precision, attention_precision, tuning, mrope_layout)
    M, H, B, S = sh.M, sh.H, sh.B, sh.S
    x2 = x.view(M, H)
    new = functools.partial(torch.empty, device=dev, dtype=torch.float32)
    override = dict(override or {})
    unknown = set(override) - {s for s in STAGES}
    if unknown:
        raise ValueError(f"{NAME} (fast): override names unknown stages {sorted(unknown)}; "
                         f"stages: {', '.join(STAGES)}")

    def stage(name: str, cols: int, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        if name in override:
            value = override[name]
            if value.numel() != M * cols:
                raise ValueError(f"{NAME} (fast): override[{name!r}] must have {M * cols} elements "
                                 f"([{B}, {S}, {cols}]), got shape {tuple(value.shape)}")
            value = value.detach().to(device=dev, dtype=torch.float32).reshape(M, cols).contiguous()
        else:
            value = compute()
        if taps is not None:
            taps[name] = value.view(B, S, cols)
        return value

    QD, KD, I = sh.QD, sh.KD, sh.I
    h = stage("input_norm", H, lambda: launch_norm(x2, w_in, new(M, H), eps, plan, mutant))

    def qkv_plain():
        out = new(M, QD + 2 * KD)
        launch_qkv(h, (wq, bq, wk, bk, wv, bv), cos, sin, sh, plan, out, None, fused=False, mutant=mutant)
        return out
    qkv = stage("qkv_proj", QD + 2 * KD, qkv_plain)
    qk = stage("mrope", QD + KD, lambda: launch_mrope(qkv, cos, sin, sh, new(M, QD + KD), plan, mutant))
    vt = torch.zeros(B, sh.Hkv, sh.D, sh.S_pad, device=dev, dtype=torch.float32)
    v = qkv[:, QD + KD:]
    vt[..., :S] = (round_tf32(v) if plan.round_attn else v).view(B, S, sh.Hkv, sh.D).permute(0, 2, 3, 1)
    attn = stage("attention", QD, lambda: launch_attention(qk, vt, new(M, QD), sh, plan, mutant))
    x1 = stage("o_proj", H, lambda: launch_residual_gemm(
        attn, wo, None if mutant == "missing_residual" else x2, new(M, H), plan.o_proj, precision))
    h2 = stage("post_norm", H, lambda: launch_norm(x1, w_post, new(M, H), eps, plan, mutant))
    gu = stage("gate_up", 2 * I, lambda: launch_gate_up(h2, wg, wu, new(M, 2 * I), plan.gate_up, precision,
                                                       fuse_act=False, mutant=mutant))
    act = stage("act", I, lambda: launch_swiglu(gu, new(M, I), plan, mutant))
    m = stage("down", H, lambda: launch_residual_gemm(act, wd, None, new(M, H), plan.down, precision))
    out = stage("residual", H, lambda: m.clone() if mutant == "missing_final_residual" else x1 + m)
    return (out.view(B, S, H),)


def round_tf32(t: torch.Tensor) -> torch.Tensor:
    """torch twin of the kernels' _round_tf32 (nearest TF32 value, ties away from zero)."""
    bits = t.contiguous().view(torch.int32)
    return ((bits + 0x1000) & -8192).view(torch.float32)


STAGES = ("input_norm", "qkv_proj", "mrope", "attention", "o_proj", "post_norm", "gate_up", "act",
          "down", "residual")


def variant(mutant: str | None = None, *, precision: str = "tf32", attention_precision: str | None = None,
            tuning: Mapping[str, Any] | None = None, mrope_layout: str = "sol") -> Callable[..., tuple[torch.Tensor]]:
    """A forward with a fixed policy (and optionally a planted bug), carrying ``.staged``.
    ``mrope_layout="hf"``: ``forward_hf_mrope``'s layout."""
    if mrope_layout not in MROPE_LAYOUTS:
        raise ValueError(f"{NAME} (fast): mrope_layout must be one of {MROPE_LAYOUTS}, got {mrope_layout!r}")
    if mutant is not None and mutant not in MUTANTS:
        raise ValueError(f"{NAME} (fast): mutant must be one of {MUTANTS} or None, got {mutant!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"{NAME} (fast): precision must be one of {PRECISIONS}, got {precision!r}")
    opts = dict(precision=precision, attention_precision=attention_precision, mutant=mutant, tuning=tuning,
                mrope_layout=mrope_layout)

    def fn(*inputs):
        return _run(inputs, **opts)

    def staged(*inputs, taps=None, override=None):
        return _run_staged(inputs, taps=taps, override=override, **opts)

    fn.staged = staged
    tags = [precision] + (["hf_mrope"] if mrope_layout == "hf" else []) + ([mutant] if mutant else [])
    fn.__name__ = fn.__qualname__ = f"forward[{', '.join(tags)}]"
    return fn


def forward(hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias, k_proj_weight,
            k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight, rope_cos, rope_sin,
            post_attention_layernorm_weight, gate_proj_weight, up_proj_weight, down_proj_weight,
            rms_norm_eps, *, precision: str = "tf32", attention_precision: str | None = None):
    """The fused Triton decoder layer with the benchmark's mRoPE layout (SOL-ExecBench
    L2/019); returns ``(output,)`` float32 [B, S, H]."""
    return _run((hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias, k_proj_weight,
                 k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight, rope_cos, rope_sin,
                 post_attention_layernorm_weight, gate_proj_weight, up_proj_weight, down_proj_weight,
                 rms_norm_eps), precision=precision, attention_precision=attention_precision)


def forward_staged(*inputs, taps: MutableMapping[str, torch.Tensor] | None = None,
                   override: Mapping[str, torch.Tensor] | None = None, precision: str = "tf32",
                   attention_precision: str | None = None):
    """Stage-tap protocol: same outputs as ``forward`` (same kernels, stage boundaries
    materialised), every SPEC stage stored in ``taps``, ``override`` replaces a stage.

    Taps hold the values as the kernels store them: under "tf32" the stages that only feed
    tensor-core products (input_norm, mrope, attention, post_norm, act) are TF32-rounded;
    qkv_proj, gate_up, o_proj, down and residual are plain fp32 accumulations."""
    return _run_staged(inputs, taps=taps, override=override, precision=precision,
                       attention_precision=attention_precision)


forward.staged = forward_staged


def forward_hf_mrope(hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias, k_proj_weight,
                     k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight, rope_cos, rope_sin,
                     post_attention_layernorm_weight, gate_proj_weight, up_proj_weight, down_proj_weight,
                     rms_norm_eps, *, precision: str = "tf32", attention_precision: str | None = None):
    """``forward`` with HF Qwen2-VL's mRoPE layout (the operator's "hf_mrope" variant): the
    section (D/8, 3D/16, 3D/16) from axes t, h, w, repeated for the two rotate_half halves."""
    return _run((hidden_states, input_layernorm_weight, q_proj_weight, q_proj_bias, k_proj_weight,
                 k_proj_bias, v_proj_weight, v_proj_bias, o_proj_weight, rope_cos, rope_sin,
                 post_attention_layernorm_weight, gate_proj_weight, up_proj_weight, down_proj_weight,
                 rms_norm_eps), precision=precision, attention_precision=attention_precision, mrope_layout="hf")


def forward_hf_mrope_staged(*inputs, taps: MutableMapping[str, torch.Tensor] | None = None,
                            override: Mapping[str, torch.Tensor] | None = None, precision: str = "tf32",
                            attention_precision: str | None = None):
    """The stage-tap protocol of ``forward_hf_mrope`` (see ``forward_staged``)."""
    return _run_staged(inputs, taps=taps, override=override, precision=precision,
                       attention_precision=attention_precision, mrope_layout="hf")


forward_hf_mrope.staged = forward_hf_mrope_staged
