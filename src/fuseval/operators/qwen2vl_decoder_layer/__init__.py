"""SOL-ExecBench L2/019: one Qwen2-VL decoder layer in float32 (RMSNorm, QKV with bias,
mRoPE in the benchmark's contiguous (D/4, 3D/8, 3D/8) layout, causal GQA attention,
O-projection, RMSNorm, SwiGLU MLP, two residual adds).

``reference.py``: the float64 oracle with stage taps, the benchmark's reference as it runs
(``sol_reference``) and torch baselines; ``fast.py``: the Triton fast path (its kernels in
``_kernels.py``, ``_attention.py`` and ``_gluon.py``, their launchers in ``_launch.py``, tile
tables and plans in ``_plans.py``)."""
from .. import OperatorSpec

SPEC = OperatorSpec(
    name="qwen2vl_decoder_layer",
    package=__name__,
    inputs={"realistic": ".reference:realistic_inputs"},
    cost_model=".reference:cost_model",
    properties=".properties:HOOKS",
    mutants=".mutants:catalogue",
    diagnosis=".diagnosis:hints",
    fast_options=".fast:options",
)
