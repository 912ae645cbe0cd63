"""A faster Triton interpreter for the CPU runs, computing exactly what it computes.

Triton 3.6's interpreter re-patches ``triton.language`` (an ``inspect.getmembers`` walk of
the module, its tensor class and ``tl.math``, about 2 ms) at every call of a ``@triton.jit``
helper from inside a kernel, although the launch that runs the kernel has patched the very
same modules already and restores them when it ends; the helper's patches are never
restored themselves. The fast paths' kernels call helpers in their inner loops (decode,
rounding, online softmax), so on the small configurations this re-patching is about 30% of
an interpreted call.

:func:`install` makes a helper call skip the re-patch when every language module its
globals see is one the enclosing launch, or an earlier helper call within it, patched
(Triton's own helpers in ``triton.language.standard``, such as ``tl.sum``, also see
``triton.language.core``, which a kernel's globals usually do not hold); otherwise (a
helper seen outside a launch, or the first to bring a language module in) it patches as
before. A helper's patches are never restored by Triton, so within the launch they
stand, and patching again would set the same attributes to equivalent values.

Two more of the interpreter's per-op costs go the same way, with the same results:
``_get_np_dtype`` rebuilds a 20-entry dict of numpy dtypes at each of its calls (a table
built once answers instead), and ``tl.tuple_type`` formats its display name at each
construction, hundreds of thousands of times per call of a fast path, though only error
messages read it (it is now formatted when read). Together about 15% of an interpreted
call (op A's 16 small cases 7.7 -> 6.3 s, op B's 8.5 -> 7.4 s). The kernels' outputs are bit for bit the same
(``tests/test_interpreter_patch.py``). It applies to the Triton version it was written
against (3.6.x) and only under ``TRITON_INTERPRET=1``; ``FUSEVAL_PLAIN_INTERPRETER=1``
leaves Triton untouched.
"""
from __future__ import annotations

import os
import threading

__all__ = ["install", "installed"]

_STATE = threading.local()
_INSTALLED = [False]


def installed() -> bool:
    return _INSTALLED[0]


def _language_modules(fn, tl) -> frozenset[int]:
    return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)


def install() -> bool:
    """Install the helper-call shortcut (once); returns whether it is in force."""
    if _INSTALLED[0]:
        return True
    if os.environ.get("TRITON_INTERPRET") != "1" or os.environ.get("FUSEVAL_PLAIN_INTERPRETER") == "1":
        return False
    import triton
    import triton.language as tl
    from triton.runtime import interpreter as interp
    needed = (getattr(interp, "GridExecutor", None), getattr(interp, "InterpretedFunction", None),
              getattr(interp, "_patch_lang", None), getattr(interp, "InterpreterError", None),
              getattr(interp, "_get_np_dtype", None), getattr(tl.core, "tuple_type", None))
    if not triton.__version__.startswith("3.6.") or any(x is None for x in needed) \
            or not hasattr(interp.InterpretedFunction, "rewrite"):
        return False
    launch = interp.GridExecutor.__call__

    def launch_call(self, *args, **kwargs):
        # the language modules this launch patches (its kernel's globals), for its helpers
        outer = getattr(_STATE, "patched", None)
        _STATE.patched = _language_modules(self.fn, tl)
        try:
            return launch(self, *args, **kwargs)
        finally:
            _STATE.patched = outer

    def helper_call(self, *args, **kwargs):
        patched = getattr(_STATE, "patched", None)
        mods = _language_modules(self.fn, tl)
        if patched is None or not mods <= patched:
            interp._patch_lang(self.fn)
            if patched is not None:
                # a helper's patches are never restored: they hold for the rest of the launch
                _STATE.patched = patched | mods
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interp.InterpreterError(repr(e)) from e

    interp.GridExecutor.__call__ = launch_call
    interp.InterpretedFunction.__call__ = helper_call
    _install_type_shortcuts(interp, tl)
    _INSTALLED[0] = True
    return True


def _install_type_shortcuts(interp, tl) -> None:
    """``_get_np_dtype`` from a table of the scalar types (filled by the original on
    first sight), and ``tuple_type``'s display name formatted when read."""
    original = interp._get_np_dtype
    table: dict = {}

    def np_dtype(tt_dtype):
        if isinstance(tt_dtype, tl.pointer_type):
            return original(tt_dtype)
        scalar = tt_dtype
        if isinstance(tt_dtype, tl.block_type):
            if isinstance(tt_dtype.element_ty, tl.pointer_type):
                return original(tt_dtype)
            scalar = tt_dtype.element_ty
        found = table.get(scalar)
        if found is None:
            found = table[scalar] = original(scalar)
        return found

    def tuple_type_init(self, types, fields=None):
        self.types = types
        self.fields = fields or [''] * len(types)

    def tuple_type_name(self):
        return '[' + ','.join([f"{k}:{v}" for k, v in zip(self.fields, self.types)]) + ']'

    interp._get_np_dtype = np_dtype
    tl.core.tuple_type.__init__ = tuple_type_init
    tl.core.tuple_type.name = property(tuple_type_name)
