"""What runs in the worker process of an isolated implementation (see :mod:`fuseval.isolation`).

The worker imports the implementation (fuseval's process never does) and serves its
calls: messages in are pickled tuples from fuseval (trusted); replies out are JSON bytes,
which fuseval reads as data and never unpickles. After each call it reports what
:mod:`fuseval.integrity` sees (patched functions, threads left running) and describes the
outputs (type, shape, dtype, device, storages shared with inputs) before copying them into
the buffers fuseval allocated.

Also here: how an implementation's exception is described (one line and its file:line),
used by both sides.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from typing import Any, Callable

__all__ = ["child_main", "describe_exception", "impl_error_location", "is_oom"]


def impl_error_location(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of an exception outside fuseval and torch (the
    implementation's own line), or of the innermost frame when there is none."""
    while exc.__cause__ is not None:        # a wrapped error: where the original was raised
        exc = exc.__cause__
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    here = os.path.dirname(os.path.abspath(__file__))
    mine = [f for f in frames if not os.path.abspath(f.filename).startswith(here + os.sep)
            and f"{os.sep}torch{os.sep}" not in f.filename and not f.filename.startswith("<frozen")]
    f = (mine or frames)[-1]
    return f"{f.filename}:{f.lineno}"


def describe_exception(exc: BaseException) -> tuple[str, str]:
    """(one line "Type: message", "file:line") of an implementation's exception."""
    line = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return line, impl_error_location(exc)


def is_oom(exc: BaseException) -> bool:
    from .errors import is_out_of_memory
    return is_out_of_memory(exc)


# --------------------------------------------------------------------------- describing outputs
def _describe(o: Any, device: str, input_spans: list[tuple[int, int, int]]) -> dict[str, Any]:
    import torch
    if type(o) is not torch.Tensor:
        kind = "tensor_subclass" if isinstance(o, torch.Tensor) else "not_tensor"
        return {"kind": kind, "type": f"{type(o).__module__}.{type(o).__qualname__}"}
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


def _guarded(thunk: Callable[[], Any]) -> tuple[dict | None, Any]:
    """Run implementation code: (failure reply or None, result)."""
    try:
        return None, thunk()
    except SystemExit as exc:
        return {"status": "exited", "code": exc.code if isinstance(exc.code, int) else 1,
                "error": f"the implementation called sys.exit({exc.code!r})"}, None
    except BaseException as exc:  # noqa: BLE001 - any failure of the implementation is a verdict
        line, where = describe_exception(exc)
        return {"status": "raised", "error": line, "where": where, "oom": is_oom(exc),
                "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]}, None


# --------------------------------------------------------------------------- the loop
class _Worker:
    """The worker's state: the implementation, its staged form, the outputs kept for a
    later ``recopy``, and the integrity snapshot taken before the implementation loaded."""

    def __init__(self, conn):
        from . import integrity
        self.conn = conn
        self.baseline = integrity.snapshot()     # before the implementation is imported
        self.fn = self.staged = self.kept = None

    def reply(self, obj: dict) -> None:
        self.conn.send_bytes(json.dumps(obj).encode())

    def load(self, impl, defn, path, cwd) -> None:
        from . import integrity
        # the caller's search path and folder, as they are now (a spare worker was started
        # before the caller chose them)
        sys.path[:] = list(path)
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        from .ops import resolve_impl
        failure, fn = _guarded(lambda: resolve_impl(defn, impl))
        if failure is not None:
            self.reply({**failure, "cause": failure["status"], "status": "load_failed"})
            return
        from .budget.runner import staged_of
        self.fn, self.staged = fn, staged_of(defn, impl, fn)
        self.reply({"status": "loaded", "staged": self.staged is not None,
                    "tampered": integrity.changed(self.baseline)})

    def _run(self, req: dict, inputs, dev):
        """(failure reply or None, the answer, the stage taps) of one call."""
        import torch
        taps: dict[str, Any] = {}
        if req["which"] == "staged":
            from .budget.runner import _StageReached, _TapsUntil
            taps = _TapsUntil(req.get("stop"))

            def thunk():
                try:
                    return self.staged(*inputs, taps=taps, override=dict(req.get("override") or {}))
                except _StageReached:
                    return None
        else:
            def thunk():
                return self.fn(*inputs)
        failure, out = _guarded(lambda: (thunk(), torch.cuda.synchronize(dev) if dev.type == "cuda" else None)[0])
        return failure, out, taps

    def call(self, req: dict) -> None:
        import torch
        from . import integrity
        from .hygiene import poison_allocator
        inputs = req["inputs"]
        torch.set_num_threads(max(1, int(req.get("threads", 1))))
        dev = torch.device(req["device"])
        if req.get("poison"):
            poison_allocator(dev, int(req["poison"]))
        before = integrity.threads()
        t0 = time.perf_counter()
        failure, out, taps = self._run(req, inputs, dev)
        seconds = time.perf_counter() - t0
        integ = {"tampered": integrity.changed(self.baseline), "threads": integrity.new_threads(before)}
        if failure is not None:
            failure.update(integ, seconds=seconds)
            self.reply(failure)
            return
        spans = _tensor_spans(inputs)
        if out is None and req["which"] == "staged":
            outs, shape = [], "none"
        elif isinstance(out, torch.Tensor) and type(out) is torch.Tensor:
            outs, shape = [out], "tensor"
        elif isinstance(out, (tuple, list)):
            outs, shape = list(out), "sequence"
        else:
            outs, shape = [], "other"
        described = [_describe(o, req["device"], spans) for o in outs]
        tap_items = list(dict.items(taps))
        tap_desc = [(k, _describe(v, req["device"], spans)) for k, v in tap_items]
        tname = type(out).__qualname__ if type(out).__module__ == "builtins" else \
            f"{type(out).__module__}.{type(out).__qualname__}"
        self.reply({"status": "ok", "seconds": seconds, "shape": shape, "type": tname,
                    "outputs": described, "taps": tap_desc, **integ})
        fill = self.conn.recv()
        if fill[0] != "fill":
            return
        _, out_bufs, tap_bufs = fill
        self._copy(out_bufs, outs, dev)
        self._copy(tap_bufs, [v for _, v in tap_items], dev)
        if req.get("keep"):
            self.kept = outs
        self.reply({"status": "filled"})

    @staticmethod
    def _copy(bufs, tensors, dev) -> None:
        import torch
        for buf, t in zip(bufs, tensors):
            if buf is not None:
                buf.copy_(t)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def recopy(self, bufs) -> None:
        import torch
        kept = self.kept or []
        for buf, o in zip(bufs, kept):
            if buf is not None:
                buf.copy_(o)
        if kept and any(getattr(o, "is_cuda", False) for o in kept):
            torch.cuda.synchronize()
        self.kept = None
        self.reply({"status": "filled"})


def child_main(conn, threads: int) -> None:
    """The worker's loop (the target of the spawned process)."""
    sys.stdout = sys.stderr          # the implementation's prints must not mix into fuseval's stdout
    import torch
    import torch.multiprocessing  # noqa: F401 - registers the shared-memory reductions
    torch.set_num_threads(max(1, int(threads)))
    worker = _Worker(conn)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        kind = msg[0]
        if kind == "quit":
            return
        if kind == "load":
            worker.load(*msg[1:])
        elif kind == "call":
            worker.call(msg[1])
        elif kind == "recopy":
            worker.recopy(msg[1])
