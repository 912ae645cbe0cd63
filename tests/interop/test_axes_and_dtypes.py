"""Axis binding from expressions of constants, axes no input shows, and the benchmark's
own dtypes (packed FP4 as ``torch.float4_e2m1fn_x2``, FP8 e4m3 / e5m2), on problem folders
written by these tests, through ``fuseval check`` as a user runs it."""
import pytest
import torch

from fuseval import cli
from fuseval.operators import load
from fuseval.inputs import TORCH_DTYPES, generate_inputs
from fuseval.validate import bind_axes
from problem_folders import tensor, workload, write_problem

# the 16 e2m1 values by code (sign bit 3)
E2M1 = "[0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]"


def _projection_of_constants(tmp_path):
    """Quant/018's shape pattern: the activation's width is ``num_heads * head_dim`` and
    the scale blocks ``proj_dim // block``: two constants no input shows alone."""
    return write_problem(
        tmp_path / "consts", name="test_projection_of_constants",
        axes={"tokens": {"type": "var"}, "hidden": {"type": "const", "value": 24},
              "num_heads": {"type": "const", "value": 2}, "head_dim": {"type": "const", "value": 16},
              "block": {"type": "const", "value": 8},
              "proj_dim": {"type": "expr", "expression": "num_heads * head_dim"},
              "blocks": {"type": "expr", "expression": "proj_dim // block"}},
        inputs={"x": tensor(["tokens", "proj_dim"], "float32"), "o_weight": tensor(["hidden", "proj_dim"], "float32"),
                "o_scale": tensor(["hidden", "blocks"], "float32", "positive block scales")},
        outputs={"y": tensor(["tokens", "hidden"], "float32")},
        reference="""
            import torch


            def run(x, o_weight, o_scale):
                w = o_weight * o_scale.abs().repeat_interleave(o_weight.shape[1] // o_scale.shape[1], dim=1)
                return x @ w.t()
            """,
        workloads=[workload({"tokens": 3}, atol=1e-4, rtol=1e-4), workload({"tokens": 5}, atol=1e-4, rtol=1e-4)])


def test_check_binds_axes_given_by_expressions_of_constants(tmp_path, register, capsys):
    folder = _projection_of_constants(tmp_path)
    code = cli.main(["check", "--problem", folder, "--impl", "sol_reference", "--in-process"])
    out, err = capsys.readouterr()
    assert code == 0, out + err


def test_equations_with_one_unknown_are_solved_exactly():
    from fuseval.definitions.axes import solutions
    assert solutions("a * b", 12, "a", {"b": 4}) == (3, 3)
    assert solutions("head_dim // 3", 42, "head_dim", {}) == (126, 128)
    assert solutions("(h + 2 * p - k) // s + 1", 8, "h", {"p": 1, "k": 3, "s": 2}) == (15, 16)
    assert solutions("n // b", 512, "b", {"n": 8192}) == (16, 16)        # inverted by trying values
    assert solutions("a * 2", 7, "a", {}) == (4, 3)                      # none


def test_shapes_that_contradict_the_expressions_name_the_input(tmp_path, register):
    folder = _projection_of_constants(tmp_path)
    defn = load(register(folder).name)
    wrong = list(generate_inputs(defn, {"tokens": 3}))
    wrong[2] = torch.ones(24, 3)          # 32 // block == 3 for block 9..10: the definition's 8 gives 4
    with pytest.raises(ValueError, match=r"'o_scale' has blocks = 3, expected proj_dim // block = 4"):
        bind_axes(defn, wrong)


def test_an_axis_the_shapes_leave_open_is_named(tmp_path, register):
    folder = write_problem(
        tmp_path / "rows", name="test_rows_of_two_var_axes",
        axes={"batch": {"type": "var"}, "seq": {"type": "var"}, "h": {"type": "const", "value": 4},
              "rows": {"type": "expr", "expression": "batch * seq"}},
        inputs={"x": tensor(["rows", "h"], "float32")}, outputs={"y": tensor(["rows", "h"], "float32")},
        reference="def run(x):\n    return x + 1\n", workloads=[workload({"batch": 2, "seq": 3})])
    defn = load(register(folder).name)
    x = generate_inputs(defn, {"batch": 2, "seq": 3})
    assert bind_axes(defn, x)["seq"] == 3                 # from the binding the inputs were drawn for
    with pytest.raises(ValueError, match=r"axis 'batch' cannot be determined from the inputs' shapes: "
                                         r"it appears only in 'batch \* seq' \(= 6 in input 'x'\)"):
        bind_axes(defn, list(x))


def _sizes_only_an_output(tmp_path):
    return write_problem(
        tmp_path / "outsize", name="test_axis_sizes_only_an_output",
        axes={"n": {"type": "var"}, "keep": {"type": "var"}, "h": {"type": "const", "value": 4}},
        inputs={"x": tensor(["n", "h"], "float32"), "keep_count": tensor(None, "int32")},
        outputs={"y": tensor(["keep", "h"], "float32")},
        reference="""
            def run(x, keep_count):
                return x[-keep_count:] * 2
            """,
        workloads=[workload({"n": 6, "keep": 2}, {"keep_count": {"type": "scalar", "value": 2}}),
                   workload({"n": 8, "keep": 3}, {"keep_count": {"type": "scalar", "value": 3}})])


def test_an_axis_that_sizes_only_an_output_comes_from_the_drawn_binding(tmp_path, register, capsys):
    folder = _sizes_only_an_output(tmp_path)
    defn = load(register(folder).name)
    x = generate_inputs(defn, {"n": 8, "keep": 3})
    assert bind_axes(defn, x)["keep"] == 3
    with pytest.raises(ValueError, match=r"\['keep'\] cannot be read off the inputs"):
        bind_axes(defn, list(x))                  # a plain list does not say what it was drawn for
    assert cli.main(["check", "--problem", folder, "--impl", "sol_reference", "--in-process"]) == 0, \
        capsys.readouterr()


def _native_dtypes(tmp_path):
    """An NVFP4 x FP8 projection: packed e2m1 weights with e4m3 block scales, an e5m2 bias."""
    return write_problem(
        tmp_path / "native", name="test_native_low_precision_dtypes",
        axes={"m": {"type": "var"}, "n": {"type": "const", "value": 8}, "k": {"type": "const", "value": 32},
              "k_half": {"type": "expr", "expression": "k // 2"}, "sf": {"type": "const", "value": 16},
              "k_blocks": {"type": "expr", "expression": "k // sf"}},
        inputs={"x": tensor(["m", "k"], "bfloat16"), "w_fp4": tensor(["n", "k_half"], "float4_e2m1fn_x2"),
                "w_scale": tensor(["n", "k_blocks"], "float8_e4m3fn"), "bias": tensor(["n"], "float8_e5m2"),
                "global_scale": tensor(None, "float32")},
        outputs={"y": tensor(["m", "n"], "bfloat16")},
        reference=f"""
            import torch

            E2M1 = {E2M1}


            def run(x, w_fp4, w_scale, bias, global_scale):
                packed = w_fp4.view(torch.uint8).to(torch.int64)
                codes = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2)
                w = torch.tensor(E2M1, device=x.device)[codes]
                w = w * w_scale.to(torch.float32).repeat_interleave(16, dim=-1) * global_scale
                return (x.to(torch.float32) @ w.t() + bias.to(torch.float32)).to(torch.bfloat16)
            """,
        workloads=[workload({"m": 4}, {"global_scale": {"type": "scalar", "value": 0.5}}, atol=2e-2, rtol=2e-2),
                   workload({"m": 6}, {"global_scale": {"type": "scalar", "value": 0.5}}, atol=2e-2, rtol=2e-2)])


def test_inputs_in_the_benchmarks_own_dtypes_bind_and_check(tmp_path, register, capsys):
    from fuseval.inputs import DrawnInputs
    folder = _native_dtypes(tmp_path)
    defn = load(register(folder).name)
    x = generate_inputs(defn, {"m": 4})
    as_benchmark = [v.view(torch.float4_e2m1fn_x2) if isinstance(v, torch.Tensor) and v.dtype == torch.uint8 else v
                    for v in x]
    assert as_benchmark[1].dtype == torch.float4_e2m1fn_x2
    assert bind_axes(defn, DrawnInputs(as_benchmark, {"m": 4}))["k"] == 32
    with pytest.raises(ValueError, match=r"'w_scale' must have dtype torch.float8_e4m3fn"):
        bind_axes(defn, as_benchmark[:2] + [as_benchmark[2].view(torch.uint8)] + as_benchmark[3:])
    assert cli.main(["check", "--problem", folder, "--impl", "sol_reference", "--in-process"]) == 0, \
        capsys.readouterr()


def test_the_built_in_nvfp4_operator_takes_packed_fp4_as_the_benchmark_hands_it():
    from fuseval.operators import implementations as ops
    op = ops.get("nvfp4_qkv_rope", "small")
    x = generate_inputs(op.definition, {"batch_size": 1, "seq_len": 2}, seed=0)
    as_benchmark = [v.view(torch.float4_e2m1fn_x2) if spec.dtype == "float4_e2m1fn_x2" else v
                    for v, spec in zip(x, op.definition.inputs)]
    assert TORCH_DTYPES["float4_e2m1fn_x2"] == torch.uint8
    bind_axes(op.definition, as_benchmark)
    for name in ("reference", "torch", "sol_reference"):
        fn = op.implementation(name)
        for a, b in zip(fn(*x), fn(*as_benchmark)):
            assert torch.equal(a, b), name
