"""Running a gate's components side by side, with the results put back in the plan's
order, so that the report (and its verdict and exit code) is the same as a serial run's.

Two ways, chosen by :func:`by_operator`:

* **One thread per operator** (:func:`run_operators`): with the implementation isolated,
  at least as many operators (two or more) as ``jobs``, and no GPU of its own for each
  (the CPU, or one GPU). Each thread runs its operator's components in turn, through the
  implementation worker that validating the operator's context started. The costly part
  of a component then runs outside this process's interpreter lock: the implementation's
  calls (the Triton interpreter on the CPU) in its worker process, and on a GPU the
  oracles' and metrics' kernels, which torch runs with the lock released. No pool process
  imports torch and starts a second worker (and CUDA context) for an operator whose worker
  is already waiting (figures: docs/design/harness.md#gate-threads-and-cuda-streams).
* **A pool of processes** (:func:`run_units`) otherwise: each (operator, component) is a
  unit of work handed to a pool of ``jobs`` worker processes.

Why processes: on a CPU the components are bound by the Triton interpreter and by the
float64 oracles, both single-threaded Python and numpy, so threads would share one core.
Every unit builds its own validated context in its pool process (an implementation's
isolation worker is started there, once per pool process and implementation, and serves
every component that process runs); nothing but the request and the result crosses a
process boundary, so no unit can see another's inputs or answers.

Progress messages of the pool processes are relayed to the caller's ``progress`` through
a queue, each prefixed as a serial run prefixes them (by operator and component).
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import queue as _queue
import sys
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Sequence

import torch

from ..memory import apply_cuda_share
from .context import GateContext
from .results import ComponentResult
from ..errors import EXIT_INTERNAL
from ..torch_flags import tf32_is_off
from .components import run_guarded
from .context import context, settings
from .request import GateRequest
from .results import TestResult

__all__ = ["by_operator", "default_jobs", "gpu_assignment", "run_operators", "run_units"]

# a unit's expected share of a gate's time, for the order of submission (longest first,
# so the pool's processes finish together)
_WEIGHT = {"check": 3, "budget": 2, "properties": 1}

_relay: Any = None      # the pool process's queue to the parent (set by _init)
_contexts: dict[str, GateContext] = {}


def default_jobs(device: str, units: int, operators: int = 1, isolated: bool = False) -> int:
    """Side-by-side jobs for ``units`` units of work over ``operators`` operators: on the
    CPU one per core (at most 4: each also starts an implementation worker); on CUDA one
    process per GPU when the gate runs on "cuda" and the machine has several
    (:func:`gpu_assignment`); on one GPU one thread per operator when the implementation
    is ``isolated`` (:func:`by_operator`), else one (two processes sharing one H200
    measured no gain: each compiles and loads its own kernels and CUDA context)."""
    if units < 2:
        return 1
    if device == "cpu":
        return max(1, min(units, os.cpu_count() or 1, 4))
    gpus = _gpu_ids(device)
    if gpus:
        return min(units, len(gpus))
    return operators if isolated and operators > 1 else 1


def _gpu_ids(device: str) -> list[str] | None:
    """The CUDA_VISIBLE_DEVICES entries a gate on ``device`` may spread over: every visible
    GPU when it runs on "cuda" (or "cuda:0") and there are two or more, else None."""
    if device not in ("cuda", "cuda:0"):
        return None
    n = torch.cuda.device_count()
    if n < 2:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible else [str(i) for i in range(n)]
    return ids[:n] if len(ids) >= 2 else None


def gpu_assignment(device: str, jobs: int, ids: list[str] | None = None) -> list[str] | None:
    """The GPU of each of the ``jobs - 1`` pool processes (a CUDA_VISIBLE_DEVICES entry;
    this process keeps the first GPU), when every process can have one of its own; None
    when they share (one GPU, fewer GPUs than processes, an explicit cuda:N, the CPU)."""
    ids = _gpu_ids(device) if ids is None else ids
    if not ids or len(ids) < jobs:
        return None
    return ids[1:jobs]


def _init(relay, threads: int, path: list[str], cwd: str, gpus: list[str] | None, counter) -> None:
    """A pool process: the parent's import path and folder (an implementation given as
    'module:function' imports there as in the parent), the relay, its share of threads,
    and (``gpus``) a GPU of its own, seen as cuda:0 here and by its implementation worker."""
    global _relay
    sys.path[:] = path
    os.chdir(cwd)
    _relay = relay
    if gpus:
        with counter.get_lock():
            k = counter.value
            counter.value += 1
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[k % len(gpus)]
    torch.set_num_threads(threads)
    apply_cuda_share()   # the parent's share of the GPU, where it was given one


def _progress(message: str) -> None:
    _relay.put(message)


def _run_unit(request: GateRequest, op: str, component: str) -> bytes:
    """One component of one operator, in a pool process (its context built once per
    operator, from the request the parent validated); its ComponentResult pickled, once
    (the report object it carries left out when it does not pickle: its data comes back
    all the same)."""
    ctx = _contexts.get(op)
    if ctx is None:
        ctx = _contexts[op] = context(op, request.impl, settings(request, progress=_progress))
    result = run_guarded(component, ctx)
    try:
        return pickle.dumps(result)
    except Exception:  # noqa: BLE001 - the report object stays in the pool process
        result.result = None
        return pickle.dumps(result)


def run_units(units: Sequence[tuple[GateContext, str]], request: GateRequest, jobs: int,
              progress: Callable[[str], None], device: str = "cpu") -> list[ComponentResult]:
    """Run every (context, component) of ``units``, ``jobs`` at a time: this process takes
    units itself (with the contexts, and implementation workers, it already validated)
    and ``jobs - 1`` pool processes take the others; results in the order of ``units``.
    ``request``: the run's, as this process validated it, with its seeds resolved and no
    ``progress`` (it is pickled to the pool processes; the implementation is a name). On a machine with a GPU for every process,
    each pool process runs on a GPU of its own (:func:`gpu_assignment`)."""
    order = sorted(range(len(units)), key=lambda i: -_WEIGHT.get(units[i][1], 1))
    lock = threading.Lock()
    results: list[ComponentResult | None] = [None] * len(units)

    def next_unit() -> int | None:
        with lock:
            return order.pop(0) if order else None

    ctx_mp = multiprocessing.get_context("spawn")
    relay = ctx_mp.Queue()
    stop = threading.Event()

    def pump() -> None:
        while not stop.is_set() or not relay.empty():
            try:
                progress(relay.get(timeout=0.1))
            except _queue.Empty:
                continue

    def drive(pool: ProcessPoolExecutor) -> None:
        while (i := next_unit()) is not None:
            ctx, name = units[i]
            try:
                results[i] = pickle.loads(pool.submit(_run_unit, request, ctx.op, name).result())
            except Exception as exc:  # noqa: BLE001 - a pool process that died: that unit's error
                results[i] = _lost(ctx, name, exc)

    threads = max(1, (os.cpu_count() or 1) // jobs)
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        gpus = gpu_assignment(device, jobs) if device != "cpu" else None
        with ProcessPoolExecutor(max_workers=jobs - 1, mp_context=ctx_mp, initializer=_init,
                                 initargs=(relay, threads, list(sys.path), os.getcwd(), gpus,
                                           ctx_mp.Value("i", 0))) as pool:
            drivers = [threading.Thread(target=drive, args=(pool,), daemon=True) for _ in range(jobs - 1)]
            for d in drivers:
                d.start()
            while (i := next_unit()) is not None:
                results[i] = run_guarded(units[i][1], units[i][0])
            for d in drivers:
                d.join()
    finally:
        stop.set()
        reader.join()
    return results  # type: ignore[return-value]


def by_operator(units: Sequence[tuple[GateContext, str]], device: str, isolated: bool, jobs: int) -> bool:
    """Whether :func:`run_operators` runs these units: the implementation in worker
    processes (else its calls would share this process's interpreter lock, and one thread
    would wait for the other), at least as many operators as ``jobs`` (each thread then has
    an operator to itself; with more processes than operators, the pool can also split one
    operator's components), and no GPU of its own for each job (with one,
    :func:`run_units` gives every pool process its own GPU). On a GPU also only while
    TF32 is off (:mod:`fuseval.torch_flags`): the float32 references that the threads run
    here would otherwise read TF32 on or off as another thread's block sets it."""
    n = len({ctx.op for ctx, _ in units})
    return (isolated and n > 1 and n >= jobs and gpu_assignment(device, jobs) is None
            and (device == "cpu" or tf32_is_off()))


# Hypothesis keeps per-test state in globals: two properties components never run at once
_PROPERTIES_LOCK = threading.Lock()


@contextlib.contextmanager
def _own_stream(device: str):
    """On CUDA, the calling thread's kernels on a CUDA stream of its own for the block
    (torch's current stream is per thread). On the one default stream, the threads'
    kernels run strictly in the order they were queued: a small kernel of one operator
    waited behind the other's float64 GEMMs, and every read of a result behind both
    (docs/design/harness.md#gate-threads-and-cuda-streams). The
    stream first waits for what this process queued before; tensors travel to an
    implementation worker with an event of the stream that wrote them (CUDA IPC), and the
    worker synchronises before it answers, so its outputs are complete when read here."""
    if not str(device).startswith("cuda"):
        yield
        return
    dev = torch.device(device)
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        stream.synchronize()


def _run_operator(units: Sequence[tuple[GateContext, str]], idx: list[int], results: list) -> None:
    """One operator's units, in their order (on a CUDA stream of their own:
    :func:`_own_stream`), except that a properties component waits while another thread
    runs one: the operator's next other unit goes first."""
    with _own_stream(units[idx[0]][0].device):
        _run_in_turn(units, idx, results)


def _run_in_turn(units: Sequence[tuple[GateContext, str]], idx: list[int], results: list) -> None:
    pending = list(idx)
    while pending:
        for i in pending:
            if units[i][1] != "properties":
                results[i] = run_guarded(units[i][1], units[i][0])
                break
            # wait for the lock only when nothing else of this operator is left to run
            if _PROPERTIES_LOCK.acquire(blocking=all(units[j][1] == "properties" for j in pending)):
                try:
                    results[i] = run_guarded(units[i][1], units[i][0])
                finally:
                    _PROPERTIES_LOCK.release()
                break
        pending.remove(i)


def run_operators(units: Sequence[tuple[GateContext, str]], jobs: int) -> list[ComponentResult]:
    """Run the units with up to ``jobs`` threads, each taking a whole operator at a time
    (the operators with the most expected work first) and running its components
    (:func:`_run_operator`); results in the order of ``units``."""
    groups: dict[str, list[int]] = {}
    for i, (ctx, _) in enumerate(units):
        groups.setdefault(ctx.op, []).append(i)
    queue = sorted(groups.values(), key=lambda idx: -sum(_WEIGHT.get(units[i][1], 1) for i in idx))
    lock = threading.Lock()
    results: list[ComponentResult | None] = [None] * len(units)

    def drive() -> None:
        while True:
            with lock:
                if not queue:
                    return
                idx = queue.pop(0)
            _run_operator(units, idx, results)

    threads = [threading.Thread(target=drive, daemon=True) for _ in range(min(jobs, len(queue)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results  # type: ignore[return-value]


def _lost(ctx: GateContext, name: str, exc: Exception) -> ComponentResult:
    """The result of a unit whose pool process died (killed, out of memory): an error (exit 70)."""
    msg = f"{name}: the gate's worker process running it died ({type(exc).__name__}: {exc})"
    return ComponentResult(ctx.op, name, "error", msg[:300], exit_code=EXIT_INTERNAL, messages=[msg],
                           tests=[TestResult(name, "error", 0.0, msg, msg)])
