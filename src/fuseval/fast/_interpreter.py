"""A faster Triton interpreter for the CPU runs, computing exactly what it computes.

Triton 3.6's interpreter re-patches ``triton.language`` (an ``inspect.getmembers`` walk of
the module, its tensor class and ``tl.math``) at every call of a ``@triton.jit``
helper from inside a kernel, although the launch that runs the kernel has patched the very
same modules already and restores them when it ends; the helper's patches are never
restored themselves. The fast paths' kernels call helpers in their inner loops (decode,
rounding, online softmax), so on the small configurations this re-patching is a large
share of an interpreted call (figures: docs/design/harness.md#triton-interpreter-shortcuts).

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
messages read it (it is now formatted when read).

Shapes (``_install_shape_shortcuts``): every op builds a ``block_type`` and a ``tensor``,
each unwrapping, validating and re-wrapping its shape in fresh Triton tuples; a shape
seen before reuses the objects of its first sight. Two operands of one shared shape skip
``broadcast_impl_value``'s loop, and a cast to an operand's own scalar type returns it at
once (Triton returns both unchanged in those cases).

The kernels' outputs are bit for bit the same, and Triton's errors for shapes it refuses
are its own (``tests/fast/test_interpreter_patch.py``). It applies to the Triton version it was written
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
    _install_shape_shortcuts(tl.core)
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


def _install_shape_shortcuts(core) -> None:
    """Block types and tensors of a shape seen before share that shape's objects.

    Each interpreted op makes a ``block_type`` (its shape unwrapped, validated and
    formatted) and a ``tensor`` (the shape again as a Triton tuple of constexprs, and its
    element count), which the semantic layer only reads. The first ``block_type`` of a
    shape runs Triton's own code; later ones of that shape reuse its shape tuple and count
    (the display name is formatted when read), and a tensor whose type holds such a shared
    tuple reuses one tuple of constexprs and one count. The interpreter never mutates
    these objects (only the compiler's code generator writes into Triton tuples).
    ``_unwrap_if_constexpr`` answers plain values and constexprs before its general case."""
    constexpr, block_type, tensor, triton_tuple = core.constexpr, core.block_type, core.tensor, core.tuple
    original_block_init, original_tensor_init = block_type.__init__, tensor.__init__
    original_unwrap = core._unwrap_if_constexpr
    block_shapes: dict = {}      # dims (ints) -> (the shared Triton tuple, numel)
    # id(shared Triton tuple), None for scalars -> (numel as constexpr, shape as constexprs)
    tensor_shapes: dict = {}

    def block_type_init(self, element_ty, shape):
        kind = type(shape)
        if kind is list or kind is triton_tuple:
            try:
                dims = tuple([d.value if type(d) is constexpr else d
                              for d in (shape if kind is list else shape.values)])
                known = block_shapes.get(dims)
            except TypeError:                       # an unhashable dimension: Triton's error
                known = None
            if known is not None:
                self.element_ty = element_ty
                self.shape, self.numel = known
                return
        original_block_init(self, element_ty, shape)
        dims = tuple(self.shape.values)
        if all(type(d) is int for d in dims) and dims not in block_shapes:
            block_shapes[dims] = (self.shape, self.numel)

    def block_type_name(self):
        return f'<{self.shape}, {self.element_ty}>'

    def tensor_init(self, handle, type_):
        block = type_.is_block()
        known = tensor_shapes.get(id(type_.shape) if block else None)
        if known is None:
            original_tensor_init(self, handle, type_)
            if not block:
                tensor_shapes[None] = (self.numel, self.shape)        # scalars: () and 1
            elif block_shapes.get(tuple(type_.shape.values), (None,))[0] is type_.shape:
                tensor_shapes[id(type_.shape)] = (self.numel, self.shape)
            return
        self.handle = handle
        self.numel, self.shape = known
        self.type = type_
        self.dtype = type_.scalar

    plain = {int, float, bool, str, type(None), tensor}

    def unwrap_if_constexpr(o):
        t = type(o)
        if t is constexpr:
            return o.value
        if t in plain:
            return o
        return original_unwrap(o)

    block_type.__init__ = block_type_init
    block_type.name = property(block_type_name, lambda self, value: None)
    tensor.__init__ = tensor_init
    core._unwrap_if_constexpr = unwrap_if_constexpr

    # two blocks of one shared shape need no broadcast: Triton's loop over the dimensions
    # would return both operands unchanged
    from triton.language.semantic import TritonSemantic
    original_broadcast = TritonSemantic.broadcast_impl_value

    def broadcast_impl_value(self, lhs, rhs):
        lhs_ty, rhs_ty = lhs.type, rhs.type
        if lhs_ty.is_block() and rhs_ty.is_block() and lhs_ty.shape is rhs_ty.shape:
            return lhs, rhs
        return original_broadcast(self, lhs, rhs)

    # a cast to the operand's own scalar type returns the operand (Triton's first test)
    original_cast = TritonSemantic.cast

    def cast(self, input, dst_ty, fp_downcast_rounding=None):
        if input.type.scalar is dst_ty.scalar:
            return input
        return original_cast(self, input, dst_ty, fp_downcast_rounding)

    TritonSemantic.broadcast_impl_value = broadcast_impl_value
    TritonSemantic.cast = cast
