"""Launch plans of op A's fast path: the call's shape, the tile of each kernel and the
precision policy, chosen from tile tables.

Tables are data (:class:`Tables`): the H200 tables below are the ones in force unless a
caller passes others (``fast.variant(tables=...)``, ``fast.with_tables(...)``), and
``Tables.to_json`` / ``Tables.from_json`` write and read them, so that a benchmark can
time a table it measured and ``fuseval bench`` can record the one it timed.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import torch

NAME = "qwen2vl_decoder_layer"

# Precision policies (see fast.py): what the tensor cores read and how intermediates are stored
PRECISIONS = ("tf32", "fp16", "tf32x3", "ieee")
# cos/sin chunk layouts: "sol" the benchmark's (forward), "hf" HF Qwen2-VL's (forward_hf_mrope)
MROPE_LAYOUTS = ("sol", "hf")


@dataclass(frozen=True)
class Shape:
    """The axes of one call (read off the inputs by ``fast.shape_of``)."""
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
    round_b: bool = False          # "tf32": round the weight tiles to TF32 in the kernel (_round_tf32)
    GROUP_M: int = 8
    split_k: int = 1               # residual GEMMs: K slices summed by a second kernel (small M)
    gluon: bool = False            # sm_90, "tf32": the warp-specialized Gluon kernel (_gluon.py)
    weights_as_a: bool = False     # "fp16", residual and gate/up GEMMs: the weights as the tensor cores'
                                   # A operand (gemm_weights_as_a_kernel; BN weight rows x BM tokens; TMA)


@dataclass(frozen=True)
class AttnConfig:
    BM: int
    BN: int
    num_warps: int
    num_stages: int
    use_tma: bool = False          # K and V tiles fetched by TMA descriptors
    gluon: bool = False            # sm_90, "tf32": the Gluon kernel (_gluon.py), products overlapped
                                   # with the softmax


_KINDS = ("qkv", "o_proj", "gate_up", "down")


@dataclass(frozen=True)
class Tables:
    """Tile tables: ``gemm[kind][tokens]`` for kind in qkv, o_proj, gate_up, down (qkv
    entries are (heads per tile, config)), ``attention[seq_len]``; a call takes the
    entry of the nearest size (log scale)."""
    gemm: Mapping[str, Mapping[int, Any]]
    attention: Mapping[int, AttnConfig]
    source: str = "fuseval"
    # "fp16" tables: calls of at least this many tokens convert the weights to fp16 once
    # per call (``Plan.fp16_weights``); their GEMM rows are the sizes >= it, the calls
    # below take the rows below it. None: never.
    fp16_weights_from: int | None = None

    def __post_init__(self):
        missing = [k for k in _KINDS if not self.gemm.get(k)]
        if missing or not self.attention:
            raise ValueError(f"{NAME} (fast): a tile table needs rows for {list(_KINDS)} and attention; "
                             f"{self.source} lacks {missing or ['attention']}")

    def to_json(self) -> dict[str, Any]:
        """{kind: {size: {"config": {...}[, "heads_per_tile": n]}}, "attention": {...}}."""
        out: dict[str, Any] = {}
        for kind, rows in self.gemm.items():
            out[kind] = {}
            for size, entry in sorted(rows.items()):
                if kind == "qkv":
                    out[kind][str(size)] = {"heads_per_tile": entry[0], "config": asdict(entry[1])}
                else:
                    out[kind][str(size)] = {"config": asdict(entry)}
        out["attention"] = {str(s): {"config": asdict(c)} for s, c in sorted(self.attention.items())}
        if self.fp16_weights_from is not None:
            out["fp16_weights_from"] = self.fp16_weights_from
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], source: str = "a JSON table") -> "Tables":
        """The inverse of ``to_json`` (sizes are token counts; for "attention" sequence lengths)."""
        unknown = set(raw) - set(_KINDS) - {"attention", "fp16_weights_from"}
        if unknown:
            raise ValueError(f"{NAME} (fast): {source} has unknown kinds {sorted(unknown)}; "
                             f"expected {list(_KINDS) + ['attention', 'fp16_weights_from']}")
        gemm: dict[str, dict[int, Any]] = {}
        for kind in _KINDS:
            gemm[kind] = {}
            for size, entry in raw.get(kind, {}).items():
                cfg = GemmConfig(**entry["config"])
                gemm[kind][int(size)] = (int(entry["heads_per_tile"]), cfg) if kind == "qkv" else cfg
        attention = {int(s): AttnConfig(**e["config"]) for s, e in raw.get("attention", {}).items()}
        start = raw.get("fp16_weights_from")
        return cls(gemm, attention, source, None if start is None else int(start))

    def gemm_rows(self, kind: str, fp16_weights: bool) -> Mapping[int, Any]:
        """The rows of ``kind`` for calls with fp16 weights (sizes >= fp16_weights_from)
        or with fp32 weights (the sizes below; all of them when fp16_weights_from is None)."""
        rows = self.gemm[kind]
        start = self.fp16_weights_from
        if start is None:
            return rows
        chosen = {m: e for m, e in rows.items() if (m >= start) == fp16_weights}
        if not chosen:
            raise ValueError(f"{NAME} (fast): {self.source} has no {kind} rows "
                             f"{'at or above' if fp16_weights else 'below'} fp16_weights_from={start}")
        return chosen


G = GemmConfig
# Explored on one H200 (benchmarks/qwen2vl_breakdown.py --phases explore, which writes this
# table as gpu_table.json; figures: docs/design/qwen2vl_decoder_layer.md#gemm-kernels-and-the-tile-table):
# the fastest tile of each kernel at M = 128, 512, 1024, 2048, 3072, 4096 and 8192 tokens.
# Small M needs small tiles to occupy the 132 SMs (and split-K for the 18944-long K of the
# down projection at 128 tokens); large M wants 128 x 256 tiles with TMA. ``gluon=True``
# rows run the warp-specialized Gluon kernel (_gluon.py): it wins for the residual GEMMs
# from 1024-2048 tokens up, while the Triton persistent kernel stays ahead for gate/up above
# 1024. QKV entries are (heads per tile, config): the tile is BM tokens x heads * head_dim.
_TF32_GEMM: dict[str, dict[int, Any]] = {
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
# Attention by seq_len. The Gluon kernel where it was faster than Triton's: 64 x 32 tiles
# at 64 x 128 tokens, 64 x 64 tiles with one K/V slot (two programs per SM) from 1571
# tokens (figures: docs/design/qwen2vl_decoder_layer.md#25-attention).
_TF32_ATTENTION = {128: AttnConfig(64, 32, 4, 2, gluon=True), 373: AttnConfig(64, 32, 4, 2, True),
                   1571: AttnConfig(64, 64, 4, 1, gluon=True), 8192: AttnConfig(64, 64, 4, 1, gluon=True)}
TF32_TABLES = Tables(_TF32_GEMM, _TF32_ATTENTION, "H200 TF32 table (fuseval)")

# The "fp16" policy (why, with the figures: docs/design/qwen2vl_decoder_layer.md#the-fp16-policy-the-default
# and sections 2.7-2.8 there). From ``fp16_weights_from`` = 512 tokens up, the call first
# converts every GEMM weight to fp16 (one pass over 1.4 GB of traffic), and the GEMMs then
# run fp16 x fp16 tiles from shared memory, well above the TF32 rate that converting inside
# the GEMMs reaches. The rows from 512 up are the fastest tiles per size of that section's
# exploration (t: TMA tiles; persistent, with Triton's warp specialization where it won).
# Below 512 tokens the conversion would cost more than the GEMMs, so those calls convert
# fp32 weight tiles in registers with the weights as the tensor cores' register A operand
# (``weights_as_a``, BM tokens x BN weight rows; faster than converting them into the B
# operand), split-K for 128 tokens. Attention: the best tiles of the policies exploration
# (128 x 64 tiles and three K/V stages at 8192 tokens).
_FP16_GEMM: dict[str, dict[int, Any]] = {
    "qkv": {128: (1, G(64, 0, 64, 4, 3)), 512: (2, G(128, 0, 64, 8, 4, True)),
            **{m: (1, G(128, 0, 64, 8, 4, True)) for m in (1024, 2048, 4096)},
            8192: (2, G(128, 0, 64, 8, 3, True))},
    "o_proj": {128: G(128, 128, 64, 8, 3, split_k=4, weights_as_a=True),
               512: G(128, 128, 64, 8, 4, True, True, True), 1024: G(128, 256, 64, 8, 4, True),
               2048: G(128, 256, 64, 8, 3, True, True, True), 4096: G(128, 256, 64, 8, 3, True, True, True),
               8192: G(128, 256, 64, 8, 3, True, True)},
    "gate_up": {128: G(128, 128, 32, 8, 4, GROUP_M=16, weights_as_a=True),
                512: G(128, 128, 64, 8, 3, True, GROUP_M=16), 1024: G(128, 128, 64, 8, 4, True, GROUP_M=16),
                2048: G(128, 128, 64, 8, 4, True, GROUP_M=16), 4096: G(128, 128, 64, 8, 3, True, GROUP_M=16),
                8192: G(128, 128, 64, 8, 3, True, GROUP_M=16)},
    "down": {128: G(128, 128, 64, 8, 3, split_k=4, weights_as_a=True),
             512: G(128, 128, 64, 8, 4, True, True, True), 1024: G(128, 256, 64, 8, 4, True),
             2048: G(128, 256, 64, 8, 3, True, True), 4096: G(128, 128, 64, 8, 4, True, True, True),
             8192: G(128, 256, 64, 8, 3, True, True)},
}
_FP16_ATTENTION = {128: AttnConfig(64, 64, 4, 2, True), 1024: AttnConfig(128, 64, 8, 3, True),
                   8192: AttnConfig(128, 64, 8, 3, True)}
FP16_TABLES = Tables(_FP16_GEMM, _FP16_ATTENTION, "H200 fp16 table (fuseval, partly explored)",
                     fp16_weights_from=512)

# Policies "tf32x3" and "ieee" need more shared memory per stage (tf32x3 splits operands)
# or run on CUDA cores (ieee): modest tiles that fit.
GPU_SAFE = dict(qkv=G(64, 64, 32, 4, 2), qkv_heads_per_tile=1, o_proj=G(64, 128, 32, 4, 2),
                gate_up=G(64, 64, 32, 4, 2), down=G(64, 128, 32, 4, 2),
                attention=AttnConfig(64, 32, 4, 1))
del G


def _half_pow2(n: int, lo: int, hi: int) -> int:
    """The power of two covering half of ``n``, clamped to [lo, hi]."""
    p = lo
    while p < hi and p < (n + 1) // 2:
        p *= 2
    return p


def cpu_entries(sh: Shape) -> dict:
    """Tiles under the Triton interpreter, where CPU time goes per program and per op, not
    per element: row tiles of half the rows (32 to 256), so that every call of more than
    32 rows still runs at least two row tiles (tile offsets and masks are exercised) in
    as few programs as that allows; 32-wide column and K tiles (two or more of each at
    the small configurations' widths)."""
    gemm = GemmConfig(_half_pow2(sh.M, 32, 256), 32, 32, 4, 1)
    rows = sh.S * sh.G                  # attention rows: (token, head) pairs of one kv head
    return dict(qkv=gemm, qkv_heads_per_tile=2, o_proj=gemm, gate_up=gemm, down=gemm,
                attention=AttnConfig(_half_pow2(rows, 32, 256), _half_pow2(sh.S, 16, 128), 4, 1),
                norm_rows=_half_pow2(sh.M, 16, 256), norm_warps=4)


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
    fp16_weights: bool = False     # "fp16": every GEMM weight converted to fp16 by one pass per call

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

    @property
    def act_dtype(self) -> torch.dtype:
        """Storage of the activations that feed the GEMMs (h, h2, attention output, act)."""
        return torch.float16 if self.precision == "fp16" else torch.float32

    @property
    def qkv_dtype(self) -> torch.dtype:
        """Storage of q', k' and V^T (they feed the attention's products only)."""
        return torch.float16 if self.attention_precision == "fp16" else torch.float32

    @property
    def uses_fp16(self) -> bool:
        """Whether some operand is converted to fp16 (then out-of-range values are watched)."""
        return "fp16" in (self.precision, self.attention_precision)

    def to_json(self) -> dict[str, Any]:
        return {k: (asdict(v) if isinstance(v, (GemmConfig, AttnConfig)) else v)
                for k, v in asdict(self).items()}


def nearest(table: Mapping[int, Any], size: int) -> Any:
    return table[min(table, key=lambda k: abs(math.log(k / max(size, 1))))]


def heads_per_tile(sh: Shape, want: int) -> int:
    """Largest power of two <= want dividing both head counts (tiles never straddle q/k/v)."""
    hpt = 1
    while hpt * 2 <= want and sh.Hq % (hpt * 2) == 0 and sh.Hkv % (hpt * 2) == 0:
        hpt *= 2
    return hpt


def check_choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{NAME} (fast): {name} must be one of {allowed}, got {value!r}")


def default_tables(precision: str) -> Tables:
    return FP16_TABLES if precision == "fp16" else TF32_TABLES


@dataclass
class TablesInForce:
    """The tables a call uses when it names none: per policy, replaceable by ``fast.with_tables``."""
    by_policy: dict[str, Tables] = field(default_factory=dict)

    def get(self, precision: str) -> Tables:
        return self.by_policy.get(precision) or default_tables(precision)


IN_FORCE = TablesInForce()


def plan_for(sh: Shape, device: torch.device, precision: str = "tf32", attention_precision: str | None = None,
             tuning: Mapping[str, Any] | None = None, mrope_layout: str = "sol", *,
             tables: Tables | None = None, compiled: bool = True) -> Plan:
    """Tile shapes for one call. ``tables``: the tile tables (default: those in force for
    the policy); ``tuning`` overrides single entries ({"o_proj": GemmConfig, ...,
    "qkv_heads_per_tile": int}). ``compiled``: False under the Triton interpreter (then
    small CPU tiles). ``mrope_layout`` is part of the plan, so CUDA graphs of the two
    layouts never mix."""
    check_choice("mrope_layout", mrope_layout, MROPE_LAYOUTS)
    check_choice("precision", precision, PRECISIONS)
    attention_precision = attention_precision or precision
    check_choice("attention_precision", attention_precision, PRECISIONS)
    if device.type == "cuda" and compiled:
        plan = _gpu_entries(sh, precision, attention_precision, tables)
    else:
        plan = cpu_entries(sh)
    plan.update(tuning or {})
    if plan.get("fp16_weights") and precision != "fp16":
        raise ValueError(f"{NAME} (fast): fp16_weights needs precision 'fp16', got {precision!r}")
    plan["qkv_heads_per_tile"] = heads_per_tile(sh, plan["qkv_heads_per_tile"])
    return Plan(precision=precision, attention_precision=attention_precision, mrope_layout=mrope_layout, **plan)


def _gpu_entries(sh: Shape, precision: str, attention_precision: str, tables: Tables | None) -> dict:
    gemm_tables = tables or IN_FORCE.get(precision)
    attention_tables = tables or IN_FORCE.get(attention_precision)
    M = sh.M
    start = gemm_tables.fp16_weights_from
    fp16_weights = precision == "fp16" and start is not None and M >= start
    row = lambda kind: nearest(gemm_tables.gemm_rows(kind, fp16_weights), M)
    hpt, qkv = row("qkv")
    plan = dict(qkv=qkv, qkv_heads_per_tile=hpt, o_proj=row("o_proj"), gate_up=row("gate_up"), down=row("down"),
                attention=nearest(attention_tables.attention, sh.S), norm_rows=1,
                norm_warps=8 if sh.H >= 2048 else 4, fp16_weights=fp16_weights)
    if precision in ("tf32x3", "ieee"):
        plan.update({k: v for k, v in GPU_SAFE.items() if k != "attention"})
    if attention_precision in ("tf32x3", "ieee"):
        plan["attention"] = GPU_SAFE["attention"]
    return plan


@functools.lru_cache(maxsize=None)
def sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
