"""Op B's weight predecode (``_kernels._predecode_kernel``: 12.6 MB of FP4 codes and e4m3
scales read, 50 MB of bf16 written per call) over tile shapes and warp counts: GPU time of
CUDA-graph replays (``fuseval.bench_parts.time_graph_replay``: CUDA events, L2 flushed, median), the
bandwidth it reaches, and whether each output equals production's bit for bit.

    PYTHONPATH=src python3 benchmarks/probes/nvfp4_predecode_tiles.py [--br 16,32,64] [--bk 128,256] [--warps 4,8]
"""
from __future__ import annotations

import argparse

import torch

from fuseval.bench_parts import time_graph_replay
from fuseval.operators import load
from fuseval.inputs import generate_inputs
from fuseval.operators.nvfp4_qkv_rope import _kernels as K
from fuseval.operators.nvfp4_qkv_rope import fast



def _gpu_ms(fn) -> float:
    return time_graph_replay(fn, device="cuda").median_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--br", default="8,16,32,64")
    ap.add_argument("--bk", default="64,128,256,512")
    ap.add_argument("--warps", default="2,4,8")
    args = ap.parse_args()
    defn = load("nvfp4_qkv_rope", "seed")
    inputs = generate_inputs(defn, {"seq_len": 256, "batch_size": 1}, seed=0, device="cuda")
    (x, _, _, wq, sq, gq, wk, sk, gk, wv, sv, gv, *_) = inputs
    hidden = x.shape[-1]
    production = fast.predecode_weights(wq, sq, wk, sk, wv, sv, hidden)
    nbytes = sum(t.numel() * t.element_size() for t in (wq, sq, wk, sk, wv, sv)) + production.numel() * 2
    weights = [t for t in (wq, sq, wk, sk, wv, sv)]
    base = _gpu_ms(lambda: fast.predecode_weights(wq, sq, wk, sk, wv, sv, hidden))
    print(f"production (32 x 128, 4 warps): {base * 1000:.1f} us, {nbytes / base / 1e9:.2f} TB/s", flush=True)
    sink = torch.empty_like(production)
    fill = _gpu_ms(lambda: sink.fill_(1.0))
    print(f"reference: fill of the 50 MB output {fill * 1000:.1f} us "
          f"({production.numel() * 2 / fill / 1e9:.2f} TB/s written)", flush=True)
    rows = []
    for br in (int(v) for v in args.br.split(",")):
        for bk in (int(v) for v in args.bk.split(",")):
            for warps in (int(v) for v in args.warps.split(",")):
                out = torch.full_like(production, float("nan"))

                def run(out=out, br=br, bk=bk, warps=warps):
                    K._predecode_kernel[(out.shape[0] // br, hidden // bk)](
                        *weights, out, NQ=wq.shape[0], NKV=wk.shape[0], K=hidden, BR=br, BK=bk, num_warps=warps)
                try:
                    ms = _gpu_ms(run)
                except Exception as exc:  # noqa: BLE001 - a shape that does not compile is a result
                    print(f"{br:3d} x {bk:4d}, {warps} warps: failed {type(exc).__name__}", flush=True)
                    continue
                equal = torch.equal(out, production)
                rows.append((ms, br, bk, warps, equal))
                print(f"{br:3d} x {bk:4d}, {warps} warps: {ms * 1000:6.1f} us, {nbytes / ms / 1e9:.2f} TB/s, "
                      f"bit-equal {equal}", flush=True)
    print("fastest:")
    for ms, br, bk, warps, equal in sorted(rows)[:6]:
        print(f"  {br:3d} x {bk:4d}, {warps} warps: {ms * 1000:6.1f} us ({base / ms:.2f}x production), "
              f"bit-equal {equal}")


if __name__ == "__main__":
    main()
