"""The reference lifted to float64 (fuseval.interop.lift) and torch._scaled_mm by exact
dequantization (fuseval.interop.emulate). Expected values are computed here in float64
from the formulas, never taken from the code under test."""
import math
import os

import pytest
import torch

from fuseval.interop import emulate, lift
from fuseval.interop.problem_code import reference_module
from fuseval.interop.sol_problem import read_problem
from fuseval.refimpl import nvfp4

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "sol_problems")


def test_a_cast_to_bf16_inside_is_lifted():
    def ref(x):
        return (x.to(torch.bfloat16) * 3).float().sum(-1)
    x = torch.randn(4, 64)
    result = lift.run_lifted(ref, [x])
    exact = (x.double() * 3).sum(-1)
    assert result.report.lifted and result.lifted[0].dtype == torch.float64
    assert torch.allclose(result.lifted[0], exact, rtol=1e-14, atol=1e-14)
    assert not torch.allclose(result.native[0].double(), exact, rtol=1e-6, atol=1e-6)   # rounding inside
    assert result.report.lifted_casts == {"lifted: to float32 -> bfloat16": 1}


def test_buffers_of_fixed_dtype_and_default_float32_tensors_are_lifted():
    def ref(x):
        out = torch.empty(x.shape, dtype=torch.bfloat16)
        out.copy_(x * torch.tensor(1.0 / 3.0))          # a float32 constant by torch's default
        return out
    x = torch.randn(16, dtype=torch.float32)
    result = lift.run_lifted(ref, [x])
    assert result.lifted[0].dtype == torch.float64
    assert torch.allclose(result.lifted[0], x.double() / 3, rtol=1e-15, atol=0)
    assert result.native[0].dtype == torch.bfloat16


def test_methods_float_half_bfloat16_are_lifted():
    def ref(x):
        return (x.half().float() + x.bfloat16().float()) * 0.5
    x = torch.randn(32) * 10
    result = lift.run_lifted(ref, [x])
    assert torch.equal(result.lifted[0], x.double())


def _quantizer_ref(x):
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = amax / 448.0
    codes = (x / scale).to(torch.float8_e4m3fn)
    return codes.to(torch.float32) * scale, codes


def _tie_inputs() -> torch.Tensor:
    """Rows whose elements sit exactly on e4m3 rounding midpoints of x / (amax / 448) in real
    arithmetic: a float32 and a float64 scale land on different sides of some of them."""
    rows = []
    for amax in (3.0, 5.0, 6.0, 11.0, 13.0, 17.0, 19.0, 23.0):
        mids = [m + 0.5 for m in range(8, 16)] + [m + 1.0 for m in range(16, 32, 2)]
        rows.append([amax] + [t * amax / 448.0 for t in mids])
    return torch.tensor(rows, dtype=torch.float32)


def test_quantizer_codes_stay_as_defined_and_lifting_them_would_move_codes():
    x = _tie_inputs()
    native_codes = _quantizer_ref(x)[1]
    all_f64_codes = (x.double() / (x.double().abs().amax(-1, keepdim=True) / 448.0)).to(torch.float8_e4m3fn)
    moved = native_codes.view(torch.uint8) != all_f64_codes.view(torch.uint8)
    assert moved.any(), "precondition: the test inputs must put some codes on a float32/float64 tie"

    kept = lift.run_lifted(_quantizer_ref, [x], ["x"])
    assert torch.equal(kept.lifted[1].view(torch.uint8), native_codes.view(torch.uint8))
    assert kept.report.kept_casts == {"kept (quantizer): to float32 -> float8_e4m3fn": 1}
    assert kept.report.quantized_inputs == ["x"]
    # the dequantized values: the kept codes times the float32 scale, exact in float64
    scale32 = x.abs().amax(-1, keepdim=True) / 448.0
    assert torch.equal(kept.lifted[0], native_codes.double() * scale32.double())

    # mutant: lift the quantizer too: codes move to the float64 ones
    lifted_all = lift.run_lifted(_quantizer_ref, [x], ["x"], keep_quantizers=False)
    assert torch.equal(lifted_all.lifted[1].view(torch.uint8), all_f64_codes.view(torch.uint8))


def test_a_quantizer_writing_codes_in_place_through_masks_is_kept():
    def ref(x):
        scale = x.abs().amax() / 6.0
        y = x / scale
        codes = torch.zeros_like(x, dtype=torch.uint8)
        codes[(y > 0.25) & (y < 0.75)] = 1          # part of an e2m1 encoder, by comparisons
        codes[y >= 0.75] = 2
        return codes.view(torch.int8), y.to(torch.bfloat16)
    x = torch.randn(64)
    result = lift.run_lifted(ref, [x])
    assert torch.equal(result.lifted[0], result.native[0])
    # y is behind the codes: it keeps the reference's float32 arithmetic; only its own
    # cast to bf16 (which no quantizer reads) is lifted
    y32 = x / (x.abs().amax() / 6.0)
    assert result.lifted[1].dtype == torch.float64 and torch.equal(result.lifted[1], y32.double())


def test_a_reference_that_branches_on_dtype_falls_back_to_the_native_run_with_a_note():
    def ref(x):
        if x.dtype == torch.float32:
            return x.sum(-1)
        return x.abs().sum(-1)
    x = torch.randn(3, 5)
    result = lift.run_lifted(ref, [x])
    assert not result.report.lifted and "another path" in result.report.note
    assert torch.equal(result.lifted[0], result.native[0].double())


def test_a_reference_without_torch_calls_is_not_lifted():
    result = lift.run_lifted(lambda x: (x,), [1.0])
    assert not result.report.lifted and "no torch calls" in result.report.note


def test_a_python_float_taken_out_of_a_tensor_flows_into_a_later_quantizer():
    def ref(x):
        scale = (x.abs().amax() / 448.0).item()     # float32 arithmetic, then a Python float
        return (x.double() / scale).to(torch.float8_e4m3fn)
    x = _tie_inputs()[:1]
    native = ref(x)
    with_float64_scale = (x.double() / (3.0 / 448.0)).to(torch.float8_e4m3fn)
    assert not torch.equal(native.view(torch.uint8), with_float64_scale.view(torch.uint8)), \
        "precondition: a float64 scale must move a code of these inputs"
    result = lift.run_lifted(ref, [x])
    assert torch.equal(result.lifted[0].view(torch.uint8), native.view(torch.uint8))


def test_problem_fixture_quantizer_is_reported():
    p = read_problem(os.path.join(DATA, "fp8_quant"))
    source = reference_module(p)
    x, w = torch.randn(16, 64), torch.randn(8, 64) / 8
    result = lift.run_lifted(source.run, [x, w], list(p.inputs))
    lines = "\n".join(result.report.lines())
    assert "kept (quantizer): to float32 -> float8_e4m3fn: 1" in lines and "lifted: to float32 -> bfloat16: 2" in lines
    exact = result.lifted[1].double() * (x.abs().amax(-1, keepdim=True) / 448.0).double() @ w.double().T
    assert torch.allclose(result.lifted[0], exact, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- _scaled_mm
def _swizzle(scales: torch.Tensor) -> torch.Tensor:
    """cuBLAS's block-scale layout, written from its description: 128x4 tiles, each as 32
    groups of (4 row quarters x 4 columns), flattened."""
    rows, cols = scales.shape
    tiles = scales.view(rows // 128, 128, cols // 4, 4).permute(0, 2, 1, 3)
    return tiles.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1).contiguous()


def test_unswizzle_inverts_the_layout():
    grid = torch.arange(256 * 8, dtype=torch.int32).view(256, 8)
    assert torch.equal(emulate.unswizzle_block_scales(_swizzle(grid), 256, 8), grid)
    with pytest.raises(ValueError, match="expected 2048 elements"):
        emulate.unswizzle_block_scales(torch.zeros(100), 256, 8)


@pytest.mark.parametrize("lifted", [True, False])
def test_nvfp4_scaled_mm_by_exact_dequantization(lifted):
    g = torch.Generator().manual_seed(0)
    m, n, k = 128, 128, 64
    a = nvfp4.quantize_nvfp4(torch.randn(m, k, generator=g))
    b = nvfp4.quantize_nvfp4(torch.randn(n, k, generator=g))
    a_deq = nvfp4.dequantize_nvfp4(a[0], a[1], 1.0)
    b_deq = nvfp4.dequantize_nvfp4(b[0], b[1], 1.0)
    fp4 = torch.float4_e2m1fn_x2
    out = emulate.scaled_mm((a[0].view(fp4), b[0].view(fp4).t(), _swizzle(a[1].view(torch.uint8)),
                             _swizzle(b[1].view(torch.uint8)).view(torch.float8_e4m3fn)),
                            {"out_dtype": torch.bfloat16}, lifted=lifted)
    exact = a_deq @ b_deq.T
    if lifted:
        assert out.dtype == torch.float64 and torch.allclose(out, exact, rtol=1e-14, atol=1e-12)
    else:
        assert out.dtype == torch.bfloat16 and torch.equal(out, exact.to(torch.bfloat16))


def test_fp8_scaled_mm_rowwise_and_tensorwise_scales():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(8, 32, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(16, 32, generator=g).to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(8, 1, generator=g) + 0.5, torch.rand(1, 16, generator=g) + 0.5
    out = emulate.scaled_mm((a, b, sa, sb), {"out_dtype": torch.float32}, lifted=True)
    exact = (a.double() * sa.double()) @ (b.double() * sb.double())
    assert torch.allclose(out, exact, rtol=1e-14, atol=1e-12)
    one = torch.tensor(2.0)
    out = emulate.scaled_mm((a, b, one, one), {"out_dtype": torch.bfloat16}, lifted=False)
    assert torch.equal(out, (4 * a.double() @ b.double()).to(torch.bfloat16))
    with pytest.raises(ValueError, match="does not tile"):
        emulate.scaled_mm((a, b, torch.ones(3, 5), one), {}, lifted=True)


def test_an_fp4_gemm_reference_runs_on_a_machine_without_blackwell():
    fp4 = torch.float4_e2m1fn_x2

    def ref(a, b, sa, sb):
        return torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(2)
    qa = nvfp4.quantize_nvfp4(torch.randn(128, 64, generator=g))
    qb = nvfp4.quantize_nvfp4(torch.randn(128, 64, generator=g))
    args = [qa[0].view(fp4), qb[0].view(fp4), _swizzle(qa[1].view(torch.uint8)).view(torch.float8_e4m3fn),
            _swizzle(qb[1].view(torch.uint8)).view(torch.float8_e4m3fn)]
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 10:
        pytest.skip("this machine runs the FP4 GEMM itself")
    native = lift.run_native(ref, args)[0]
    result = lift.run_lifted(ref, args)
    exact = nvfp4.dequantize_nvfp4(qa[0], qa[1], 1.0) @ nvfp4.dequantize_nvfp4(qb[0], qb[1], 1.0).T
    assert torch.equal(native, exact.to(torch.bfloat16))
    assert result.lifted[0].dtype == torch.float64 and torch.allclose(result.lifted[0], exact, rtol=1e-14)
    assert any("emulated by exact dequantization" in n for n in result.report.emulated)
    assert math.isfinite(float(result.lifted[0].abs().max()))
