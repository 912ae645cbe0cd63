"""Op B's GEMM launcher: tile configurations, the tile table, launch plans and one launch.

A call goes through three steps: **check** (``plan``: the inputs' axes by ``bind_axes``,
the tile configuration for their token count, the kernel's constexprs and grid, computed
once per distinct input signature and cached), **allocate** (the outputs), **launch**
(the Gluon kernel on Hopper where it applies, else the Triton kernel of ``_kernels.py``).

Where the tiles come from: ``config`` of :func:`gemm` is a :class:`KernelConfig`, a dict of
its fields, a label such as ``'256,64,8,4,a,g'`` or a whole tile table (``[(max_tokens,
config), ...]`` or ``[{"max_tokens": n | None, "config": {...}}, ...]``); None takes the
table in force: :data:`H200_TABLE` on CUDA, small tiles in the interpreter. The fast
module's ``options()`` reports these tables; nothing is read from the environment.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Sequence

import torch
from ... import fast as _kernel_runtime  # noqa: F401  (before triton: selects the interpreter on CPU-only machines)
import triton

from .. import load
from . import _kernels as K
from ._quant import DEFAULT_QUANT_CONFIG, QuantConfig, quantize_rows
from ...validate import bind_axes

NAME = "nvfp4_qkv_rope"
UNBOUNDED = 1 << 62            # max_tokens of a table's last row


@dataclass(frozen=True)
class KernelConfig:
    """Tile shape and launch parameters of the fused GEMM (the N tile is one head, or two).

    ``w_as_a``: compute acc^T = W x^T (the weights as the dot's first operand);
    ``heads_per_tile`` 2: one N tile spans two heads; ``gluon``: on Hopper, the Gluon kernel
    (``_gluon.py``) where it applies, with ``num_stages`` x-tile slots; ``predecode``: the
    weights decoded once per call into a bf16 copy that the GEMM reads as a dense operand
    (by TMA in the Gluon kernel), instead of being decoded in every K step of every tile."""
    block_m: int
    block_k: int
    num_warps: int = 8
    num_stages: int = 3
    w_as_a: bool = False
    heads_per_tile: int = 1
    gluon: bool = False
    predecode: bool = False

    _FLAGS = {"a": "w_as_a", "g": "gluon", "p": "predecode"}

    def __post_init__(self):
        if self.block_k % 16 or self.block_k < 16 or self.block_m < 16:
            raise ValueError(f"kernel config: block_k must be a multiple of 16 and block_m >= 16, "
                             f"got block_m={self.block_m}, block_k={self.block_k}")
        if self.heads_per_tile not in (1, 2):
            raise ValueError(f"kernel config: heads_per_tile must be 1 or 2, got {self.heads_per_tile}")

    @classmethod
    def parse(cls, text: str) -> "KernelConfig":
        """A config from its label 'BM,BK,WARPS,STAGES[,a][,h2][,g][,p]' (``a``: W as the A
        operand; ``h2``: two heads per tile; ``g``: the Gluon kernel; ``p``: predecoded
        weights), e.g. '128,64,8,3,a' or '256,64,8,4,a,g,p'."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        flags = parts[4:]
        known = set(cls._FLAGS) | {"h1", "h2"}
        if len(parts) < 4 or any(f not in known for f in flags) or len(set(flags)) != len(flags) \
                or not all(p.isdigit() for p in parts[:4]):
            raise ValueError(f"kernel config must be 'BM,BK,WARPS,STAGES[,a][,h2][,g][,p]', got {text!r}")
        return cls(int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]),
                   heads_per_tile=2 if "h2" in flags else 1,
                   **{attr: flag in flags for flag, attr in cls._FLAGS.items()})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KernelConfig":
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"kernel config: unknown field(s) {unknown}; fields: {sorted(names)}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    def label(self) -> str:
        flags = [f for f, attr in self._FLAGS.items() if getattr(self, attr)]
        if self.heads_per_tile == 2:
            flags.insert(1 if self.w_as_a else 0, "h2")
        return ",".join([str(self.block_m), str(self.block_k), str(self.num_warps), str(self.num_stages)] + flags)


TileTable = tuple[tuple[int, KernelConfig], ...]     # ((max_tokens, config), ...), ascending

# The tile table on CUDA (explored on an H200), by the number of tokens M = B*S: the Gluon
# kernel on weights predecoded once per call (bf16, by TMA), transposed (tokens as the
# wgmma's N). 128-token tiles where 256-token ones would leave most SMs idle (48 programs
# at 256 tokens) or run 1.45 waves (1024 tokens); 256-token tiles elsewhere (fewer re-reads
# of the weights per FLOP). Why, with the figures (also against the in-loop FP4 decode
# '256,64,8,4,a,g' it replaced): docs/design/nvfp4_qkv_rope.md#three-launches-per-call, 2.1.
_DENSE_128 = KernelConfig(128, 64, 8, 6, w_as_a=True, gluon=True, predecode=True)
_DENSE_256 = KernelConfig(256, 64, 8, 4, w_as_a=True, gluon=True, predecode=True)
H200_TABLE: TileTable = (
    (256, _DENSE_128),
    (512, _DENSE_256),
    (1024, _DENSE_128),
    (UNBOUNDED, _DENSE_256),
)
# Where a Gluon config cannot run (not sm_90, head_dim != 128, a mutant or a stage tap),
# the Triton kernel takes this config of the same tile height instead.
TRITON_FOR_GLUON = {128: KernelConfig(128, 64, 4, 4, True), 256: KernelConfig(256, 64, 8, 3, True)}


def as_config(value: KernelConfig | Mapping | str) -> KernelConfig:
    if isinstance(value, KernelConfig):
        return value
    if isinstance(value, str):
        return KernelConfig.parse(value)
    if isinstance(value, Mapping):
        return KernelConfig.from_dict(value)
    raise ValueError(f"{NAME}: a kernel config must be a KernelConfig, a dict of its fields or a label "
                     f"'BM,BK,WARPS,STAGES[,flags]', got {type(value).__name__}")


def as_table(config) -> TileTable | None:
    """``config`` as a tile table (None stays None: the table in force). A single config is a
    one-row table; rows are (max_tokens, config) pairs or {"max_tokens", "config"} dicts,
    max_tokens None meaning unbounded."""
    if config is None:
        return None
    if isinstance(config, (KernelConfig, str)) or (isinstance(config, Mapping) and "block_m" in config):
        return ((UNBOUNDED, as_config(config)),)
    if isinstance(config, Mapping) and "tile_table" in config:
        config = config["tile_table"]
    if not isinstance(config, Sequence) or not config:
        raise ValueError(f"{NAME}: config must be a kernel config or a non-empty tile table, got {config!r}")
    rows = []
    for row in config:
        if isinstance(row, Mapping):
            bound, cfg = row.get("max_tokens"), row.get("config")
        elif isinstance(row, Sequence) and len(row) == 2:
            bound, cfg = row
        else:
            raise ValueError(f"{NAME}: a tile table row must be (max_tokens, config) or "
                             f"{{'max_tokens', 'config'}}, got {row!r}")
        rows.append((UNBOUNDED if bound is None else int(bound), as_config(cfg)))
    return tuple(sorted(rows, key=lambda r: r[0]))


def table_to_json(table: TileTable) -> list[dict]:
    return [{"max_tokens": None if bound >= UNBOUNDED else bound, "config": cfg.to_dict()}
            for bound, cfg in table]


def _pow2_at_least(n: int, lo: int) -> int:
    p = lo
    while p < n:
        p *= 2
    return p


def interpreter_config(m: int, hidden: int) -> KernelConfig:
    """Tiles for the Triton interpreter (CPU), where time goes per program and per op, not
    per element: two heads and half the tokens per tile (16 to 256 tokens), so that every
    call of more than 16 tokens still runs at least two row tiles (the tile-offset and
    masking code is exercised) in as few programs as that allows; up to 64 columns."""
    return KernelConfig(min(256, _pow2_at_least((m + 1) // 2, 16)), min(64, _pow2_at_least(hidden, 16)), 4, 1,
                        heads_per_tile=2)


def pick_config(m: int, hidden: int, device: torch.device, table: TileTable | None = None) -> KernelConfig:
    """The tile configuration for ``m`` tokens: from ``table`` if given, else from
    :data:`H200_TABLE` on CUDA and :func:`interpreter_config` elsewhere."""
    if table is None:
        if device.type != "cuda":
            return interpreter_config(m, hidden)
        table = H200_TABLE
    for max_m, cfg in table:
        if m <= max_m:
            return cfg
    return table[-1][1]


# --------------------------------------------------------------------------- launch plans
# Small cases run in tens of microseconds, so the host side matters: everything that
# depends only on the inputs' shapes, dtypes, devices and layout is computed once per
# distinct signature and cached; a call then only checks alignment, allocates and launches.
@dataclass(frozen=True)
class Plan:
    b: int
    s: int
    hq: int
    hkv: int
    d: int
    m: int
    hidden: int
    grid: tuple
    consts: dict                          # the Triton kernel's constexprs
    contiguous: bool
    predecode: bool                       # decode the weights to bf16 first
    gluon: KernelConfig | None = None     # set: launch the Gluon kernel with this config


_DEFN = None
_PLANS: dict[tuple, Plan] = {}


def bind(inputs, check_values: bool) -> dict[str, int]:
    """Axis binding of ``inputs``; ValueError naming the input on any mismatch."""
    global _DEFN
    if _DEFN is None:
        _DEFN = load(NAME)
    return bind_axes(_DEFN, inputs, check_values=check_values)


def _signature(inputs) -> tuple:
    return tuple((t.shape, t.dtype, t.get_device(), t.is_contiguous()) if isinstance(t, torch.Tensor)
                 else type(t) for t in inputs)


def _gluon_applies(cfg: KernelConfig, dev: torch.device, mode: int, mutant: int, dense: bool,
                   d: int, hidden: int) -> bool:
    """The Gluon kernel: production calls on Hopper, head_dim 128, whole 64-wide K steps."""
    return (cfg.gluon and dev.type == "cuda" and mode == K.MODE_FULL and mutant == 0 and not dense
            and d == 128 and hidden % 64 == 0 and cfg.block_k == 64 and cfg.num_warps == 8
            and cfg.num_stages >= (2 if cfg.predecode else 4) and cfg.block_m in (128, 256)
            and torch.cuda.get_device_capability(dev)[0] == 9)


def plan(inputs, mode: int, table: TileTable | None, mutant: int, dense: bool, check_values: bool) -> Plan:
    """The launch plan of ``inputs`` (validated: shapes, dtypes, devices, and values with
    ``check_values``). ``dense``: a dense (overridden) weight replaces the FP4 one."""
    key = (_signature(inputs), mode, table, mutant, dense)
    cached = _PLANS.get(key)
    if cached is not None and not check_values:
        return cached
    bound = bind(inputs, check_values)
    b, s, hidden = bound["batch_size"], bound["seq_len"], bound["hidden_size"]
    hq, hkv, d = bound["num_attention_heads"], bound["num_key_value_heads"], bound["head_dim"]
    m, nt = b * s, hq + 2 * hkv
    dev = inputs[0].device
    cfg = pick_config(m, hidden, dev, table)
    interp = dev.type != "cuda"
    gluon = _gluon_applies(cfg, dev, mode, mutant, dense, d, hidden)
    gluon_cfg = cfg if gluon else None
    if cfg.gluon and not gluon:
        fallback = TRITON_FOR_GLUON.get(cfg.block_m, KernelConfig(cfg.block_m, cfg.block_k, 4, 3, True))
        cfg = KernelConfig(**{**fallback.to_dict(), "predecode": cfg.predecode})
    # predecoding needs whole blocks of rows and columns (see _predecode_kernel)
    predecode = cfg.predecode and not dense and mutant == 0 and hidden % 16 == 0
    # two heads per tile only where no tile would straddle projections (even head counts)
    hpt = 2 if cfg.heads_per_tile == 2 and hq % 2 == 0 and hkv % 2 == 0 else 1
    w_dense = dense or predecode
    # int32 scale words: compiled path only (the interpreter gains nothing), whole words per tile
    scale_i32 = (not interp and hidden % 64 == 0 and cfg.block_k % 64 == 0 and mutant != K.GEMM_MUTANT_CODES[
        "scale_wrong_block"] and not w_dense)
    consts = dict(K=hidden, HQ=hq, HKV=hkv, D=d, HP=_pow2_at_least(d // 2, 8),
                  BM=cfg.block_m, BK=cfg.block_k, W_DENSE=w_dense, W_AS_A=cfg.w_as_a,
                  HPT=hpt, SCALE_I32=scale_i32, INTERP=interp, MODE=mode, MUTANT=mutant,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    contiguous = all(t.is_contiguous() for t in inputs if isinstance(t, torch.Tensor))
    result = Plan(b, s, hq, hkv, d, m, hidden, (triton.cdiv(m, cfg.block_m) * (nt // hpt),), consts,
                  contiguous, predecode, gluon_cfg)
    if len(_PLANS) > 256:
        _PLANS.clear()
    _PLANS[key] = result
    return result


def word_aligned(t: torch.Tensor) -> torch.Tensor:
    """The kernels read packed codes (and scales) as 4-byte words: a tensor that starts
    off a 16-byte boundary (a slice of a larger buffer) is copied to a fresh one."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


# --------------------------------------------------------------------------- one launch
def _scale_args(gq, gk, gv, dummy: torch.Tensor, act, scaled_dense: bool):
    """The GEMM's global scales as ((gs tensor or ``dummy``, gq, gk, gv), read the tensor?):
    the quantizer's gs vector (``act``), 1 for a dense weight that carries its own scale,
    else the weights' scales (Python floats as fp32 arguments; tensors, 0-d or one-element
    on any device, read on the device to avoid a host sync)."""
    if act is not None:
        return (act[1], 1.0, 1.0, 1.0), True
    if scaled_dense:
        return (dummy, 1.0, 1.0, 1.0), False
    if any(isinstance(g, torch.Tensor) for g in (gq, gk, gv)):
        gs_vec = torch.stack([torch.as_tensor(g).reshape(()).to(device=dummy.device, dtype=torch.float32)
                              for g in (gq, gk, gv)])
        return (gs_vec, 1.0, 1.0, 1.0), True
    return (dummy, float(gq), float(gk), float(gv)), False


def _predecode_args(wq, sq, wk, sk, wv, sv, hidden: int):
    """(word-aligned weights, the bf16 [(Hq + 2 Hkv) * D, hidden] output, BR, BK) of the
    predecode: BR rows divide both projections' row counts, BK columns divide hidden."""
    nq, nkv = wq.shape[0], wk.shape[0]
    out = torch.empty((nq + 2 * nkv, hidden), dtype=torch.bfloat16, device=wq.device)
    br = 32
    while br > 1 and (nq % br or nkv % br):
        br //= 2
    bk = 128 if hidden % 128 == 0 else 16
    return [word_aligned(t) for t in (wq, sq, wk, sk, wv, sv)], out, br, bk


def predecode_weights(wq, sq, wk, sk, wv, sv, hidden: int) -> torch.Tensor:
    """The q, k, v weights decoded to bf16 code * scale, stacked [(Hq + 2 Hkv) * D, hidden]."""
    weights, out, br, bk = _predecode_args(wq, sq, wk, sk, wv, sv, hidden)
    K._predecode_kernel[(out.shape[0] // br, hidden // bk)](
        *weights, out, NQ=wq.shape[0], NKV=wk.shape[0], K=hidden, BR=br, BK=bk, num_warps=4)
    return out


def quantize(inputs, p: Plan, quant: str, quant_config: QuantConfig = DEFAULT_QUANT_CONFIG):
    """The launches before the GEMM of a W4A4 call: x quantized (``quant`` "tensor"; "token"
    is the per-token mutant) and, where the plan predecodes and the config fuses it, the
    weights' predecode in the quantizer's first launch. Returns ((xs, scratch), the
    predecoded weights or None); ``inputs`` contiguous."""
    (x, cos, sin, wq, sq, gq, wk, sk, gk, wv, sv, gv, qn, kn, eps) = inputs
    fused = w_dense = None
    if p.predecode and quant == "tensor" and quant_config.fuse_predecode:
        weights, w_dense, br, bk = _predecode_args(wq, sq, wk, sk, wv, sv, p.hidden)
        fused = (*weights, w_dense, br, bk)
    # x is bf16 and contiguous here (validated by the plan): its int16 bits, [M, H]
    xs, scratch, _, _ = quantize_rows(x.view(p.m, -1).view(torch.int16), True, p.m, p.hidden,
                                      (gq, gk, gv), False, quant == "token", quant_config, fused)
    return (xs, scratch), w_dense          # gs = scratch[0:3]


def gemm(inputs, *, mode: int, table: TileTable | None, mutant: int = 0, check_values: bool = False,
         w_dense: torch.Tensor | None = None, quant: str | None = None,
         act: tuple[torch.Tensor, torch.Tensor] | None = None,
         quant_config: QuantConfig = DEFAULT_QUANT_CONFIG, predecoded: torch.Tensor | None = None):
    """One GEMM launch with the epilogue of ``mode`` (``_kernels.MODE_*``).

    The activation operand: ``quant`` "tensor" quantizes x first (the benchmark's W4A4;
    "token" is the per-token mutant; :func:`quantize`), ``act`` = (xs, gs) gives it ready
    (the stage taps, the bench's parts), neither uses x as it is (W4A16); gs (fp32 [3] on
    the device) then replaces the weights' global decode scales. ``w_dense`` (bf16-exact
    [N, hidden]) replaces the FP4 weights and carries its own global scale;
    ``predecoded``: the weights' predecode of these inputs, made already (where the plan
    predecodes). ``mutant``: a ``GEMM_MUTANT_CODES`` value."""
    p = plan(inputs, mode, table, mutant, w_dense is not None, check_values)
    if not p.contiguous:
        inputs = [t.contiguous() if isinstance(t, torch.Tensor) else t for t in inputs]
    (x, cos, sin, wq, sq, gq, wk, sk, gk, wv, sv, gv, qn, kn, eps) = inputs
    dev = x.device
    if mode == K.MODE_FULL:
        outs = tuple(torch.empty((p.b, h, p.s, p.d), dtype=torch.bfloat16, device=dev)
                     for h in (p.hq, p.hkv, p.hkv))
        q_out, k_out, v_out = outs
        proj, result = q_out, outs
    else:
        proj = torch.empty((p.m, (p.hq + 2 * p.hkv) * p.d), dtype=torch.float32, device=dev)
        q_out = k_out = v_out = result = proj
    if p.m == 0:
        return result
    scaled_dense = w_dense is not None
    if quant is not None:
        # the weights' predecode rides in the quantizer's first launch (the W4A4 path)
        act, predecoded = quantize(inputs, p, quant, quant_config)
    gs_args, gs_from_ptr = _scale_args(gq, gk, gv, x, act, scaled_dense)
    if act is not None:
        x = act[0]
    if p.predecode and w_dense is None:
        w_dense = predecoded if predecoded is not None else predecode_weights(wq, sq, wk, sk, wv, sv, p.hidden)
    if p.gluon is not None and x.data_ptr() % 16 == 0:
        from . import _gluon
        cfg = p.gluon
        common = dict(block_m=cfg.block_m, block_k=cfg.block_k, stages=cfg.num_stages,
                      heads_per_tile=p.consts["HPT"], num_warps=cfg.num_warps)
        if p.predecode:
            _gluon.launch_dense(x.view(p.m, -1), cos, sin, w_dense, gs_args, gs_from_ptr, qn, kn, eps,
                                result, p.m, p.s, p.hq, p.hkv, **common)
        else:
            u8 = lambda t: word_aligned(t).view(torch.uint8)     # noqa: E731
            _gluon.launch(x.view(p.m, -1), cos, sin, [u8(t) for t in (wq, wk, wv)],
                          [u8(t) for t in (sq, sk, sv)], gs_args, gs_from_ptr, qn, kn, eps,
                          result, p.m, p.s, p.hq, p.hkv, w_as_a=cfg.w_as_a, **common)
        return result
    K._nvfp4_qkv_rope_kernel[p.grid](
        x, cos, sin,
        word_aligned(wq), word_aligned(sq), word_aligned(wk), word_aligned(sk),
        word_aligned(wv), word_aligned(sv), x if w_dense is None else w_dense,
        *gs_args, qn, kn, float(eps),
        q_out, k_out, v_out, proj, p.m, p.s, GS_FROM_PTR=gs_from_ptr, **p.consts)
    return result
