"""The GPU-only kernels compile for the H200 (sm_90) on a machine without a GPU.

CI has no GPU, so nothing else there would notice a change that breaks the compiled
path: the Gluon kernel of op B never runs under the interpreter, and op A's TMA /
warp-specialized variants run there only as numpy. benchmarks/sm90_compile.py compiles
them with Triton's own ptxas against a stand-in sm_90 driver (in a subprocess, since it
replaces Triton's active driver) and reports shared memory and registers; a config that
does not compile, or needs more than the 227 KB of shared memory an H200 SM offers,
fails here.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "sm90_compile.py"


def _compile(*args: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line and not line.startswith("kernel")]


@pytest.mark.parametrize("configs", ["256,64,4,1,1;256,64,5"])
def test_op_b_gluon_kernel_compiles_for_sm90(configs):
    rows = _rows(_compile("--gluon", configs, "--tokens", "512"))
    assert len(rows) == len(configs.split(";")), rows
    for row in rows:
        assert "FAILED" not in row, row
        smem_kb, spill = float(row[2]), int(row[4])
        assert smem_kb <= 227 and spill <= 64, row


def test_op_a_table_kernels_compile_for_sm90():
    """The QKV and attention kernels of op A's H200 table (TMA variants included)."""
    rows = _rows(_compile("--table", "--only", "qkv,attention", "--tokens", "512"))
    failed = [r for r in rows if "FAILED" in r]
    assert rows and not failed, failed


def test_op_a_gemm_table_compiles_for_sm90():
    """Every GEMM config of op A's H200 table, the Gluon warp-specialized rows included."""
    rows = _rows(_compile("--table", "--only", "o_proj,gate_up,down", "--tokens", "512"))
    failed = [r for r in rows if "FAILED" in r]
    assert rows and not failed, failed
    for row in rows:
        assert float(row[2]) <= 227, row
