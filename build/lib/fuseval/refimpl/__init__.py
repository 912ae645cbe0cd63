"""The shared pieces of the float64 oracles: ``stages`` holds the stage functions every
operator composes (rms_norm, linear, rope, attention, swiglu...), ``nvfp4`` the exact NVFP4
codec. Each operator's own oracle lives in its package (``fuseval/operators/<name>/``),
with stage taps under the stage names of its definition."""
