"""The staged-call protocol of implementations: stage taps and overrides.

An implementation with stage taps is called as ``staged(*inputs, taps=dict, override=dict)``:
it stores each stage's output in ``taps`` under the stage's name and, for a stage named in
``override``, continues from the given tensor instead of its own (docs/budget.md). The
budget runs it here and in an implementation's worker process.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Mapping, Sequence

import torch

from .definitions import Definition
from .operators.implementations import resolve_impl

__all__ = ["StageReached", "TapsUntil", "run_until", "staged_of", "as_tuple", "has_params", "reference_of"]


class StageReached(Exception):
    """Raised from a taps dict once the wanted stage is written: ends a run early."""


class TapsUntil(dict):
    """A taps dict that stops the pipeline right after ``stop`` is stored."""

    def __init__(self, stop: str | None):
        super().__init__()
        self.stop = stop

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if key == self.stop:
            raise StageReached(key)


def run_until(fn: Callable, inputs: Sequence[Any], *, override: Mapping[str, torch.Tensor] | None,
              stop: str | None, **kwargs) -> tuple[dict[str, torch.Tensor], tuple | None]:
    """Run a staged function with ``override``; return (taps, outputs).

    With ``stop``, the run ends as soon as that stage's tap is stored (outputs None), so
    a local pass costs about one stage, not a pipeline. An implementation that fills its
    taps only at the end simply runs to completion."""
    taps = TapsUntil(stop)
    try:
        out = fn(*inputs, taps=taps, override=dict(override or {}), **kwargs)
    except StageReached:
        out = None
    return dict(taps), (None if out is None else as_tuple(out))


def as_tuple(out) -> tuple:
    if isinstance(out, torch.Tensor):
        return (out,)
    return tuple(out)


def has_params(fn: Callable, *names: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(n in params for n in names)


def staged_of(defn: Definition, impl: str | Callable, fn: Callable) -> Callable | None:
    """The staged function of an implementation, or None when it exposes no taps.

    ``forward.staged`` (the protocol); else the function itself when it takes ``taps``
    and ``override`` (the references, ``functools.partial(reference, ...)``); the float32
    reference of the table gets ``reference(dtype=float32)``."""
    staged = getattr(fn, "staged", None)
    if callable(staged):
        return staged
    if impl == "reference_fp32":
        return functools.partial(reference_of(defn), dtype=torch.float32)
    if has_params(fn, "taps", "override"):
        return fn
    return None


def reference_of(defn: Definition) -> Callable:
    return resolve_impl(defn, "reference")
