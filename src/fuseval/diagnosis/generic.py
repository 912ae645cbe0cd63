"""Generic mistakes: bugs that fit any reference, tried where they apply.

An imported problem has no mutant catalogue, but its reference is torch code, and a few
mistakes are the same in every kernel: a dropped epsilon, a transposed operand, a missing
causal mask, a wrong softmax scale, a matmul accumulated in bf16 or fp16, every
intermediate kept in bf16. Each is a :class:`torch.overrides.TorchFunctionMode` that
rewrites the torch calls it concerns while the lifted oracle (:mod:`fuseval.interop.lift`)
runs the reference; a mistake *applies* when it rewrote at least one call and the result
differs from the oracle's. The mode sits outside the lift's own modes, so it sees every
call with the arguments the lifted run gives it (float64), and the native (traced) run and
the lifted one take the same path.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from ..definitions import Definition
from ..operators.implementations import resolve_impl
from .matching import MutantMatch, agreement_all, passes

__all__ = ["GENERIC_MISTAKES", "run_generic", "generic_matches"]

_ADD = {torch.add, torch.Tensor.add, torch.Tensor.__add__, torch.Tensor.__radd__}
_MUL = {torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__}
_DIV = {torch.div, torch.Tensor.div, torch.Tensor.__truediv__}
_MATMUL = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.bmm, torch.Tensor.mm,
           torch.Tensor.bmm}
_MASK = {torch.Tensor.masked_fill, torch.Tensor.masked_fill_, torch.masked_fill}
_NORMS = {F.layer_norm: 4, F.group_norm: 4}
if hasattr(F, "rms_norm"):
    _NORMS[F.rms_norm] = 3


def _scalar(x) -> float | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    if isinstance(x, torch.Tensor) and x.dim() == 0 and x.is_floating_point():
        return float(x)
    return None


def _round(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype).to(t.dtype)


def _is_scale(s: float) -> bool:
    """s is 1/sqrt(n) or sqrt(n) for an integer n >= 4 (an attention scale)."""
    for v in (s, 1.0 / s if s else 0.0):
        if v > 0:
            n = round(1.0 / (v * v))
            if n >= 4 and abs(n * v * v - 1) < 1e-6:
                return True
    return False


class _Mistake(TorchFunctionMode):
    """Rewrites the calls of one kind of mistake; ``hits`` counts the rewritten calls."""

    def __init__(self, kind: str, site: int | None = None, count_only: bool = False):
        super().__init__()
        self.kind, self.hits, self.site, self.count_only = kind, 0, site, count_only
        self.sites: list[str] = []          # each call the mistake applies to, in words

    def summary(self) -> dict:
        """What the run under this mode did (JSON data: it crosses from a problem's worker)."""
        return {"hits": self.hits, "sites": list(self.sites)}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if self.count_only or self.site is not None:
            # one call site only: find the calls it applies to, rewrite the chosen one
            done = getattr(self, "_" + self.kind)(func, list(args), dict(kwargs))
            if done is NotImplemented:
                return func(*args, **kwargs)
            k = len(self.sites)
            self.sites.append(_site_text(func, args))
            if k == self.site:
                self.hits += 1
                return done
            return func(*args, **kwargs)
        done = getattr(self, "_" + self.kind)(func, list(args), kwargs)
        if done is not NotImplemented:
            self.hits += 1
            return done
        return func(*args, **kwargs)

    # each rewrite returns the mistaken result, or NotImplemented where it does not apply
    def _dropped_epsilon(self, func, args, kw):
        if func in _ADD and len(args) == 2:
            for k in (0, 1):
                s = _scalar(args[1 - k])
                if isinstance(args[k], torch.Tensor) and args[k].dim() > 0 and s is not None and 0 < s <= 1e-3:
                    return func(args[0], 0.0) if k == 0 else func(0.0, args[1])
        if func in _NORMS:
            pos = _NORMS[func]
            if "eps" in kw and kw["eps"]:
                kw["eps"] = 0.0
                return func(*args, **kw)
            if len(args) > pos and args[pos]:
                args[pos] = 0.0
                return func(*args, **kw)
        return NotImplemented

    def _transposed_operand(self, func, args, kw):
        if func in _MATMUL and len(args) >= 2 and isinstance(args[1], torch.Tensor) and args[1].dim() >= 2 \
                and args[1].shape[-1] == args[1].shape[-2] and args[1].shape[-1] > 1:
            return func(args[0], args[1].transpose(-1, -2), *args[2:], **kw)
        if func is F.linear and len(args) >= 2 and args[1].dim() == 2 and args[1].shape[0] == args[1].shape[1]:
            return func(args[0], args[1].t(), *args[2:], **kw)
        return NotImplemented

    def _missing_causal_mask(self, func, args, kw):
        if func is F.scaled_dot_product_attention:
            if kw.get("is_causal") or (len(args) > 5 and args[5]):
                kw["is_causal"] = False
                args = args[:5]
                return func(*args, **kw)
            if kw.get("attn_mask") is not None or (len(args) > 3 and args[3] is not None):
                kw["attn_mask"] = None
                return func(*args[:3], **kw)
        if func in _MASK and len(args) >= 3:
            v = _scalar(args[2])
            if v is not None and v <= -1e4:
                return args[0] if func is not torch.Tensor.masked_fill_ else args[0]
        return NotImplemented

    def _softmax_scale(self, func, args, kw):
        if func is F.scaled_dot_product_attention and kw.get("scale") is None and len(args) < 7:
            kw["scale"] = 1.0
            return func(*args, **kw)
        if (func in _MUL or func in _DIV) and len(args) == 2:
            for k in (0, 1):
                s = _scalar(args[1 - k])
                if isinstance(args[k], torch.Tensor) and args[k].dim() >= 2 and s is not None and _is_scale(s):
                    return args[k]
        return NotImplemented

    def _accumulate(self, func, args, kw, dtype: torch.dtype):
        if func is F.linear and len(args) >= 2:
            x, w = args[0], args[1]
            bias = args[2] if len(args) > 2 else kw.get("bias")
            y = _chunked(x, w.transpose(-1, -2), dtype)
            return y if bias is None else _round(y + bias, dtype)
        if func in _MATMUL and len(args) >= 2 and all(isinstance(a, torch.Tensor) for a in args[:2]) \
                and args[0].dim() >= 2 and args[1].dim() >= 2 and args[0].is_floating_point():
            return _chunked(args[0], args[1], dtype)
        return NotImplemented

    def _accumulation_bf16(self, func, args, kw):
        return self._accumulate(func, args, kw, torch.bfloat16)

    def _accumulation_fp16(self, func, args, kw):
        return self._accumulate(func, args, kw, torch.float16)

    def _intermediates_bf16(self, func, args, kw):
        out = func(*args, **kw)
        if isinstance(out, torch.Tensor) and out.is_floating_point() and out.dtype in (torch.float32, torch.float64):
            return _round(out, torch.bfloat16)
        return NotImplemented if not isinstance(out, torch.Tensor) else out


def _site_text(func, args) -> str:
    shapes = " x ".join(str(list(a.shape)) for a in args[:2] if isinstance(a, torch.Tensor))
    return f"{getattr(func, '__name__', str(func))}({shapes})"


def _chunked(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, chunk: int = 16) -> torch.Tensor:
    """a @ b with operands in ``dtype`` and the running sum rounded to ``dtype`` after each
    ``chunk`` of the reduction: an accumulator of that precision."""
    a, b = _round(a, dtype), _round(b, dtype)
    k = a.shape[-1]
    acc = None
    for k0 in range(0, k, chunk):
        part = a[..., k0:k0 + chunk] @ b[..., k0:k0 + chunk, :]
        acc = part if acc is None else acc + part
        acc = _round(acc, dtype)
    return acc


# name -> what the mistake is, in a sentence
GENERIC_MISTAKES = {
    "dropped_epsilon": "the epsilon of a normalisation dropped (x * rsqrt(mean(x^2)))",
    "transposed_operand": "a square matmul operand used transposed",
    "missing_causal_mask": "the causal mask (or attention mask) never applied",
    "softmax_scale": "the attention scores not scaled by 1/sqrt(d)",
    "accumulation_bf16": "matmuls accumulated in bf16 (operands and running sums rounded to bf16)",
    "accumulation_fp16": "matmuls accumulated in fp16 (operands and running sums rounded to fp16)",
    "intermediates_bf16": "every intermediate rounded to bf16 (a wrong intermediate dtype)",
}


def _run_under_mode(defn: Definition) -> Callable | None:
    """How an operator whose reference runs elsewhere (an imported problem's, in its own
    worker) runs it under a torch function mode: its module's ``reference_under_mode``,
    or None for an operator whose oracle runs here."""
    module = defn.operator.module
    return getattr(module, "reference_under_mode", None)


def _reference_runner(defn: Definition) -> Callable[[Sequence[Any]], tuple]:
    """How to run the float64 reference of one of fuseval's own operators (under the
    variant in force, as its mutants are)."""
    ref = resolve_impl(defn.operator.load(), "reference")

    def run_reference(inputs):
        outs = ref(*inputs)
        return tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    return run_reference


# mistakes tried one call site at a time (a single transposed weight, not every square one)
PER_SITE = {"transposed_operand": 8}


def run_generic(defn: Definition, kind: str, inputs: Sequence[Any], site: int | None = None,
                count_only: bool = False) -> tuple[tuple | None, int, list[str]]:
    """(the oracle's outputs with mistake ``kind`` (at call ``site`` only, when given), how
    many calls it rewrote, the calls it applies to). An imported problem's oracle is its
    reference lifted to float64, run where its code runs
    (its module's ``reference_under_mode``, under this module's mode)."""
    elsewhere = _run_under_mode(defn)
    if elsewhere is not None:
        outs, said = elsewhere(inputs, (f"{__name__}:_Mistake", [kind, site, count_only]))
        return tuple(outs), int(said["hits"]), [str(x) for x in said["sites"]]
    mode = _Mistake(kind, site, count_only)
    with torch.no_grad(), mode:
        outs = _reference_runner(defn)(inputs)
    return tuple(outs), mode.hits, mode.sites


def generic_matches(defn: Definition, inputs, outputs, refs, tol, output_names) -> list:
    """Every generic mistake that applies on ``inputs``, as :class:`MutantMatch` (kind "generic")."""

    found = []
    tries = []
    for kind, what in GENERIC_MISTAKES.items():
        if kind in PER_SITE:
            try:
                _, _, sites = run_generic(defn, kind, inputs, count_only=True)
            except Exception:  # noqa: BLE001 - the mistake does not apply here
                sites = []
            # a site seen twice with the same shapes is one call of a loop: its first one is tried
            seen: dict[str, int] = {}
            for k, text in enumerate(sites):
                seen.setdefault(text, k)
            tries += [(f"{kind}#{k}", kind, k, f"{what}: call {k} of the reference, {text}")
                      for text, k in list(seen.items())[:PER_SITE[kind]]]
        else:
            tries.append((kind, kind, None, what))
    for name, kind, site, what in tries:
        t0 = time.perf_counter()
        try:
            produced, hits, _ = run_generic(defn, kind, inputs, site=site)
        except Exception as exc:  # noqa: BLE001 - a mistake that breaks the reference does not apply
            found.append(MutantMatch(name, "", what, 0.0, {}, math.inf, False, kind="generic",
                                     error=f"{type(exc).__name__}: {exc}"[:200]))
            continue
        if not hits:
            continue
        produced = [p.to(o.dtype) if isinstance(p, torch.Tensor) and p.dtype != o.dtype and p.is_floating_point()
                    else p for p, o in zip(produced, outputs)]
        a, per, l2 = agreement_all(outputs, produced, tol, output_names)
        found.append(MutantMatch(name, "", what, a, per, l2, not passes(produced, refs, tol), kind="generic",
                                 seconds=time.perf_counter() - t0))
    return found
