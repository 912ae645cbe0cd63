"""Filling Triton's kernel cache before a GPU gate needs it.

On a GPU the gate runs each operator's components one after the other, and every
kernel that is not in Triton's on-disk cache is compiled when a component first calls it:
with an empty cache, compilation is a large share of the gate of both fast paths
(figures: docs/design/harness.md#gate-warm-up).
Compilation is CPU work, and GPU machines have many cores.

:func:`start` spawns a few processes that take the run's work one item at a time, the next
one no process has taken (:func:`plan`): every case shape of the check's configuration and
of the budget's, in the order the gate reaches them, the operators in turn, and one run of
each operator's property checks. For a case shape they call the implementation once on
freshly drawn inputs, and its stage taps (``fn.staged``) where it has them, while the gate
runs. Their kernels land in the cache the gate's own worker reads, so it finds most of
them compiled. Nothing they compute is kept or compared: an item that fails is skipped
(the gate's components report their own failures), and the processes are stopped when
the gate ends. They run only what the gate's worker runs anyway (the implementation it
already trusts to run in a process of its own), only on CUDA and only for
implementations given by name.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import time
from typing import Any, Callable, Sequence

import torch

from ..inputs import generate_inputs
from ..operators import load
from ..operators.implementations import resolve_impl
from ..properties import check_implementation

__all__ = ["Warmup", "plan", "shapes", "spawn", "start"]


def shapes(contexts: Sequence[Any], components: Sequence[str] = ("check", "budget")) -> list[tuple[str, Any, dict]]:
    """(operator, configuration, axes) of every distinct case shape the check and the
    budget of ``contexts`` will run (those of ``components``): each operator's in the order
    its components reach them, the operators taken in turn (the gate may run them side by
    side, each starting with its first case)."""
    per_op: list[list[tuple[str, Any, dict]]] = []
    for ctx in contexts:
        seen: set = set()
        out: list[tuple[str, Any, dict]] = []
        runs = [(ctx.config, ctx.cases)] if "check" in components else []
        runs += [(ctx.budget_config, ctx.budget_cases)] if "budget" in components else []
        for config, cases in runs:
            defn = load(ctx.op, config)
            for case in defn.cases(cases):
                key = tuple(sorted(defn.resolve_axes(case.axes).items()))
                if key not in seen:
                    seen.add(key)
                    out.append((ctx.op, config, dict(case.axes)))
        per_op.append(out)
    return [items[k] for k in range(max(map(len, per_op), default=0)) for items in per_op if k < len(items)]


def plan(contexts: Sequence[Any], components: Sequence[str], processes: int) -> list[tuple]:
    """The warm-up's work, in the order it is taken: ("case", operator, configuration,
    axes) per case shape (:func:`shapes`) and, for each operator whose properties run,
    ("properties", operator, properties profile, None): one run of its property checks
    with the implementation in the warm-up process. The properties draw their examples
    derandomized, so that run compiles the kernels of the very shapes the gate's
    properties will draw (docs/design/harness.md#gate-warm-up). They come after the first
    ``processes`` case shapes: the checks need those at once, the properties some seconds
    later."""
    cases = [("case", *item) for item in shapes(contexts, components)]
    props = [("properties", ctx.op, ctx.profile.properties, None) for ctx in contexts
             if "properties" in components and "properties" not in (ctx.not_run or {})]
    return cases[:processes] + props + cases[processes:]


def _warm_one(item: tuple, impl: str, device: str, mode: str) -> None:
    """One item of :func:`plan`: a case shape's calls, or an operator's property checks."""
    kind, op, config, axes = item
    if kind == "properties":
        check_implementation(op, impl, profile=config, device=device)
        return
    defn = load(op, config)
    fn = resolve_impl(defn, impl)
    inputs = generate_inputs(defn, axes, seed=0, mode=mode, device=device)
    fn(*inputs)
    staged = getattr(fn, "staged", None)
    if staged is not None:
        staged(*inputs, taps={}, override={})
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _warm(items: list[tuple], impl: str, device: str, mode: str, path: list[str], cwd: str,
          taken, done, last) -> None:
    """One warm-up process: takes the next item no process has taken and runs it
    (:func:`_warm_one`), until none is left."""
    sys.path[:] = path
    os.chdir(cwd)
    while True:
        with taken.get_lock():
            k = taken.value
            taken.value += 1
        if k >= len(items):
            return
        try:
            _warm_one(items[k], impl, device, mode)
        except Exception:  # noqa: BLE001 - the gate reports the implementation's failures itself
            pass
        finally:
            with done.get_lock():
                done.value += 1
                last.value = time.time()


class Warmup:
    """The running warm-up processes of one gate run."""

    def __init__(self, procs: list, total: int, shared: tuple):   # (taken, done, last finished at)
        # the shared values live as long as this object: a process that starts after
        # they are collected cannot attach to their locks
        self.procs, self.total, self._shared = procs, total, shared
        self._done, self._last = shared[1:]
        self.started = time.time()

    @property
    def done(self) -> int:
        return self._done.value

    def stop(self) -> str:
        """End the processes that are still at work; returns a line for the progress."""
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(5)
        line = f"warm-up: {self.done} of {self.total} items compiled beside the gate"
        if self.done:
            line += f", the last {max(0.0, self._last.value - self.started):.1f} s after the start"
        return line


def start(contexts: Sequence[Any], impl: Any, device: str, mode: str, *, isolated: bool,
          progress: Callable[[str], None], processes: int | None = None,
          components: Sequence[str] = ("check", "properties", "budget")) -> Warmup | None:
    """Start the warm-up for a gate on ``device`` running ``components`` (None where it
    does not apply: not CUDA, an implementation given as a callable or run in the gate's
    own process, nothing to run)."""
    if not str(device).startswith("cuda") or not isinstance(impl, str) or not isolated:
        return None
    n = processes or max(1, min(8, (os.cpu_count() or 2) // 2))
    items = plan(contexts, components, n)
    if not items:
        return None
    warm = spawn(items, impl, device, mode, n)
    n_cases = sum(1 for item in items if item[0] == "case")
    props = len(items) - n_cases
    progress(f"warm-up: {len(warm.procs)} processes compiling the kernels of {n_cases} case shapes"
             + (f" and {props} operators' properties" if props else "") + " beside the gate")
    return warm


def spawn(items: list[tuple], impl: str, device: str, mode: str, n: int) -> Warmup:
    """``n`` processes sharing ``items``: each takes the next one no process has taken."""
    n = max(1, min(n, len(items)))
    ctx = multiprocessing.get_context("spawn")
    taken, done, last = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Value("d", 0.0)
    procs = []
    # the processes need fuseval and the implementation, nothing of __main__ (a caller's
    # script without a main guard would run again in each)
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = type(sys)("__main__")
    try:
        for k in range(n):
            p = ctx.Process(target=_warm, args=(items, impl, str(device), mode, list(sys.path), os.getcwd(),
                                                taken, done, last), daemon=True, name=f"fuseval-warmup-{k}")
            p.start()
            procs.append(p)
    finally:
        if main is not None:
            sys.modules["__main__"] = main
    return Warmup(procs, len(items), (taken, done, last))
