"""Torch's process-wide matmul precision flags, set for the length of a block.

``torch.backends.cuda.matmul.allow_tf32`` (with cuDNN's twin) and
``allow_fp16_reduced_precision_reduction`` are global to the process: a reference that
needs them set one way (the benchmark's reference runs with TF32 off; the fp16 baseline
accumulates in fp32 throughout) sets them for its block and restores them after. The
gate may run two operators in threads of one process (:mod:`fuseval.gate.parallel`), so
every such block holds one lock: two blocks never interleave their save and restore (which
would leave a flag changed after both). A float32 computation outside any block still
reads whatever a block in another thread set; the threaded gate on a GPU therefore runs
only while TF32 is off, the one setting that blocks in the gate's process ask for
(:func:`tf32_is_off`).
"""
from __future__ import annotations

import threading

import torch

__all__ = ["matmul_flags", "tf32_is_off"]

_LOCK = threading.RLock()


class matmul_flags:  # noqa: N801 - used as a context manager, like torch's own
    """Within the block: TF32 tensor cores for float32 matmuls and convolutions on or off
    (``tf32``), and cuBLAS fp16 GEMMs allowed reduced-precision split-K reductions or not
    (``fp16_reduction``); None leaves a flag as it is."""

    def __init__(self, *, tf32: bool | None = None, fp16_reduction: bool | None = None):
        self.tf32, self.fp16_reduction = tf32, fp16_reduction

    def __enter__(self):
        _LOCK.acquire()
        m = torch.backends.cuda.matmul
        self.old = (m.allow_tf32, torch.backends.cudnn.allow_tf32, m.allow_fp16_reduced_precision_reduction)
        if self.tf32 is not None:
            m.allow_tf32 = torch.backends.cudnn.allow_tf32 = self.tf32
        if self.fp16_reduction is not None:
            m.allow_fp16_reduced_precision_reduction = self.fp16_reduction
        return self

    def __exit__(self, *exc):
        m = torch.backends.cuda.matmul
        try:
            m.allow_tf32, torch.backends.cudnn.allow_tf32, m.allow_fp16_reduced_precision_reduction = self.old
        finally:
            _LOCK.release()


def tf32_is_off() -> bool:
    """Whether float32 matmuls run in full float32 (torch's default)."""
    return not torch.backends.cuda.matmul.allow_tf32
