"""CPU smoke tests of the maintained benchmark tools (benchmarks/README.md).

Each tool runs once with its smallest options (the ``tiny`` configuration, one case; the
Python tools through their ``main(argv)``, run_gpu.sh as a command); its outputs must name
every operator it covered and carry finite numbers. A deliberately wrong implementation
(outputs scaled by 1.5) must turn each tool's exit status to 1, and a copy of run_gpu.sh
that returns the status of ``tee`` instead of the bench's must be told apart from the
real one.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fuseval import operators
from fuseval.operators.implementations import get

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
# the operators shipped with fuseval (tests may register toy operators of their own)
OPS = [op for op in operators.names() if operators.spec(op).package.startswith("fuseval.operators.")]

BROKEN_MODULE = '''
from fuseval.operators.implementations import get

def scaled(*inputs):
    """{op}'s torch baseline with every output scaled by 1.5."""
    return tuple(o * 1.5 for o in get("{op}", "tiny").implementation("torch")(*inputs))
'''


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    env.pop("OUT", None)
    env.update(extra)
    return env


def _load_tool(name: str):
    """A benchmark script as a module, to call its main() in this process."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{Path(name).stem}", BENCH / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _finite_numbers(values) -> list[float]:
    numbers = [float(v) for v in values]
    assert numbers and all(math.isfinite(v) for v in numbers), values
    return numbers


@pytest.fixture
def broken_impl(tmp_path, monkeypatch):
    """'module:function' of a wrong implementation of the first operator, importable here."""
    (tmp_path / "broken_impl.py").write_text(BROKEN_MODULE.format(op=OPS[0]))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "broken_impl:scaled"


# --------------------------------------------------------------------------- oracle_timing.py
def test_oracle_timing_times_every_shipped_operator_on_the_cpu(tmp_path, capsys):
    assert len(OPS) >= 2, f"expected the shipped operators, found {OPS}"
    out = tmp_path / "out"
    rc = _load_tool("oracle_timing.py").main(["--ops", ",".join(OPS), "--device", "cpu", "--config", "tiny",
                                              "--cases", "0", "--reps", "1", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    report = json.loads((out / "oracle_timing.json").read_text())
    assert report["device"] == "cpu" and report["config"] == "tiny"
    assert sorted(row["op"] for row in report["rows"]) == sorted(OPS)
    for row in report["rows"]:
        assert row["case"] == 0 and row["impl"] == "torch" and row["impl_passed"] is True, row
        assert _finite_numbers([row["gen_s"], row["oracle_f64_s"]])[1] > 0
        assert all(0.0 <= m <= 1.0 for m in _finite_numbers(row["matched"].values()))
        _finite_numbers(row["max_abs"].values())
    table = stdout.splitlines()
    for op in OPS:
        line = next(line for line in table if line.startswith(op + " "))
        assert "torch: pass" in line and "max_abs [" in line, line


def test_oracle_timing_fails_a_wrong_implementation(tmp_path, broken_impl, capsys):
    tool = _load_tool("oracle_timing.py")
    rc = tool.main(["--ops", OPS[0], "--device", "cpu", "--config", "tiny", "--cases", "0", "--reps", "1",
                    "--impls", f"{OPS[0]}={broken_impl}", "--out", str(tmp_path)])
    assert rc == 1
    assert f"{broken_impl}: FAIL" in capsys.readouterr().out


def test_oracle_timing_rejects_an_unknown_operator(capsys):
    tool = _load_tool("oracle_timing.py")
    with pytest.raises(SystemExit) as exc:
        tool.main(["--ops", "no_such_op", "--device", "cpu"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "no_such_op" in err and OPS[0] in err


# --------------------------------------------------------------------------- fidelity_acceptance.py
def test_fidelity_acceptance_gives_three_verdicts_per_case_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "out"
    rc = _load_tool("fidelity_acceptance.py").main(["--impl", "torch", "--ops", ",".join(OPS), "--config", "tiny",
                                                    "--cases", "0", "--device", "cpu", "--out", str(out)])
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    report = json.loads((out / "fidelity.json").read_text())
    with_sol = [op for op in OPS if "sol_reference" in get(op, "tiny").definition.implementations]
    assert with_sol and sorted(row["op"] for row in report["rows"]) == sorted(with_sol)
    for row in report["rows"]:
        for verdict in ("impl_vs_oracle", "predicted_benchmark", "sol_reference_vs_oracle"):
            assert row[verdict]["passed"] is True, (row["op"], verdict, row[verdict])
            assert all(0.0 <= m <= 1.0 for m in _finite_numbers(row[verdict]["matched"].values()))
        _finite_numbers(row["impl_vs_oracle"]["max_abs"].values())
    text = (out / "fidelity.txt").read_text()
    assert text.strip() == stdout.strip()
    for op in with_sol:
        assert f"{op}: torch vs oracle 1/1, predicted benchmark 1/1, sol_reference vs oracle 1/1" in text


def test_fidelity_acceptance_fails_a_wrong_implementation(tmp_path, broken_impl, capsys):
    tool = _load_tool("fidelity_acceptance.py")
    rc = tool.main(["--impl", broken_impl, "--ops", OPS[0], "--config", "tiny", "--cases", "0",
                    "--device", "cpu", "--out", str(tmp_path)])
    assert rc == 1
    out = capsys.readouterr().out
    assert f"{broken_impl}: FAIL" in out
    assert f"{OPS[0]}: {broken_impl} vs oracle 0/1, predicted benchmark 0/1, sol_reference vs oracle 1/1" in out


# --------------------------------------------------------------------------- run_gpu.sh
def _run_gpu(script: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), OPS[0], "--config", "tiny", "--cases", "0", "--no-plot", *args],
                          cwd=out.parent, env=_env(OUT=str(out), PYTHON=sys.executable),
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the path without a GPU (with one it benchmarks)")
def test_run_gpu_passes_the_bench_exit_status_through_without_a_gpu(tmp_path):
    out = tmp_path / "out"
    # --require-gpu: the bench skips and exits 6 (no device), through the pipe into tee
    r = _run_gpu(BENCH / "run_gpu.sh", out, "--require-gpu")
    assert r.returncode == 6, r.stdout + r.stderr
    bench = json.loads((out / OPS[0] / "bench.json").read_text())
    assert bench["op"] == OPS[0] and "no CUDA device" in bench["skipped"]
    assert "skipped" in (out / OPS[0] / "bench.log").read_text()
    # the mutant: the same script returning tee's status hides that failure
    mutant = tmp_path / "run_gpu_mutant.sh"
    text = (BENCH / "run_gpu.sh").read_text()
    assert 'status="${PIPESTATUS[0]}"' in text and "set -uo pipefail" in text
    mutant.write_text(text.replace('status="${PIPESTATUS[0]}"', "status=$?").replace("set -uo pipefail", "set -u"))
    # the mutant lives outside the checkout: point it back at the real one's src/
    mutant.write_text(mutant.read_text().replace('root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"',
                                                 f'root="{ROOT}"'))
    assert _run_gpu(mutant, out, "--require-gpu").returncode == 0
