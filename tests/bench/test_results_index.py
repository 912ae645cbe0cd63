"""The results index (benchmarks/results_index.py) and run_gpu.sh's RECORD step.

On a temporary results folder with fake runs (two of one operator on different dates, one of
another): the table holds each operator's latest run, with figures computed from its cases;
the text outside the markers is kept byte for byte; ``--check`` passes on what the tool wrote
and fails after a hand edit. ``record`` replaces an operator's previous run and refuses a
skipped bench; run_gpu.sh with ``RECORD=1`` records a real (CPU, tiny) bench end to end. The
repository's own index must be in sync with its files.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "benchmarks" / "results_index.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("benchmark_results_index", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ri = _load_tool()

HEAD = "# Results\n\nHand-written text before the table: 1.234 ms stays as it is.\n\n## Latest\n\n"
TAIL = "\n\nHand-written text after the table | with a pipe |\n"
COPY_BW = 4e12
BF16 = 800e12


def fake_run(op: str, medians: dict[str, list[float]], *, passed: dict[str, list[bool]] | None = None,
             floors: list[float] | None = None, record: dict | None = None) -> dict:
    """A bench.json as `fuseval bench` writes it, with what the index reads."""
    n = len(next(iter(medians.values())))
    floors = floors or [0.5] * n
    impls = list(medians)
    cases = []
    for i in range(n):
        cases.append({
            "case": i, "axes": {"seq_len": 128 * (i + 1)},
            "timings": {impl: {"median_ms": medians[impl][i], "reps": 100} for impl in impls},
            "flops": BF16 * floors[i] / 1e3, "bytes": 1e6, "floor_ms": floors[i], "bound": "compute",
            "floor_sustained_ms": None, "floors_at_ms": {},
            "check": {impl: {"passed": (passed or {}).get(impl, [True] * n)[i], "violations": [],
                             "outputs": {"out": {"max_abs": 1e-3 * (2 if impl == "fast" else 3),
                                                 "matched_ratio": 1.0}}} for impl in impls}})
    data = {"op": op, "config": "seed", "device": "NVIDIA Test GPU", "seed": 1, "mode": "benchmark",
            "impls": impls, "fast": "fast",
            "ceilings": {"device_name": "NVIDIA Test GPU", "copy_bytes_per_s": COPY_BW,
                         "matmul_flops_per_s": {"bf16": BF16, "tf32": BF16 / 2},
                         "sustained_matmul_flops_per_s": {}, "sustained_s": 0.0},
            "settings": {"warmup_ms": 30.0, "rep_ms": 150.0, "min_reps": 10, "max_reps": 500,
                         "l2_flush_bytes": 1 << 28, "check": True, "hygiene": True},
            "cases": cases, "summary": {"suite_mean_ms": {"stale": "the index must not read this"}}}
    if record:
        data["record"] = record
    return data


def write_run(results: Path, folder: str, data: dict, stem: str = "bench") -> Path:
    d = results / folder
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{stem}.json").write_text(json.dumps(data, indent=1))
    (d / f"{stem}.txt").write_text(f"{data['op']} table\n")
    return d


@pytest.fixture
def results(tmp_path) -> Path:
    """Two runs of op_x (2026-01-05 and, later, 2026-03-01), one of op_y, and an index."""
    res = tmp_path / "results"
    write_run(res, "gpu-2026-01-05-op_x", fake_run("op_x", {"fast": [9.0, 9.0], "torch": [90.0, 90.0]}))
    write_run(res, "gpu-2026-03-01-op_x/bench", fake_run("op_x", {"fast": [1.0, 2.0], "torch": [3.0, 6.0]},
                                                         passed={"torch": [True, False]}))
    write_run(res, "gpu-2026-02-10-op_y", fake_run(
        "op_y", {"fast": [0.25, 0.75], "torch": [1.0, 1.0]},
        record={"date": "2026-02-10", "command": "bash benchmarks/run_gpu.sh op_y", "device": "NVIDIA Test GPU"}),
        stem="bench_y")
    (res / "notes").mkdir()
    (res / "notes" / "other.json").write_text('{"not": "a run"}')
    (res / "README.md").write_text(HEAD + ri.BEGIN + "\nan old table\n" + ri.END + TAIL)
    return res


def _rows(readme: Path) -> dict[str, list[str]]:
    """op -> the cells of its row in the marked table."""
    block = readme.read_text().split(ri.BEGIN)[1].split(ri.END)[0]
    rows = {}
    for line in block.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            rows[cells[0].split("`")[1]] = cells
    return rows


def test_the_index_holds_the_latest_run_per_operator_with_figures_from_its_cases(results, capsys):
    assert ri.main(["--results", str(results)]) == 0
    rows = _rows(results / "README.md")
    assert sorted(rows) == ["op_x", "op_y"]
    op, date, device, command, suite, floor, share, verdicts, files = rows["op_x"]
    assert date == "2026-03-01"                                     # not the 2026-01-05 run
    assert device == "NVIDIA Test GPU"
    # the mean of the case medians (1.0, 2.0 and 3.0, 6.0), not the old run's 9.0 nor the summary
    assert suite == "fast **1.5**, torch 4.5 (3.00x)"
    assert floor == "0.5 (bf16 800 TFLOP/s)"
    assert share == "33.3%"
    assert verdicts.startswith("fast 2/2, torch 1/2;")
    assert "no larger than torch's in 2/2 (case, output) pairs" in verdicts
    assert files == "[`gpu-2026-03-01-op_x/bench/bench.{json,txt}`](gpu-2026-03-01-op_x/bench/)"
    assert command.startswith("`fuseval bench --op op_x --impls fast,torch --cases 0-1 --check --sustained-s 0`")
    assert "rebuilt" in command
    op, date, device, command, suite, floor, share, verdicts, files = rows["op_y"]
    assert (date, command) == ("2026-02-10", "`bash benchmarks/run_gpu.sh op_y`")
    assert suite == "fast **0.5**, torch 1 (2.00x)" and share == "100.0%"
    assert files == "[`gpu-2026-02-10-op_y/bench_y.{json,txt}`](gpu-2026-02-10-op_y/)"


def test_text_outside_the_markers_is_kept(results):
    assert ri.main(["--results", str(results)]) == 0
    text = (results / "README.md").read_text()
    assert text.startswith(HEAD + ri.BEGIN + "\n") and text.endswith("\n" + ri.END + TAIL)
    assert "an old table" not in text
    # a second run changes nothing
    assert ri.main(["--results", str(results)]) == 0
    assert (results / "README.md").read_text() == text


def test_check_passes_on_the_written_table_and_fails_after_a_hand_edit(results, capsys):
    assert ri.main(["--results", str(results), "--check"]) == 1      # the old table
    assert ri.main(["--results", str(results)]) == 0
    assert ri.main(["--results", str(results), "--check"]) == 0
    readme = results / "README.md"
    text = readme.read_text()
    assert "fast **1.5**" in text
    readme.write_text(text.replace("fast **1.5**", "fast **1.4**"))
    capsys.readouterr()
    assert ri.main(["--results", str(results), "--check"]) == 1
    assert "+| `op_x`" in capsys.readouterr().out                   # the diff names the row
    # an edit outside the markers is no concern of the check
    readme.write_text(text.replace("stays as it is", "was edited"))
    assert ri.main(["--results", str(results), "--check"]) == 0


def test_a_readme_without_markers_is_a_usage_error(results, tmp_path, capsys):
    (results / "README.md").write_text(HEAD + TAIL)
    before = sorted(p.relative_to(results) for p in results.rglob("*"))
    assert ri.main(["--results", str(results), "--check"]) == 2
    assert ri.main(["--results", str(results)]) == 2
    # record checks the index before it moves a file
    out = _bench_out(tmp_path, fake_run("op_x", {"fast": [5.0]}), "# run_gpu.sh 2026-04-02T10:00:00Z: cmd")
    assert ri.main(["--results", str(results), "record", str(out)]) == 2
    assert (results / "README.md").read_text() == HEAD + TAIL
    assert sorted(p.relative_to(results) for p in results.rglob("*")) == before


def test_the_repository_index_is_in_sync_with_its_runs(capsys):
    rc = ri.main(["--check"])
    assert rc == 0, "benchmarks/results/README.md differs from its runs (run benchmarks/results_index.py):\n" \
        + capsys.readouterr().out


def _bench_out(tmp_path: Path, data: dict, header: str | None) -> Path:
    out = tmp_path / "out" / data["op"]
    out.mkdir(parents=True)
    (out / "bench.json").write_text(json.dumps(data))
    (out / "bench.txt").write_text("the table\n")
    (out / "bench.log").write_text((header + "\n" if header else "") + "the bench's output\n")
    return out


def test_record_replaces_the_operators_previous_runs_and_rewrites_the_index(results, tmp_path):
    out = _bench_out(tmp_path, fake_run("op_x", {"fast": [5.0], "torch": [10.0]}),
                     "# run_gpu.sh 2026-04-02T10:00:00Z: bash benchmarks/run_gpu.sh op_x --rep-ms 50")
    assert ri.main(["--results", str(results), "record", str(out)]) == 0
    new = results / "test-gpu-2026-04-02-op_x"
    assert sorted(p.name for p in new.iterdir()) == ["bench.json", "bench.txt"]
    data = json.loads((new / "bench.json").read_text())
    assert data["record"]["command"] == "bash benchmarks/run_gpu.sh op_x --rep-ms 50"
    assert data["record"]["date"] == "2026-04-02" and data["cases"][0]["timings"]["fast"]["median_ms"] == 5.0
    # both earlier op_x runs are gone (their folders too), op_y's and the other files stay
    assert not (results / "gpu-2026-01-05-op_x").exists() and not (results / "gpu-2026-03-01-op_x").exists()
    assert (results / "gpu-2026-02-10-op_y" / "bench_y.json").exists() and (results / "notes").exists()
    rows = _rows(results / "README.md")
    assert rows["op_x"][1] == "2026-04-02" and rows["op_x"][3] == "`bash benchmarks/run_gpu.sh op_x --rep-ms 50`"
    assert rows["op_x"][4] == "fast **5**, torch 10 (2.00x)"
    assert ri.main(["--results", str(results), "--check"]) == 0


def test_record_refuses_a_skipped_bench_or_no_command(results, tmp_path, capsys):
    before = sorted(p.relative_to(results) for p in results.rglob("*"))
    out = tmp_path / "skipped"
    out.mkdir()
    (out / "bench.json").write_text(json.dumps({"op": "op_x", "skipped": "no CUDA device"}))
    (out / "bench.txt").write_text("")
    assert ri.main(["--results", str(results), "record", str(out)]) == 1
    assert "the bench was skipped (no CUDA device)" in capsys.readouterr().err
    out = _bench_out(tmp_path, fake_run("op_x", {"fast": [5.0]}), header=None)
    assert ri.main(["--results", str(results), "record", str(out)]) == 1
    assert "no command" in capsys.readouterr().err
    assert sorted(p.relative_to(results) for p in results.rglob("*")) == before


def test_the_rebuilt_command_knows_the_bench_defaults():
    """BENCH_DEFAULTS (to rebuild an old run's command) are `fuseval bench`'s defaults."""
    import argparse

    from fuseval.commands import bench
    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    defaults = vars(p.parse_args(["--op", "x"]))
    for key, value in ri.BENCH_DEFAULTS.items():
        assert defaults[key] == value, key


def test_run_gpu_records_a_successful_bench_with_record_1(tmp_path):
    """RECORD=1: the driver's own bench (CPU, tiny, one case) becomes the official run."""
    from fuseval import operators
    op = next(o for o in operators.names() if operators.spec(o).package.startswith("fuseval.operators."))
    res = tmp_path / "results"
    write_run(res, "gpu-2026-01-05-" + op, fake_run(op, {"fast": [9.0], "torch": [90.0]}))
    (res / "README.md").write_text(HEAD + ri.BEGIN + "\n" + ri.END + TAIL)
    env = dict(os.environ, OUT=str(tmp_path / "out"), RESULTS=str(res), RECORD="1", PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    r = subprocess.run(["bash", str(ROOT / "benchmarks" / "run_gpu.sh"), op, "--device", "cpu", "--config", "tiny",
                        "--cases", "0", "--impls", "torch", "--no-plot"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    folders = [p for p in res.iterdir() if p.is_dir()]
    assert len(folders) == 1 and folders[0].name.endswith("-" + op) and folders[0].name != "gpu-2026-01-05-" + op
    data = json.loads((folders[0] / "bench.json").read_text())
    assert data["record"]["command"].startswith(f"bash benchmarks/run_gpu.sh {op} --device cpu")
    row = _rows(res / "README.md")[op]
    assert row[1] == data["record"]["date"] and "torch 1/1" in row[7]
    assert (res / "README.md").read_text().startswith(HEAD) and (res / "README.md").read_text().endswith(TAIL)
