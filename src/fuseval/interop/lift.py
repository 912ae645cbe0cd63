"""A problem's reference run as written, and lifted to float64, without editing its source.

The lifted run is fuseval's oracle of an imported problem: the reference's float inputs
in float64 and its own casts to lower float types (``.to(torch.bfloat16)``, ``.float()``,
``dtype=torch.float32`` buffers, torch's float32 default for new tensors) kept in
float64, through a :class:`torch.overrides.TorchFunctionMode`. Quantizers stay as the
problem defines them, since their codes are part of the operator: lifting the scale
arithmetic of an fp8 quantizer moves scales across e4m3 midpoints and flips codes.

How (two runs of the reference):

1. **native, traced**: the reference as written (what the benchmark compares against),
   every torch call recorded with the calls whose results it read (a tensor's readers
   depend on every call that created or wrote its storage; a Python float taken out of a
   tensor may flow anywhere, so every later call depends on it).
2. **lifted, replayed**: the same calls in the same order. The *quantizer slice* (every
   call a quantizing cast depends on: casts to fp8/fp4, float-to-integer conversions,
   bit reinterpretations, and the calls behind integer or fp8/fp4 outputs) runs natively
   on the native inputs; every other call gets its float arguments and dtype arguments
   in float64 (complex64 in complex128).

When the second run takes another path (a branch on a dtype or a value), raises, or
cannot be made (a reference without torch calls), the oracle is the native run and the
:class:`LiftReport` says why (``lifted`` False, ``note``): whoever compares against it
reports that its verdict is against the reference in its own precision. Running out of
memory in the lifted run is not such a case: it is raised, as the caller's budget. The report lists the casts that were lifted and
the ones that were kept, by function and dtypes.
"""
from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import is_out_of_memory
from . import emulate

__all__ = ["LiftReport", "LiftResult", "run_lifted", "run_native", "LOWER_PRECISION"]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# lower precision -> what the lifted run computes in
LOWER_PRECISION: dict[torch.dtype, torch.dtype] = {
    torch.float32: torch.float64, torch.float16: torch.float64, torch.bfloat16: torch.float64,
    torch.complex64: torch.complex128,
}
if hasattr(torch, "complex32"):
    LOWER_PRECISION[torch.complex32] = torch.complex128

_LIFTED_METHODS = {torch.Tensor.float: torch.Tensor.double, torch.Tensor.half: torch.Tensor.double,
                   torch.Tensor.bfloat16: torch.Tensor.double}
_CASTS = {"to", "type", "type_as", "float", "half", "bfloat16", "double"}
# integer results of float or bool data that are selections, not codes: they stay lifted
_SELECTIONS = {"argmax", "argmin", "argsort", "sort", "topk", "kthvalue", "max", "min", "median", "mode",
               "nonzero", "argwhere", "unique", "unique_consecutive", "msort", "nanmedian"}
_FLOAT_EXTRACTIONS = {"item", "tolist", "__float__"}
_QUANTIZED_NAMES = {_dtype_name(d) for d in emulate.QUANTIZED_DTYPES}
# how many bits a float format keeps, coarsely: a cast to a lower rank rounds ("new": a buffer made
# with a dtype, which rounds whatever is written into it)
_RANK = {"new": 4, "float64": 3, "complex128": 3, "float32": 2, "complex64": 2, "float16": 1, "bfloat16": 1,
         "complex32": 1}


def _func_key(func: Any) -> str:
    """A stable name of a torch function (property getters included: ``shape.__get__``)."""
    owner = getattr(func, "__self__", None)
    if owner is not None and not isinstance(owner, (type, torch.Tensor)) and hasattr(owner, "__name__"):
        return f"{owner.__name__}.{getattr(func, '__name__', '?')}"
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)


def _is_integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex) and dtype != torch.bool


def _short(func_key: str) -> str:
    return func_key.split(".")[-1]


def _tensors(flat: Sequence[Any]) -> list[tuple[int, torch.Tensor]]:
    return [(i, x) for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]


def _root(t: torch.Tensor) -> torch.Tensor:
    base = t._base
    return t if base is None else base


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:          # inference tensors have no version counter
        return -1


def _call(func, args, kwargs, *, lifted: bool, notes: list[str]):
    """``func(*args, **kwargs)``; ``torch._scaled_mm`` by exact dequantization where the
    lifted run needs it, or where this machine cannot run it (an FP4 GEMM off Blackwell)."""
    if emulate.is_scaled_mm(func):
        if lifted:
            return emulate.scaled_mm(args, kwargs, lifted=True)
        try:
            return func(*args, **kwargs)
        except (RuntimeError, NotImplementedError, TypeError, ValueError) as exc:
            note = (f"torch._scaled_mm emulated by exact dequantization (float64 accumulation, one rounding "
                    f"to out_dtype): this machine cannot run it ({str(exc).splitlines()[0][:120]})")
            if note not in notes:
                notes.append(note)
            return emulate.scaled_mm(args, kwargs, lifted=False)
    return func(*args, **kwargs)


@dataclass
class _Call:
    key: str
    deps: set[int]                       # calls (>= 0) and inputs (-1 - index) it read
    mutated: tuple[int, ...]             # flat argument positions written in place
    arg_dtypes: dict[int, torch.dtype]   # flat position -> dtype of each tensor argument
    seed: bool                           # a quantizing cast (its slice stays native)
    cast: tuple[str, str] | None = None  # (from dtype, to dtype) of a cast-like call
    # flat position -> each dtype argument as the native run passed it (a kept call gets these back:
    # ``dtype = x.dtype`` read off a lifted tensor is float64 in the replay)
    dtype_args: dict[int, torch.dtype] = field(default_factory=dict)


class _Trace(TorchFunctionMode):
    """The native run, recording every torch call and what it read."""

    def __init__(self, inputs: Sequence[Any]):
        super().__init__()
        self.calls: list[_Call] = []
        self.notes: list[str] = []
        self._writers: dict[int, tuple[weakref.ref, set[int]]] = {}
        self._scalar_sources: set[int] = set()
        for k, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                self._add_writer(_root(x), -1 - k)

    def _add_writer(self, root: torch.Tensor, node: int) -> None:
        key = id(root)
        entry = self._writers.get(key)
        if entry is None or entry[0]() is not root:
            entry = (weakref.ref(root, lambda _r, k=key: self._writers.pop(k, None)), set())
            self._writers[key] = entry
        entry[1].add(node)

    def deps_of(self, t: torch.Tensor) -> set[int]:
        entry = self._writers.get(id(_root(t)))
        return set(entry[1]) if entry is not None and entry[0]() is _root(t) else set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        tensors = _tensors(flat)
        versions = [_version(t) for _, t in tensors]
        deps = set(self._scalar_sources)
        for _, t in tensors:
            deps |= self.deps_of(t)
        out = _call(func, args, kwargs, lifted=False, notes=self.notes)
        index = len(self.calls)
        key = _func_key(func)
        mutated = tuple(pos for (pos, t), v in zip(tensors, versions) if _version(t) != v)
        for pos in mutated:
            self._add_writer(_root(flat[pos]), index)
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        for o in outs:
            self._add_writer(_root(o), index)
        name = _short(key)
        reinterprets = name == "view" and any(isinstance(x, torch.dtype) for x in flat)
        float_in = any(t.dtype.is_floating_point or t.dtype.is_complex for _, t in tensors)
        # codes: integers made from floats or from comparisons of floats (a bool -> uint8 mask,
        # a bucketize, a rounding cast), values in an fp8/fp4 format, bit reinterpretations
        integer_out = any(_is_integer(o.dtype) for o in outs)
        seed = any(o.dtype in emulate.QUANTIZED_DTYPES for o in outs) or reinterprets \
            or (integer_out and name not in _SELECTIONS
                and any(t.dtype.is_floating_point or t.dtype == torch.bool for _, t in tensors))
        if name in _FLOAT_EXTRACTIONS and float_in:
            self._scalar_sources.add(index)
        cast = None
        if (name in _CASTS or reinterprets) and tensors and outs and outs[0].dtype != tensors[0][1].dtype:
            cast = (_dtype_name(tensors[0][1].dtype), _dtype_name(outs[0].dtype))
        elif "dtype" in kwargs and outs and name not in _CASTS:
            cast = ("new", _dtype_name(outs[0].dtype))
        self.calls.append(_Call(key, deps, mutated, {p: t.dtype for p, t in tensors}, seed, cast,
                                {p: x for p, x in enumerate(flat) if isinstance(x, torch.dtype)}))
        return out

    def slice_of_quantizers(self, outputs: Sequence[Any]) -> set[int]:
        """The calls every quantizing cast (and every integer or fp8/fp4 output) depends on."""
        todo = [i for i, c in enumerate(self.calls) if c.seed]
        for o in outputs:
            if isinstance(o, torch.Tensor) and not (o.dtype.is_floating_point and o.dtype not in
                                                    emulate.QUANTIZED_DTYPES) and not o.dtype.is_complex:
                todo += [d for d in self.deps_of(o) if d >= 0]
        keep: set[int] = set()
        while todo:
            i = todo.pop()
            if i in keep:
                continue
            keep.add(i)
            todo += [d for d in self.calls[i].deps if d >= 0 and d not in keep]
        return keep


class _Diverged(RuntimeError):
    pass


class _Lift(TorchFunctionMode):
    """The replay in float64: the quantizer slice natively, everything else lifted."""

    def __init__(self, trace: _Trace, keep: set[int], native_of: dict[int, Any], native_default: torch.dtype):
        super().__init__()
        self.trace, self.keep, self.native_of = trace, keep, native_of
        self.native_default = native_default
        self.position = 0
        self.left_low: Counter = Counter()     # calls whose float outputs stayed below float64
        self.notes: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        i, self.position = self.position, self.position + 1
        calls = self.trace.calls
        key = _func_key(func)
        if i >= len(calls) or calls[i].key != key:
            expected = calls[i].key if i < len(calls) else "the end of the run"
            raise _Diverged(f"the lifted run took another path at torch call {i}: {key} where the "
                            f"native run made {expected}")
        record = calls[i]
        flat, spec = tree_flatten((args, kwargs))
        if i in self.keep:
            for pos, x in enumerate(flat):
                native_dtype = record.dtype_args.get(pos)
                if isinstance(x, torch.dtype) and native_dtype is not None and x != native_dtype:
                    # a dtype the reference read off a lifted tensor (``out_dtype=x.dtype``): the
                    # quantizer slice runs as written, so it gets the native run's
                    flat[pos] = native_dtype
                elif isinstance(x, torch.Tensor):
                    x = self.native_of.get(id(x), x)
                    want = record.arg_dtypes.get(pos)
                    if want is not None and x.dtype != want:
                        # a lifted value reached the quantizer slice through a path the trace
                        # did not see (not through a tensor it tracks): read as the reference would
                        note = (f"call {i} ({_short(key)}) of the quantizer slice read a lifted {x.dtype}: "
                                f"rounded to {want}")
                        if note not in self.notes:
                            self.notes.append(note)
                        x = x.to(want)
                    flat[pos] = x
            args, kwargs = tree_unflatten(flat, spec)
            with _default_dtype(self.native_default):
                return _call(func, args, kwargs, lifted=False, notes=self.notes)
        for pos, x in enumerate(flat):
            if isinstance(x, torch.Tensor) and x.dtype in LOWER_PRECISION and pos not in record.mutated:
                flat[pos] = x.to(LOWER_PRECISION[x.dtype])
            elif isinstance(x, torch.dtype) and x in LOWER_PRECISION:
                flat[pos] = LOWER_PRECISION[x]
        args, kwargs = tree_unflatten(flat, spec)
        out = _call(_LIFTED_METHODS.get(func, func), args, kwargs, lifted=True, notes=self.notes)
        for o in tree_flatten(out)[0]:
            if isinstance(o, torch.Tensor) and o.dtype in LOWER_PRECISION:
                self.left_low[f"{_short(key)} -> {str(o.dtype).replace('torch.', '')}"] += 1
        return out


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


# --------------------------------------------------------------------------- results
@dataclass
class LiftReport:
    """What the lifted run did. ``lifted`` False: the oracle is the native run (``note`` why)."""
    lifted: bool
    note: str | None = None
    calls: int = 0
    kept_calls: int = 0                          # calls of the quantizer slice, run natively
    casts: dict[str, int] = field(default_factory=dict)   # "lifted|kept: func from -> to" -> count
    quantized_inputs: list[str] = field(default_factory=list)   # inputs read by the quantizer slice
    left_low: dict[str, int] = field(default_factory=dict)      # lifted calls that stayed below float64
    emulated: list[str] = field(default_factory=list)

    @property
    def kept_casts(self) -> dict[str, int]:
        return {k: v for k, v in self.casts.items() if k.startswith("kept")}

    @property
    def lifted_casts(self) -> dict[str, int]:
        return {k: v for k, v in self.casts.items() if k.startswith("lifted")}

    def lines(self) -> list[str]:
        """The report as text lines, for the terminal."""
        if not self.lifted:
            return [f"lifted oracle: not lifted, the native run is the oracle ({self.note})"]
        out = [f"lifted oracle: {self.calls} torch calls, {self.kept_calls} kept in the reference's own "
               f"precision (the quantizer slice)"]
        out += [f"  {k}: {v}" for k, v in sorted(self.casts.items())]
        if self.quantized_inputs:
            out.append("  inputs read by a quantizer (kept as defined): " + ", ".join(self.quantized_inputs))
        out += [f"  stayed below float64 outside the quantizers: {k} ({v}x)" for k, v in sorted(self.left_low.items())]
        out += [f"  note: {n}" for n in self.emulated]
        return out


@dataclass
class LiftResult:
    native: tuple[Any, ...]      # the reference as written
    lifted: tuple[Any, ...]      # the oracle: float outputs in float64
    report: LiftReport


def _as_tuple(out: Any) -> tuple[Any, ...]:
    if isinstance(out, (tuple, list)):
        return tuple(out)
    return (out,)


class _NativeMode(TorchFunctionMode):
    """The reference as written; only ``torch._scaled_mm`` is emulated where it cannot run."""

    def __init__(self):
        super().__init__()
        self.notes: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return _call(func, args, kwargs or {}, lifted=False, notes=self.notes)


def run_native(fn: Callable, inputs: Sequence[Any]) -> tuple[Any, ...]:
    """``fn(*inputs)`` as written (``torch._scaled_mm`` emulated only where it cannot run)."""
    with torch.no_grad(), _NativeMode():
        return _as_tuple(fn(*inputs))


def _float64(out: Any) -> Any:
    if isinstance(out, torch.Tensor) and out.dtype in LOWER_PRECISION:
        return out.to(LOWER_PRECISION[out.dtype])
    return out


def _cast_summary(trace: _Trace, keep: set[int]) -> dict[str, int]:
    counts: Counter = Counter()
    for i, c in enumerate(trace.calls):
        if c.cast is None:
            continue
        src, dst = c.cast
        # a cast that rounds: down from a float, into a quantized format, or a new buffer of
        # a lower float type (casts up, and from codes or integers, are exact either way)
        rounds = dst in _RANK and src in _RANK and (_RANK[dst] < _RANK[src] or _RANK[dst] == _RANK[src] < 3)
        quantizes = dst in _QUANTIZED_NAMES and (src in _RANK or src == "uint8")
        if not (rounds or quantizes):
            continue
        what = "kept (quantizer)" if i in keep else "lifted"
        counts[f"{what}: {_short(c.key)} {src} -> {dst}"] += 1
    return dict(counts)


def _first_failure(exc: BaseException) -> BaseException:
    """What made the lifted run fail: an exception raised while another one unwound the
    reference (a ``@torch.no_grad()`` decorator's exit makes one more torch call, which the
    replay sees as another path) stands for the one before it."""
    seen = exc
    while isinstance(seen, _Diverged) and seen.__context__ is not None and seen.__context__ is not seen:
        seen = seen.__context__
    return seen


def run_lifted(fn: Callable, inputs: Sequence[Any], input_names: Sequence[str] | None = None, *,
               keep_quantizers: bool = True) -> LiftResult:
    """Run ``fn`` as written and lifted to float64 (module docstring); float tensor inputs
    below float64 are copied to float64 for the lifted run, the others shared.
    ``keep_quantizers=False`` lifts the quantizers' scale arithmetic too: wrong for an
    oracle (it moves codes), there to show what keeping them prevents."""
    names = list(input_names) if input_names is not None else [f"input {k}" for k in range(len(inputs))]
    trace = _Trace(inputs)
    native_default = torch.get_default_dtype()
    with torch.no_grad(), trace:
        native = _as_tuple(fn(*inputs))
    if not trace.calls:
        report = LiftReport(False, "the reference makes no torch calls", emulated=trace.notes)
        return LiftResult(native, tuple(_float64(o) for o in native), report)
    keep = trace.slice_of_quantizers(native) if keep_quantizers else set()
    lifted_inputs, native_of = [], {}
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.dtype in LOWER_PRECISION:
            y = x.to(LOWER_PRECISION[x.dtype])
            native_of[id(y)] = x
            lifted_inputs.append(y)
        else:
            lifted_inputs.append(x)
    quantized = sorted({-1 - d for i in keep for d in trace.calls[i].deps if d < 0})
    replay = _Lift(trace, keep, native_of, native_default)
    try:
        with torch.no_grad(), _default_dtype(torch.float64), replay:
            lifted = _as_tuple(fn(*lifted_inputs))
        if replay.position != len(trace.calls):
            raise _Diverged(f"the lifted run made {replay.position} torch calls, the native run "
                            f"{len(trace.calls)}")
    except Exception as exc:  # noqa: BLE001 - a lifted run that fails: the native one, said in the report
        cause = _first_failure(exc)
        if is_out_of_memory(cause):
            raise cause from None         # memory is the caller's budget, not a reason to change the oracle
        why = cause if isinstance(cause, _Diverged) else f"the lifted run raised {type(cause).__name__}: {cause}"
        report = LiftReport(False, str(why).splitlines()[0], len(trace.calls), emulated=trace.notes)
        return LiftResult(native, tuple(_float64(o) for o in native), report)
    report = LiftReport(True, None, len(trace.calls), len(keep), _cast_summary(trace, keep),
                        [names[k] for k in quantized if k < len(names)], dict(replay.left_low),
                        list(dict.fromkeys(trace.notes + replay.notes)))
    return LiftResult(native, lifted, report)
