"""Op B's GEMM on predecoded weights scheduled stream-K, against production's one program
per tile (W4A16, so no quantizer). The stream-K kernel lives here, not in the package: it
measured slower than production at every token count it was meant for (2026-12-02, H200,
docs/design/nvfp4_qkv_rope.md 2.0a).

The schedule: the TILES x NK K steps (a tile: BM tokens x one head) laid end to end and
cut into one equal range per program, one program per SM. Each tile is finished (partials
added in program order, epilogue) by the program holding its last K steps; programs run
their segments from the range's end to its start, so they publish the partials they owe
first (workspace slot, CTA barrier, release increment of the tile's counter) and finish
their own tile last (acquire reads of the counter, L2 loads). Ranges are taken by a
ticket drawn at start, so a program only waits for programs that started before it.

Prints GPU time of CUDA-graph replays (``fuseval.bench_parts.time_graph_replay``: CUDA events, L2 flushed,
median) of production's W4A16 call (predecode + GEMM), the predecode alone, the dense GEMM
alone on weights predecoded outside the timing, as production launches it and stream-K,
and whether each stream-K output is within rounding of the float64 oracle and the same on
a second run.

    PYTHONPATH=src:tests python3 benchmarks/probes/nvfp4_streamk_split.py [--tokens 256,1024]
"""
from __future__ import annotations

import argparse

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from fuseval.bench_parts import time_graph_replay
from fuseval.operators import load
from fuseval.inputs import generate_inputs
from fuseval.operators.nvfp4_qkv_rope import _gluon, fast
from fuseval.operators.nvfp4_qkv_rope import reference as ref
from fuseval.operators.nvfp4_qkv_rope._gluon import _epilogue, _x_descriptor

from test_fast_nvfp4_qkv_rope import _within_rounding


@gluon.jit
def _owner(step, P, TOTAL):
    """The program whose K-step range holds global step ``step``: program p runs steps
    [p * TOTAL // P, (p + 1) * TOTAL // P), so the owner is the largest p with
    p * TOTAL // P <= step, i.e. ceil((step + 1) * P / TOTAL) - 1."""
    return ((step + 1) * P + TOTAL - 1) // TOTAL - 1


@gluon.jit
def dense_streamk_kernel(
        x_desc, w_desc, cos_ptr, sin_ptr,
        gs_ptr, gs_q, gs_k, gs_v, qn_ptr, kn_ptr, eps,
        q_out, k_out, v_out, ws_ptr, count_ptr, M, S, TOTAL, TILES, SEGS,
        K: gl.constexpr, HQ: gl.constexpr, HKV: gl.constexpr,
        BM: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
        GS_FROM_PTR: gl.constexpr, num_warps: gl.constexpr):
    """Production's dense kernel (``_gluon.nvfp4_qkv_rope_gluon_dense_kernel``) with the
    stream-K schedule of the module docstring. The ring is allocated per segment: dead
    during the epilogue, its shared memory is the epilogue's layout-conversion scratch
    (both together do not fit at BM = 256)."""
    BN: gl.constexpr = 128
    NK: gl.constexpr = K // BK
    NT: gl.constexpr = HQ + 2 * HKV
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                  instr_shape=[16, BM, 16])
    P = gl.num_programs(0)
    p = gl.atomic_add(count_ptr + TILES, 1, sem="relaxed", scope="gpu")     # the ticket
    start = p * TOTAL // P
    end = (p + 1) * TOTAL // P
    first_tile = start // NK

    NBYTES: gl.constexpr = x_desc.block_type.nbytes + w_desc.block_type.nbytes
    # a partial's offsets within its workspace slot, in the accumulator's own layout
    ws_rows = gl.arange(0, BN, layout=gl.SliceLayout(1, MMA))
    ws_cols = gl.arange(0, BM, layout=gl.SliceLayout(0, MMA))
    ws_offs = gl.expand_dims(ws_rows, 1) * BM + gl.expand_dims(ws_cols, 0)

    seg_end = end
    while seg_end > start:
        tile = (seg_end - 1) // NK
        k0 = gl.maximum(tile * NK, start) - tile * NK
        n = seg_end - tile * NK - k0
        h = tile % NT
        off_m = (tile // NT) * BM
        row0 = h * 128
        # ---- the dense kernel's K loop over the segment's steps k0 .. k0 + n
        x_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], x_desc.layout)
        w_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, BK], w_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
        for i in gl.static_range(STAGES - 1):
            if i < n:
                slot = i
                mbarrier.expect(bars.index(slot), NBYTES)
                tma.async_copy_global_to_shared(x_desc, [off_m, (k0 + i) * BK], bars.index(slot), x_smem.index(slot))
                tma.async_copy_global_to_shared(w_desc, [row0, (k0 + i) * BK], bars.index(slot), w_smem.index(slot))
        acc = gl.zeros([BN, BM], gl.float32, layout=MMA)
        for kk in range(n):
            slot = kk % STAGES
            mbarrier.wait(bars.index(slot), phase=(kk // STAGES) & 1)
            acc = warpgroup_mma(w_smem.index(slot), x_smem.index(slot).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            gl.thread_barrier()
            nxt = kk + STAGES - 1
            if nxt < n:
                refill = nxt % STAGES
                mbarrier.expect(bars.index(refill), NBYTES)
                tma.async_copy_global_to_shared(x_desc, [off_m, (k0 + nxt) * BK], bars.index(refill),
                                                x_smem.index(refill))
                tma.async_copy_global_to_shared(w_desc, [row0, (k0 + nxt) * BK], bars.index(refill),
                                                w_smem.index(refill))
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))
        # ---- finish the tile, or publish the partial for the program that will
        q_first = _owner(tile * NK, P, TOTAL)
        if p == _owner(tile * NK + NK - 1, P, TOTAL):
            if q_first < p:
                seen = gl.atomic_add(count_ptr + tile, 0, sem="acquire", scope="gpu")
                while seen < p - q_first:
                    seen = gl.atomic_add(count_ptr + tile, 0, sem="acquire", scope="gpu")
                for q in range(q_first, p):
                    q_slot = q * SEGS + (tile - (q * TOTAL // P) // NK)
                    acc += gl.load(ws_ptr + q_slot.to(gl.int64) * (BN * BM) + ws_offs, cache_modifier=".cg")
            _epilogue(gl.permute(acc, (1, 0)), h, off_m, cos_ptr, sin_ptr, gs_ptr, gs_q, gs_k, gs_v, qn_ptr,
                      kn_ptr, eps, q_out, k_out, v_out, M, S, HQ, HKV, BM, 1, GS_FROM_PTR, 1.0, num_warps)
        else:
            slot = p * SEGS + (tile - first_tile)
            gl.store(ws_ptr + slot.to(gl.int64) * (BN * BM) + ws_offs, acc)
            gl.thread_barrier()
            gl.atomic_add(count_ptr + tile, 1, sem="release", scope="gpu")
        seg_end -= n


def streamk_programs(m: int, block_m: int, block_k: int, hidden: int, hq: int, hkv: int, sms: int):
    """(programs, total K steps, segments per program at most) of the stream-K launch: one
    program per SM, or one per step where there are fewer steps."""
    total = triton.cdiv(m, block_m) * (hq + 2 * hkv) * (hidden // block_k)
    programs = min(sms, total)
    per_program = triton.cdiv(total, programs)
    nk = hidden // block_k
    return programs, total, triton.cdiv(per_program - 1, nk) + 1


def launch_dense_streamk(x2d, cos, sin, w_dense, gs_args, gs_from_ptr, qn, kn, eps, outs, m, seq, hq, hkv, *,
                         block_m: int, block_k: int, stages: int, num_warps: int = 8,
                         programs: int | None = None):
    """``programs`` (default one per SM) share the tiles' K steps; the workspace of partial
    sums and the counters (one per tile, then the ticket) are allocated per call."""
    hidden = x2d.shape[1]
    sms = programs or torch.cuda.get_device_properties(x2d.device).multi_processor_count
    n_programs, total, segs = streamk_programs(m, block_m, block_k, hidden, hq, hkv, sms)
    tiles = triton.cdiv(m, block_m) * (hq + 2 * hkv)
    ws = torch.empty(n_programs * segs * 128 * block_m, dtype=torch.float32, device=x2d.device)
    counts = torch.zeros(tiles + 1, dtype=torch.int32, device=x2d.device)
    w_layout = gl.NVMMASharedLayout.get_default_for([128, block_k], gl.bfloat16)
    w_desc = TensorDescriptor.from_tensor(w_dense, [128, block_k], w_layout)
    dense_streamk_kernel[(n_programs,)](
        _x_descriptor(x2d, block_m, block_k), w_desc, cos, sin, *gs_args, qn, kn, float(eps),
        outs[0], outs[1], outs[2], ws, counts, m, seq, total, tiles, segs,
        K=hidden, HQ=hq, HKV=hkv, BM=block_m, BK=block_k, STAGES=stages,
        GS_FROM_PTR=gs_from_ptr, num_warps=num_warps)



def _gpu_ms(fn) -> float:
    return time_graph_replay(fn, device="cuda").median_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="256,1024")
    args = ap.parse_args()
    defn = load("nvfp4_qkv_rope", "seed")
    for tokens in (int(t) for t in args.tokens.split(",")):
        inputs = generate_inputs(defn, {"seq_len": tokens, "batch_size": 1}, seed=0, device="cuda")
        (x, cos, sin, wq, sq, gq, wk, sk, gk, wv, sv, gv, qn, kn, eps) = inputs
        m, hq, hkv = tokens, wq.shape[0] // 128, wk.shape[0] // 128
        outs = [torch.empty((1, h, m, 128), dtype=torch.bfloat16, device="cuda") for h in (hq, hkv, hkv)]
        gs = (x, float(gq), float(gk), float(gv))
        row = {"production w4a16": _gpu_ms(lambda: fast.forward_w4a16(*inputs))}
        w_dense = fast.predecode_weights(wq, sq, wk, sk, wv, sv, x.shape[-1])
        row["predecode alone"] = _gpu_ms(lambda: fast.predecode_weights(wq, sq, wk, sk, wv, sv, x.shape[-1]))
        refs = ref.reference(*inputs, activations="bf16")
        for bm, st, p in ((128, 6, 132), (128, 4, 132), (256, 4, 132), (256, 3, 132)):
            def run(bm=bm, st=st, p=p):
                launch_dense_streamk(x.view(m, -1), cos, sin, w_dense, gs, False, qn, kn, eps, outs, m, m, hq, hkv,
                                     block_m=bm, block_k=64, stages=st, programs=p)
            for o in outs:
                o.fill_(float("nan"))
            run()
            first = [o.clone() for o in outs]
            run()
            ok = all(bool(_within_rounding(o, r, 1e-5).all()) for o, r in zip(first, refs))
            same = all(torch.equal(a, b) for a, b in zip(first, outs))
            name = f"dense stream-K BM={bm} st={st} P={p} (GEMM)"
            print(f"{tokens:6d} tokens  {name:44s} within rounding of the oracle {ok}, same bits twice {same}",
                  flush=True)
            row[name] = _gpu_ms(run)
        for bm, st in ((128, 6), (256, 4)):
            row[f"dense BM={bm} st={st} (GEMM)"] = _gpu_ms(lambda: _gluon.launch_dense(
                x.view(m, -1), cos, sin, w_dense, gs, False, qn, kn, eps, outs, m, m, hq, hkv,
                block_m=bm, block_k=64, stages=st))
        for k, v in row.items():
            print(f"{tokens:6d} tokens  {k:44s} {v * 1000:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
