"""Op B's GEMM on predecoded weights, tile per program against stream-K (W4A16, so no
quantizer): GPU time of CUDA-graph replays (``fuseval.bench.time_call``: CUDA events, L2
flushed, median) of production's W4A16 call (predecode + GEMM), the predecode alone, and
the dense GEMM alone on weights predecoded outside the timing, as production launches it
(one program per tile) and stream-K (P programs share the tiles' K steps), per token count.

    PYTHONPATH=src python3 benchmarks/probes/nvfp4_streamk_split.py [--tokens 256,1024]
"""
from __future__ import annotations

import argparse

import torch

from fuseval.bench import time_call
from fuseval.definitions import load
from fuseval.inputs import generate_inputs
from fuseval.operators.nvfp4_qkv_rope import _gluon, fast


def _graph_ms(fn) -> float:
    fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return time_call(graph.replay, device="cuda").median_ms


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
        row = {
            "production w4a16": _graph_ms(lambda: fast.forward_w4a16(*inputs)),
        }
        w_dense = fast.predecode_weights(wq, sq, wk, sk, wv, sv, x.shape[-1])
        row["predecode alone"] = _graph_ms(lambda: fast.predecode_weights(wq, sq, wk, sk, wv, sv, x.shape[-1]))
        for bm, st, p in ((128, 6, 132), (128, 4, 132), (256, 4, 132), (256, 3, 132)):
            row[f"dense stream-K BM={bm} st={st} P={p} (GEMM)"] = _graph_ms(lambda: _gluon.launch_dense_streamk(
                x.view(m, -1), cos, sin, w_dense, gs, False, qn, kn, eps, outs, m, m, hq, hkv,
                block_m=bm, block_k=64, stages=st, programs=p))
        for bm, st in ((128, 6), (256, 4)):
            row[f"dense BM={bm} st={st} (GEMM)"] = _graph_ms(lambda: _gluon.launch_dense(
                x.view(m, -1), cos, sin, w_dense, gs, False, qn, kn, eps, outs, m, m, hq, hkv,
                block_m=bm, block_k=64, stages=st))
        for k, v in row.items():
            print(f"{tokens:6d} tokens  {k:44s} {v * 1000:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
