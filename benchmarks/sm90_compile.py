"""Compile op A's Triton kernels for sm_90 (H200) on a machine without a GPU, and report
what each config costs: shared memory, registers, spills, wgmma count. A config that
needs more than the 227 KB of shared memory, or spills heavily, is not worth device time.

    PYTHONPATH=src python benchmarks/sm90_compile.py [--only qkv,o_proj,...] [--table] [--precision fp16]

How: Triton is imported without the interpreter and with a stand-in driver that reports
an sm_90 target; the launchers run in ``compile_only`` mode (``kernel.warmup``), which
compiles without launching. ptxas from Triton's wheel gives registers and spills. Op B's Gluon
kernel: ``--gluon CONFIGS``; op B's Triton kernels: benchmarks/probes/nvfp4_sm90_compile.py.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)
CACHE = tempfile.mkdtemp(prefix="sm90_cache_")
os.environ["TRITON_CACHE_DIR"] = CACHE

import torch  # noqa: E402

torch.cuda.is_available = lambda: True          # keep fuseval.fast from selecting the interpreter

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402


class _Sm90Driver:
    """Enough of a CUDA driver for ``warmup``: device 0, stream 0, target sm_90."""

    def __init__(self, real):
        self._real = real

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def __getattr__(self, name):
        return getattr(self._real, name)


def _install_driver():
    from triton.backends.nvidia.driver import CudaDriver
    real = object.__new__(CudaDriver)
    try:
        real.__init__()
    except Exception:  # noqa: BLE001 - no libcuda here; only the compiler is needed
        pass
    driver.set_active(_Sm90Driver(real))


def _ptxas():
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def _report(before: set[str]):
    """Shared memory, registers and spills of the kernels compiled since ``before``."""
    rows = []
    for meta_path in glob.glob(os.path.join(CACHE, "*", "*.json")):
        d = os.path.dirname(meta_path)
        if d in before or os.path.basename(meta_path).startswith("__grp__"):
            continue
        meta = json.load(open(meta_path))
        ptx = meta_path[:-5] + ".ptx"
        out = subprocess.run([_ptxas(), "-arch=sm_90a", "-v", ptx, "-o", os.devnull],
                             capture_output=True, text=True).stderr
        regs = spill = 0
        for line in out.splitlines():
            if "Used" in line and "registers" in line:
                regs = int(line.split("Used")[1].split("registers")[0])
            if "spill stores" in line:
                spill = int(line.split("bytes spill stores")[0].split(",")[-1])
        src = open(ptx).read()
        rows.append((meta["name"], meta["shared"], regs, spill, src.count("wgmma.mma_async")))
    return rows


HEADER = f"{'kernel':10s} {'variant':18s} {'smem KB':>8s} {'regs':>5s} {'spill B':>8s} {'wgmma':>6s}  compile s"
SMEM_LIMIT = 232448                               # bytes of shared memory per block on an H200


def _compile_and_report(kind: str, name: str, compile_fn) -> None:
    """Run ``compile_fn`` (which compiles one or more kernels into the cache) and print a
    row per kernel it added; a compile error is printed as a row too (it is a result)."""
    before = set(glob.glob(os.path.join(CACHE, "*")))
    t0 = time.time()
    try:
        compile_fn()
    except Exception as exc:  # noqa: BLE001 - a failed variant is a result
        print(f"{kind:10s} {name:18s} FAILED {type(exc).__name__}: {str(exc)[-3000:]}", flush=True)
        return
    for row in _report(before):
        fits = "" if row[1] <= SMEM_LIMIT else "  (does not fit: > 227 KB)"
        print(f"{kind:10s} {name:18s} {row[1] / 1024:8.1f} {row[2]:5d} {row[3]:8d} {row[4]:6d}"
              f"  {time.time() - t0:.1f}{fits}", flush=True)


def _nvfp4_gluon(configs: list[str], tokens: int) -> None:
    """Op B's Gluon kernel: compile each 'BM,BK,STAGES[,HEADS_PER_TILE[,W_AS_A]]' config."""
    from fuseval.operators import load
    from fuseval.operators.nvfp4_qkv_rope import _gluon as G
    from fuseval.inputs import generate_inputs
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    defn = load("nvfp4_qkv_rope")
    inputs = generate_inputs(defn, {"seq_len": tokens, "batch_size": 1}, seed=0, device=torch.device("cpu"))
    (x, cos, sin, wq, sq, gq, wk, sk, gk, wv, sv, gv, qn, kn, eps) = inputs
    u8 = [t.view(torch.uint8) for t in (wq, sq, wk, sk, wv, sv)]
    out = torch.empty(1, dtype=torch.bfloat16)
    for text in configs:
        given = [int(v) for v in text.split(",")]
        bm, bk, stages, hpt, w_as_a, warps = given + [1, 0, 8][len(given) - 3:]
        layout = gl.NVMMASharedLayout.get_default_for([bm, bk], gl.bfloat16)
        x_desc = TensorDescriptor.from_tensor(x.view(-1, x.shape[-1]), [bm, bk], layout)
        _compile_and_report("gluon", text, lambda: G.nvfp4_qkv_rope_gluon_kernel.warmup(
            x_desc, cos, sin, *u8, x, float(gq), float(gk), float(gv), qn, kn, float(eps),
            out, out, out, tokens, tokens, K=x.shape[-1], HQ=32, HKV=8, BM=bm, BK=bk, STAGES=stages,
            HPT=hpt, W_AS_A=bool(w_as_a), GS_FROM_PTR=False, num_warps=warps, grid=(1,)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--table", action="store_true",
                    help="op A: compile the module's H200 table (each distinct config once) instead of "
                         "the exploration's variant space")
    ap.add_argument("--precision", default="tf32", choices=("tf32", "fp16"),
                    help="op A: the precision policy (and, with --table, its table)")
    ap.add_argument("--gluon", default="", help="op B Gluon configs 'BM,BK,STAGES[,HPT[,W_AS_A[,WARPS]]]', ';'-separated")
    args = ap.parse_args()
    _install_driver()
    print(HEADER)
    if args.gluon:
        _nvfp4_gluon(args.gluon.split(";"), args.tokens)
        return
    from fuseval.operators.qwen2vl_decoder_layer import fast as F
    sys.path.insert(0, os.path.dirname(__file__))
    import qwen2vl_breakdown as B                  # variant_space and kernel_calls
    B.DEVICE = "cpu"
    W = B.make_weights("cpu", empty=True)
    act = B.make_activations(1, args.tokens, "cpu", empty=True)
    sh = F.shape_of(B.inputs_of(W, act))
    only = set(filter(None, args.only.split(",")))
    space = B.variant_space()
    if args.table:
        tables = F.tables(args.precision)
        space = {kind: {f"table@{size}": cfg for size, cfg in rows.items()} for kind, rows in tables.gemm.items()}
        space["attention"] = {f"table@S{size}": cfg for size, cfg in tables.attention.items()}
        for kind, rows in space.items():       # each distinct config once
            seen = set()
            space[kind] = {name: cfg for name, cfg in rows.items() if not (cfg in seen or seen.add(cfg))}
    for kind, variants in space.items():
        if only and kind not in only:
            continue
        for name, cfg in variants.items():
            plan = F.plan_for(sh, torch.device("cuda"), args.precision, tuning=B.tuning_for(kind, cfg))

            def compile_kernel():
                with F.compile_only():
                    B.kernel_calls(W, act, plan, args.precision)[kind]()
            _compile_and_report(kind, name, compile_kernel)


if __name__ == "__main__":
    main()
