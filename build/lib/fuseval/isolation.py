"""Running an implementation in a process of its own.

An implementation under test runs in fuseval's process only with ``--in-process``. By
default it runs in a **worker**: a spawned Python process that imports the implementation
(fuseval's process never does), receives each call's inputs through shared memory, and
copies the outputs into buffers fuseval allocated in shared memory. The oracle, the
comparison and the verdict are computed only in fuseval's process, which reads nothing
from the worker but those buffers and a small JSON message per call, so an implementation
cannot replace the comparison, read the oracle's outputs, or end fuseval's process. What
the worker does in the implementation's place:

* each call has a deadline (``timeout``): past it the worker is killed and the call's
  verdict is ``timeout``;
* ``sys.exit`` in a call is ``exited``; a worker that ends while a call runs
  (``os._exit``, a crash, a signal) is ``exited`` or ``crashed``, with its exit status;
  the next call starts a fresh worker;
* after every call, :mod:`fuseval.integrity`: patched comparison / torch functions
  (``tampered``) and threads left running (``lingering_thread``);
* outputs must be exactly ``torch.Tensor`` on the device of the check (``bad_outputs``,
  ``wrong_device``), reported before anything is copied.

On the CPU the tensors travel as torch shared-memory storages (``share_memory_``); on CUDA
through CUDA IPC (``torch.multiprocessing``): the buffers are allocated on the device by
fuseval and written by the worker. One worker serves one implementation for a whole run
(until the ``session()`` it was started in ends; otherwise until fuseval's process
exits), so the implementation is imported once; every case still gets fresh inputs.

The worker's own side (its loop, how it describes outputs and exceptions) is
:mod:`fuseval.worker_process`.
"""
from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .worker_process import child_main, describe_exception, impl_error_location, is_oom

__all__ = ["DEFAULT_TIMEOUT", "Worker", "CallResult", "IsolatedImpl", "IsolationWarning", "worker_for",
           "session", "close_all", "can_isolate", "isolates", "impl_error_location", "describe_exception", "is_oom"]

# seconds a case may take in the implementation (every call of the case together); the
# first call of a GPU kernel includes its compilation
DEFAULT_TIMEOUT = 300.0
# whether check, the gate, the budget and baselines isolate when not told (``isolate=None``);
# the CLI says True unless --in-process. fuseval's own test suite sets it to False for the
# tests of the rules themselves, and runs the isolated path in tests/test_hostile.py
ISOLATE = True


def default_isolate(isolate: bool | None) -> bool:
    return ISOLATE if isolate is None else bool(isolate)


# seconds to start a worker and import the implementation
START_TIMEOUT = 180.0
_MAX_WORKERS = 6


class IsolationWarning(UserWarning):
    """An implementation given as a Python object that cannot be sent to a worker runs in
    fuseval's own process instead (it is trusted)."""


# --------------------------------------------------------------------------- the parent side
@dataclass
class CallResult:
    """One call of the implementation in its worker, as fuseval's process sees it."""
    status: str                       # ok | raised | exited | crashed | timeout | bad
    outputs: Any = None               # a tuple of plain tensors (status ok), or what check_outputs_shape reads
    taps: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)
    aliases: list[tuple[int, int]] = field(default_factory=list)   # (output index, input index)
    where: str = ""                   # file:line of an exception
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class _Opaque:
    """Stands in for an output that is not a tensor, so the shape check names its type."""

    def __init__(self, type_name: str):
        self.type_name = type_name


def _dtype(name: str):
    import torch
    d = getattr(torch, str(name), None)
    return d if isinstance(d, torch.dtype) else None


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class Worker:
    """A spawned process that serves calls of one implementation of one operator."""

    def __init__(self, impl: Any, defn: Any, device: str, *, threads: int | None = None):
        self.impl, self.defn, self.device = impl, defn, str(device)
        self.threads = threads
        self.proc = None
        self.conn = None
        self.staged = False
        self.load_tampered: list[str] = []

    # ---- life cycle
    def spawn(self) -> None:
        """Start the process (it imports torch and fuseval while the caller goes on)."""
        import torch
        import torch.multiprocessing as tmp
        ctx = tmp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        proc = ctx.Process(target=child_main, args=(child, self.threads or torch.get_num_threads()),
                           daemon=True, name="fuseval-worker")
        # the worker must not re-run the caller's main script (a script without a main guard
        # would recurse): it needs fuseval and the implementation, nothing of __main__
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = type(sys)("__main__")
        try:
            proc.start()
        finally:
            if main is not None:
                sys.modules["__main__"] = main
        child.close()
        self.proc, self.conn = proc, parent

    def start(self) -> None:
        """A process with the implementation imported: the spare one if there is one."""
        spare = _take_spare()
        if spare is not None:
            self.proc, self.conn = spare.proc, spare.conn
        else:
            self.spawn()
        _make_spare()
        self.conn.send(("load", self.impl, self.defn, list(sys.path), os.getcwd()))
        reply = self._receive(time.monotonic() + START_TIMEOUT)
        if reply.get("status") == "loaded":
            self.staged = bool(reply.get("staged"))
            self.load_tampered = [str(x) for x in reply.get("tampered", [])][:20]
            return
        from .ops import ImplementationError
        self.kill()
        if reply.get("status") == "load_failed":
            raise ImplementationError(f"implementation {_label(self.impl)!r} does not load: "
                                      f"{reply.get('error')}" + (f" (at {reply['where']})" if reply.get("where") else ""))
        raise ImplementationError(f"implementation {_label(self.impl)!r}: its worker process ended while "
                                  f"importing it ({reply.get('error', reply.get('status'))})")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.kill()
            with contextlib.suppress(Exception):
                self.proc.join(5)
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        self.proc = self.conn = None

    def ask_to_quit(self) -> None:
        if self.alive():
            with contextlib.suppress(Exception):
                self.conn.send(("quit",))

    def close(self, asked: bool = False) -> None:
        """Quit (``asked``: the quit was sent already), killed after 2 s."""
        if not asked:
            self.ask_to_quit()
        if self.alive():
            self.proc.join(2)
        self.kill()

    # ---- messages
    def _receive(self, deadline: float | None) -> dict:
        """The next reply; a dead worker, a deadline passed or a reply that is not fuseval's
        JSON become replies with status crashed / exited / timeout / bad."""
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            ready = self.conn.poll(wait)
        except (EOFError, OSError):
            ready = True
        if not ready:
            self.kill()
            return {"status": "timeout"}
        try:
            data = self.conn.recv_bytes(1 << 22)
        except (EOFError, OSError):
            self.proc.join(5)
            code = self.proc.exitcode
            self.kill()
            if code is not None and code < 0:
                return {"status": "crashed", "error": f"the implementation's process was killed by {_signal_name(code)}"}
            return {"status": "exited", "code": code,
                    "error": f"the implementation's process ended with exit status {code} during the call"}
        try:
            reply = json.loads(data.decode())
            if not isinstance(reply, dict):
                raise ValueError("not an object")
            return reply
        except (ValueError, UnicodeDecodeError):
            self.kill()
            return {"status": "bad", "error": "the worker sent a reply that is not fuseval's (the implementation "
                                              "wrote into fuseval's channel)"}

    def call(self, inputs: Sequence[Any], *, which: str = "forward", override: Mapping[str, Any] | None = None,
             stop: str | None = None, keep: bool = False, poison: int = 0, deadline: float | None = None,
             want_taps: bool = False, expected: Sequence[tuple[tuple[int, ...] | None, Any]] | None = None
             ) -> CallResult:
        """Call the implementation on ``inputs``; ``expected``: (shape, dtype) per output, to
        bound what fuseval allocates for a malformed answer."""
        import torch
        if not self.alive():
            self.start()
        shared = [_share(t) for t in inputs]
        req = {"inputs": shared, "which": which, "override": {k: _share(v) for k, v in (override or {}).items()},
               "stop": stop, "keep": keep, "poison": int(poison), "device": self.device,
               "threads": torch.get_num_threads()}
        try:
            self.conn.send(("call", req))
        except (OSError, BrokenPipeError):
            self.kill()
            self.start()
            self.conn.send(("call", req))
        reply = self._receive(deadline)
        res = CallResult(str(reply.get("status")), seconds=float(reply.get("seconds") or 0.0))
        self._integrity(reply, res)
        status = res.status
        if status == "timeout":
            res.violations.append("timeout")
            res.messages.append("the implementation did not return before the case's timeout; its process was killed")
            return res
        if status in ("exited", "crashed"):
            res.violations.append(status)
            res.messages.append(str(reply.get("error")))
            return res
        if status == "raised":
            res.error, res.where = str(reply.get("error")), str(reply.get("where") or "")
            res.violations.append("out_of_memory" if reply.get("oom") else "raised")
            res.messages.append(f"implementation raised: {res.error}" + (f" (at {res.where})" if res.where else ""))
            return res
        if status != "ok":
            res.status = "bad"
            res.violations.append("tampered")
            res.messages.append(str(reply.get("error", "the worker's reply was not understood")))
            return res
        outs = reply.get("outputs") or []
        out_bufs, outputs = [], []
        limit = _limit(expected)
        for i, d in enumerate(outs):
            buf, placeholder = self._buffer(d, f"output {i}", res, limit)
            out_bufs.append(buf)
            outputs.append(buf if buf is not None else placeholder)
            for j in d.get("aliases", []) if isinstance(d, dict) else []:
                res.aliases.append((i, int(j)))
        tap_bufs, tap_names = [], []
        for item in (reply.get("taps") or []) if want_taps else []:
            name, d = str(item[0]), item[1]
            buf, _ = self._buffer(d, f"tap {name!r}", res, 1 << 34)
            tap_bufs.append(buf)
            tap_names.append(name)
        self.conn.send(("fill", out_bufs, tap_bufs))
        done = self._receive(deadline)
        if done.get("status") != "filled":
            return self.call_failed(done, res)
        shape = reply.get("shape")
        if shape == "tensor":
            res.outputs = (outputs[0],)
        elif shape == "sequence":
            res.outputs = tuple(outputs)
        elif shape == "none":
            res.outputs = None
        else:
            res.outputs = _Opaque(str(reply.get("type")))
            res.violations.append("bad_outputs")
            res.messages.append(f"implementation returned {reply.get('type')}, expected a tuple of "
                                f"{len(self.defn.outputs)} tensors ({', '.join(self.defn.output_names)})")
        res.taps = {n: b for n, b in zip(tap_names, tap_bufs) if b is not None}
        return res

    def call_failed(self, done: dict, res: CallResult) -> CallResult:
        res.status = str(done.get("status"))
        name = {"timeout": "timeout", "crashed": "crashed", "exited": "exited"}.get(res.status, "tampered")
        res.violations.append(name)
        res.messages.append(str(done.get("error") or f"the worker failed while handing back the outputs ({res.status})"))
        res.outputs = None
        return res

    def recopy(self, expected_like: Sequence[Any], deadline: float | None) -> list | None:
        """The previous call's outputs (kept in the worker) copied again, into fresh buffers
        shaped like ``expected_like``: what the implementation's first answer holds now."""
        import torch
        bufs = [_alloc(tuple(t.shape), t.dtype, self.device) if isinstance(t, torch.Tensor) else None
                for t in expected_like]
        self.conn.send(("recopy", bufs))
        done = self._receive(deadline)
        return bufs if done.get("status") == "filled" else None

    def _integrity(self, reply: dict, res: CallResult) -> None:
        tampered = [str(x) for x in (reply.get("tampered") or [])][:20] or self.load_tampered
        if tampered:
            res.violations.append("tampered")
            res.messages.append("the implementation replaced functions a verdict relies on: " + ", ".join(tampered[:8]))
        threads = [str(x) for x in (reply.get("threads") or [])][:20]
        if threads:
            res.violations.append("lingering_thread")
            res.messages.append("the implementation left threads running after it returned: " + ", ".join(threads[:8]))

    def _buffer(self, d: Any, what: str, res: CallResult, limit: int):
        """A shared buffer for one described tensor, or (None, a placeholder) with the
        violation recorded when the tensor must not be copied."""
        if not isinstance(d, dict):
            return None, _Opaque("?")
        kind = d.get("kind")
        if kind == "tensor_subclass":
            res.violations.append("bad_outputs")
            res.messages.append(f"{what} is a {d.get('type')}, a subclass of torch.Tensor; expected exactly torch.Tensor")
            return None, _Opaque(str(d.get("type")))
        if kind != "tensor":
            res.violations.append("bad_outputs")
            res.messages.append(f"{what} is {d.get('type')}, expected a tensor")
            return None, _Opaque(str(d.get("type")))
        dtype = _dtype(d.get("dtype"))
        shape = d.get("shape")
        if dtype is None or not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
            res.violations.append("bad_outputs")
            res.messages.append(f"{what}: unreadable description {d!r}")
            return None, _Opaque("?")
        dev = str(d.get("device"))
        if dev != self.device and not (self.device.startswith("cuda") and dev.startswith("cuda")):
            res.violations.append("wrong_device")
            res.messages.append(f"{what} is on device {dev}, expected {self.device}")
            return None, _Opaque(f"tensor on {dev}")
        import torch
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if nbytes > limit:
            res.violations.append("bad_outputs")
            res.messages.append(f"{what} has shape {tuple(shape)} ({nbytes} bytes), far larger than expected")
            return None, _Opaque(f"tensor of shape {tuple(shape)}")
        return _alloc(tuple(shape), dtype, self.device), None


def _limit(expected) -> int:
    import torch
    if not expected:
        return 1 << 34
    total = 0
    for shape, dtype in expected:
        total += math.prod(shape or ()) * torch.empty((), dtype=dtype).element_size()
    return 4 * total + (1 << 20)


def _alloc(shape, dtype, device: str):
    import torch
    t = torch.empty(shape, dtype=dtype, device=device)
    return t.share_memory_() if t.device.type == "cpu" else t


def _share(v: Any) -> Any:
    """A tensor in memory the worker can map (CPU: moved into shared memory in place; CUDA
    tensors travel by IPC handle as they are)."""
    import torch
    if isinstance(v, torch.Tensor) and v.device.type == "cpu" and not v.is_shared():
        v.share_memory_()
    return v


def _label(impl: Any) -> str:
    from .ops import impl_label
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


def isolates(impl: Any, isolate: bool) -> bool:
    """Whether ``impl``'s calls run in a worker process: isolation asked for (``isolate``,
    resolved) and the implementation sendable to a worker (:func:`can_isolate`)."""
    return bool(isolate) and can_isolate(impl)[0]


_spare: list[Worker] = []


def _take_spare() -> Worker | None:
    while _spare:
        w = _spare.pop()
        if w.alive():
            return w
        w.kill()
    return None


def _make_spare() -> None:
    """Inside a ``session()``, start a process for the next implementation now, so that it
    has imported torch by the time it is needed (``FUSEVAL_SPARE_WORKER=0`` turns this
    off). Outside one there may be no next implementation (a check of one), and a spare
    would only cost its start (about 3 s of CPU)."""
    if _spare or _session_depth[0] == 0 or os.environ.get("FUSEVAL_SPARE_WORKER", "1") == "0":
        return
    w = Worker(None, None, "cpu")
    w.spawn()
    _spare.append(w)


def _key(impl: Any, defn: Any, device: str) -> tuple:
    ident = impl if isinstance(impl, str) else pickle.dumps(impl)
    # the same 'module:function' names another file from another folder or search path;
    # the working folder is importable either way (ops._import_callable puts it on the
    # path at the first such import), so its entry on the path does not tell runs apart
    cwd = os.getcwd()
    path = tuple(p for p in sys.path if p not in ("", cwd))
    return (ident, cwd, path, defn.name, defn.variant, tuple(sorted(defn.implementations.items())), str(device))


def worker_for(impl: Any, defn: Any, device: str) -> Worker:
    """The live worker of ``impl`` for ``defn`` on ``device``, started if needed."""
    key = _key(impl, defn, device)
    with _lock:
        w = _workers.get(key)
        if w is None:
            w = Worker(impl, defn, device)
            w.start()
            while len(_workers) >= _MAX_WORKERS:
                _workers.pop(next(iter(_workers))).close()
            _workers[key] = w
        elif not w.alive():
            w.start()
        return w


def prespawn(impl: Any, defns: Sequence[Any], device: str) -> int:
    """Spawn now, side by side, the processes the workers of ``impl`` for ``defns`` on
    ``device`` will need (one per definition without a live worker, less the spares already
    waiting), so that they import torch together rather than one after the other; each
    ``worker_for`` then takes one. Returns how many were spawned."""
    with _lock:
        need = sum(1 for d in defns if (w := _workers.get(_key(impl, d, device))) is None or not w.alive())
        spawned = 0
        for _ in range(need - len(_spare)):
            w = Worker(None, None, "cpu")
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
    which call an implementation like a function. A call that does not return outputs
    raises :class:`IsolationViolation` naming the violation."""

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
            raise IsolationViolation(res.violations[0], "; ".join(res.messages))

    def __call__(self, *inputs):
        res = self.worker.call(inputs, deadline=self._deadline())
        self._raise_for(res)
        return res.outputs

    def _staged(self, *inputs, taps=None, override=None):
        stop = getattr(taps, "stop", None)
        res = self.worker.call(inputs, which="staged", override=override, stop=stop, deadline=self._deadline(),
                               want_taps=taps is not None)
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
