"""The diagnosis of failing cases (fuseval.diagnosis): anatomy of independently written
mistakes (tests/helpers/diagnosis_mistakes.py, none from a catalogue), mutants diagnosed as
themselves, precision diagnosed as precision, imported problems, check and CLI hooks.
Every case draws fresh inputs from a random seed and compares against the float64 oracle."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch

import diagnosis_mistakes as M
from fuseval.operators import load
from fuseval.diagnosis import diagnose_case, diagnose_outputs
from fuseval.diagnosis.matching import passes, rank_of
from fuseval.inputs import generate_inputs
from fuseval.operators.implementations import resolve_impl
from fuseval.operators.mutants import catalogue

HERE = os.path.dirname(os.path.dirname(__file__))  # tests/
SRC = os.path.join(os.path.dirname(HERE), "src")
CASE = {M.B_OP: 4, M.A_OP: 10, M.R_OP: 3}      # seq 16 x batch 4; seq 32; seq 8 x batch 4


def _run(op, impl, mutants=False, mode="benchmark", case_index=None):
    defn = load(op, "small")
    case = defn.cases()[CASE[op] if case_index is None else case_index]
    tol = case.tolerance or defn.tolerance
    inputs = generate_inputs(defn, case.axes, seed=random.randrange(2 ** 31), mode=mode)
    refs = resolve_impl(defn, "reference")(*inputs)
    outs = impl(*inputs)
    return diagnose_case(defn, inputs, outs, refs, tol, case=case.index, mutants=mutants), defn


def _run_with_redraws(impl):
    """The diagnosis of ``impl`` on op B's case, with the calls on redrawn inputs that
    show which inputs its error depends on."""
    defn = load(M.B_OP, "small")
    case = defn.cases()[CASE[M.B_OP]]
    tol = case.tolerance or defn.tolerance
    seed = random.randrange(2 ** 31)
    inputs = generate_inputs(defn, case.axes, seed=seed)
    ref = resolve_impl(defn, "reference")
    return diagnose_case(defn, inputs, impl(*inputs), ref(*inputs), tol, mutants=False,
                         call=lambda x: impl(*x), reference=ref,
                         redraw=lambda k: generate_inputs(defn, case.axes, seed=seed + 7 * k + 1))


def _out(d, name):
    return next(a for a in d.outputs if a.name == name)


def _kinds(a):
    return [f.kind for f in a.findings]


def _axis(a, name):
    return next(x for x in a.axes if x.name == name)


# --------------------------------------------------------------------------- ten+ mistakes
def test_tile_boundary_bug_is_the_last_row_of_every_tile_and_zeros():
    d, _ = _run(M.B_OP, M.b_tile_tail_unwritten)
    for name in ("query_states", "key_states", "value_states"):
        a = _out(d, name)
        tok = _axis(a, "seq_len")
        assert tok.confined and tok.slices == [7, 15]
        assert "tile edges" in tok.pattern and "tile of 8" in tok.pattern
        assert _kinds(a)[0] == "zeros"
        assert not any(x.confined for x in a.axes if x.name != "seq_len")


def test_one_head_using_another_heads_weights():
    d, _ = _run(M.B_OP, M.b_head_uses_other_weights)
    a = _out(d, "query_states")
    head = _axis(a, "num_attention_heads")
    assert head.confined and head.slices == [1]
    assert a.findings[0].kind == "slice_map" and a.findings[0].details["map"] == {1: 0}
    assert _out(d, "key_states").failing == 0 and _out(d, "value_states").failing == 0


def test_wrong_kv_head_grouping_is_a_roll_of_the_kv_heads():
    d, _ = _run(M.B_OP, M.b_kv_heads_rolled)
    for name in ("key_states", "value_states"):
        f = _out(d, name).findings[0]
        assert f.kind == "slice_map" and f.details["axis"] == "num_key_value_heads"
        assert f.details["map"] == {0: 1, 1: 0}
    assert _out(d, "query_states").failing == 0


def test_rope_on_values_fails_values_only_and_depends_on_the_rope_tables():
    d = _run_with_redraws(M.b_rope_on_values)
    assert [a.name for a in d.outputs if a.failing] == ["value_states"]
    dep = {x.group: x for x in d.dependence}
    assert set(dep) == {"activations", "weights", "rope tables"}
    assert dep["rope tables"].changes and dep["rope tables"].still_fails


def test_a_constant_offset_depends_on_no_input():
    d = _run_with_redraws(M.b_values_offset)
    f = _out(d, "value_states").findings[0]
    assert f.kind == "offset" and abs(f.details["offset"] - 0.25) < 0.01
    # bf16 rounding of the outputs moves the error a little; the offset itself does not move
    assert all(not x.changes for x in d.dependence), [x.text for x in d.dependence]


def test_values_of_batch_item_zero_everywhere():
    d, _ = _run(M.B_OP, M.b_batch_item_zero_everywhere)
    for a in d.outputs:
        f = a.findings[0]
        assert f.kind == "slice_map" and f.details["axis"] == "batch_size"
        assert set(f.details["map"].values()) == {0} and sorted(f.details["map"]) == [1, 2, 3]


def test_one_head_sign_flipped():
    d, _ = _run(M.B_OP, M.b_head_sign_flipped)
    a = _out(d, "query_states")
    assert _axis(a, "num_attention_heads").slices == [2]
    assert a.findings[0].kind == "sign"


def test_keys_scaled_by_two():
    d, _ = _run(M.B_OP, M.b_keys_doubled)
    f = _out(d, "key_states").findings[0]
    assert f.kind == "factor" and abs(f.details["factor"] - 2) < 0.01


def test_unwritten_last_token_is_nan_at_the_far_edge():
    d, _ = _run(M.B_OP, M.b_last_token_nan)
    for a in d.outputs:
        tok = _axis(a, "seq_len")
        assert tok.slices == [tok.size - 1] and "far edge" in tok.pattern
        assert a.findings[0].kind == "nonfinite"


def test_second_rope_half_unrotated_is_located_in_that_half():
    d, _ = _run(M.B_OP, M.b_second_half_unrotated)
    hd = _axis(_out(d, "query_states"), "head_dim")
    assert hd.confined and hd.slices == list(range(8, 16)) and "second RoPE half" in hd.where


def test_token_and_head_dim_transposed():
    d, _ = _run(M.B_OP, M.b_values_transposed)
    kinds = _kinds(_out(d, "value_states"))
    assert "transpose" in kinds[:2]


def test_an_extra_bias_along_hidden():
    d, _ = _run(M.A_OP, M.a_extra_bias)
    f = d.outputs[0].findings[0]
    assert f.kind == "axis_only" and f.details["axis"] == "hidden_size"


def test_a_stale_token_tile():
    d, _ = _run(M.A_OP, M.a_token_tile_stale)
    a = d.outputs[0]
    assert _axis(a, "seq_len").slices == list(range(16, 32))
    f = a.findings[0]
    assert f.kind == "slice_map" and f.details["map"] == {i: i - 16 for i in range(16, 32)}


def test_outputs_swapped():
    d, _ = _run(M.R_OP, M.r_outputs_swapped)
    assert d.verdict == "structure" and d.swapped
    assert all(a.findings[0].kind == "other_output" for a in d.outputs)


def test_transposed_weight_and_missing_mask_found_among_generic_mistakes():
    d, _ = _run(M.A_OP, M.a_q_weight_transposed, mutants=True)
    assert d.verdict == "known mistake" and d.best.name.startswith("transposed_operand#")
    d, _ = _run(M.A_OP, M.a_no_causal_mask, mutants=True)
    assert d.verdict == "known mistake" and d.best.name == "missing_causal_mask"


def test_all_heads_reading_kv_head_zero_names_no_mutant():
    # heads are mixed by the O-projection: the error is everywhere, and no mutant explains it
    d, _ = _run(M.A_OP, M.a_all_heads_read_kv0, mutants=True)
    assert d.verdict == "unexplained" and d.best is None
    assert not any(x.confined for x in d.outputs[0].axes)


# --------------------------------------------------------------------------- precision
def test_correct_implementation_is_precision_not_a_mutant():
    d, _ = _run(M.A_OP, M.a_correct, mutants=True)
    assert d.verdict == "passed" and d.best is None
    assert d.outputs[0].findings[0].kind == "precision" and d.outputs[0].level in ("float32", "TF32/fp16")


def test_bf16_operands_on_op_a_are_precision_not_a_mutant():
    d, _ = _run(M.A_OP, M.a_bf16_operands, mutants=True)
    assert d.outputs[0].failing > 0
    assert d.verdict == "precision" and d.best is None
    assert d.outputs[0].level == "bf16"


# --------------------------------------------------------------------------- the catalogues
@pytest.mark.parametrize("op", [M.R_OP, M.B_OP, M.A_OP])
def test_every_visible_mutant_is_diagnosed_as_itself(op):
    """Each mutant as an implementation, on the first case where it fails (benchmark inputs,
    then realistic): ranked first, or in the top 3 with its stage named."""
    defn = load(op, "small")
    ref = resolve_impl(defn, "reference")
    seed = random.randrange(2 ** 31)
    draws = {}
    seen = 0
    for m in catalogue(op):
        for mode in ("benchmark", "realistic"):
            for case in defn.cases()[:6]:
                key = (mode, case.index)
                if key not in draws:
                    x = generate_inputs(defn, case.axes, seed=seed + case.index, mode=mode)
                    draws[key] = (x, ref(*x))
                x, refs = draws[key]
                tol = case.tolerance or defn.tolerance
                outs = m(*x)
                if passes(outs, refs, tol):
                    continue
                d = diagnose_case(defn, x, outs, refs, tol)
                rank = rank_of(d.matches, m.name)
                assert rank == 1 or (rank <= 3 and d.best.stage == m.stage), (m.name, rank, d.matches[:3])
                assert d.verdict == "known mistake"
                seen += 1
                break
            else:
                continue
            break
    assert seen >= len(catalogue(op)) // 2


def test_mutants_from_their_stage_equal_the_whole_run():
    from fuseval.diagnosis.matching import _prefix_taps
    defn = load(M.B_OP, "small")
    case = defn.cases()[3]
    x = generate_inputs(defn, case.axes, seed=random.randrange(2 ** 31))
    taps, order = _prefix_taps(defn, x)
    for m in catalogue(M.B_OP):
        part = m.fn.staged(*x, override={s: taps[s] for s in order[:order.index(m.stage)]})
        for a, b in zip(m(*x), part):
            assert torch.equal(a.float().nan_to_num(3.0), b.float().nan_to_num(3.0)), m.name


# --------------------------------------------------------------------------- imported problems
def test_imported_problem_anatomy_and_generic_epsilon(register):
    spec = register(os.path.join(HERE, "data", "sol_problems", "rmsnorm"))
    defn = load(spec.name)
    case = defn.cases()[0]
    tol = case.tolerance or defn.tolerance
    x = generate_inputs(defn, case.axes, seed=random.randrange(2 ** 31))
    refs = resolve_impl(defn, "reference")(*x)
    from fuseval.diagnosis.generic import run_generic
    outs, hits, _ = run_generic(defn, "dropped_epsilon", x)
    assert hits >= 1
    # the epsilon only shows on rows with a small RMS: make the first row tiny
    names = defn.input_names
    x[0] = x[0].clone()
    x[0].view(-1, x[0].shape[-1])[0] *= 1e-4
    refs = resolve_impl(defn, "reference")(*x)
    outs, _, _ = run_generic(defn, "dropped_epsilon", x)
    outs = [o.to(r.dtype) if o.dtype != r.dtype else o for o, r in zip(outs, refs)]
    d = diagnose_case(defn, x, [o.to(torch.bfloat16) for o in outs], refs, tol)
    if d.outputs[0].failing:
        assert d.best is not None and d.best.name == "dropped_epsilon", d.summary
    del names


# --------------------------------------------------------------------------- check and the CLI
def test_check_prints_a_short_diagnosis_and_json_has_it(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.path.join(HERE, "helpers")]))
    out = subprocess.run([sys.executable, "-m", "fuseval.cli", "check", "--op", M.B_OP, "--impl",
                          "diagnosis_mistakes:b_head_sign_flipped", "--config", "small", "--cases", "4",
                          "--in-process", "--no-hygiene", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, env=env, cwd=HERE, timeout=300)
    assert out.returncode != 0, out.stderr
    assert "diagnosis: structure" in out.stdout and "query head 2" in out.stdout, out.stdout
    import json
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["cases"][0]["diagnosis"]["verdict"] == "structure"


def test_diagnose_command_writes_plots(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.path.join(HERE, "helpers")]))
    out = subprocess.run([sys.executable, "-m", "fuseval.cli", "diagnose", "--op", M.B_OP, "--impl",
                          "diagnosis_mistakes:b_head_uses_other_weights", "--config", "small", "--case", "4",
                          "--in-process", "--out", str(tmp_path / "d")],
                         capture_output=True, text=True, env=env, cwd=HERE, timeout=300)
    assert out.returncode == 1, out.stderr
    assert "input dependence" in out.stdout and "query head 1 holds the oracle's query head 0" in out.stdout
    assert (tmp_path / "d" / "diagnosis.png").stat().st_size > 1000
    assert "<img" in (tmp_path / "d" / "diagnosis.html").read_text()


def test_diagnose_command_rejects_a_bad_case_in_one_line():
    env = dict(os.environ, PYTHONPATH=SRC)
    out = subprocess.run([sys.executable, "-m", "fuseval.cli", "diagnose", "--op", M.B_OP, "--impl", "torch",
                          "--config", "small", "--case", "99"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2 and "--case" in out.stderr and "Traceback" not in out.stderr
