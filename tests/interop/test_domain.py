"""Properties of imported problems draw inside the problem's domain and judge what they
draw fairly: the steps, ties and orderings every workload shows; draws the problem's own
code refuses are rejected, not failures; a bound on memory per draw; out of memory in
the properties is exit 7; an absolute tolerance scales with adversarial magnitudes; an
output the tolerance cannot see is reported, not failed, where the benchmark's own
reference shows the same.

The problem folders are written by these tests; every expectation is read off the
folders' own workloads or written here, never taken from the code under test. Each rule
has a broken implementation (or a broken draw) here that it still rejects."""
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings

from fuseval import cli
from fuseval.operators import load
from fuseval.comparison import BLIND_FRACTION, blind_outputs
from fuseval.definitions import TensorSpec, Tolerance
from fuseval.errors import OutOfMemory
from fuseval.properties import check_implementation
from fuseval.properties import fast_vs_reference
from fuseval.properties.strategies import DRAW_COPIES, axis_bindings
from problem_folders import tensor, workload, write_problem

_OOM = 'raise RuntimeError("DefaultCPUAllocator: can\'t allocate memory: you tried to allocate 1 bytes")'


def _one_axis(tmp_path, name, body, ns, h=8, atol=1e-3, rtol=1e-3):
    """y = 2x + 1 over x[n, h] (float32), with ``body`` run first (it may refuse inputs)."""
    return write_problem(
        tmp_path / name, name=f"test_{name}",
        axes={"n": {"type": "var"}, "h": {"type": "const", "value": h}},
        inputs={"x": tensor(["n", "h"], "float32")}, outputs={"y": tensor(["n", "h"], "float32")},
        reference=f"""
            import torch

            CALLS = []


            def run(x):
                n = x.shape[0]
            {body}
                return x * 2 + 1
            """,
        workloads=[workload({"n": n}, atol=atol, rtol=rtol) for n in ns])


# --------------------------------------------------------------------------- the workloads' domain
def test_draws_follow_the_steps_ties_and_orderings_every_workload_shows(tmp_path, register):
    # m: multiples of 128 in every workload; q = 2 n + 1 in every one; n < p in every one
    rows = [{"m": 128, "n": 3, "p": 5, "q": 7}, {"m": 384, "n": 7, "p": 9, "q": 15},
            {"m": 256, "n": 1, "p": 9, "q": 3}]
    folder = write_problem(
        tmp_path / "shaped", name="test_shaped",
        axes={a: {"type": "var"} for a in "mnpq"},
        inputs={"x": tensor(["m", "n"], "float32"), "z": tensor(["p", "q"], "float32")},
        outputs={"y": tensor(["m", "n"], "float32")},
        reference="""
            def run(x, z):
                return x * 2
            """,
        workloads=[workload(r) for r in rows])
    spec = register(folder)
    seen = []

    @settings(max_examples=60, database=None, derandomize=True)
    @given(axis_bindings(spec.name, "small"))
    def collect(binding):
        seen.append(dict(binding.axes))
    collect()
    assert seen
    assert all(a["m"] % 128 == 0 for a in seen), seen
    assert all(a["q"] == 2 * a["n"] + 1 for a in seen), seen
    assert all(a["n"] <= a["p"] for a in seen), seen
    assert len({a["m"] for a in seen}) >= 2 and len({a["n"] for a in seen}) >= 3   # still drawn, not fixed


def test_a_draw_the_problems_code_refuses_is_outside_its_domain(tmp_path, register):
    # the workloads show n = 3 and n = 12; the reference refuses 5..9, which only its code says
    folder = _one_axis(tmp_path, "refuses", """
                if 4 < n < 10:
                    raise ValueError(f"n must be below 5 or above 9, got {n}")""", [3, 12])
    spec = register(folder)
    report = check_implementation(spec.name, "sol_reference", profile="ci")
    assert report.passed, str(report)
    assert report.examples_run > 0

    def off_by_a_hundredth(x):
        return x * 2 + 1.01
    wrong = check_implementation(spec.name, off_by_a_hundredth, profile="ci", metamorphic=False)
    assert not wrong.passed and wrong.failures[0].property == "tolerance"


def test_a_draw_the_problems_reference_answers_in_other_shapes_is_outside_its_domain(tmp_path, register):
    # SOL L1/020: for bindings between its workloads the reference reads another size off
    # its inputs' values and answers in a shape its definition does not give for them
    folder = _one_axis(tmp_path, "reshapes", """
                if 4 < n < 10:
                    return (x * 2 + 1)[:-1]""", [3, 12])
    spec = register(folder)
    report = check_implementation(spec.name, "sol_reference", profile="ci", metamorphic=False)
    assert report.passed, str(report)
    assert report.examples_run > 0

    def short_everywhere(x):
        return (x * 2 + 1)[:-1]
    wrong = check_implementation(spec.name, short_everywhere, profile="ci", metamorphic=False)
    assert not wrong.passed and "shape" in " ".join(wrong.failures[0].messages)


def test_a_leading_axis_the_problems_code_refuses_to_split_skips_the_independence_check(tmp_path, register):
    # SOL Quant/027 and Quant/033: every workload's n is a multiple of 4 and the reference
    # refuses any other n (its FP4 GEMM wants M % 128 == 0), so the item-alone run of the
    # batch-independence check (n = 1) is outside its domain: the check does not apply,
    # the draw stays (before: every metamorphic draw rejected, exit 5)
    folder = _one_axis(tmp_path, "tiled", """
                if n % 4:
                    raise ValueError(f"M must be a multiple of 4, got {n}")""", [4, 8, 12])
    spec = register(folder)
    report = check_implementation(spec.name, "sol_reference", profile="ci")
    assert report.passed, str(report)
    assert "metamorphic" in report.properties


# --------------------------------------------------------------------------- memory
def test_the_draws_stay_within_the_memory_bound_of_the_device(tmp_path, register, monkeypatch):
    # n = 4000 is a workload; the "device" has room for about 100 rows per draw only, and the
    # reference runs out of memory beyond that
    folder = _one_axis(tmp_path, "bounded", f"""
                if n > 100:
                    {_OOM}""", [2, 4000], h=1)
    spec = register(folder)
    per_row = 2 * 8 * DRAW_COPIES        # x and y, float64, the planned copies
    monkeypatch.setattr(fast_vs_reference, "draw_budget", lambda device: 100 * per_row)
    report = check_implementation(spec.name, "sol_reference", profile="ci")
    assert report.passed, str(report)
    assert report.lowered_bound is None


def test_the_oracle_running_out_of_memory_lowers_the_bound_instead_of_ending_the_run(tmp_path, register,
                                                                                     monkeypatch):
    # no bound known (None): the oracle's first draw above 100 rows runs out of memory; the
    # run goes on with smaller draws only and says so
    folder = _one_axis(tmp_path, "learns", f"""
                if n > 100:
                    {_OOM}""", [2, 4000], h=1)
    spec = register(folder)
    per_row = 2 * 8 * DRAW_COPIES
    monkeypatch.setattr(fast_vs_reference, "draw_budget", lambda device: None)
    report = check_implementation(spec.name, "sol_reference", profile="ci")
    assert report.passed, str(report)
    assert report.examples_run > 0
    assert report.lowered_bound is not None and report.lowered_bound < 4000 * per_row
    assert any("ran out of memory" in n for n in report.notes()), report.notes()
    # a wrong implementation still fails on the draws that fit
    def off_by_a_hundredth(x):
        return x * 2 + 1.01
    assert not check_implementation(spec.name, off_by_a_hundredth, profile="ci", metamorphic=False).passed


def test_the_implementation_running_out_of_memory_never_lowers_the_bound(tmp_path, register, monkeypatch):
    # an implementation that "runs out of memory" on the draws it would rather not be
    # judged on: its allocation failure is a verdict on it, never a rejected draw
    folder = _one_axis(tmp_path, "dodges", "", [2, 400], h=1)
    spec = register(folder)
    monkeypatch.setattr(fast_vs_reference, "draw_budget", lambda device: None)

    def wrong_when_large(x):
        if x.shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 bytes")
        return x * 2 + 1
    try:
        report = check_implementation(spec.name, wrong_when_large, profile="ci", metamorphic=False)
    except OutOfMemory:
        return                          # ending the run as out of memory is no pass either
    assert not report.passed, str(report)
    assert report.lowered_bound is None


def test_no_draw_within_the_memory_bound_is_out_of_memory_not_a_bad_definition(tmp_path, register, capsys,
                                                                               monkeypatch):
    # the smallest workload plans 16 rows; the device has room for 4: exit 7 (out of
    # memory), not exit 5 ("Hypothesis found no example", a bad definition)
    folder = _one_axis(tmp_path, "too_big", "", [16, 64], h=1)
    spec = register(folder)
    per_row = 2 * 8 * DRAW_COPIES
    monkeypatch.setattr(fast_vs_reference, "draw_budget", lambda device: 4 * per_row)
    with pytest.raises(OutOfMemory, match=r"no draw fits the memory of cpu: the bound per draw is 0 MiB.*"
                                          r"the smallest binding the space allows plans"):
        check_implementation(spec.name, "sol_reference", profile="ci")
    code = cli.main(["gate", "--problem", folder, "--impl", "sol_reference", "--in-process", "--skip",
                     "check,budget", "--seeds", "1", "--out", str(tmp_path / "gate"), "--quiet"])
    assert code == 7, capsys.readouterr().out


def test_out_of_memory_in_the_oracle_once_is_no_verdict(tmp_path, register, capsys):
    # the first draw off the workloads runs out of memory, a rerun would fit: what
    # Hypothesis calls flaky, which is no verdict on the implementation and no bug in
    # fuseval: that size is left out, the gate says so and judges the rest
    folder = _one_axis(tmp_path, "oom_once", f"""
                if n not in (3, 12) and not CALLS:
                    CALLS.append(n)
                    {_OOM}""", [3, 12])
    code = cli.main(["gate", "--problem", folder, "--impl", "sol_reference", "--in-process", "--skip",
                     "check,budget", "--seeds", "1", "--out", str(tmp_path / "gate")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "ran out of memory" in out, out


# --------------------------------------------------------------------------- magnitudes
def test_an_absolute_tolerance_scales_with_adversarial_magnitudes(tmp_path, register):
    # a float32 sum: faithful, its error grows with the inputs' magnitude; the workload's
    # atol (1e-4) is written for unit inputs (sums near 16, float32 spacing 2e-6) and it
    # has no rtol: at 2**8 times the magnitude (the adversarial rows) the spacing is 5e-4
    folder = write_problem(
        tmp_path / "sums", name="test_sums",
        axes={"n": {"type": "var"}, "h": {"type": "const", "value": 256}},
        inputs={"x": tensor(["n", "h"], "float32")}, outputs={"y": tensor(["n"], "float32")},
        reference="""
            def run(x):
                return x.sum(-1)
            """,
        workloads=[workload({"n": n}, atol=1e-4, rtol=0.0) for n in (4, 16)])
    spec = register(folder)
    report = check_implementation(spec.name, "sol_reference", profile="ci", metamorphic=False)
    assert report.passed, str(report)

    def drops_the_last_term(x):
        return x[:, :-1].sum(-1)
    wrong = check_implementation(spec.name, drops_the_last_term, profile="ci", metamorphic=False)
    assert not wrong.passed


def test_the_scaled_tolerance_multiplies_only_the_absolute_parts():
    tol = Tolerance(atol=1e-3, rtol=1e-2, min_matched_ratio=0.99, max_abs_error=0.5, max_error_ratio=64.0)
    scaled = fast_vs_reference.magnitude_scaled(tol, 4096.0)
    assert (scaled.atol, scaled.max_abs_error) == (1e-3 * 4096, 0.5 * 4096)
    assert (scaled.rtol, scaled.min_matched_ratio, scaled.max_error_ratio) == (1e-2, 0.99, 64.0)
    assert fast_vs_reference.magnitude_scaled(tol, 0.5) == tol          # never tighter than written


# --------------------------------------------------------------------------- the reference's own error
def _rounds_between_workloads(tmp_path, name="rounds"):
    """y = 2x + 1, which the reference rounds to bfloat16 at the sizes between its two
    workloads (n = 3 and 12) only: it meets its tolerance on both workloads and misses it
    on the draws in between (SOL L1/020, L1/061, L2/007: a reference near its tolerance)."""
    return _one_axis(tmp_path, name, """
                if 4 < n < 10:
                    return (x * 2 + 1).to(torch.bfloat16).to(torch.float32)""", [3, 12], h=64)


def test_a_draw_the_benchmarks_reference_misses_too_is_judged_by_its_error(tmp_path, register):
    spec = register(_rounds_between_workloads(tmp_path))
    report = check_implementation(spec.name, "sol_reference", profile="ci", metamorphic=False)
    assert report.passed, str(report)
    assert report.excused, "the draws between the workloads were expected to miss the tolerance"
    assert all(4 < f.example.binding.axes["n"] < 10 for f in report.excused)
    assert "missed it too" in report.notes()[0]
    # as rounding to float16 (a finer format) between the workloads: within the reference's error
    def rounds_finer(x):
        y = x * 2 + 1
        return y.half().float() if 4 < x.shape[0] < 10 else y
    assert check_implementation(spec.name, rounds_finer, profile="ci", metamorphic=False).passed


def test_a_draw_the_benchmarks_reference_misses_does_not_excuse_a_larger_error(tmp_path, register):
    spec = register(_rounds_between_workloads(tmp_path, "rounds_wrong"))

    def off_between_the_workloads(x):
        y = x * 2 + 1
        return y + 0.05 if 4 < x.shape[0] < 10 else y
    report = check_implementation(spec.name, off_between_the_workloads, profile="ci", metamorphic=False)
    assert not report.passed
    failure = report.failures[0]
    assert failure.property == "tolerance" and 4 < failure.example.binding.axes["n"] < 10
    assert any("beyond 2x the baseline's error" in m for m in failure.messages), failure.messages


def test_without_the_precision_baseline_the_references_own_misses_fail(tmp_path, register, monkeypatch):
    # the rule's mutant: with no baseline, the benchmark's own reference fails its properties
    spec = register(_rounds_between_workloads(tmp_path, "rounds_strict"))
    hooks = fast_vs_reference.hooks_of(load(spec.name))
    monkeypatch.setattr(fast_vs_reference, "hooks_of",
                        lambda op: replace(hooks, precision_baseline=None) if op.name == spec.name else hooks)
    report = check_implementation(spec.name, "sol_reference", profile="ci", metamorphic=False)
    assert not report.passed and not report.excused


# --------------------------------------------------------------------------- blind outputs
def test_a_tiny_output_the_benchmarks_reference_shares_is_reported_not_failed(tmp_path, register, capsys):
    # an output of RMS ~1e-14 under atol 1e-3: no error a kernel makes on it can show
    folder = write_problem(
        tmp_path / "tiny", name="test_tiny",
        axes={"n": {"type": "var"}, "h": {"type": "const", "value": 8}},
        inputs={"x": tensor(["n", "h"], "float32")},
        outputs={"y": tensor(["n", "h"], "float32"), "tiny": tensor(["n", "h"], "float32")},
        reference="""
            def run(x):
                return x * 2, x * 1e-14
            """,
        workloads=[workload({"n": n}) for n in (3, 4)])
    code = cli.main(["gate", "--problem", folder, "--impl", "sol_reference", "--in-process", "--skip",
                     "properties,budget", "--seeds", "1", "--out", str(tmp_path / "gate"), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "blind output(s) of the problem" in out
    # --strict makes a warning a failure
    assert cli.main(["gate", "--problem", folder, "--impl", "sol_reference", "--in-process", "--skip",
                     "properties,budget", "--seeds", "1", "--out", str(tmp_path / "gate2"), "--quiet",
                     "--strict"]) != 0


def test_a_blind_output_the_benchmarks_reference_does_not_share_still_fails():
    spec = TensorSpec("y", ("n",), "float32")
    tol = Tolerance(atol=1e-3, rtol=0.0, min_matched_ratio=0.99)
    exact = torch.full((16,), 1e-9, dtype=torch.float64)           # the oracle: tiny
    theirs = torch.full((16,), 1.0)                                 # the benchmark's reference: not tiny
    found = blind_outputs(0, [exact], [spec], tol, [theirs])
    assert len(found) == 1 and not found[0].in_benchmark
    shared = blind_outputs(0, [exact], [spec], tol, [exact.float()])
    assert len(shared) == 1 and shared[0].in_benchmark
    assert blind_outputs(0, [exact * 0 + 1.0], [spec], tol, [theirs]) == []    # 1e-3 < 10% of RMS 1
    assert BLIND_FRACTION == 0.1


def test_a_workload_with_an_empty_activation_runs_every_recipe(tmp_path, register):
    # n = 0 is a workload (an empty batch): the adversarial recipes (zero rows, magnitudes)
    # have no row to change there, which is no error
    spec = register(_one_axis(tmp_path, "empty", "    pass", [0, 3]))
    report = check_implementation(spec.name, "sol_reference", profile="ci")
    assert report.passed, str(report)


def test_a_cache_update_whose_reference_misses_its_tolerance_is_no_hygiene_violation(tmp_path, register, capsys):
    # a KV-cache update (the cache, empty on one workload, concatenated with the new
    # states) rounded to float16: every call misses the tolerance, which is a tolerance
    # failure of each call, not a cached result, a mutated input or an aliased output
    folder = write_problem(
        tmp_path / "cache", name="test_cache_update",
        axes={"past": {"type": "var"}, "new": {"type": "var"}, "h": {"type": "const", "value": 4},
              "total": {"type": "expr", "expression": "past + new"}},
        inputs={"states": tensor(["new", "h"], "float32"), "cache": tensor(["past", "h"], "float32")},
        outputs={"updated": tensor(["total", "h"], "float32")},
        reference="""
            import torch


            def run(states, cache):
                return torch.cat([cache, (states / 3).half().float()], dim=0)
            """,
        workloads=[workload({"past": 0, "new": 5}, atol=1e-7, rtol=1e-7),
                   workload({"past": 6, "new": 1}, atol=1e-7, rtol=1e-7)])
    code = cli.main(["check", "--problem", folder, "--impl", "sol_reference", "--in-process", "--seed", "3"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert not any(word in out for word in ("cached_result", "mutated_input", "aliased_output", "output_reused")), out


def test_list_shows_each_workloads_own_rtol(tmp_path, register, capsys):
    folder = _one_axis(tmp_path, "listed", "    pass", [3, 12], atol=1e-5, rtol=0.05)
    assert cli.main(["list", "--problem", folder, "--op", "test_listed"]) == 0
    out = capsys.readouterr().out
    assert "case  0: n=3  atol 1e-05 rtol 0.05" in out, out


def test_an_implementation_out_of_memory_in_the_budget_is_exit_7(tmp_path, register, capsys, monkeypatch):
    folder = _one_axis(tmp_path, "budget_oom", "    pass", [3, 12])
    (tmp_path / "oom_kernels.py").write_text(
        "def run(x):\n"
        "    if x.shape[0] > 10:\n"
        f"        {_OOM}\n"
        "    return x * 2 + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = cli.main(["gate", "--problem", folder, "--impl", "oom_kernels:run", "--in-process", "--skip",
                     "check,properties", "--budget-cases", "0,1", "--seeds", "1", "--out", str(tmp_path / "g"),
                     "--quiet"])
    out = capsys.readouterr().out
    assert code == 7, out


def test_an_answer_that_does_not_depend_on_the_changed_inputs_is_no_cache(tmp_path, register, capsys):
    # the weight w changes no output (a gradient independent of a weight): the later call
    # with only the weights drawn anew answers identically, which is right, not cached
    folder = write_problem(
        tmp_path / "ignores_w", name="test_ignores_w",
        axes={"n": {"type": "var"}, "h": {"type": "const", "value": 4}},
        inputs={"x": tensor(["n", "h"], "float32"), "w": tensor(["h"], "float32")},
        outputs={"y": tensor(["n", "h"], "float32")},
        reference="""
            def run(x, w):
                return x * 2
            """,
        workloads=[workload({"n": 3}), workload({"n": 5})])
    code = cli.main(["check", "--problem", folder, "--impl", "sol_reference", "--in-process", "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    # a cache that ignores the activations is still one (their change moves the oracle)
    (tmp_path / "cache_kernels.py").write_text(
        "SEEN = []\n"
        "def run(x, w):\n"
        "    if not SEEN:\n"
        "        SEEN.append(x * 2)\n"
        "    return SEEN[0].clone() if SEEN[0].shape == x.shape else x * 2\n")
    import sys
    sys.path.insert(0, str(tmp_path))
    try:
        code = cli.main(["check", "--problem", folder, "--impl", "cache_kernels:run", "--in-process", "--seed", "1",
                         "--cases", "0"])
    finally:
        sys.path.remove(str(tmp_path))
    assert code == 13, capsys.readouterr().out
