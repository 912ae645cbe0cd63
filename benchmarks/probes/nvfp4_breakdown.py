"""Where op B's W4A4 call spends its GPU time, per token count: the activation quantizer
(``act_quant``, two launches), the weights' predecode (``predecode_weights``), the W4A16
forward on predecoded weights (predecode + GEMM) and the whole W4A4 forward, each captured
into a CUDA graph and the replays timed (``fuseval.bench.parts.time_graph_replay``: CUDA events, L2
flushed, median), so host launch work is left out. GEMM ~ w4a16 - predecode.

    PYTHONPATH=src python3 benchmarks/probes/nvfp4_breakdown.py [--tokens 256,2048,8192] [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch

from fuseval.bench.parts import time_graph_replay
from fuseval.operators import load
from fuseval.inputs import generate_inputs
from fuseval.operators.nvfp4_qkv_rope import fast



def _gpu_ms(fn) -> float:
    return time_graph_replay(fn, device="cuda").median_ms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="256,2048,8192")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    defn = load("nvfp4_qkv_rope", "seed")
    rows = {}
    unfused = fast.QuantConfig(fuse_predecode=False)
    for tokens in (int(t) for t in args.tokens.split(",")):
        inputs = generate_inputs(defn, {"seq_len": tokens, "batch_size": 1}, seed=0, device="cuda")
        (x, _, _, wq, sq, gq, wk, sk, gk, wv, sv, gv, *_) = inputs
        row = {
            "act_quant": _gpu_ms(lambda: fast.act_quant(x, (gq, gk, gv))),
            "predecode": _gpu_ms(lambda: fast.predecode_weights(wq, sq, wk, sk, wv, sv, x.shape[-1])),
            "w4a16 (predecode + GEMM)": _gpu_ms(lambda: fast.forward_w4a16(*inputs)),
            "w4a4 unfused": _gpu_ms(lambda: fast.forward(*inputs, quant_config=unfused)),
            "w4a4": _gpu_ms(lambda: fast.forward(*inputs)),
        }
        row["GEMM (w4a16 - predecode)"] = row["w4a16 (predecode + GEMM)"] - row["predecode"]
        rows[tokens] = row
        print(f"{tokens:6d} tokens: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items()) + " ms", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "gpu_ms": rows}, f, indent=1)


if __name__ == "__main__":
    main()
