"""Tests for the float64 oracles (fuseval.refimpl): the shared stage functions, both
operators' references against an independent re-derivation, stage taps and overrides,
and the float32 variants.

The independent oracles below are written from SPEC.md alone and on purpose differently
from fuseval's code: numpy float64, explicit Python loops over batch, heads and positions,
RMSNorm per token, projections per head, RoPE per rotated pair with explicit index
arithmetic (including the mRoPE axis of each head-dim index), causal attention with an
explicit loop over keys and the GQA mapping ``i // group``, and NVFP4 dequantization per
element from the bit rules of SPEC.md (no fuseval codec).
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fuseval.definitions import evaluate_expression
from fuseval.operators import load
from fuseval.inputs import generate_inputs
from fuseval.operators.nvfp4_qkv_rope import reference as op_b
from fuseval.operators.qwen2vl_decoder_layer import reference as op_a
from fuseval.refimpl import stages as st
from act_quant_independent import quantize_loops

OP_A = "qwen2vl_decoder_layer"
OP_B = "nvfp4_qkv_rope"


# op A: 6 query heads over 2 kv heads (group 3), head_dim 16 -> mRoPE section (2, 3, 3)
CONFIG_A = {"hidden_size": 32, "num_heads": 6, "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 40}
AXES_A = {"batch_size": 2, "seq_len": 5, "kv_seq_len": 5}
# op B: 4 query heads over 2 kv heads, head_dim 8, hidden 48 = three 16-column scale blocks
CONFIG_B = {"hidden_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
AXES_B = {"batch_size": 2, "seq_len": 5}

STAGES_A = ["input_norm", "qkv_proj", "mrope", "attention", "o_proj", "post_norm", "gate_up", "act",
            "down", "residual"]
STAGES_B = ["act_quant", "dequant", "proj", "qk_norm", "rope", "layout"]
# op B's dequant does not read the activations: it is not downstream of act_quant
INDEPENDENT = {("act_quant", "dequant")}


def _g(seed):
    return torch.Generator().manual_seed(seed)


# ====================================================================== independent oracle
def rms_norm_row(v: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """One token: v / sqrt(mean(v^2) + eps) * w."""
    ms = 0.0
    for value in v:
        ms += value * value
    ms /= len(v)
    r = 1.0 / math.sqrt(ms + eps)
    return np.array([v[i] * r * w[i] for i in range(len(v))])


def rope_pairs(t: np.ndarray, cos_at, sin_at) -> np.ndarray:
    """Rotate one head vector pair by pair: (t[j], t[j+D/2]) with rotate_half semantics,
    out[j] = t[j] cos_j - t[j+h] sin_j, out[j+h] = t[j+h] cos_{j+h} + t[j] sin_{j+h}.
    ``cos_at(d)`` / ``sin_at(d)`` give the table entry for head-dim index d."""
    half = len(t) // 2
    out = np.empty_like(t)
    for j in range(half):
        out[j] = t[j] * cos_at(j) - t[j + half] * sin_at(j)
        out[j + half] = t[j + half] * cos_at(j + half) + t[j] * sin_at(j + half)
    return out


def mrope_axis(d: int, head_dim: int, layout: str = "sol") -> int:
    """SPEC: the benchmark ("sol") takes axis 0 for d < D/4, 1 for d < 5D/8, 2 above;
    HF ("hf") axes 0,1,2,0,1,2 over consecutive chunks (D/8, 3D/16, 3D/16) x 2."""
    if layout == "sol":
        return 0 if d < head_dim // 4 else (1 if d < 5 * head_dim // 8 else 2)
    s0, s1 = head_dim // 8, 3 * head_dim // 16
    r = d % (head_dim // 2)
    return 0 if r < s0 else (1 if r < s0 + s1 else 2)


def attention_loops(q, k, v, group):
    """q [B][S][Hq] head vectors, k/v [B][S][Hkv]; causal, query head i reads kv head i // group."""
    B, S, Hq = len(q), len(q[0]), len(q[0][0])
    D = len(q[0][0][0])
    out = [[[None] * Hq for _ in range(S)] for _ in range(B)]
    for b in range(B):
        for i in range(Hq):
            kv = i // group
            for s in range(S):
                scores = [float(np.dot(q[b][s][i], k[b][j][kv])) / math.sqrt(D) for j in range(s + 1)]
                top = max(scores)
                weights = [math.exp(x - top) for x in scores]
                total = sum(weights)
                acc = np.zeros(D)
                for j in range(s + 1):
                    acc = acc + (weights[j] / total) * v[b][j][kv]
                out[b][s][i] = acc
    return out


def oracle_a(inputs, num_heads, num_kv_heads, head_dim, layout="sol"):
    """Op A from SPEC.md; returns (output [B,S,H], stage values in the tap layouts).
    The cos/sin tables may have more rows than S: token s reads row s."""
    (x, ln1, wq, bq, wk, bk, wv, bv, wo, cos, sin, ln2, wg, wu, wd, eps) = [
        t.double().numpy() if isinstance(t, torch.Tensor) else float(t) for t in inputs]
    B, S, H = x.shape
    D, Hq, Hkv = head_dim, num_heads, num_kv_heads
    h = np.zeros((B, S, H))
    q = [[[None] * Hq for _ in range(S)] for _ in range(B)]
    k = [[[None] * Hkv for _ in range(S)] for _ in range(B)]
    v = [[[None] * Hkv for _ in range(S)] for _ in range(B)]
    qr = [[[None] * Hq for _ in range(S)] for _ in range(B)]
    kr = [[[None] * Hkv for _ in range(S)] for _ in range(B)]
    for b in range(B):
        for s in range(S):
            h[b, s] = rms_norm_row(x[b, s], ln1, eps)
            for head in range(Hq):
                rows = slice(head * D, (head + 1) * D)
                q[b][s][head] = wq[rows] @ h[b, s] + bq[rows]
            for head in range(Hkv):
                rows = slice(head * D, (head + 1) * D)
                k[b][s][head] = wk[rows] @ h[b, s] + bk[rows]
                v[b][s][head] = wv[rows] @ h[b, s] + bv[rows]
            cos_at = lambda d, b=b, s=s: cos[mrope_axis(d, D, layout), b, s, d]
            sin_at = lambda d, b=b, s=s: sin[mrope_axis(d, D, layout), b, s, d]
            for head in range(Hq):
                qr[b][s][head] = rope_pairs(q[b][s][head], cos_at, sin_at)
            for head in range(Hkv):
                kr[b][s][head] = rope_pairs(k[b][s][head], cos_at, sin_at)
    attn = attention_loops(qr, kr, v, Hq // Hkv)
    flat = lambda heads: np.concatenate(heads)
    x1 = np.zeros_like(x)
    h2 = np.zeros_like(x)
    gu = np.zeros((B, S, 2 * wg.shape[0]))
    act = np.zeros((B, S, wg.shape[0]))
    down = np.zeros_like(x)
    out = np.zeros_like(x)
    for b in range(B):
        for s in range(S):
            a = flat(attn[b][s])
            x1[b, s] = x[b, s] + np.array([np.dot(wo[n], a) for n in range(H)])
            h2[b, s] = rms_norm_row(x1[b, s], ln2, eps)
            g = np.array([np.dot(wg[n], h2[b, s]) for n in range(wg.shape[0])])
            u = np.array([np.dot(wu[n], h2[b, s]) for n in range(wu.shape[0])])
            gu[b, s] = np.concatenate([g, u])
            act[b, s] = np.array([g[n] / (1.0 + math.exp(-g[n])) * u[n] for n in range(len(g))])
            down[b, s] = np.array([np.dot(wd[n], act[b, s]) for n in range(H)])
            out[b, s] = x1[b, s] + down[b, s]
    taps = {
        "input_norm": h,
        "qkv_proj": np.array([[np.concatenate(q[b][s] + k[b][s] + v[b][s]) for s in range(S)] for b in range(B)]),
        "mrope": np.array([[np.concatenate(qr[b][s] + kr[b][s]) for s in range(S)] for b in range(B)]),
        "attention": np.array([[flat(attn[b][s]) for s in range(S)] for b in range(B)]),
        "o_proj": x1, "post_norm": h2, "gate_up": gu, "act": act, "down": down, "residual": out,
    }
    return torch.from_numpy(out), {n: torch.from_numpy(np.ascontiguousarray(t)) for n, t in taps.items()}


def e2m1(code: int) -> float:
    """SPEC: bit 3 sign, bits 2-1 exponent (bias 1), bit 0 mantissa; exponent 0: m * 0.5."""
    e, m = (code >> 1) & 3, code & 1
    mag = m * 0.5 if e == 0 else (1.0 + 0.5 * m) * 2.0 ** (e - 1)
    return -mag if code & 8 else mag


def e4m3(byte: int) -> float:
    """SPEC: s.eeee.mmm, bias 7, exponent 0: m/8 * 2^-6, s.1111.111 NaN."""
    e, m = (byte >> 3) & 15, byte & 7
    if e == 15 and m == 7:
        return math.nan
    mag = (m / 8.0) * 2.0 ** -6 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return -mag if byte & 0x80 else mag


def dequant_loops(packed: torch.Tensor, scale: torch.Tensor, gs: float) -> np.ndarray:
    """W[n, k] = e2m1(code[n, k]) * e4m3(scale[n, k // 16]) * gs, one element at a time;
    byte [n, k // 2] holds column k in its low nibble when k is even, else the high one."""
    p = packed.tolist()
    sb = scale.view(torch.uint8).tolist()
    rows, K = len(p), 2 * len(p[0])
    w = np.zeros((rows, K))
    for n in range(rows):
        for col in range(K):
            byte = p[n][col // 2]
            code = byte & 0xF if col % 2 == 0 else (byte >> 4) & 0xF
            w[n, col] = e2m1(code) * e4m3(sb[n][col // 16]) * gs
    return w


def act_quant_loops(x: torch.Tensor) -> np.ndarray:
    """x_hat [B, S, H]: the benchmark's quantizer over all B*S tokens (one global amax),
    per element (tests/helpers/act_quant_independent.py), decoded one element at a time."""
    B, S, H = x.shape
    codes, scales, gd = quantize_loops(x.float().reshape(B * S, H))
    out = np.zeros((B * S, H))
    for r in range(B * S):
        for c in range(H):
            out[r, c] = e2m1(int(codes[r, c])) * e4m3(int(scales[r, c // 16])) * float(gd)
    return out.reshape(B, S, H)


def oracle_b(inputs, num_heads, num_kv_heads, head_dim, activations="nvfp4"):
    """Op B from SPEC.md; returns ((q, k, v) [B,h,S,D], stage values in the tap layouts).
    ``activations="bf16"``: the w4a16 variant (x used as given)."""
    x, cos, sin = (t.double().numpy() for t in inputs[:3])
    x_hat = act_quant_loops(inputs[0]) if activations == "nvfp4" else x
    weights = [dequant_loops(inputs[3 + 3 * i], inputs[4 + 3 * i], float(inputs[5 + 3 * i]))
               for i in range(3)]
    qn_w, kn_w = inputs[12].double().numpy(), inputs[13].double().numpy()
    eps = float(inputs[14])
    B, S, _ = x.shape
    D, Hq, Hkv = head_dim, num_heads, num_kv_heads
    heads = {"q": Hq, "k": Hkv, "v": Hkv}
    proj = {p: np.zeros((B, S, heads[p], D)) for p in "qkv"}
    normed = {p: np.zeros((B, S, heads[p], D)) for p in "qk"}
    rot = {p: np.zeros((B, S, heads[p], D)) for p in "qk"}
    for b in range(B):
        for s in range(S):
            for p, w in zip("qkv", weights):
                for head in range(heads[p]):
                    proj[p][b, s, head] = w[head * D:(head + 1) * D] @ x_hat[b, s]
            for p, nw in (("q", qn_w), ("k", kn_w)):
                for head in range(heads[p]):
                    normed[p][b, s, head] = rms_norm_row(proj[p][b, s, head], nw, eps)
                    rot[p][b, s, head] = rope_pairs(normed[p][b, s, head],
                                                    lambda d: cos[b, s, d], lambda d: sin[b, s, d])
    outs = [np.zeros((B, heads[p], S, D)) for p in "qkv"]
    for b in range(B):
        for s in range(S):
            for i, src in enumerate((rot["q"], rot["k"], proj["v"])):
                for head in range(src.shape[2]):
                    outs[i][b, head, s] = src[b, s, head]
    flat = lambda t: t.reshape(B, S, -1)
    taps = {
        **({"act_quant": x_hat} if activations == "nvfp4" else {}),
        "dequant": np.concatenate(weights, axis=0),
        "proj": np.concatenate([flat(proj[p]) for p in "qkv"], axis=-1),
        "qk_norm": np.concatenate([flat(normed["q"]), flat(normed["k"])], axis=-1),
        "rope": np.concatenate([flat(rot["q"]), flat(rot["k"])], axis=-1),
        "layout": np.concatenate(outs, axis=1),
    }
    return ([torch.from_numpy(o) for o in outs],
            {n: torch.from_numpy(np.ascontiguousarray(t)) for n, t in taps.items()})


# ====================================================================== inputs
def inputs_a(seed=0, config=CONFIG_A, axes=AXES_A):
    """Benchmark-style inputs with norm weights that are not ones (so a reference that
    dropped a norm weight would be caught)."""
    d = load(OP_A, config)
    x = generate_inputs(d, axes, seed=seed)
    i1, i2 = d.input_index("input_layernorm_weight"), d.input_index("post_attention_layernorm_weight")
    g = _g(seed + 100)
    x[i1] = 1 + 0.3 * torch.randn(x[i1].shape, generator=g)
    x[i2] = 1 + 0.3 * torch.randn(x[i2].shape, generator=g)
    return d, x


def inputs_b(seed=0, config=CONFIG_B, axes=AXES_B):
    """Benchmark inputs with norm weights that are not ones and about half of the block
    scales negated (the benchmark's own are positive; a sign bug must still show)."""
    d = load(OP_B, config)
    x = generate_inputs(d, axes, seed=seed)
    g = _g(seed + 200)
    for name in ("q_norm_weight", "k_norm_weight"):
        i = d.input_index(name)
        x[i] = (1 + 0.3 * torch.randn(x[i].shape, generator=g)).to(torch.bfloat16)
    for name in ("q_proj_scale", "k_proj_scale", "v_proj_scale"):
        i = d.input_index(name)
        flip = (torch.rand(x[i].shape, generator=g) < 0.5).to(torch.uint8) << 7
        x[i] = (x[i].view(torch.uint8) ^ flip).view(torch.float8_e4m3fn)
    return d, x


def assert_close64(got: torch.Tensor, want: torch.Tensor, what: str, tol: float = 1e-12):
    assert got.dtype == torch.float64, what
    assert tuple(got.shape) == tuple(want.shape), (what, tuple(got.shape), tuple(want.shape))
    err = float((got - want).abs().max())
    scale = max(1.0, float(want.abs().max()))
    assert err <= tol * scale, f"{what}: max abs error {err:.3e} (scale {scale:.3g})"


@pytest.fixture(scope="module")
def run_a():
    d, x = inputs_a()
    taps = {}
    (out,) = op_a.reference(*x, taps=taps)
    want, want_taps = oracle_a(x, 6, 2, 16)
    return SimpleNamespace(defn=d, inputs=x, out=out, taps=taps, want=want, want_taps=want_taps)


@pytest.fixture(scope="module")
def run_b():
    d, x = inputs_b()
    taps = {}
    outs = op_b.reference(*x, taps=taps)
    want, want_taps = oracle_b(x, 4, 2, 8)
    return SimpleNamespace(defn=d, inputs=x, outs=outs, taps=taps, want=want, want_taps=want_taps)


# ====================================================================== stage functions
def test_rms_norm_matches_per_row_formula_with_eps_inside_the_root():
    x = torch.randn(2, 3, 7, generator=_g(1), dtype=torch.float64) * 0.3
    w = torch.randn(7, generator=_g(2), dtype=torch.float64)
    eps = 0.05                       # large, so eps outside the root would be visible
    got = st.rms_norm(x, w, eps)
    for b in range(2):
        for s in range(3):
            want = rms_norm_row(x[b, s].numpy(), w.numpy(), eps)
            assert np.allclose(got[b, s].numpy(), want, rtol=1e-14, atol=1e-14)


def test_linear_uses_out_by_in_weights_and_optional_bias():
    x = torch.randn(2, 4, 5, generator=_g(3), dtype=torch.float64)
    w = torch.randn(3, 5, generator=_g(4), dtype=torch.float64)      # [out, in], not square
    b = torch.randn(3, generator=_g(5), dtype=torch.float64)
    y, yb = st.linear(x, w), st.linear(x, w, b)
    assert y.shape == (2, 4, 3)
    for i in range(2):
        for j in range(4):
            for n in range(3):
                ref = sum(float(x[i, j, kk]) * float(w[n, kk]) for kk in range(5))
                assert float(y[i, j, n]) == pytest.approx(ref, abs=1e-13)
                assert float(yb[i, j, n]) == pytest.approx(ref + float(b[n]), abs=1e-13)


def test_rotate_half_layout():
    t = torch.arange(8, dtype=torch.float64)
    assert st.rotate_half(t).tolist() == [-4, -5, -6, -7, 0, 1, 2, 3]
    t2 = torch.arange(12, dtype=torch.float64).view(2, 6)
    assert st.rotate_half(t2).tolist() == [[-3, -4, -5, 0, 1, 2], [-9, -10, -11, 6, 7, 8]]


def test_rope_rotates_pairs_and_does_not_assume_unit_cos_sin():
    t = torch.randn(3, 8, generator=_g(6), dtype=torch.float64)
    cos = torch.randn(3, 8, generator=_g(7), dtype=torch.float64)   # cos^2 + sin^2 != 1
    sin = torch.randn(3, 8, generator=_g(8), dtype=torch.float64)
    got = st.rope(t, cos, sin)
    for r in range(3):
        want = rope_pairs(t[r].numpy(), lambda d: float(cos[r, d]), lambda d: float(sin[r, d]))
        assert np.allclose(got[r].numpy(), want, rtol=0, atol=1e-15)
    # broadcasting [B, 1, S, D] tables over heads
    t4 = torch.randn(2, 3, 4, 8, generator=_g(9), dtype=torch.float64)
    c4 = torch.randn(2, 1, 4, 8, generator=_g(10), dtype=torch.float64)
    s4 = torch.randn(2, 1, 4, 8, generator=_g(11), dtype=torch.float64)
    got4 = st.rope(t4, c4, s4)
    assert torch.equal(got4[1, 2], st.rope(t4[1, 2], c4[1, 0], s4[1, 0]))


@pytest.mark.parametrize("head_dim, section", [(128, [16, 24, 24]), (16, [2, 3, 3]), (48, [6, 9, 9])])
def test_mrope_section(head_dim, section):
    assert st.mrope_section(head_dim) == section


@pytest.mark.parametrize("head_dim", [24, 8, 100])
def test_mrope_section_rejects_head_dim_not_multiple_of_16(head_dim):
    with pytest.raises(ValueError, match=str(head_dim)):
        st.mrope_section(head_dim)


@pytest.mark.parametrize("layout", ["sol", "hf"])
@pytest.mark.parametrize("head_dim", [128, 16])
def test_mrope_select_takes_each_index_from_its_position_axis(head_dim, layout):
    B, S, rows = 2, 3, 5
    # table[a, b, s, d] = 1000 a + 100 b + 10 s + d / 1000: every entry names where it came from;
    # the table has more rows (kv_seq_len) than the S tokens: the first S rows are used
    a_, b_, s_, d_ = torch.meshgrid(torch.arange(3.0), torch.arange(B * 1.0), torch.arange(rows * 1.0),
                                    torch.arange(head_dim * 1.0), indexing="ij")
    table = (1000 * a_ + 100 * b_ + 10 * s_ + d_ / 1000).double()
    got = st.mrope_select(table, S, layout)
    assert got.shape == (B, S, head_dim)
    for b in range(B):
        for s in range(S):
            for d in range(head_dim):
                assert float(got[b, s, d]) == float(table[mrope_axis(d, head_dim, layout), b, s, d])
    if head_dim == 128:   # SPEC's chunks spelled out
        axis = ([0] * 32 + [1] * 48 + [2] * 48 if layout == "sol" else
                [0] * 16 + [1] * 24 + [2] * 24 + [0] * 16 + [1] * 24 + [2] * 24)
        assert [int(float(got[1, 2, d]) // 1000) for d in range(128)] == axis


def test_mrope_select_rejects_tables_shorter_than_the_tokens():
    with pytest.raises(ValueError, match=r"kv_seq_len=3.*seq_len=4"):
        st.mrope_select(torch.zeros(3, 1, 3, 16), 4)


@pytest.mark.parametrize("query_chunk", [2048, 3, 1])
def test_causal_gqa_attention_matches_loops(query_chunk):
    B, Hq, Hkv, S, D = 2, 6, 2, 7, 4
    q = torch.randn(B, Hq, S, D, generator=_g(12), dtype=torch.float64)
    k = torch.randn(B, Hkv, S, D, generator=_g(13), dtype=torch.float64)
    v = torch.randn(B, Hkv, S, D, generator=_g(14), dtype=torch.float64)
    got = st.causal_gqa_attention(q, k, v, query_chunk=query_chunk)
    as_lists = lambda t: [[[t[b, h, s].numpy() for h in range(t.shape[1])] for s in range(S)] for b in range(B)]
    want = attention_loops(as_lists(q), as_lists(k), as_lists(v), Hq // Hkv)
    for b in range(B):
        for h in range(Hq):
            for s in range(S):
                assert np.allclose(got[b, h, s].numpy(), want[b][s][h], rtol=1e-13, atol=1e-13)


def test_causal_attention_ignores_future_keys():
    B, H, S, D = 1, 2, 6, 4
    q = torch.randn(B, H, S, D, generator=_g(15), dtype=torch.float64)
    k = torch.randn(B, 1, S, D, generator=_g(16), dtype=torch.float64)
    v = torch.randn(B, 1, S, D, generator=_g(17), dtype=torch.float64)
    base = st.causal_gqa_attention(q, k, v, query_chunk=4)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 4:] += 10
    v2[:, :, 4:] -= 10
    changed = st.causal_gqa_attention(q, k2, v2, query_chunk=4)
    assert torch.equal(base[:, :, :4], changed[:, :, :4])
    assert not torch.allclose(base[:, :, 4:], changed[:, :, 4:])


def test_silu_and_swiglu():
    x = torch.tensor([-30.0, -2.0, -0.5, 0.0, 0.5, 2.0, 30.0], dtype=torch.float64)
    want = [xi / (1 + math.exp(-xi)) for xi in x.tolist()]
    assert np.allclose(st.silu(x).numpy(), want, rtol=1e-15, atol=1e-300)
    # extreme arguments stay finite (no inf/inf)
    big = torch.tensor([-1000.0, 1000.0], dtype=torch.float64)
    assert st.silu(big).tolist() == [-0.0, 1000.0]
    gate = torch.tensor([1.0, -1.0, 3.0], dtype=torch.float64)
    up = torch.tensor([2.0, 5.0, -1.0], dtype=torch.float64)
    want = [g / (1 + math.exp(-g)) * u for g, u in zip(gate.tolist(), up.tolist())]
    assert np.allclose(st.swiglu(gate, up).numpy(), want, rtol=1e-15, atol=0)


# ====================================================================== full oracles
def test_op_a_reference_matches_independent_loops(run_a):
    assert run_a.out.dtype == torch.float64
    assert_close64(run_a.out, run_a.want, "output")


def test_op_b_reference_matches_independent_loops(run_b):
    names = ("query_states", "key_states", "value_states")
    assert [tuple(o.shape) for o in run_b.outs] == [(2, 4, 5, 8), (2, 2, 5, 8), (2, 2, 5, 8)]
    for got, want, name in zip(run_b.outs, run_b.want, names):
        assert_close64(got, want, name)


def test_op_b_inputs_exercise_signed_scales_and_several_blocks(run_b):
    """Guard of the test above: its inputs must contain negative block scales and more than
    one block per row, or a wrong sign / block index rule could go unnoticed."""
    scale = run_b.inputs[4].float()
    assert scale.shape[1] == 3 and (scale < 0).any() and (scale > 0).any()


def test_op_a_uses_the_first_seq_len_rows_of_longer_rope_tables():
    """kv_seq_len > seq_len (the benchmark: "may differ from seq_len with KV cache"): the
    layer reads rows 0..seq_len-1 of both tables, keys only from this call's tokens."""
    axes = {"batch_size": 2, "seq_len": 5, "kv_seq_len": 9}
    d, x = inputs_a(seed=4, axes=axes)
    (out,) = op_a.reference(*x)
    want, _ = oracle_a(x, 6, 2, 16)
    assert_close64(out, want, "output")
    # the rows past seq_len do not matter; the first ones do
    y = list(x)
    y[9], y[10] = x[9].clone(), x[10].clone()
    y[9][:, :, 5:] = 7.0
    assert torch.equal(op_a.reference(*y)[0], out)
    y[9][:, :, 0] = 7.0
    assert not torch.equal(op_a.reference(*y)[0], out)


def test_op_a_rejects_rope_tables_shorter_than_the_tokens():
    d, x = inputs_a()
    x[9], x[10] = x[9][:, :, :4], x[10][:, :, :4]
    with pytest.raises(ValueError, match=r"kv_seq_len >= seq_len.*kv_seq_len=4.*seq_len=5"):
        op_a.reference(*x)


def test_op_a_hf_mrope_variant_matches_independent_loops_with_hf_layout(run_a):
    (out,) = op_a.reference_hf_mrope(*run_a.inputs)
    want, _ = oracle_a(run_a.inputs, 6, 2, 16, layout="hf")
    assert_close64(out, want, "output")
    assert float((out - run_a.out).abs().max()) > 1e-3      # the layouts are different functions


def test_op_b_w4a16_variant_matches_independent_loops(run_b):
    outs = op_b.reference_w4a16(*run_b.inputs)
    want, _ = oracle_b(run_b.inputs, 4, 2, 8, activations="bf16")
    for got, w, name in zip(outs, want, ("q", "k", "v")):
        assert_close64(got, w, name)
        assert float((got - run_b.outs[("q", "k", "v").index(name)]).abs().max()) > 1e-3


def test_op_a_sol_reference_is_float32_close_to_the_oracle(run_a):
    (out,) = op_a.sol_reference(*run_a.inputs)
    assert out.dtype == torch.float32
    err = float((out.double() - run_a.out).abs().max())
    assert 0 < err < 1e-4


def test_op_b_sol_reference_rounds_like_the_benchmark(run_b):
    """The projection rounded to bf16 twice (cuBLAS's output, then times the global scales,
    themselves rounded to bf16 as torch does on the GPU),
    the norm rounded to bf16, RoPE in bf16: q and k differ from the oracle by several bf16
    roundings, v by at most two."""
    outs = op_b.sol_reference(*run_b.inputs)
    for got, want, name in zip(outs, run_b.outs, ("q", "k", "v")):
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        # relative to each head row's largest element (RoPE's sum may cancel to ~0)
        rel = (got.double() - want).abs() / want.abs().amax(-1, keepdim=True)
        assert float(rel.max()) < (0.03 if name != "v" else 2.5 * 2.0 ** -8), name
        assert not torch.equal(got, want.to(torch.bfloat16)) or name == "v"
    # v: exactly bf16(bf16(proj) * g) of the oracle's own projection tap
    b, s = 2, 5
    proj_v = run_b.taps["proj"][..., -16:]
    g = run_b.taps["act_quant.global_decode"] * torch.tensor(float(run_b.inputs[11]), dtype=torch.float32)
    raw = (proj_v / float(run_b.taps["act_quant.global_decode"]) / float(run_b.inputs[11])).to(torch.bfloat16)
    want_v = (raw.float() * g.to(torch.bfloat16).float()).to(torch.bfloat16).view(b, s, 2, 8).transpose(1, 2)
    assert torch.equal(outs[2], want_v)


def test_op_a_tiny_config_matches_independent_loops():
    d, x = inputs_a(seed=3, config="tiny", axes={"batch_size": 1, "seq_len": 4, "kv_seq_len": 4})
    c = d.const_axes
    (out,) = op_a.reference(*x)
    want, _ = oracle_a(x, c["num_heads"], c["num_kv_heads"], c["head_dim"])
    assert_close64(out, want, "output")


# ====================================================================== taps
def _documented_layouts_a(B, S, H, qkv, kv, I):
    return {"input_norm": (B, S, H), "qkv_proj": (B, S, qkv + 2 * kv), "mrope": (B, S, qkv + kv),
            "attention": (B, S, qkv), "o_proj": (B, S, H), "post_norm": (B, S, H),
            "gate_up": (B, S, 2 * I), "act": (B, S, I), "down": (B, S, H), "residual": (B, S, H)}


def test_op_a_taps_have_every_stage_in_its_documented_layout(run_a):
    assert set(run_a.taps) == set(STAGES_A) == set(run_a.defn.stage_names)
    layouts = _documented_layouts_a(2, 5, 32, 96, 32, 40)
    bound = run_a.defn.resolve_axes(AXES_A)
    for s in run_a.defn.stages:
        assert tuple(run_a.taps[s.name].shape) == layouts[s.name], s.name
        assert tuple(evaluate_expression(e, bound) for e in s.shape) == layouts[s.name], s.name
    for name in STAGES_A:
        assert_close64(run_a.taps[name], run_a.want_taps[name], name)


def test_op_b_taps_have_every_stage_in_its_documented_layout(run_b):
    stages = {k for k in run_b.taps if "." not in k}
    assert stages == set(STAGES_B) == set(run_b.defn.stage_names)
    B, S, H, D = 2, 5, 48, 8
    assert set(run_b.taps) - stages == {"act_quant.codes", "act_quant.scales", "act_quant.global_decode"}
    codes, scales, gd = quantize_loops(run_b.inputs[0].float().reshape(B * S, H))
    assert torch.equal(run_b.taps["act_quant.codes"].reshape(B * S, H), torch.from_numpy(codes))
    assert torch.equal(run_b.taps["act_quant.scales"].reshape(B * S, H // 16), torch.from_numpy(scales))
    assert float(run_b.taps["act_quant.global_decode"]) == float(gd)
    layouts = {"act_quant": (B, S, H), "dequant": (32 + 16 + 16, H), "proj": (B, S, 64), "qk_norm": (B, S, 48),
               "rope": (B, S, 48), "layout": (B, 4 + 2 + 2, S, D)}
    bound = run_b.defn.resolve_axes(AXES_B)
    for s in run_b.defn.stages:
        assert tuple(run_b.taps[s.name].shape) == layouts[s.name], s.name
        assert tuple(evaluate_expression(e, bound) for e in s.shape) == layouts[s.name], s.name
    for name in STAGES_B:
        assert_close64(run_b.taps[name], run_b.want_taps[name], name)
    # dequantization is exact: bitwise equal to the per-element product
    assert torch.equal(run_b.taps["dequant"], run_b.want_taps["dequant"])


# ====================================================================== overrides
def _run(op, inputs, **kw):
    taps = {}
    ref = op_a.reference if op == OP_A else op_b.reference
    return ref(*inputs, taps=taps, **kw), taps


@pytest.mark.parametrize("op, stage", [(OP_A, s) for s in STAGES_A] + [(OP_B, s) for s in STAGES_B])
def test_override_with_own_tap_reproduces_and_perturbed_tap_changes_only_downstream(op, stage, run_a, run_b):
    run = run_a if op == OP_A else run_b
    base_outs = (run.out,) if op == OP_A else run.outs
    order = STAGES_A if op == OP_A else STAGES_B
    # the oracle's own tap: bitwise the same outputs and taps
    outs, taps = _run(op, run.inputs, override={stage: run.taps[stage].clone()})
    assert all(torch.equal(a, b) for a, b in zip(outs, base_outs))
    assert all(torch.equal(taps[n], run.taps[n]) for n in order)
    # a perturbed tap: upstream untouched, the stage holds the given tensor, downstream moves
    noise = torch.randn(run.taps[stage].shape, generator=_g(18), dtype=torch.float64)
    perturbed = run.taps[stage] + 1e-3 * noise * (1 + run.taps[stage].abs())
    outs, taps = _run(op, run.inputs, override={stage: perturbed})
    k = order.index(stage)
    for n in order[:k]:
        assert torch.equal(taps[n], run.taps[n]), f"upstream stage {n} changed"
    assert torch.equal(taps[stage], perturbed)
    for n in order[k + 1:]:
        if (stage, n) in INDEPENDENT:
            assert torch.equal(taps[n], run.taps[n]), f"stage {n} does not read {stage}"
        else:
            assert not torch.equal(taps[n], run.taps[n]), f"downstream stage {n} did not change"
    assert not all(torch.equal(a, b) for a, b in zip(outs, base_outs))


def test_op_a_override_of_a_middle_stage_continues_with_the_oracle(run_a):
    """Overriding ``attention`` with the independent oracle's value gives the same output:
    the pipeline really continues from the given tensor."""
    (out,) = op_a.reference(*run_a.inputs, override={"attention": run_a.want_taps["attention"]})
    assert_close64(out, run_a.want, "output")


def test_override_accepts_a_lower_precision_tensor(run_b):
    outs = op_b.reference(*run_b.inputs, override={"proj": run_b.taps["proj"].float()})
    assert all(o.dtype == torch.float64 for o in outs)
    for got, want in zip(outs, run_b.outs):
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-7)


def test_stage_namespace_is_used(run_a):
    """Mutation tests swap one stage function: a wrong rms_norm must change the output."""
    wrong = SimpleNamespace(**{n: getattr(st, n) for n in st.__all__})
    wrong.rms_norm = lambda x, w, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # drops w
    (out,) = op_a.reference(*run_a.inputs, stages=wrong)
    assert not torch.allclose(out, run_a.out, atol=1e-3)


# ====================================================================== validation, float32
def test_references_validate_their_inputs_unless_told_not_to():
    d, x = inputs_a()
    x[9] = x[9][:, :, :4]           # rope_cos with kv_seq_len 4 != seq_len 5
    x[10] = x[10][:, :, :4]
    with pytest.raises(ValueError, match="kv_seq_len"):
        op_a.reference(*x)
    d, y = inputs_b()
    y[0] = y[0].float()
    with pytest.raises(ValueError, match="hidden_states"):
        op_b.reference(*y)


def test_op_a_float32_reference_is_close_to_float64(run_a):
    (out32,) = op_a.reference_fp32(*run_a.inputs)
    assert out32.dtype == torch.float32
    err = float((out32.double() - run_a.out).abs().max())
    assert 0 < err < 1e-4


def test_op_b_float32_reference_is_float64_rounded_to_bf16(run_b):
    outs = op_b.reference_fp32(*run_b.inputs)
    for got, want in zip(outs, run_b.outs):
        assert got.dtype == torch.bfloat16
        # bf16 keeps 8 significant bits: relative rounding error <= 2^-8 (+ fp32 noise)
        assert ((got.double() - want).abs() <= 2.0 ** -8 * want.abs() + 1e-6).all()
