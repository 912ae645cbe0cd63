"""The lifted float64 oracle on patterns of the benchmark's references that once made it
compute something else than the reference in exact arithmetic (each a finding of the
dataset sweep that was not one). The problem folders are written by these tests; expected
values are computed here from the formulas, never taken from the code under test."""
import torch

from fuseval import cli
from fuseval.interop import lift
from fuseval.interop.problem_code import reference_module
from fuseval.interop.sol_problem import read_problem
from problem_folders import tensor, workload, write_problem


# SOL Quant/019 (nvfp4 GQA): ``dtype = hidden_states.dtype`` is passed as the output dtype of
# buffers (``torch.empty(..., dtype=output_dtype)``) that a later activation quantizer reads. In
# the lifted replay ``hidden_states`` is float64, so the kept (native) calls of the quantizer's
# slice made float64 buffers, the in-place writes into them went to rounded copies, and the
# oracle came out of uninitialized memory (all zeros: the reference matched 0.05%).
_DTYPE_FROM_INPUT = """
    import torch


    @torch.no_grad()
    def run(x):
        dtype = x.dtype
        buf = torch.empty(x.shape, dtype=dtype)
        buf[:] = x * 3
        amax = buf.float().abs().amax(dim=-1, keepdim=True)
        scale = amax / 448.0
        codes = (buf.float() / scale).to(torch.float8_e4m3fn)
        return codes.to(dtype) * scale.to(dtype)
    """


def _dtype_problem(tmp_path):
    return write_problem(
        tmp_path / "dtype_from_input", name="test_dtype_from_input",
        axes={"n": {"type": "var"}, "h": {"type": "const", "value": 64}},
        inputs={"x": tensor(["n", "h"], "bfloat16")}, outputs={"y": tensor(["n", "h"], "bfloat16")},
        reference=_DTYPE_FROM_INPUT, workloads=[workload({"n": 8}, atol=1e-2, rtol=2e-2)])


def test_a_dtype_read_off_an_input_reaches_the_quantizer_slice_as_the_native_run_read_it(tmp_path):
    problem = read_problem(_dtype_problem(tmp_path))
    run = reference_module(problem).run
    x = (torch.randn(8, 64) * 2).to(torch.bfloat16)
    result = lift.run_lifted(run, [x], ["x"])
    assert result.report.lifted, result.report.note
    # the quantizer's input is buf, (x * 3) in bf16; its codes and scale as written; the
    # dequantization after the codes (codes * scale) is outside the slice: exact in float64
    buf = (x.double() * 3).to(torch.bfloat16)
    scale = buf.float().abs().amax(-1, keepdim=True) / 448.0
    codes = (buf.float() / scale).to(torch.float8_e4m3fn)
    expected = codes.double() * scale.double()
    assert torch.equal(result.lifted[0], expected)
    assert not any("read a lifted" in n for n in result.report.emulated), result.report.emulated


def test_the_check_of_such_a_reference_passes_against_its_oracle(tmp_path, register, capsys):
    folder = _dtype_problem(tmp_path)
    code = cli.main(["check", "--problem", folder, "--impl", "sol_reference", "--in-process", "--no-hygiene",
                     "--seed", "0"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
