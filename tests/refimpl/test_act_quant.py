"""The benchmark's NVFP4 activation quantizer (fuseval.refimpl.nvfp4.quantize_activations)
against two independent implementations (tests/helpers/act_quant_independent.py): codes, block
scales and the global decode scale equal bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from act_quant_independent import e2m1_by_thresholds, quantize_loops, quantize_ml_dtypes
from fuseval.refimpl import nvfp4


def _ours(x: torch.Tensor):
    aq = nvfp4.quantize_activations(x)
    return aq.codes.numpy(), aq.scales.numpy(), np.float32(aq.global_decode.item())


def _assert_same(x, want):
    codes, scales, gd = _ours(x)
    w_codes, w_scales, w_gd = want
    assert gd.tobytes() == np.float32(w_gd).tobytes(), (gd, w_gd)
    bad_s = np.flatnonzero(scales != w_scales)
    assert bad_s.size == 0, f"{bad_s.size} scale bytes differ, first at {bad_s[:5]}"
    bad_c = np.flatnonzero(codes != w_codes)
    assert bad_c.size == 0, (f"{bad_c.size} codes differ, first at {bad_c[:5]}: ours "
                             f"{codes.flat[bad_c[:5]]} want {w_codes.flat[bad_c[:5]]}")


def _adversarial_rows() -> torch.Tensor:
    """Rows whose scaled values land exactly on every threshold and its neighbours.

    Row 0 fixes amax = 6 * 448 / 2688 * ... : with amax = 6 the global encode is 448 and
    a block whose amax is 6 gets s = 448 (the clamp's edge); its encode is then 1/(448 *
    (1/448)) and y = x exactly, so x = 0.25, 0.75, ... are exact ties."""
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    rows = []
    for t in ties:
        up, down = np.nextafter(np.float32(t), np.float32(10)), np.nextafter(np.float32(t), np.float32(0))
        row = [6.0, t, -t, float(up), float(down), -float(up), -float(down), 0.0,
               -0.0, 0.1, -0.1, -0.25, 0.5, 3.0, 4.0, -6.0]
        rows.append(row)
    rows.append([0.0] * 16)                                   # a zero block
    rows.append([1e-30, -1e-30] * 8)                          # a block whose scale underflows to 0
    rows.append([-0.0] * 16)                                  # -0.0 everywhere: code 0, not 8
    rows.append([6.0, 5.999, -6.0, 1e-8] + [0.01] * 12)       # another block at the clamp's edge
    return torch.tensor(rows, dtype=torch.float32)


def test_thresholds_are_round_to_nearest_even_with_the_benchmarks_sign_rule():
    grid = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    for code, lo_tie in [(0, 0.25), (2, 0.75), (2, 1.25), (4, 1.75), (4, 2.5), (6, 3.5), (6, 5.0)]:
        assert e2m1_by_thresholds(lo_tie) == code == int(nvfp4.encode_e2m1(torch.tensor(lo_tie)))
    assert e2m1_by_thresholds(-0.0) == 0 and e2m1_by_thresholds(-0.1) == 8
    assert [grid[e2m1_by_thresholds(v)] for v in (0.3, 0.7, 1.3, 1.7, 2.6, 3.4, 5.1)] == \
        [0.5, 0.5, 1.5, 1.5, 3, 3, 6]


def test_adversarial_values_match_the_loops_bit_for_bit():
    x = _adversarial_rows()
    _assert_same(x, quantize_loops(x))
    codes, scales, gd = _ours(x)
    assert gd == np.float32(1) / np.float32(448)       # amax 6: global encode 2688 / 6
    assert scales[0, 0] == 0x7E                         # the block holding amax: e4m3 448
    # ties at 448 x (1/448): 0.25 -> 0, -0.25 -> -0 (code 8), 0.75 -> 1 (code 2), -0.75 -> code 10
    assert list(codes[0, :3]) == [7, 0, 8] and codes[1, 1] == 2 and codes[1, 2] == 10
    zero_row, under_row, negzero_row = 7, 8, 9
    assert (codes[zero_row] == 0).all() and scales[zero_row, 0] == 0
    assert scales[under_row, 0] == 0                    # the scale underflows e4m3 ...
    assert set(codes[under_row].tolist()) == {7, 15}    # ... so encode = fp32 max and y saturates
    assert (codes[negzero_row] == 0).all()              # -0.0 is code 0 (y < 0 is false)
    assert codes[0, 10] == 8                            # -0.1 -> -0 (code 8)


def test_adversarial_values_match_ml_dtypes_bit_for_bit():
    x = _adversarial_rows()
    _assert_same(x, quantize_ml_dtypes(x))


@pytest.mark.parametrize("dist", ["randn", "heavy", "bf16", "tiny", "huge"])
def test_a_million_random_values_match_ml_dtypes_bit_for_bit(dist):
    g = torch.Generator().manual_seed(11)
    shape = (1024, 1024)
    x = torch.randn(shape, generator=g)
    if dist == "heavy":
        x = x * torch.exp(3 * torch.randn(shape, generator=g))
    elif dist == "bf16":
        x = x.to(torch.bfloat16)
    elif dist == "tiny":
        x = x * 1e-30
    elif dist == "huge":
        x = x * 1e36
    _assert_same(x, quantize_ml_dtypes(x.float().numpy()))


def test_random_rows_match_the_loops():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 64, generator=g) * torch.exp(torch.randn(6, 64, generator=g))
    _assert_same(x, quantize_loops(x))


def test_dequantized_activations_are_code_times_scale_times_global_decode():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 2, 32, generator=g).to(torch.bfloat16)
    aq = nvfp4.quantize_activations(x)
    assert aq.codes.shape == (3, 2, 32) and aq.scales.shape == (3, 2, 2)
    codes, scales, gd = quantize_loops(x.float().reshape(6, 32))
    want = np.zeros((6, 32))
    from test_refimpl import e2m1, e4m3
    for r in range(6):
        for c in range(32):
            want[r, c] = e2m1(int(codes[r, c])) * e4m3(int(scales[r, c // 16])) * float(gd)
    assert torch.equal(aq.dequantize().reshape(6, 32), torch.from_numpy(want))
    # close to x: NVFP4 keeps about 1.5 significant bits per element
    assert float((aq.dequantize() - x.double()).abs().max()) <= float(x.float().abs().max()) / 4


def test_the_per_token_amax_mutant_changes_codes():
    """The deliberately wrong per-row amax is visible in the codes (the act_quant tap
    compares them exactly), even where x_hat barely moves."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(8, 64, generator=g) * torch.linspace(0.1, 10, 8)[:, None]
    right = nvfp4.quantize_activations(x)
    wrong = nvfp4.quantize_activations(x, amax_over="token")
    assert not torch.equal(right.scales, wrong.scales)


@pytest.mark.parametrize("bad, match", [(torch.zeros(4, 15), "multiple of 16"),
                                        (torch.zeros(4, 16, dtype=torch.int32), "floating-point")])
def test_bad_input_is_named(bad, match):
    with pytest.raises(ValueError, match=match):
        nvfp4.quantize_activations(bad)
