"""SOL-ExecBench Quant/028: the NVFP4 (W4A4) QKV projection of Qwen3 with per-head q/k
RMSNorm and RoPE, GQA 32/8 heads, bf16 outputs in [B, heads, S, D].

``reference.py``: the float64 oracle (after the benchmark's own float32 activation
quantizer), the benchmark's reference as it runs (``sol_reference``), torch baselines and
the benchmark's input generator; ``fast.py``: the Triton fast path (quantizer ``_quant.py``,
kernels ``_kernels.py`` and, on Hopper, ``_gluon.py``, launcher ``_launch.py``, stage taps
``_staged.py``), whose ``options()`` gives the tile tables in force."""
from .. import OperatorSpec

SPEC = OperatorSpec(
    name="nvfp4_qkv_rope",
    package=__name__,
    inputs={"benchmark": ".reference:benchmark_inputs"},
    cost_model=".reference:cost_model",
    properties=".properties:HOOKS",
    mutants=".mutants:catalogue",
    diagnosis=".diagnosis:hints",
    fast_options=".fast:options",
    fast_parts=".fast:parts",
)
