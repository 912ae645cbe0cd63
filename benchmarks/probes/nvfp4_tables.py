"""Candidate configurations of op B's fast path, as implementations ``fuseval bench`` can
time beside the production one (``--impls fast,nvfp4_tables:decode256,...`` with this
folder on PYTHONPATH). Each is ``fast.variant(...)``: the W4A4 forward with those options.

Config labels 'BM,BK,WARPS,STAGES,flags' (``KernelConfig.parse``): ``a`` transposed product,
``g`` Gluon kernel, ``p`` weights predecoded to bf16 once per call and read by TMA.
"""
from __future__ import annotations

from fuseval.operators.nvfp4_qkv_rope import fast

CANDIDATES = {
    "decode256": dict(config="256,64,8,4,a,g"),         # the in-loop decode (production until 2026-12-01)
    "p256s4": dict(config="256,64,8,4,a,g,p"),
    "p128s6": dict(config="128,64,8,6,a,g,p"),
    "p128s3": dict(config="128,64,8,3,a,g,p"),       # 96 KB of shared memory: two programs per SM
    # the production table with the predecode as a launch of its own
    "unfused": dict(quant_config=fast.QuantConfig(fuse_predecode=False)),
    # the production table, CUDA graphs up to 4096 tokens
    "graphs4096": dict(graph_max_tokens=4096),
    # the quantizer's fastest settings of the act-quant probe (tile 4096:4, amax steps of
    # 16384 elements; design B 2.2, the probe is at commit 7cff3a3), timed in the whole call
    "quant4096": dict(quant_config=fast.QuantConfig(tile=4096, warps=4, amax_block=16384)),
}

for _name, _options in CANDIDATES.items():
    globals()[_name] = fast.variant(**_options)
