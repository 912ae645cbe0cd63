"""float64 (and float32) references of every stage of the fused operators: the oracles.

``stages`` holds the shared stage functions, ``nvfp4`` the exact NVFP4 codec, and one
module per operator composes them (with stage taps under the SPEC.md stage names)."""
