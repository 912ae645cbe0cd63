"""The parent side of a worker: fuseval's process starting, calling and verifying one
confined worker process (:mod:`fuseval.runner.isolation` says what is verified and why; the
worker's own side is :mod:`fuseval.runner.in_worker`)."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .in_worker import child_main
from .answers import MAX_TAPS, Opaque, output_spec, size_limit, tap_specs
from . import confine, integrity, procs, transport
from ..operators.implementations import ImplementationError, impl_label

__all__ = ["Worker", "CallResult", "MAX_REPLY_BYTES", "IDLE_CPU_SECONDS", "MAX_TAPS", "START_TIMEOUT"]

# the largest reply fuseval reads from a worker; a larger one is not fuseval's
MAX_REPLY_BYTES = 1 << 22
# CPU seconds a worker may use between calls (an idle worker uses none) before the work
# it kept doing after returning is a violation
IDLE_CPU_SECONDS = 0.25
SETTLE_WINDOWS = 4                # windows of the end-of-case CPU watch a busy worker must fill

# seconds to start a worker and import the implementation
START_TIMEOUT = 180.0


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
    output: str = ""                  # what the implementation printed during the call
    timing: dict | None = None        # a timed run's numbers (Worker.time)
    note: Any = None                  # what fuseval's own code served in the worker said (JSON data)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def add(self, violation: str, message: str) -> None:
        self.violations.append(violation)
        self.messages.append(message)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class _Output:
    """The worker's standard output and error: a pipe drained by a thread of fuseval's
    process into a bounded buffer (the last ``keep`` bytes), read per call."""

    def __init__(self, fd: int, keep: int = 1 << 16):
        self.fd, self.keep = fd, keep
        self.data = bytearray()
        self.dropped = 0
        self.lock = threading.Lock()
        self.thread = integrity.own_thread(threading.Thread(target=self._drain, name="fuseval-worker-output",
                                                            daemon=True))
        self.thread.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with contextlib.suppress(OSError):
                    os.close(self.fd)
                return
            with self.lock:
                self.data += chunk
                if len(self.data) > self.keep:
                    cut = len(self.data) - self.keep
                    self.dropped += cut
                    del self.data[:cut]

    def take(self, wait: float = 0.0) -> str:
        """What arrived since the last take (its last ``keep`` bytes)."""
        if wait:
            time.sleep(wait)
        with self.lock:
            text = self.data.decode("utf-8", "replace")
            dropped, self.dropped = self.dropped, 0
            self.data = bytearray()
        return (f"[{dropped} earlier bytes not kept]\n" if dropped else "") + text


class Worker:
    """A spawned, confined process that serves calls of one implementation of one operator."""

    def __init__(self, impl: Any, defn: Any, device: str, *, threads: int | None = None):
        self.impl, self.defn, self.device = impl, defn, str(device)
        self.threads = threads
        self.proc = self.conn = self.output = None
        self.scratch: str | None = None
        self.staged = False
        self.load_tampered: list[str] = []
        self.confinement: dict[str, Any] = {}
        self.idle_from: tuple[float, float] | None = None     # (cpu seconds, monotonic) at the last reply
        self.kept: list[list[Any]] = []                       # fuseval's copies of the case's kept outputs
        self.load_output = ""

    # ---- life cycle
    def spawn(self) -> None:
        """Start the process; it confines itself and imports torch while the caller goes on."""
        import torch
        import torch.multiprocessing as tmp
        confine.ensure_open_files()
        ctx = tmp.get_context("spawn")
        parent, child = ctx.Pipe(duplex=True)
        self.scratch = tempfile.mkdtemp(prefix="fuseval-worker-")
        plan = confine.Plan(self.scratch, confine.cache_folder(), gpu=self.device.startswith("cuda"))
        proc = ctx.Process(target=child_main, args=(child, self.threads or torch.get_num_threads(), plan),
                           daemon=True, name="python")
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
        read, write = os.pipe()
        try:
            transport.send_fds(parent, [write])
        finally:
            os.close(write)
        self.proc, self.conn, self.output = proc, parent, _Output(read)

    def start(self, spare: "Worker | None" = None) -> None:
        """A process with the implementation imported: ``spare`` (a worker spawned ahead,
        with nothing loaded yet) if given, else a new one."""
        if spare is not None:
            self.proc, self.conn, self.output, self.scratch = spare.proc, spare.conn, spare.output, spare.scratch
        else:
            self.spawn()
        ready = self._receive(time.monotonic() + START_TIMEOUT)
        if ready.get("status") != "ready":
            text = self.output.take(0.05)
            self.kill()
            raise ImplementationError(f"implementation {_label(self.impl)!r}: its worker process did not start "
                                      f"({ready.get('error', ready.get('status'))})" + _quoted(text))
        self.confinement = dict(ready.get("confinement") or {})
        confine.warn_missing(self.confinement)
        self.conn.send(("load", self.impl, self.defn, list(sys.path), os.getcwd()))
        reply = self._receive(time.monotonic() + START_TIMEOUT)
        self.load_output = self.output.take()
        if reply.get("status") == "loaded":
            self.staged = bool(reply.get("staged"))
            self.load_tampered = [str(x)[:200] for x in reply.get("tampered", [])][:20]
            self._end_children()
            self._mark_idle()
            return
        self.kill()
        if reply.get("status") == "load_failed":
            raise ImplementationError(f"implementation {_label(self.impl)!r} does not load: "
                                      f"{reply.get('error')}" + (f" (at {reply['where']})" if reply.get("where") else "")
                                      + _quoted(self.load_output))
        raise ImplementationError(f"implementation {_label(self.impl)!r}: its worker process ended while "
                                  f"importing it ({reply.get('error', reply.get('status'))})" + _quoted(self.load_output))

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def confinement_text(self) -> str:
        if not self.confinement:
            return confine.confinement().describe()
        return confine.Applied(**self.confinement).describe()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def kill(self) -> None:
        """End the worker and every process of its session, and remove its scratch folder."""
        if self.proc is not None:
            pid = self.proc.pid
            with contextlib.suppress(Exception):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.proc.kill()
            with contextlib.suppress(Exception):
                self.proc.join(5)
            procs.end_session(pid)
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        self.proc = self.conn = None
        self.scratch = None
        self.idle_from = None
        self.kept = []

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
            data = self.conn.recv_bytes(MAX_REPLY_BYTES)
        except EOFError:
            return self._ended()
        except OSError as exc:
            if "bad message length" in str(exc):
                self.kill()
                return {"status": "bad", "error": f"the worker sent a reply larger than {MAX_REPLY_BYTES} bytes "
                                                  "(fuseval's replies are small JSON messages)"}
            return self._ended()
        try:
            reply = json.loads(data.decode())
            if not isinstance(reply, dict):
                raise ValueError("not an object")
            return reply
        except (ValueError, UnicodeDecodeError):
            self.kill()
            return {"status": "bad", "error": "the worker sent a reply that is not fuseval's (the implementation "
                                              "wrote into fuseval's channel)"}

    def _ended(self) -> dict:
        self.proc.join(5)
        code = self.proc.exitcode
        self.kill()
        if code is not None and code < 0:
            return {"status": "crashed", "error": f"the implementation's process was killed by {_signal_name(code)}"}
        if code is None:
            return {"status": "exited", "error": "the implementation's process closed fuseval's channel and did not "
                                                 "end; it was killed"}
        return {"status": "exited", "code": code,
                "error": f"the implementation's process ended with exit status {code} during the call"}

    def _send(self, message: tuple, fds: Sequence[int] = ()) -> None:
        self.conn.send(message)
        if fds:
            transport.send_fds(self.conn, fds)

    def _mark_idle(self) -> None:
        cpu = procs.cpu_seconds(self.pid) if self.pid else None
        self.idle_from = None if cpu is None else (cpu, time.monotonic())

    def idle_violation(self) -> str | None:
        """Whether the worker used CPU time since its last reply, when it had nothing to do."""
        if self.idle_from is None or not self.alive():
            return None
        cpu = procs.cpu_seconds(self.pid)
        if cpu is None:
            return None
        used, elapsed = cpu - self.idle_from[0], time.monotonic() - self.idle_from[1]
        # a worker that works while it waits fills most of the wait; what the release of
        # the last call's memory costs stays well under it
        if used > max(IDLE_CPU_SECONDS, 0.5 * elapsed):
            return (f"the implementation's process used {used:.2f} s of CPU in the {elapsed:.2f} s after its last "
                    "call returned: work left running (a thread, or a process) after it answered")
        return None

    def settle(self, window: float = 0.05) -> str | None:
        """Watch the worker for ``window`` seconds after a case's last call: an idle worker
        uses no CPU; one that keeps working (a thread spinning, work deferred past its
        answer) is named. Returns the finding or None."""
        if not self.alive():
            return None
        # the worker answers a ping only once its loop is back waiting: what its own
        # bookkeeping of the last request costs is spent before the watch starts
        try:
            self._send(("ping",))
            if self._receive(time.monotonic() + 10.0).get("status") != "idle":
                return "the implementation's process did not answer fuseval's ping after the case's last call"
        except (OSError, EOFError):
            return None
        # a spinning thread stays busy (running or waiting to run, so that a loaded machine
        # does not hide it); the release of what a call left ends: only busy in every window is named
        readings = []
        for _ in range(SETTLE_WINDOWS):
            before, t0 = procs.busy_reading(self.pid), time.monotonic()
            time.sleep(window)
            after, elapsed = procs.busy_reading(self.pid), time.monotonic() - t0
            if before is None or after is None:
                break
            readings.append((procs.busy_between(before, after), elapsed))
            # /proc counts CPU time in clock ticks: two ticks is the least a reading can show
            if readings[-1][0] < max(0.5 * elapsed, 2.0 / procs.CLOCK_TICKS):
                break
        self._end_children()
        if len(readings) == SETTLE_WINDOWS and all(u >= max(0.5 * e, 2.0 / procs.CLOCK_TICKS) for u, e in readings):
            used, elapsed = sum(u for u, _ in readings), sum(e for _, e in readings)
            return (f"the implementation's process kept using CPU after its last call returned ({used:.2f} s in "
                    f"{elapsed:.2f} s): a thread or process left working")
        return None

    def _end_children(self, res: CallResult | None = None) -> None:
        """Kill every process of the worker's session but the worker; a call that left any
        has the violation ``child_process``."""
        if not self.pid:
            return
        left = procs.end_session(self.pid, keep=self.pid)
        if left and res is not None:
            res.add("child_process", "the implementation left processes running after it returned: "
                    + ", ".join(p.describe() for p in left[:8]) + " (killed)")

    def call(self, inputs: Sequence[Any], *, which: str = "forward", override: Mapping[str, Any] | None = None,
             stop: str | None = None, keep: bool = False, new_case: bool = False, poison: int = 0,
             deadline: float | None = None, want_taps: bool = False,
             expected: Sequence[tuple[tuple[int, ...] | None, Any]] | None = None) -> CallResult:
        """Call the implementation on ``inputs``; ``expected``: (shape, dtype) per output, to
        bound what fuseval allocates for a malformed answer. ``keep``: the worker keeps the
        answer for :meth:`recheck_kept` (``new_case`` forgets the previous case's first)."""
        import torch
        res = self._begin_call()
        if new_case:
            self.kept = []
        override = dict(override or {})
        shared = transport.share_inputs(list(inputs) + list(override.values()))
        req = {"inputs": shared.payload, "nfds": len(shared.fds), "n_inputs": len(inputs),
               "override_names": list(override), "which": which, "stop": stop, "keep": keep,
               "new_case": new_case, "poison": int(poison), "device": self.device,
               "threads": torch.get_num_threads()}
        try:
            self._send(("call", req), shared.fds)
        except (OSError, BrokenPipeError):
            self.kill()
            self.start()
            self._send(("call", req), shared.fds)
        try:
            reply = self._receive(deadline)
            self._answer(reply, res, expected, want_taps, keep, deadline, len(inputs) + len(override))
        except BaseException:
            # fuseval's side broke off the exchange (the worker may be waiting for its output
            # buffers): a worker left mid-exchange would read the next call as this one's
            self.kill()
            raise
        finally:
            self._after_call(shared, res)
        return res

    def _begin_call(self) -> CallResult:
        """The result of a call about to be made, the worker started if it is not alive,
        with what the worker did while it waited (the idle watch) already on it."""
        if not self.alive():
            self.start()
        res = CallResult("ok")
        idle = self.idle_violation()
        if idle:
            res.add("lingering_thread", idle)
        return res

    def _after_call(self, shared: transport.Shared, res: CallResult) -> None:
        """What follows every call, whatever it returned: the worker's session emptied, the
        inputs verified and released, the idle watch started, what it printed taken."""
        if self.alive():
            self._end_children(res)
        self._verify(shared, res)
        shared.close()
        if self.alive():
            self._mark_idle()
        res.output = self.output.take() if self.output is not None else ""

    def _answer(self, reply: dict, res: CallResult, expected, want_taps: bool, keep: bool,
                deadline: float | None, n_inputs: int) -> None:
        """Read the call's reply into ``res`` and, when it has outputs, have them filled."""
        if not self._status(reply, res, "ok"):
            return
        outs = reply.get("outputs") or []
        if isinstance(reply.get("note"), str):
            with contextlib.suppress(ValueError):
                res.note = json.loads(reply["note"])
        out_specs, placeholders = [], []
        limit = size_limit(expected)
        for i, d in enumerate(outs[:64]):
            spec, placeholder = output_spec(d, f"output {i}", res, limit, self.device)
            out_specs.append(spec)
            placeholders.append(placeholder)
            for j in (d.get("aliases", []) if isinstance(d, dict) else [])[:n_inputs]:
                if isinstance(j, int) and 0 <= j < n_inputs:
                    res.aliases.append((i, j))
        taps, tap_names = tap_specs(reply.get("taps") or [] if want_taps else [], res, limit, self.defn, self.device,
                                    described=reply.get("n_taps"))
        buffers = transport.output_buffers(out_specs + taps, self.device)
        try:
            self._send(("fill", buffers.payload[:len(out_specs)], buffers.payload[len(out_specs):],
                        len(buffers.fds)), buffers.fds)
            done = self._receive(deadline)
            filled = transport.collect(buffers)
        finally:
            buffers.close()
        if done.get("status") != "filled":
            self.call_failed(done, res)
            return
        copies = filled[:len(out_specs)]
        outputs = [c if c is not None else p for c, p in zip(copies, placeholders)]
        if keep:
            self.kept.append(copies)
        shape = reply.get("shape")
        if shape == "tensor" and outputs:
            res.outputs = (outputs[0],)
        elif shape == "sequence":
            res.outputs = tuple(outputs)
        elif shape == "none":
            res.outputs = None
        else:
            res.outputs = Opaque(str(reply.get("type"))[:200])
            res.add("bad_outputs", f"implementation returned {str(reply.get('type'))[:200]}, expected a tuple of "
                    f"{len(self.defn.outputs)} tensors ({', '.join(self.defn.output_names)})")
        res.taps = {n: b for n, b in zip(tap_names, filled[len(out_specs):]) if n is not None and b is not None}

    def _status(self, reply: dict, res: CallResult, expected: str) -> bool:
        """Read a reply's status and integrity report into ``res``; whether it is
        ``expected`` (else the violation is recorded)."""
        res.status, res.seconds = str(reply.get("status")), float(reply.get("seconds") or 0.0)
        self._integrity(reply, res)
        status = res.status
        if status == "timeout":
            res.add("timeout", "the implementation did not return before the case's timeout; its process was killed")
        elif status in ("exited", "crashed"):
            res.add(status, str(reply.get("error")))
        elif status == "raised":
            res.error, res.where = str(reply.get("error"))[:4000], str(reply.get("where") or "")[:400]
            res.add("out_of_memory" if reply.get("oom") else "raised",
                    f"implementation raised: {res.error}" + (f" (at {res.where})" if res.where else ""))
        elif status != expected:
            res.status = "bad"
            res.add("tampered", str(reply.get("error", "the worker's reply was not understood"))[:400])
        return status == expected

    # ------------------------------------------------------------------ timing
    def time(self, sets: Sequence[Sequence[Any]], activation: int | None, seed: int, rules: Mapping[str, Any], *,
             deadline: float | None = None) -> CallResult:
        """Time the implementation over the rotation ``sets`` (:func:`fuseval.runner.clock.run_timed`
        in the worker). ``res.timing`` holds the loop's numbers (fuseval's to judge) and
        ``res.outputs`` the description of one timed call's outputs, for :meth:`timed_outputs`."""
        import torch
        res = self._begin_call()
        shared = transport.share_inputs([x for s in sets for x in s])
        req = {"inputs": shared.payload, "nfds": len(shared.fds), "n_inputs": len(sets[0]), "sets": len(sets),
               "activation": activation, "seed": int(seed), "device": self.device,
               "threads": torch.get_num_threads(), **dict(rules)}
        try:
            try:
                self._send(("time", req), shared.fds)
            except (OSError, BrokenPipeError):
                self.kill()
                res.add("crashed", "the implementation's process was gone before the timed run")
                return res
            reply = self._receive(deadline)
            if self._status(reply, res, "timed"):
                res.status = "ok"
                res.timing = {k: reply.get(k) for k in ("times_ms", "first_call", "warmup_calls", "kept", "loop_s",
                                                        "launch_ms", "watched", "empty", "sets", "output_bytes")}
                res.outputs = reply.get("outputs") or []
        finally:
            self._after_call(shared, res)
        return res

    def timed_outputs(self, indices: Sequence[int], described: Sequence[Any], expected=None, *,
                      deadline: float | None = None) -> tuple[list[list[Any]] | None, CallResult]:
        """The outputs of the last timed run's calls at ``indices`` (kept calls, in loop
        order), each as described by ``described`` (one timed call's description)."""
        res = CallResult("ok")
        limit = size_limit(expected)
        specs = []
        for i, d in enumerate(list(described)[:64]):
            spec, _ = output_spec(d, f"output {i}", res, limit, self.device)
            specs.append(spec)
        if res.violations or not self.alive():
            return None, res
        buffers = transport.output_buffers([s for _ in indices for s in specs], self.device)
        try:
            self._send(("timed_outputs", list(indices), buffers.payload, len(buffers.fds)), buffers.fds)
            done = self._receive(deadline)
            filled = transport.collect(buffers)
        finally:
            buffers.close()
        if self.alive():
            self._mark_idle()
        if done.get("status") != "filled":
            self.call_failed(done, res)
            return None, res
        n = len(specs)
        return [filled[j * n:(j + 1) * n] for j in range(len(indices))], res

    def _verify(self, shared: transport.Shared, res: CallResult) -> None:
        """The call's inputs, as fuseval sees them after it: pages the worker wrote in a
        sealed input (CPU), or a worker copy that differs from fuseval's (CUDA)."""
        names = [s.name for s in self.defn.inputs] if self.defn is not None else []
        changed: list[int] = []
        if shared.inodes and self.alive():
            written = procs.written_pages(self.pid, set(shared.inodes))
            if written is None:
                res.add("tampered", "fuseval could not read the worker's memory map to verify its inputs")
            else:
                changed += [shared.inodes[ino] for ino, kb in written.items() if kb > 0]
                # the worker holds every input until the next call: one no longer mapped
                # was unmapped by the implementation, which hides what it wrote there
                gone = sorted(shared.inodes[ino] for ino in set(shared.inodes) - set(written))
                if gone:
                    res.add("tampered", "the implementation unmapped its input(s) "
                            + ", ".join(repr(names[i]) if i < len(names) else str(i) for i in gone)
                            + " before fuseval could verify them")
        changed += transport.changed_inputs(shared)
        for i in sorted(set(changed)):
            name = names[i] if i < len(names) else f"override {i - len(names)}"
            res.add("mutated_input", f"input {name!r} was written by the implementation")

    def call_failed(self, done: dict, res: CallResult) -> CallResult:
        res.status = str(done.get("status"))
        name = {"timeout": "timeout", "crashed": "crashed", "exited": "exited"}.get(res.status, "tampered")
        res.add(name, str(done.get("error") or f"the worker failed while handing back the outputs ({res.status})"))
        res.outputs = None
        return res

    def recheck_kept(self, deadline: float | None) -> tuple[list[list[Any]], list[list[Any]]] | None:
        """(what each kept answer of the case was when fuseval copied it, what it holds now),
        call by call; the kept answers are forgotten. None when the worker could not say."""
        kept, self.kept = self.kept, []
        if not kept or not self.alive():
            return None
        specs = [None if t is None else (tuple(t.shape), t.dtype) for outs in kept for t in outs]
        buffers = transport.output_buffers(specs, self.device)
        try:
            self._send(("recopy", buffers.payload, len(buffers.fds)), buffers.fds)
            done = self._receive(deadline)
            now = transport.collect(buffers)
        finally:
            buffers.close()
        self._mark_idle()
        if done.get("status") != "filled":
            return None
        out, k = [], 0
        for outs in kept:
            out.append(now[k:k + len(outs)])
            k += len(outs)
        return kept, out

    def forget_kept(self) -> None:
        self.kept = []
        if self.alive():
            with contextlib.suppress(OSError):
                self._send(("forget",))

    def _integrity(self, reply: dict, res: CallResult) -> None:
        """What the worker admits about the implementation (advisory: it only adds)."""
        tampered = [str(x)[:200] for x in (reply.get("tampered") or [])][:20] or self.load_tampered
        if tampered:
            res.add("tampered", "the implementation replaced functions a verdict relies on: " + ", ".join(tampered[:8]))
        threads = [str(x)[:100] for x in (reply.get("threads") or [])][:20]
        if threads:
            res.add("lingering_thread", "the implementation left threads running after it returned: "
                    + ", ".join(threads[:8]))

def _quoted(text: str) -> str:
    text = text.strip()
    if not text:
        return ""
    lines = text.splitlines()[-8:]
    return "; the implementation printed:\n" + "\n".join(f"  | {line[:300]}" for line in lines)


def _label(impl: Any) -> str:
    return impl_label(impl)
