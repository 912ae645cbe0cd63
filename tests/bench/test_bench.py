"""The benchmark harness: cost model, floor, timing, report, outputs, CLI skip without a GPU."""
from __future__ import annotations

import json
import time

import pytest
import torch

from fuseval import bench, operators
from fuseval.bench import render as bench_render
from fuseval.cli import main as cli_main
from fuseval.operators import load
from fuseval.errors import EXIT_NO_DEVICE, EXIT_OK
from fuseval.operators.nvfp4_qkv_rope import reference as op_b

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")

# SPEC.md's H200 numbers: copy 4.2 TB/s, bf16 matmul 789 TFLOP/s, op B floor about 0.27 ms
SPEC_CEILINGS = bench.Ceilings("spec H200", 4.2e12, {"bf16": 789e12, "tf32": 411e12, "fp32": 51e12})


def test_cost_model_of_op_b_counts_the_gemm_and_each_byte_once():
    axes = load("nvfp4_qkv_rope").resolve_axes({"seq_len": 128, "batch_size": 2})
    cost = op_b.cost_model(axes)
    tokens, n, k = 256, 4096 + 2 * 1024, 4096
    assert cost["flops"] == 2 * tokens * n * k
    expected_bytes = (tokens * k * 2 + 2 * tokens * 128 * 2 + n * k // 2 + n * k // 16 + 2 * 128 * 2
                      + tokens * n * 2)
    assert cost["bytes"] == expected_bytes
    assert cost["matmul_dtype"] == "bf16"


def test_floor_of_op_b_matches_the_spec_figure():
    defn = load("nvfp4_qkv_rope")
    floors = [bench.floor_seconds(op_b.cost_model(defn.resolve_axes(c.axes)), SPEC_CEILINGS)
              for c in defn.cases()]
    mean_ms = 1e3 * sum(f for f, _ in floors) / len(floors)
    assert 0.26 < mean_ms < 0.28
    assert {b for _, b in floors} == {"compute"}


def test_floor_is_the_larger_term():
    c = bench.Ceilings("x", 1e12, {"bf16": 1e15})
    assert bench.floor_seconds({"flops": 1e15, "bytes": 1e9, "matmul_dtype": "bf16"}, c) == (1.0, "compute")
    assert bench.floor_seconds({"flops": 1e9, "bytes": 2e12, "matmul_dtype": "bf16"}, c) == (2.0, "memory")
    with pytest.raises(ValueError, match="fp8"):
        bench.floor_seconds({"flops": 1, "bytes": 1, "matmul_dtype": "fp8"}, c)


def test_floor_at_the_sustained_rate_uses_the_sustained_matmul_ceiling():
    c = bench.Ceilings("x", 1e12, {"tf32": 400e12}, {"tf32": 200e12}, 4.0)
    compute = {"flops": 400e12, "bytes": 1e9, "matmul_dtype": "tf32"}
    assert bench.floor_seconds(compute, c) == (1.0, "compute")
    assert bench.floor_seconds(compute, c, sustained=True) == (2.0, "compute")
    memory = {"flops": 1e9, "bytes": 3e12, "matmul_dtype": "tf32"}
    assert bench.floor_seconds(memory, c, sustained=True) == (3.0, "memory")
    with pytest.raises(ValueError, match="sustained matmul ceiling for dtype 'bf16'"):
        bench.floor_seconds({"flops": 1, "bytes": 1, "matmul_dtype": "bf16"}, c, sustained=True)


def test_sustained_rate_is_the_rate_of_the_second_half():
    """A call that slows down after 0.3 s (as a GPU does when it meets its power cap):
    the steady rate must be the slow one and the burst rate the fast one; a rate over
    all calls would lie in between and fail."""
    t_start = []

    def slowing():
        now = time.perf_counter()
        t_start.append(now)
        time.sleep(0.001 if now - t_start[0] < 0.3 else 0.003)

    r = bench.sustained_rate(slowing, 1e6, 0.9, device="cpu", idle_s=0.0)
    assert r.steady_flops_per_s == pytest.approx(1e6 / 3.1e-3, rel=0.25)
    assert r.burst_flops_per_s == pytest.approx(1e6 / 1.1e-3, rel=0.35)
    assert r.calls == len(t_start) - 1                  # one untimed call first
    t0, t1 = r.steady_interval
    assert t1 - t0 == pytest.approx(r.seconds / 2, rel=0.1)
    with pytest.raises(ValueError, match="seconds"):
        bench.sustained_rate(slowing, 1.0, 0.0, device="cpu")


def test_time_call_reports_the_median_on_the_cpu():
    calls = []

    def sleepy():
        calls.append(1)
        time.sleep(0.002)

    t = bench.time_call(sleepy, device="cpu", warmup_ms=5, rep_ms=40, min_reps=5, max_reps=12)
    assert 1.9 <= t.median_ms < 6.0
    assert 5 <= t.reps <= 12 and len(calls) >= t.reps + 2
    assert t.min_ms <= t.p20_ms <= t.median_ms <= t.p80_ms


def test_timing_quantiles():
    t = bench.Timing.from_samples([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (t.median_ms, t.min_ms, t.p20_ms, t.p80_ms, t.reps) == (3.0, 1.0, 2.0, 4.0, 5)


def test_bench_spec_reads_the_operator_pieces():
    spec = bench.bench_spec(load("nvfp4_qkv_rope"))
    assert spec.impls == ["torch", "torch_cached", "fast"]
    assert spec.fast == "fast" and spec.baselines == ["torch", "torch_cached"]
    assert spec.cost_model is op_b.cost_model
    spec = bench.bench_spec(load("nvfp4_qkv_rope"), ["torch"])
    assert spec.fast is None and spec.baselines == ["torch"]
    spec = bench.bench_spec(load("qwen2vl_decoder_layer"))
    assert "fast" in spec.impls and not any(i.startswith("reference") for i in spec.impls)


def _report(check=False, sustained=False) -> bench.BenchReport:
    cases = []
    for i, (fast_ms, torch_ms, floor_ms) in enumerate([(0.5, 2.0, 0.25), (1.5, 4.0, 1.25)]):
        cb = bench.CaseBench(i, {"seq_len": 128 * (i + 1), "batch_size": 1},
                             {"fast": {"median_ms": fast_ms}, "torch": {"median_ms": torch_ms}},
                             flops=1e9, bytes=1e6, floor_ms=floor_ms, bound="compute",
                             floor_sustained_ms=1.25 * floor_ms if sustained else None)
        if check:
            cb.check = {name: {"passed": True, "violations": [], "messages": [], "seed": 0,
                               "outputs": {"out": {"max_abs": err, "mean_abs": 0, "rel_l2": 0,
                                                   "matched_ratio": ratio}}}
                        for name, err, ratio in (("fast", 1e-3, 0.999), ("torch", 2e-3, 0.98))}
        cases.append(cb)
    ceilings = dict(SPEC_CEILINGS.__dict__)
    if sustained:
        ceilings.update(sustained_matmul_flops_per_s={"bf16": 0.8 * 789e12}, sustained_s=4.0)
    return bench.BenchReport("op", "seed", "fake GPU", 7, "benchmark", ["fast", "torch"], "fast",
                             ceilings, {}, cases)


def test_report_suite_means_floor_fraction_and_speedup():
    s = _report().summary()
    assert s["suite_mean_ms"] == {"fast": 1.0, "torch": 3.0}
    assert s["floor_mean_ms"] == 0.75
    assert s["fraction_of_floor"]["fast"] == pytest.approx(0.75)
    assert s["speedup_of_fast"] == {"torch": 3.0}


def test_write_outputs_json_table_and_plot(tmp_path):
    report = _report(check=True)
    paths = bench_render.write_outputs(report, str(tmp_path))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["bench.json", "bench.png", "bench.txt"]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["summary"]["suite_mean_ms"]["fast"] == 1.0
    assert data["summary"]["cases_passed"] == {"fast": 2, "torch": 2}
    text = (tmp_path / "bench.txt").read_text()
    assert "suite mean over 2 cases" in text and "max abs error no larger in 2/2" in text
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_shows_the_floor_at_the_sustained_rate(tmp_path):
    report = _report(sustained=True)
    s = report.summary()
    assert s["sustained_floor_mean_ms"] == pytest.approx(0.9375)
    assert s["fraction_of_sustained_floor"]["fast"] == pytest.approx(0.9375)
    assert s["fraction_of_floor"]["fast"] == pytest.approx(0.75)      # the burst floor is unchanged
    lines = bench_render.sustained_lines(report)
    assert lines == ["sustained ceilings (second half of 4 s of back-to-back products): "
                     "bf16 631 TFLOP/s (80.0% of the burst ceiling)",
                     "floor at the sustained rate: 0.9375 ms (suite mean); fast reaches 93.8% of it. It binds "
                     "only the cases whose kernels draw the GPU to its power cap (their clock falls below the "
                     "ceilings'); a kernel that runs at full clock can go below it"]
    bench_render.write_outputs(report, str(tmp_path), plot=False)
    text = (tmp_path / "bench.txt").read_text()
    assert "fast % sust. floor" in text and "93.8%" in text and "sustained for 4 s: bf16 631" in text
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["cases"][1]["floor_sustained_ms"] == pytest.approx(1.5625)
    plain = _report()
    assert bench_render.sustained_lines(plain) == [] and "sustained_floor_mean_ms" not in plain.summary()


def test_report_shows_the_floor_at_the_rates_the_cost_model_adds(tmp_path):
    """A cost model's "floors_also_at" gives each case a floor at those matmul rates; the
    summary and the terminal show their means and the fast path's fraction of them."""
    report = _report()
    report.ceilings["matmul_flops_per_s"] = dict(report.ceilings["matmul_flops_per_s"], fp16=756e12)
    for cb, ms in zip(report.cases, (0.125, 0.625)):
        cb.floors_at_ms = {"fp16": ms}
    s = report.summary()
    assert s["floor_mean_at_ms"] == {"fp16": 0.375}
    assert s["fraction_of_floor_at"]["fp16"]["fast"] == pytest.approx(0.375)
    assert s["floor_mean_ms"] == 0.75                                  # the cost model's own floor unchanged
    line = [ln for ln in bench_render.summary_lines(report) if ln.startswith("floor at the fp16")]
    assert line == ["floor at the fp16 rate (756 TFLOP/s): 0.375 ms (suite mean); fast reaches 37.5% of it"]
    report.cases[1].floors_at_ms = {}                                  # one case without it: no mean
    assert "floor_mean_at_ms" not in report.summary()
    assert "floor_mean_at_ms" not in _report().summary()
    from fuseval.operators.qwen2vl_decoder_layer.reference import cost_model
    cost = cost_model(load("qwen2vl_decoder_layer").resolve_axes({"seq_len": 128, "kv_seq_len": 128,
                                                                  "batch_size": 1}))
    assert cost["floors_also_at"] == ["tf32"]


def test_bench_json_records_the_fast_options_and_the_terminal_shows_them(tmp_path):
    report = _report()
    tiles = {str(2 ** i): {"block_m": 64, "block_n": 128, "num_warps": 8, "num_stages": 3} for i in range(6, 14)}
    report.fast_options = {"attention": {"block_m": 128, "num_warps": 8}, "precision": "tf32",
                           "graph_max_tokens": 512, "tile_table": tiles}
    bench_render.write_outputs(report, str(tmp_path), plot=False)
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["fast_options"] == report.fast_options              # everything, the long table included
    text = (tmp_path / "bench.txt").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("fast options:")]
    # one line: short values in full, the long table by name
    assert lines == ['fast options: attention={"block_m": 128, "num_warps": 8}; graph_max_tokens=512; '
                     'precision=tf32; in bench.json: tile_table']
    report.fast_options = {}
    assert bench_render.fast_options_lines(report) == [
        "fast options: none declared (the operator's spec names no fast_options for 'fast')"]
    report.fast_options, report.fast = None, None          # no fast path timed: nothing to say
    assert bench_render.fast_options_lines(report) == []


def test_bench_json_is_strict_json_with_non_finite_values(tmp_path):
    """A NaN or infinite number (a ratio over a zero latency, a failed metric) is written
    as a string, so every JSON reader accepts the file (json.dump would write NaN)."""
    report = _report(check=True)
    report.cases[0].check["fast"]["outputs"]["out"]["max_abs"] = float("inf")
    report.cases[1].check["torch"]["outputs"]["out"]["rel_l2"] = float("nan")
    bench_render.write_outputs(report, str(tmp_path), plot=False)

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    data = json.loads((tmp_path / "bench.json").read_text(), parse_constant=refuse)
    assert data["cases"][0]["check"]["fast"]["outputs"]["out"]["max_abs"] == "inf"
    assert data["cases"][1]["check"]["torch"]["outputs"]["out"]["rel_l2"] == "nan"


def test_timer_rules_are_what_bench_json_records():
    rules = bench.timer_rules()
    assert rules == {"warmup_ms": bench.WARMUP_MS, "rep_ms": bench.REP_MS, "min_reps": bench.MIN_REPS,
                     "max_reps": bench.MAX_REPS, "l2_flush_bytes": bench.L2_FLUSH_BYTES,
                     "timer": "cuda events, median"}
    assert bench.timer_rules(flush=False)["l2_flush_bytes"] == 0
    assert bench.timer_rules(rep_ms=5)["rep_ms"] == 5


def test_run_bench_rejects_a_negative_sustained_time():
    with pytest.raises(ValueError, match="sustained_s: expected seconds >= 0"):
        bench.run_bench("nvfp4_qkv_rope", device="cpu", sustained_s=-1.0)


@no_cuda
def test_bench_command_skips_cleanly_without_a_gpu(tmp_path, capsys):
    assert cli_main(["bench", "--op", "nvfp4_qkv_rope", "--out", str(tmp_path)]) == EXIT_OK
    assert "skipped" in capsys.readouterr().err
    assert "skipped" in json.loads((tmp_path / "bench.json").read_text())
    assert cli_main(["bench", "--op", "nvfp4_qkv_rope", "--require-gpu"]) == EXIT_NO_DEVICE


@no_cuda
def test_run_bench_skips_cuda_without_a_gpu():
    """Asked for the GPU where there is none, the bench skips; the CPU timer (for tests)
    is only ever asked for by name (tests/bench/test_bench_exploits.py)."""
    with pytest.raises(bench.BenchSkipped):
        bench.run_bench("nvfp4_qkv_rope", device="cuda")


@gpu
@needs_cuda
def test_gpu_run_bench_times_checks_and_floors(tmp_path):
    report = bench.run_bench("nvfp4_qkv_rope", ["fast", "torch_cached"], cases="0", config="small",
                             check=True, rep_ms=5, warmup_ms=2, min_reps=3, max_reps=10, sustained_s=1.0)
    cb = report.cases[0]
    assert cb.timings["fast"]["median_ms"] > 0 and cb.floor_ms > 0
    assert cb.check["fast"]["passed"]
    assert report.ceilings["matmul_flops_per_s"]["bf16"] > 1e13
    clocks = report.settings["clocks"]
    assert clocks["sampled"], clocks                  # nvidia-smi is there wherever a GPU is
    assert clocks["ceilings"]["samples"] >= 1 and 500 < clocks["ceilings"]["sm_mhz_median"] < 3000
    # the sustained bf16 rate: measured, not above the burst one (beyond noise), with its clock
    burst, steady = (report.ceilings[k]["bf16"] for k in ("matmul_flops_per_s", "sustained_matmul_flops_per_s"))
    assert 0.3 * burst < steady < 1.1 * burst
    assert cb.floor_sustained_ms >= 0.9 * cb.floor_ms
    assert clocks["sustained_ceilings"]["bf16"]["samples"] >= 1
    assert report.fast_options == operators.record("nvfp4_qkv_rope").fast_options()
    assert report.settings["l2_flush_bytes"] == bench.L2_FLUSH_BYTES
    bench_render.write_outputs(report, str(tmp_path))
    assert json.loads((tmp_path / "bench.json").read_text())["fast_options"] == report.fast_options


def test_parts_table_shows_each_part_against_its_floor(tmp_path):
    """Parts timed apart are written to bench.json and shown as their own table (ms and
    % of each part's floor, their sum beside the whole call); a part that failed says why."""
    report = _report()
    report.cases[0].parts = {
        "act_quant": {"median_ms": 0.1, "floor_ms": 0.05, "bound": "memory", "flops": 0, "bytes": 2e8,
                      "what": "the quantizer", "error": None},
        "gemm": {"median_ms": 0.3, "floor_ms": 0.24, "bound": "compute", "flops": 1e11, "bytes": 1e8,
                 "what": "the GEMM", "error": None}}
    report.cases[1].parts = {"act_quant": {"median_ms": None, "floor_ms": 0.1, "error": "RuntimeError: capture"},
                             "gemm": {"median_ms": 1.0, "floor_ms": 0.8, "error": None}}
    bench_render.write_outputs(report, str(tmp_path), plot=False)
    text = (tmp_path / "bench.txt").read_text()
    assert "its parts timed apart" in text and "act_quant ms" in text and "gemm ms" in text
    parts_rows = text.split("its parts timed apart")[1].splitlines()
    row0 = [c.strip() for c in next(line for line in parts_rows if "80.0%" in line).split("│")[1:-1]]
    assert row0 == ["0", "0.1", "50.0%", "0.3", "80.0%", "0.4", "0.5"]     # the sum beside the whole call
    row1 = [c.strip() for c in next(line for line in parts_rows if "│    1 │" in line).split("│")[1:-1]]
    assert row1 == ["1", "-", "-", "1", "80.0%", "-", "1.5"]            # a part not timed: no sum
    assert "case 1: part act_quant was not timed: RuntimeError: capture" in text
    assert "part act_quant: the quantizer" in text
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["cases"][0]["parts"]["gemm"]["median_ms"] == 0.3
