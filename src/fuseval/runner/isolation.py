"""Running an implementation in a confined process of its own.

An implementation under test runs in fuseval's process only with ``--in-process``. By
default it runs in a **worker**: a spawned Python process that confines itself before it
imports anything of the implementation's (:mod:`fuseval.runner.confine`: its own session,
no capabilities, a seccomp filter, a Landlock domain that lets it write only its scratch
folder), then imports the implementation (fuseval's process never does) and serves its
calls. The oracle, the comparison and the verdict are computed only in fuseval's process,
which reads nothing from the worker but the buffers it filled and a small JSON message per
call (never unpickled). The worker's standard output and error are a pipe fuseval reads
(:class:`CallResult.output`, shown quoted as the implementation's).

The verdict rests on what fuseval's process verifies itself after every call:

* the outputs: copied out of the shared buffers at once (:func:`fuseval.runner.transport.collect`);
* the inputs: sealed files on the CPU, whose private copies in the worker's memory map
  show every page it wrote (``mutated_input``, restored or not); on CUDA, the worker's
  copies compared bitwise with fuseval's;
* the worker's process tree: every process of its session but the worker is killed after
  each call, and a call that left any is ``child_process``;
* its exit: a deadline per case (``timeout``: killed); ``sys.exit`` is ``exited``; a worker
  that ends while a call runs is ``exited`` or ``crashed``, with its exit status;
* its CPU time between calls: work still running after a call returned is
  ``lingering_thread``;
* the size of what it hands back: outputs no larger than the definition's, stage taps
  bounded in number and size; a reply that is not fuseval's JSON, or is too large, is
  ``tampered``.

What the worker says about itself (functions the implementation replaced, threads it left,
outputs sharing an input's memory) can only add violations: it is believed when it admits
something, never needed for a verdict.

On the CPU, tensors travel as sealed memfds and shared output files; on CUDA through CUDA
IPC, from a memory pool of their own (:mod:`fuseval.runner.transport`). One worker serves
one implementation for a whole run (until the ``session()`` it was started in ends;
otherwise until fuseval's process exits); every case still gets fresh inputs.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import sys
import threading
import time
import warnings
from typing import Any, Sequence

from . import DEFAULT_TIMEOUT
from .confine import ConfinementWarning, confinement
from .worker import MAX_REPLY_BYTES, CallResult, Worker
from .in_worker import describe_exception, impl_error_location, is_oom
from ..operators.implementations import impl_label
from ..validate import bind_axes, expected_outputs

__all__ = ["DEFAULT_TIMEOUT", "Worker", "CallResult", "IsolatedImpl", "IsolationWarning", "worker_for",
           "session", "close_all", "can_isolate", "decide", "requested", "default_isolation",
           "impl_error_location", "describe_exception", "is_oom",
           "confinement", "MAX_REPLY_BYTES", "ConfinementWarning", "IsolationViolation"]

_MAX_WORKERS = 6
# whether check, the gate, the budget and baselines isolate when not told (``isolate=None``):
# True, unless a block of :func:`default_isolation` says otherwise
_DEFAULT = [True]


@contextlib.contextmanager
def default_isolation(isolate: bool):
    """Within the block, calls not told whether to isolate (``isolate=None``) isolate or not
    as ``isolate`` says, in every thread: for a program that embeds fuseval to check trusted
    code in its own process (fuseval's own tests of its rules do)."""
    old = _DEFAULT[0]
    _DEFAULT[0] = bool(isolate)
    try:
        yield
    finally:
        _DEFAULT[0] = old


def requested(isolate: bool | None) -> bool:
    """Whether isolation is asked for: ``isolate``, or the default in force when None."""
    return _DEFAULT[0] if isolate is None else bool(isolate)


class IsolationWarning(UserWarning):
    """An implementation given as a Python object that cannot be sent to a worker runs in
    fuseval's own process instead (it is trusted)."""


def _label(impl: Any) -> str:
    return impl_label(impl)


# --------------------------------------------------------------------------- pool
_lock = threading.Lock()
_workers: dict[tuple, Worker] = {}
_session_depth = [0]


def can_isolate(impl: Any) -> tuple[bool, str]:
    """Whether ``impl`` can be handed to a worker: names and 'module:function' paths
    always; a Python callable when it pickles by reference to an importable module."""
    if isinstance(impl, str):
        return True, ""
    module = getattr(impl, "__module__", None)
    if module in (None, "__main__", "__mp_main__"):
        return False, f"it is defined in {module or 'no module'}, which a worker process cannot import"
    try:
        pickle.dumps(impl)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means: not sendable
        return False, f"it cannot be pickled ({type(exc).__name__}: {exc})"
    return True, ""


def decide(impl: Any, isolate: bool | None = None, *, warn: bool = False, stacklevel: int = 2) -> bool:
    """The one decision whether ``impl``'s calls run in a worker process: isolation asked
    for (:func:`requested`) and the implementation sendable to a worker (:func:`can_isolate`).
    With ``warn``, an implementation asked to be isolated that cannot be gets an
    :class:`IsolationWarning` (it runs in fuseval's process: trusted)."""
    if not requested(isolate):
        return False
    ok, why = can_isolate(impl)
    if not ok and warn:
        warnings.warn(IsolationWarning(f"implementation {_label(impl)!r} runs in fuseval's own process (trusted): "
                                       f"{why}"), stacklevel=stacklevel + 1)
    return ok


_spare: list[Worker] = []


def _kind(device: str) -> str:
    return "cuda" if str(device).startswith("cuda") else "cpu"


def _take_spare(device: str) -> Worker | None:
    """A spare started for a device of ``device``'s kind (a GPU worker's confinement lets
    its driver write what it needs; a CPU worker's does not)."""
    for w in [w for w in _spare if _kind(w.device) == _kind(device)]:
        _spare.remove(w)
        if w.alive():
            return w
        w.kill()
    return None


def _make_spare(device: str) -> None:
    """Inside a ``session()``, start a process for the next implementation now, so that it
    has imported torch by the time it is needed (``FUSEVAL_SPARE_WORKER=0`` turns this
    off). Outside one there may be no next implementation (a check of one), and a spare
    would only cost its start (docs/design/harness.md#spare-worker)."""
    if _spare or _session_depth[0] == 0 or os.environ.get("FUSEVAL_SPARE_WORKER", "1") == "0":
        return
    w = Worker(None, None, _kind(device))
    w.spawn()
    _spare.append(w)


def _key(impl: Any, defn: Any, device: str) -> tuple:
    ident = impl if isinstance(impl, str) else pickle.dumps(impl)
    # the working folder is first on the worker's path whatever fuseval's has
    cwd = os.getcwd()
    path = tuple(p for p in sys.path if p not in ("", cwd))
    return (ident, cwd, path, defn.name, defn.variant,
            tuple(sorted(defn.implementations.items())), str(device))


def worker_for(impl: Any, defn: Any, device: str) -> Worker:
    """The live worker of ``impl`` for ``defn`` on ``device``, started if needed."""
    key = _key(impl, defn, device)
    with _lock:
        w = _workers.get(key)
        if w is None:
            w = Worker(impl, defn, device)
            w.start(_take_spare(device))
            _make_spare(device)
            while len(_workers) >= _MAX_WORKERS:
                _workers.pop(next(iter(_workers))).close()
            _workers[key] = w
        elif not w.alive():
            w.start(_take_spare(device))
            _make_spare(device)
        return w


def prespawn(impl: Any, defns: Sequence[Any], device: str) -> int:
    """Spawn now, side by side, the processes the workers of ``impl`` for ``defns`` on
    ``device`` will need (one per definition without a live worker, less the spares already
    waiting), so that they import torch together rather than one after the other; each
    ``worker_for`` then takes one. Returns how many were spawned."""
    with _lock:
        need = sum(1 for d in defns if (w := _workers.get(_key(impl, d, device))) is None or not w.alive())
        spawned = 0
        for _ in range(need - sum(1 for w in _spare if _kind(w.device) == _kind(device))):
            w = Worker(None, None, _kind(device))
            w.spawn()
            _spare.append(w)
            spawned += 1
        return spawned


def close_all() -> None:
    """Close every worker: all are asked to quit first, so that they shut down side by side."""
    with _lock:
        workers = list(_workers.values()) + _spare
        for w in workers:
            w.ask_to_quit()
        for w in workers:
            w.close(asked=True)
        _workers.clear()
        _spare.clear()


@contextlib.contextmanager
def session():
    """A run of several implementations (a gate): a spare worker is kept ready for the next
    one, and the workers started inside are closed on leaving (outside a session, workers
    live until the process exits)."""
    _session_depth[0] += 1
    try:
        yield
    finally:
        _session_depth[0] -= 1
        if _session_depth[0] == 0:
            close_all()


atexit.register(close_all)


class IsolatedImpl:
    """A callable that runs ``impl`` in its worker: for the budget and the property suite,
    which call an implementation like a function. A call that does not return outputs, or
    broke a rule fuseval verifies, raises :class:`IsolationViolation` naming the violation."""

    def __init__(self, impl: Any, defn: Any, device: str, timeout: float | None = DEFAULT_TIMEOUT):
        self.worker = worker_for(impl, defn, device)
        self.timeout = timeout
        self.impl = impl
        if isinstance(impl, str) and ":" in impl:
            self.__module__, _, self.__qualname__ = impl.partition(":")
        else:
            self.__module__, self.__qualname__ = "fuseval.isolated", str(_label(impl))
        if self.worker.staged:
            self.staged = self._staged

    def _deadline(self) -> float | None:
        return None if not self.timeout else time.monotonic() + float(self.timeout)

    def _raise_for(self, res: CallResult) -> None:
        if res.violations:
            said = f"; it printed: {res.output.strip()[-600:]!r}" if res.output.strip() else ""
            raise IsolationViolation(res.violations[0], "; ".join(res.messages) + said)

    def _expected(self, inputs):
        """(shape, dtype) of each output the definition gives for these inputs: what
        bounds the buffers fuseval allocates for the answer and its taps."""
        defn = self.worker.defn
        try:
            return expected_outputs(defn, bind_axes(defn, inputs, check_values=False))
        except Exception:  # noqa: BLE001 - inputs the definition cannot bind: the default bound
            return None

    def __call__(self, *inputs):
        res = self.worker.call(inputs, deadline=self._deadline(), expected=self._expected(inputs))
        self._raise_for(res)
        return res.outputs

    def _staged(self, *inputs, taps=None, override=None):
        stop = getattr(taps, "stop", None)
        res = self.worker.call(inputs, which="staged", override=override, stop=stop, deadline=self._deadline(),
                               want_taps=taps is not None, expected=self._expected(inputs))
        self._raise_for(res)
        if taps is not None:
            for k, v in res.taps.items():
                taps[k] = v          # a stopping taps dict raises here, as in-process
        return res.outputs


class IsolationViolation(RuntimeError):
    """An isolated call ended without outputs: ``violation`` names why."""

    def __init__(self, violation: str, message: str):
        super().__init__(f"{violation}: {message}")
        self.violation = violation
