"""Triton implementations of the operators (one module per operator).

Triton decides at import time whether kernels run compiled or in its CPU interpreter
(``TRITON_INTERPRET=1``). On a machine without a CUDA device there is nothing to compile
for, so importing ``fuseval.fast`` selects the interpreter unless the user chose already;
this must happen before triton is first imported to take effect."""
import os as _os

import torch as _torch

if not _torch.cuda.is_available():
    _os.environ.setdefault("TRITON_INTERPRET", "1")

if _os.environ.get("TRITON_INTERPRET") == "1":
    from ._interpreter import install as _install_interpreter_shortcut

    _install_interpreter_shortcut()
