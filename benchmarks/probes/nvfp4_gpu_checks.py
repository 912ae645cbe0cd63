"""Op B's GPU checks in one process (no pytest, no conftest): the ``gpu`` tests of
tests/fast/test_fast_nvfp4_qkv_rope.py called directly, and every candidate table of
nvfp4_tables.py against the float64 oracle on a ragged 3 x 333 batch (every element within
bf16 rounding) and against the production kernel bit for bit where they compute the same
products in the same order.

    PYTHONPATH=src:benchmarks/probes:tests python3 benchmarks/probes/nvfp4_gpu_checks.py
"""
from __future__ import annotations

import sys
import time
import traceback

import torch

from fuseval.runner import isolation
from fuseval.operators import load
from fuseval.inputs import generate_inputs
from fuseval.operators.nvfp4_qkv_rope import fast
from fuseval.operators.nvfp4_qkv_rope import reference as ref

import nvfp4_tables  # noqa: E402
import test_fast_nvfp4_qkv_rope as T  # noqa: E402


def candidates_against_the_oracle() -> int:
    """Prints one line per candidate; returns how many are not within rounding of the oracle."""
    defn = load("nvfp4_qkv_rope", "seed")
    inputs = generate_inputs(defn, {"seq_len": 333, "batch_size": 3}, seed=19, device="cuda")
    refs = ref.reference(*inputs)
    production = fast.forward(*inputs)
    failures = 0
    for name, options in nvfp4_tables.CANDIDATES.items():
        label = ", ".join(f"{k}={v}" for k, v in options.items())
        try:
            outs = getattr(nvfp4_tables, name)(*inputs)
        except Exception:  # noqa: BLE001 - a candidate that does not run is a finding
            failures += 1
            print(f"FAIL {name} {label} raised", flush=True)
            traceback.print_exc()
            continue
        within = all(bool(T._within_rounding(o, r, 1e-5).all()) for o, r in zip(outs, refs))
        equal = all(torch.equal(a, b) for a, b in zip(outs, production))
        diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(outs, production))
        failures += not within
        print(f"{'PASS' if within else 'FAIL'} {name:10s} {label[:40]:40s} within rounding of the oracle: {within}; "
              f"bit-equal to production: {equal} (max |diff| {diff:.3g})", flush=True)
    return failures


def main() -> int:
    isolation.default_isolation(False).__enter__()     # trusted: the checks run in this process
    failures = candidates_against_the_oracle()
    tests = [(n, getattr(T, n)) for n in dir(T) if n.startswith("test_gpu_") or n.startswith("test_graph_replay_is")]
    for name, fn in tests:
        t0 = time.time()
        params = getattr(fn, "pytestmark", [])
        configs = [m.args[1] for m in params if m.name == "parametrize" and m.args[0] == "config"]
        flags = [m.args[1] for m in params if m.name == "parametrize" and m.args[0] == "per_token"]
        calls = [dict(config=c) for c in configs[0]] if configs else (
            [dict(per_token=f) for f in flags[0]] if flags else [{}])
        for kw in calls:
            try:
                fn(**kw)
                print(f"PASS {name} {kw} ({time.time() - t0:.1f}s)", flush=True)
            except Exception:  # noqa: BLE001 - report every failing test, then exit non-zero
                failures += 1
                print(f"FAIL {name} {kw}", flush=True)
                traceback.print_exc()
    print(f"{failures} failure(s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
