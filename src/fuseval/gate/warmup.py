"""Filling Triton's kernel cache before a GPU gate needs it.

On a GPU the gate runs its components one after the other in one process, and every
kernel that is not in Triton's on-disk cache is compiled when a component first calls it:
with an empty cache, compilation is about half of the gate of both fast paths (104 s by
the gate's clock against 52 s warm on an H200, ``benchmarks/results/h200-2026-12-01-gate``).
Compilation is CPU work, and GPU machines have many cores.

:func:`start` spawns a few processes that each take a share of the run's case shapes
(every case of the check's configuration and of the budget's, in the order the gate
reaches them) and call the implementation once on freshly drawn inputs of each shape, and
its stage taps (``fn.staged``) where it has them, while the gate runs. Their kernels land
in the cache the gate's own worker reads, so it finds most of them compiled. Nothing they
compute is kept or compared: a call that fails is skipped (the gate's components report
their own failures), and the processes are stopped when the gate ends. They run only what
the gate's worker runs anyway (the implementation it already trusts to run in a process
of its own), only on CUDA and only for implementations given by name.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
from typing import Any, Callable, Sequence

__all__ = ["Warmup", "shapes", "spawn", "start"]


def shapes(contexts: Sequence[Any]) -> list[tuple[str, Any, dict]]:
    """(operator, configuration, axes) of every distinct case shape the check and the
    budget of ``contexts`` will run, in the order the gate reaches them."""
    from ..definitions import load
    seen: set = set()
    out: list[tuple[str, Any, dict]] = []
    for ctx in contexts:
        for config, cases in ((ctx.config, ctx.cases), (ctx.budget_config, ctx.budget_cases)):
            defn = load(ctx.op, config)
            for case in defn.cases(cases):
                key = (ctx.op, tuple(sorted(defn.resolve_axes(case.axes).items())))
                if key not in seen:
                    seen.add(key)
                    out.append((ctx.op, config, dict(case.axes)))
    return out


def _warm(items: list[tuple[str, Any, dict]], impl: str, device: str, mode: str, path: list[str], cwd: str,
          done) -> None:
    """One warm-up process: each case shape's implementation call and stage taps, once."""
    sys.path[:] = path
    os.chdir(cwd)
    import torch
    from ..definitions import load
    from ..inputs import generate_inputs
    from ..ops import resolve_impl
    for op, config, axes in items:
        try:
            defn = load(op, config)
            fn = resolve_impl(defn, impl)
            inputs = generate_inputs(defn, axes, seed=0, mode=mode, device=device)
            fn(*inputs)
            staged = getattr(fn, "staged", None)
            if staged is not None:
                staged(*inputs, taps={}, override={})
            if str(device).startswith("cuda"):
                torch.cuda.synchronize()
            del inputs
        except Exception:  # noqa: BLE001 - the gate reports the implementation's failures itself
            pass
        finally:
            with done.get_lock():
                done.value += 1


class Warmup:
    """The running warm-up processes of one gate run."""

    def __init__(self, procs: list, total: int, done):
        self.procs, self.total, self._done = procs, total, done

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
        return f"warm-up: {self.done} of {self.total} case shapes compiled beside the gate"


def start(contexts: Sequence[Any], impl: Any, device: str, mode: str, *, isolated: bool,
          progress: Callable[[str], None], processes: int | None = None) -> Warmup | None:
    """Start the warm-up for a gate on ``device`` (None where it does not apply: not CUDA,
    an implementation given as a callable or run in the gate's own process, no case)."""
    if not str(device).startswith("cuda") or not isinstance(impl, str) or not isolated:
        return None
    items = shapes(contexts)
    if not items:
        return None
    warm = spawn(items, impl, device, mode, processes or max(1, min(len(items), 8, (os.cpu_count() or 2) // 2)))
    progress(f"warm-up: {len(warm.procs)} processes compiling the kernels of {len(items)} case shapes "
             "beside the gate")
    return warm


def spawn(items: list[tuple[str, Any, dict]], impl: str, device: str, mode: str, n: int) -> Warmup:
    """``n`` processes sharing ``items`` (item k to process k mod n)."""
    n = max(1, min(n, len(items)))
    ctx = multiprocessing.get_context("spawn")
    done = ctx.Value("i", 0)
    procs = []
    # the processes need fuseval and the implementation, nothing of __main__ (a caller's
    # script without a main guard would run again in each)
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = type(sys)("__main__")
    try:
        for k in range(n):
            p = ctx.Process(target=_warm, args=(items[k::n], impl, str(device), mode, list(sys.path), os.getcwd(),
                                                done), daemon=True, name=f"fuseval-warmup-{k}")
            p.start()
            procs.append(p)
    finally:
        if main is not None:
            sys.modules["__main__"] = main
    return Warmup(procs, len(items), done)
