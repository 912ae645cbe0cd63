"""What the diagnosis should know of the decoder layer (fuseval.diagnosis.hints): its
output is [batch, token, hidden] (heads are mixed by the O-projection, so no head axis);
the fast path tiles tokens by 16-128; its input groups."""
from __future__ import annotations

from ...diagnosis.hints import Hints


def hints(bound) -> Hints:
    return Hints(
        labels={"batch_size": "batch item", "seq_len": "token", "hidden_size": "hidden index"},
        tiles={"seq_len": [16, 32, 64, 128]},
        groups={"activations": ["hidden_states"],
                "weights": ["input_layernorm_weight", "q_proj_weight", "q_proj_bias", "k_proj_weight", "k_proj_bias",
                            "v_proj_weight", "v_proj_bias", "o_proj_weight", "post_attention_layernorm_weight",
                            "gate_proj_weight", "up_proj_weight", "down_proj_weight"],
                "rope tables": ["rope_cos", "rope_sin"]})
