"""Op A's fp16 weight conversion on a second CUDA stream, as an implementation ``fuseval
bench`` can time beside the production one (``--impls fast,qwen2vl_overlap:overlap`` with
this folder on PYTHONPATH): the q, k, v weights converted first on the caller's stream,
the o_proj and MLP weights beside the norm, QKV, attention and o_proj kernels
(``Plan.overlap_conversion``). Calls below the table's fp16_weights_from convert nothing
and run as in production."""
from __future__ import annotations

from fuseval.operators.qwen2vl_decoder_layer import fast

overlap = fast.variant(tuning={"overlap_conversion": True})
