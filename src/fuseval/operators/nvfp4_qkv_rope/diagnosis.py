"""What the diagnosis should know of the NVFP4 QKV projection (fuseval.diagnosis.hints):
its outputs' axes in words, the two RoPE halves of head_dim, the fast path's token tiles
(block_m over batch*seq rows, a multiple of 16) and its input groups."""
from __future__ import annotations

from ...diagnosis.hints import Hints, Part


def hints(bound) -> Hints:
    d = bound.get("head_dim", 128)
    return Hints(
        labels={"num_attention_heads": "query head", "num_key_value_heads": "kv head", "seq_len": "token",
                "head_dim": "head-dim index", "batch_size": "batch item"},
        parts={"head_dim": [Part("first RoPE half", 0, d // 2), Part("second RoPE half", d // 2, d)]},
        tiles={"seq_len": [16, 64, 128]},
        groups={"activations": ["hidden_states"],
                "weights": ["q_proj_weight_fp4", "q_proj_scale", "q_proj_global_decode_scale", "k_proj_weight_fp4",
                            "k_proj_scale", "k_proj_global_decode_scale", "v_proj_weight_fp4", "v_proj_scale",
                            "v_proj_global_decode_scale", "q_norm_weight", "k_norm_weight"],
                "rope tables": ["cos", "sin"]})
