"""Op B's activation quantizer (W4A4, stage ``act_quant``) on the GPU: its cost, and the
whole forward with it against the weight-only ``forward_w4a16``.

    PYTHONPATH=src python benchmarks/probe_nvfp4_act_quant.py [--tokens 8192,2048]
        [--tiles 4096:4,8192:8,16384:8] [--amax-blocks 4096,8192,16384] [--suite] [--json OUT]

Times, per token count (``fuseval.bench.time_call``: CUDA events, warm-up, median, L2
flushed before each call):

* ``copy``: ``x.clone()`` (reads and writes x once: the bandwidth yardstick);
* ``quant[TILE:WARPS:AMAX]``: ``act_quant`` (both passes) per quantizer tile / warp count /
  amax step (``QuantConfig``), each variant first checked bit for bit against
  ``quantize_activations``;
* ``quant``, ``forward`` (W4A4), ``forward_w4a16``: the module's defaults, called eagerly
  (what a user sees: host launch work included where it exceeds the GPU's);
* ``gpu:...``: the same calls replayed from a CUDA graph (one launch on the host), i.e.
  their GPU time alone;
* ``host_us:...``: host time per call (back-to-back calls, no synchronisation).

``--suite`` adds both forwards' mean over the 16 benchmark cases, eager and replayed.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from fuseval.bench import time_call
from fuseval.bench_parts import time_graph_replay
from fuseval.operators import load
from fuseval.operators.nvfp4_qkv_rope import fast as F
from fuseval.inputs import generate_inputs
from fuseval.refimpl.nvfp4 import quantize_activations


def _ms(fn) -> float:
    return time_call(fn, device="cuda").median_ms



def _host_us(fn, n: int = 100) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / n * 1e6


def _exact(x, gw, cfg) -> bool:
    got = F.act_quant(x, gw, codes=True, config=cfg)
    want = quantize_activations(x)
    return bool(torch.equal(got.codes, want.codes) and torch.equal(got.scales, want.scales)
                and torch.equal(got.xs.double(), want.scaled_codes(torch.float64)))


def _gpu_ms(fn) -> float:
    return time_graph_replay(fn, device="cuda").median_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="8192,2048")
    ap.add_argument("--tiles", default="4096:4,8192:8,16384:8")
    ap.add_argument("--amax-blocks", default="4096,8192,16384")
    ap.add_argument("--suite", action="store_true")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    defn = load("nvfp4_qkv_rope", "seed")
    tiles = [tuple(int(v) for v in t.split(":")) for t in args.tiles.split(",") if t]
    blocks = [int(b) for b in args.amax_blocks.split(",") if b]
    default = F.DEFAULT_QUANT_CONFIG
    out = {"device": torch.cuda.get_device_name(), "defaults": default.to_dict(), "by_tokens": {}}
    variants = [F.QuantConfig(tile, warps, default.amax_block) for tile, warps in tiles]
    variants += [F.QuantConfig(default.tile, default.warps, blk) for blk in blocks if blk != default.amax_block]
    for tokens in (int(t) for t in args.tokens.split(",")):
        inputs = generate_inputs(defn, {"seq_len": tokens, "batch_size": 1}, seed=0, device="cuda")
        x, gw = inputs[0], (inputs[5], inputs[8], inputs[11])
        row = {"copy": _ms(lambda: x.clone())}
        for cfg in variants:
            name = f"{cfg.tile}:{cfg.warps}:{cfg.amax_block}"
            row[f"exact:quant[{name}]"] = _exact(x, gw, cfg)
            row[f"quant[{name}]"] = _ms(lambda: F.act_quant(x, gw, config=cfg))
            row[f"gpu:quant[{name}]"] = _gpu_ms(lambda: F.act_quant(x, gw, config=cfg))
        for name, fn in (("quant", lambda: F.act_quant(x, gw)), ("forward", lambda: F.forward(*inputs)),
                         ("forward_w4a16", lambda: F.forward_w4a16(*inputs))):
            row[name] = _ms(fn)
            row[f"gpu:{name}"] = _gpu_ms(fn)
            row[f"host_us:{name}"] = _host_us(fn)
        row["quant_TBps_gpu"] = 3 * x.numel() * 2 / row["gpu:quant"] / 1e9     # x twice, xs once
        out["by_tokens"][tokens] = row
        print(tokens, json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}),
              flush=True)
    if args.suite:
        suite = {"forward": [], "forward_w4a16": [], "gpu:forward": [], "gpu:forward_w4a16": []}
        for case in defn.cases():
            inputs = generate_inputs(defn, case.axes, seed=case.index, device="cuda")
            for name in ("forward", "forward_w4a16"):
                fn = getattr(F, name)
                suite[name].append(_ms(lambda: fn(*inputs)))
                suite[f"gpu:{name}"].append(_gpu_ms(lambda: fn(*inputs)))
        out["suite"] = {name: {"per_case_ms": v, "mean_ms": statistics.fmean(v)} for name, v in suite.items()}
        print("suite mean ms:", {k: round(v["mean_ms"], 4) for k, v in out["suite"].items()}, flush=True)
        for name, v in suite.items():
            print(f"per case {name}:", [round(t, 4) for t in v], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
