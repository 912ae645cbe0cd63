"""What the diagnosis should know of the residual add + RMSNorm (fuseval.diagnosis.hints)."""
from __future__ import annotations

from ...diagnosis.hints import Hints


def hints(bound) -> Hints:
    return Hints(labels={"batch_size": "batch item", "seq_len": "token", "hidden_size": "hidden index"},
                 groups={"activations": ["hidden_states", "residual"], "weights": ["rms_norm_weight"]})
