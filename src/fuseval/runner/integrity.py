"""What an implementation may not change in the process it runs in.

A snapshot of the functions a verdict depends on (fuseval's comparison and hygiene
functions, torch's tensor arithmetic and comparisons, a few builtins) is taken before the
implementation is imported; after every call the same names are looked up again, and any
that resolve to a different object are reported. In an isolated run (the default, see
:mod:`fuseval.runner.isolation`) the verdict is computed in another process, so tampering cannot
change it; it is still reported (violation ``tampered``), because an implementation that
patches torch's arithmetic is not computing what it claims to. Threads the implementation
started and left running after it returned are reported too (``lingering_thread``): they
can write into outputs after they were checked.
"""
from __future__ import annotations

import builtins
import importlib
import threading
import time
import weakref
from typing import Any

__all__ = ["snapshot", "changed", "threads", "new_threads", "WATCHED"]

# (module path, attribute path): looked up by name at snapshot and check time
WATCHED: tuple[tuple[str, str], ...] = tuple(
    # each function under every name a verdict looks it up by: where it is defined and
    # where run_case and the hygiene rules import it from
    [("fuseval.check", n) for n in ("compare", "fingerprint", "run_case", "poison_allocator", "same_outputs",
                                     "partial_calls", "judge_partial_calls", "blind_outputs", "check_outputs_shape",
                                     "bind_axes", "generate_inputs")]
    + [("fuseval.comparison", n) for n in ("compare", "_compare_sol", "_metrics", "_finite_or_zero", "_unravel",
                                          "blind_outputs", "rms")]
    + [("fuseval.hygiene", n) for n in ("fingerprint", "overlaps", "poison_allocator", "same_outputs", "_same_value",
                                         "partial_calls", "judge_partial_calls", "compare", "draw_inputs")]
    + [("fuseval.runner.in_process", n) for n in ("overlaps", "poison_allocator")]
    + [("fuseval.validate", "check_outputs_shape")]
    + [("torch", n) for n in ("abs", "sub", "add", "mul", "div", "eq", "le", "lt", "ge", "gt", "ne",
                               "isfinite", "isnan", "isinf", "isclose", "allclose", "equal", "where",
                               "full_like", "zeros_like", "argmax", "unravel_index", "empty", "zeros",
                               "tensor", "arange", "matmul", "sum", "max", "all", "any")]
    + [("torch.linalg", "vector_norm"), ("torch.testing", "assert_close")]
    + [("torch.Tensor", n) for n in ("__sub__", "__rsub__", "__add__", "__radd__", "__mul__", "__rmul__",
                                      "__truediv__", "__abs__", "__neg__", "__eq__", "__ne__", "__le__",
                                      "__lt__", "__ge__", "__gt__", "__and__", "__or__", "__invert__",
                                      "__bool__", "__float__", "__int__", "__getitem__", "__setitem__",
                                      "__torch_function__", "abs", "sub", "to", "double", "float", "detach",
                                      "clone", "copy_", "contiguous", "view", "flatten", "sum", "mean",
                                      "max", "min", "all", "any", "item", "numel", "isfinite", "isnan",
                                      "nan_to_num", "tolist", "data_ptr", "untyped_storage", "equal")]
    + [("builtins", n) for n in ("abs", "all", "any", "float", "int", "max", "min", "sum", "len",
                                  "isinstance", "type")]
    # the timer (fuseval.runner.clock binds these at import; rebinding them is reported)
    + [("time", n) for n in ("perf_counter", "perf_counter_ns", "monotonic", "time")]
    + [("torch.cuda", n) for n in ("synchronize", "Event", "Event.record", "Event.elapsed_time",
                                    "Event.synchronize", "Event.query", "current_stream", "Stream")]
    + [("fuseval.runner.clock", n) for n in ("run_timed", "refresh", "scale_of", "_watched", "_sync", "_tensors",
                                             "_perf_counter", "_Random", "_cuda_synchronize", "_Event",
                                             "_event_record", "_event_elapsed", "_tensor_copy", "_tensor_zero")]
)


def _lookup(module: str, attr: str) -> Any:
    if module == "builtins":
        obj: Any = builtins
    elif module == "torch.Tensor":
        import torch
        obj = torch.Tensor
    else:
        obj = importlib.import_module(module)
    for part in attr.split("."):
        # the class dict, not getattr: a patched __getattr__ must not hide a replacement
        d = getattr(obj, "__dict__", {})
        obj = d[part] if part in d else getattr(obj, part)
    return obj


def snapshot() -> dict[str, int]:
    """name -> id of the object the name resolves to now (the objects are kept alive by
    their modules, so an id is not reused while the name still points at it)."""
    out = {}
    for module, attr in WATCHED:
        try:
            out[f"{module}.{attr}"] = id(_lookup(module, attr))
        except (ImportError, AttributeError, KeyError):
            continue
    return out


def changed(before: dict[str, int]) -> list[str]:
    """The watched names that resolve to a different object than in ``before``."""
    now = snapshot()
    return [name for name, ident in before.items() if now.get(name) != ident]


def threads() -> set[int]:
    return {t.ident for t in threading.enumerate() if t.ident is not None}


# threads fuseval itself starts in this process (the output drain of a worker that a call
# spawned, e.g. a problem folder's confined worker started by its first call): not the
# implementation's. Held by identity, so a thread that only borrows one's name is still seen.
_OWN_THREADS: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


def own_thread(thread: threading.Thread) -> threading.Thread:
    """Mark ``thread`` as fuseval's own (:func:`new_threads` leaves it out); returns it."""
    _OWN_THREADS.add(thread)
    return thread


def new_threads(before: set[int], grace: float = 0.05) -> list[str]:
    """Threads alive now that were not in ``before`` and are not fuseval's own (after a
    short grace period for ones that are finishing): their names."""
    deadline = time.monotonic() + grace
    while True:
        extra = [t for t in threading.enumerate() if t.ident not in before and t.is_alive()
                 and t not in _OWN_THREADS]
        if not extra or time.monotonic() >= deadline:
            return [t.name for t in extra]
        time.sleep(0.005)
