"""What runs in the worker process of an isolated implementation (see :mod:`fuseval.runner.isolation`).

The worker's first acts, before anything of the implementation's is imported and before
torch starts a thread: take fuseval's pipe as its standard output and error (so nothing it
prints reaches fuseval's own descriptors), then confine itself
(:func:`fuseval.runner.confine.enter`). Then it imports the implementation (fuseval's
process never does) and serves its calls: messages in are pickled tuples from fuseval
(trusted); replies out are JSON bytes, which fuseval reads as data and never unpickles.
Inputs arrive as sealed files mapped copy-on-write, or CUDA copies of their own
(:mod:`fuseval.runner.transport`).

What the worker says about the implementation (functions it replaced, threads it left,
outputs sharing an input's memory) is advisory: fuseval adds it to the verdict, but the
verdict rests on what fuseval's process verifies itself (:mod:`fuseval.runner.isolation`).

Also here: how an implementation's exception is described (one line and its file:line),
used by both sides.
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
import traceback
from typing import Any, Callable

__all__ = ["child_main", "next_request", "describe_exception", "impl_error_location", "is_oom", "MAX_TEXT",
           "IN_WORKER", "note"]

# characters of an exception's text a reply carries (the rest is cut, and says so)
MAX_TEXT = 600
# the largest note a call's reply carries (JSON characters)
MAX_NOTE = 1 << 20
# whether this process is a worker (a problem's code runs in place here, never in another
# worker: :mod:`fuseval.interop.problem_code`)
IN_WORKER = False
_NOTE: list[Any] = [None]


def note(obj: Any) -> None:
    """What fuseval's own code served in a worker says about the current call besides its
    tensors (JSON data; :mod:`fuseval.interop.problem_code`): sent with the reply, read by
    fuseval as data. An implementation may call it too; only the callers that asked for a
    note read one."""
    _NOTE[0] = obj


def _note_text() -> str | None:
    if _NOTE[0] is None:
        return None
    try:
        text = json.dumps(_NOTE[0])
    except (TypeError, ValueError):
        text = json.dumps({"error": {"message": "the call's note is not JSON data"}})
    if len(text) > MAX_NOTE:
        text = json.dumps({"error": {"message": f"the call's note has {len(text)} characters, more than {MAX_NOTE}"}})
    return text


def impl_error_location(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of an exception outside fuseval and torch (the
    implementation's own line), or of the innermost frame when there is none."""
    while exc.__cause__ is not None:        # a wrapped error: where the original was raised
        exc = exc.__cause__
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # the fuseval package
    mine = [f for f in frames if not os.path.abspath(f.filename).startswith(here + os.sep)
            and f"{os.sep}torch{os.sep}" not in f.filename and not f.filename.startswith("<frozen")]
    f = (mine or frames)[-1]
    return f"{f.filename}:{f.lineno}"


def cut(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters cut)"


def describe_exception(exc: BaseException) -> tuple[str, str]:
    """(one line "Type: message", cut to :data:`MAX_TEXT`, and "file:line") of an
    implementation's exception."""
    try:
        line = traceback.format_exception_only(type(exc), exc)[-1].strip()
    except Exception:  # noqa: BLE001 - an exception whose str() raises is still described
        line = f"{type(exc).__name__}: (its message could not be read)"
    return cut(line), impl_error_location(exc)


def is_oom(exc: BaseException) -> bool:
    from ..errors import is_out_of_memory
    return is_out_of_memory(exc)


# --------------------------------------------------------------------------- describing outputs
def _describe(o: Any, device: str, input_spans: list[tuple[int, int, int]]) -> dict[str, Any]:
    import torch
    if type(o) is not torch.Tensor:
        kind = "tensor_subclass" if isinstance(o, torch.Tensor) else "not_tensor"
        return {"kind": kind, "type": cut(f"{type(o).__module__}.{type(o).__qualname__}", 200)}
    d: dict[str, Any] = {"kind": "tensor", "shape": [int(s) for s in o.shape],
                         "dtype": str(o.dtype).replace("torch.", ""), "device": str(o.device)}
    if o.device.type == "cuda" and device == "cuda":
        d["device"] = "cuda"
    s = o.untyped_storage()
    lo, hi = s.data_ptr(), s.data_ptr() + s.nbytes()
    d["aliases"] = [i for i, (dev_i, a, b) in enumerate(input_spans)
                    if dev_i == hash(str(o.device)) and a < hi and lo < b and hi > lo and b > a]
    return d


def _tensor_spans(inputs) -> list[tuple[int, int, int]]:
    import torch
    spans = []
    for t in inputs:
        if isinstance(t, torch.Tensor):
            s = t.untyped_storage()
            spans.append((hash(str(t.device)), s.data_ptr(), s.data_ptr() + s.nbytes()))
        else:
            spans.append((0, 0, 0))
    return spans


def _output_list(out: Any) -> list[Any]:
    """What an answer holds, output by output: one tensor, the first 64 items of a tuple or
    list, else nothing (what each item is, is described and judged by fuseval)."""
    import torch
    if isinstance(out, torch.Tensor):
        return [out]
    return list(out)[:64] if isinstance(out, (tuple, list)) else []


def _guarded(thunk: Callable[[], Any]) -> tuple[dict | None, Any]:
    """Run implementation code: (failure reply or None, result)."""
    try:
        return None, thunk()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        return {"status": "exited", "code": code,
                "error": cut(f"the implementation called sys.exit({exc.code!r})", 400)}, None
    except BaseException as exc:  # noqa: BLE001 - any failure of the implementation is a verdict
        line, where = describe_exception(exc)
        try:
            oom = is_oom(exc)
        except Exception:  # noqa: BLE001
            oom = False
        return {"status": "raised", "error": line, "where": where, "oom": oom}, None


# --------------------------------------------------------------------------- the loop
class _Worker:
    """The worker's state: the implementation, its staged form, the outputs of the current
    case's calls (kept for a later check that they were not overwritten), and the
    integrity snapshot taken before the implementation loaded."""

    def __init__(self, conn):
        from . import integrity
        self.conn = conn
        self.baseline = integrity.snapshot()     # before the implementation is imported
        self.fn = self.staged = None
        self.kept: list[list[Any]] = []
        self.held: list[Any] | None = None
        self.timed: list[Any] | None = None     # the outputs of the last timed run's calls

    def reply(self, obj: dict) -> None:
        self.conn.send_bytes(json.dumps(obj).encode())

    def load(self, impl, defn, path, cwd) -> None:
        from . import integrity
        # the caller's search path, with its folder first (as `python -m` has it): read
        # only, since the worker writes nowhere but its scratch folder
        sys.path[:] = [cwd] + [p for p in path if p not in ("", cwd)]
        from ..operators.implementations import resolve_impl
        failure, fn = _guarded(lambda: resolve_impl(defn, impl))
        if failure is not None:
            self.reply({**failure, "cause": failure["status"], "status": "load_failed"})
            return
        from ..staged import staged_of
        self.fn, self.staged = fn, staged_of(defn, impl, fn)
        self.reply({"status": "loaded", "staged": self.staged is not None,
                    "tampered": integrity.changed(self.baseline)})

    def _run(self, req: dict, inputs, override, dev):
        """(failure reply or None, the answer, the stage taps) of one call."""
        import torch
        taps: dict[str, Any] = {}
        if req["which"] == "staged":
            from ..staged import StageReached, TapsUntil
            taps = TapsUntil(req.get("stop"))

            def thunk():
                try:
                    return self.staged(*inputs, taps=taps, override=override)
                except StageReached:
                    return None
        else:
            def thunk():
                return self.fn(*inputs)
        failure, out = _guarded(lambda: (thunk(), torch.cuda.synchronize(dev) if dev.type == "cuda" else None)[0])
        return failure, out, taps

    def call(self, req: dict) -> dict | None:
        """One call of the implementation: its description is replied at once, its outputs
        copied when fuseval asks. Returns the request's last answer, which the loop sends
        once this frame is gone (None: fuseval asked for no copy)."""
        import torch
        from . import integrity
        from ..hygiene import poison_allocator
        from .transport import open_inputs, recv_fds
        fds = recv_fds(self.conn, int(req.get("nfds", 0)))
        self.held = None                  # the previous call's inputs, verified by now
        shared = open_inputs(req["inputs"], fds)
        # held until the next call: fuseval reads this process's map of them after the call
        self.held = shared
        n = int(req.get("n_inputs", len(shared)))
        inputs, override = shared[:n], dict(zip(req.get("override_names", []), shared[n:]))
        torch.set_num_threads(max(1, int(req.get("threads", 1))))
        dev = torch.device(req["device"])
        if req.get("new_case"):
            self.kept = []
        if req.get("poison"):
            poison_allocator(dev, int(req["poison"]))
        before = integrity.threads()
        _NOTE[0] = None
        t0 = time.perf_counter()
        failure, out, taps = self._run(req, inputs, override, dev)
        seconds = time.perf_counter() - t0
        integ = {"tampered": integrity.changed(self.baseline), "threads": integrity.new_threads(before)}
        if failure is not None:
            failure.update(integ, seconds=seconds)
            return failure
        spans = _tensor_spans(inputs)
        if out is None and req["which"] == "staged":
            outs, shape = [], "none"
        elif isinstance(out, torch.Tensor) and type(out) is torch.Tensor:
            outs, shape = [out], "tensor"
        elif isinstance(out, (tuple, list)):
            outs, shape = list(out)[:64], "sequence"
        else:
            outs, shape = [], "other"
        described = [_describe(o, req["device"], spans) for o in outs]
        tap_items = [(k, v) for k, v in list(dict.items(taps))[:64] if isinstance(k, str)]
        tap_desc = [(cut(k, 100), _describe(v, req["device"], spans)) for k, v in tap_items]
        tname = type(out).__qualname__ if type(out).__module__ == "builtins" else \
            f"{type(out).__module__}.{type(out).__qualname__}"
        self.reply({"status": "ok", "seconds": seconds, "shape": shape, "type": cut(tname, 200),
                    "outputs": described, "taps": tap_desc, "n_taps": len(taps), "note": _note_text(), **integ})
        fill = self.conn.recv()
        if fill[0] != "fill":
            return None
        _, out_payload, tap_payload, nfds = fill
        bufs = self._open(out_payload, tap_payload, nfds)
        changed = self._copy(bufs[:len(out_payload)], outs, dev) + \
            self._copy(bufs[len(out_payload):], [v for _, v in tap_items], dev)
        if changed:
            return {"status": "bad", "error": "an output or tap changed its shape or dtype after the call "
                    "returned: " + ", ".join(changed[:4])}
        if req.get("keep"):
            self.kept.append(outs)
        return {"status": "filled"}

    def _open(self, out_payload, tap_payload, nfds):
        from .transport import open_buffers, recv_fds
        return open_buffers(list(out_payload) + list(tap_payload), recv_fds(self.conn, int(nfds)))

    @staticmethod
    def _copy(bufs, tensors, dev) -> list[str]:
        """Copy each described tensor into fuseval's buffer; the ones that no longer match
        their description (shape, dtype) are named instead."""
        import torch
        changed = []
        for i, (buf, t) in enumerate(zip(bufs, tensors)):
            if buf is None:
                continue
            if not isinstance(t, torch.Tensor) or buf.shape != t.shape or buf.dtype != t.dtype:
                changed.append(f"#{i}")
                continue
            buf.copy_(t)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return changed

    def time(self, req: dict) -> None:
        """Time the implementation over rotating input sets (:mod:`fuseval.runner.clock`);
        the timed calls' outputs are kept for :meth:`timed_outputs`."""
        import torch
        from . import integrity
        from . import clock
        from .transport import open_inputs, recv_fds
        fds = recv_fds(self.conn, int(req.get("nfds", 0)))
        self.held = self.timed = None
        shared = open_inputs(req["inputs"], fds)
        self.held = shared
        n, count = int(req["n_inputs"]), int(req["sets"])
        sets = [shared[i * n:(i + 1) * n] for i in range(count)]
        dev = torch.device(req["device"])
        torch.set_num_threads(max(1, int(req.get("threads", 1))))
        before = integrity.threads()
        rules = {k: req[k] for k in ("warmup_ms", "rep_ms", "min_reps", "max_reps", "flush", "watched", "keep_bytes")}
        failure, result = _guarded(lambda: clock.run_timed(self.fn, sets, req.get("activation"), int(req["seed"]),
                                                           device=dev, **rules))
        integ = {"tampered": integrity.changed(self.baseline), "threads": integrity.new_threads(before)}
        if failure is not None:
            failure.update(integ)
            self.reply(failure)
            return
        numbers, kept = result
        self.timed = kept
        described = [_describe(o, req["device"], _tensor_spans(sets[0])) for o in _output_list(kept[0] if kept else ())]
        self.reply({"status": "timed", **numbers, "outputs": described, **integ})

    def timed_outputs(self, indices, payload, nfds) -> dict:
        """Copy the outputs of the timed calls at ``indices`` (in the order of the loop's
        kept calls) into fuseval's buffers, then forget every kept output. Returns the
        answer (sent by the loop)."""
        import torch
        bufs = self._open(payload, [], nfds)
        kept, self.timed = self.timed or [], None
        picked = []
        for i in indices:
            picked += _output_list(kept[i] if isinstance(i, int) and 0 <= i < len(kept) else None)
        dev = torch.device("cuda") if any(getattr(b, "is_cuda", False) for b in bufs if b is not None) \
            else torch.device("cpu")
        changed = self._copy(bufs, picked, dev) if len(picked) == len(bufs) else ["count"]
        if changed:
            return {"status": "bad", "error": "the timed calls' outputs do not match the first one's "
                    "description (" + ", ".join(changed[:4]) + ")"}
        return {"status": "filled"}

    def recopy(self, payload, nfds) -> dict:
        """Copy the outputs of every kept call of the case again (what each answer holds
        now), in order, then forget them. Returns the answer (sent by the loop)."""
        import torch
        bufs = self._open(payload, [], nfds)
        flat = [o for outs in self.kept for o in outs]
        for buf, o in zip(bufs, flat):
            if buf is not None and isinstance(o, torch.Tensor) and buf.shape == o.shape:
                buf.copy_(o)
        if any(getattr(o, "is_cuda", False) for o in flat):
            torch.cuda.synchronize()
        self.kept = []
        return {"status": "filled"}


def _take_stdio(conn) -> None:
    """fuseval's pipe as this process's standard output and error; stdin from /dev/null."""
    from .transport import recv_fds
    (pipe,) = recv_fds(conn, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(pipe, 1)
    os.dup2(pipe, 2)
    for fd in (null, pipe):
        with contextlib.suppress(OSError):
            os.close(fd)


def next_request(conn, reply: Callable[[dict], None]) -> tuple | None:
    """The next request off ``conn``; None when the worker is to end. A request whose
    tensors cannot be mapped here for lack of device memory (a CUDA input arrives through
    torch's IPC, and mapping it allocates) is answered as the call running out of memory
    (status raised, oom), and the worker ends (what else the request sent is unread; the next
    call starts a new one): the size is the verdict, not a process that died with a
    traceback (which the check would read as a broken rule, exit 16)."""
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None
    except Exception as exc:  # noqa: BLE001 - only out of memory is answered, the rest ends the worker
        if not is_oom(exc):
            raise
        line, _ = describe_exception(exc)
        reply({"status": "raised", "error": cut(f"out of memory receiving the inputs: {line}", 2000), "where": "",
               "oom": True})
        return None


# how often a worker looks whether fuseval's process is still its parent, and its exit
# code when it is gone
PARENT_POLL_S = 0.5
EXIT_PARENT_GONE = 75


def _end_with_parent(parent: int) -> None:
    """End this worker once ``parent`` (fuseval's process) is gone, even in the middle of a
    call: a worker has a session of its own, so nothing else ends it when its parent is
    killed (a sweep's time budget, SIGKILL, the out-of-memory killer), and it would go on
    holding memory and the GPU. Its parent gone, the kernel reparents it (``getppid``
    changes). A thread of fuseval's, started before the implementation is imported, so no
    call sees it as the implementation's."""
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(EXIT_PARENT_GONE)
    threading.Thread(target=watch, name="fuseval-parent-watch", daemon=True).start()


def child_main(conn, threads: int, plan) -> None:
    """The worker's loop (the target of the spawned process)."""
    global IN_WORKER
    IN_WORKER = True
    parent = os.getppid()
    _take_stdio(conn)
    from . import confine
    applied = confine.enter(plan)
    _end_with_parent(parent)
    import torch
    import torch.multiprocessing  # noqa: F401 - registers the CUDA IPC reductions
    from . import clock  # noqa: F401 - binds the timer's functions before any implementation loads
    torch.set_num_threads(max(1, int(threads)))
    if plan.gpu:
        from ..memory import apply_cuda_share
        apply_cuda_share()   # the share of the GPU its parent was given (a sweep's job), if any
    worker = _Worker(conn)
    worker.reply({"status": "ready", "confinement": applied.to_dict(), "pid": os.getpid()})
    while True:
        msg = next_request(conn, worker.reply)
        if msg is None:
            return
        kind = msg[0]
        if kind == "quit":
            return
        if kind == "load":
            worker.load(*msg[1:])
        elif kind in ("call", "recopy", "timed_outputs"):
            # the request's last answer is sent once its handler has returned: what the call
            # left (outputs, mapped buffers) is released before fuseval starts watching this
            # process's CPU time as idle (Worker.idle_violation)
            answer = getattr(worker, kind)(*msg[1:])
            if answer is not None:
                worker.reply(answer)
        elif kind == "time":
            worker.time(msg[1])
        elif kind == "forget":
            worker.kept = []
        elif kind == "ping":
            # what the last request left (its tensors, their mappings) is released before
            # fuseval starts watching this process's CPU time
            gc.collect()
            worker.reply({"status": "idle"})
