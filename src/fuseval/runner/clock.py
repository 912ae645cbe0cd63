"""The timed loop, run where the implementation runs (its confined worker).

The worker imports this module before it imports the implementation, and the functions
the loop times with are bound here at import (CUDA events' ``record`` and
``elapsed_time``, ``torch.cuda.synchronize``, ``time.perf_counter``): an implementation
that rebinds ``torch.cuda.Event.elapsed_time`` or ``time.perf_counter`` later changes
its own view of them, not this loop's, and the rebinding is reported (the names are in
:data:`fuseval.runner.integrity.WATCHED`). fuseval's process judges the numbers this loop
returns (:mod:`fuseval.runner.timing`); nothing here decides a verdict.

One timed run of an implementation on one case:

* **rotation**: the calls cycle over several input sets (distinct weights, distinct
  addresses), and before every call, outside the timed interval, the set's first floating
  activation is rewritten as its base values times a scale drawn for that call: no two
  calls see the same contents, so a cache keyed on addresses, tensor versions or contents
  can only answer with a stale result. The scales come from a seed fuseval's process sends
  and can recompute, so any call's inputs can be rebuilt there;
* **warm-up**, then **timed calls** queued back to back as the benchmark times them (CUDA
  events on the current stream around each call, the L2 cache flushed before each); every
  timed call's outputs are kept, so that fuseval's process can pick, after the loop,
  which calls to check against the oracle;
* **watched calls**: a few calls with the whole device synchronised before and after
  each, an event recorded once every stream of the process is idle; their span covers
  work on any stream, which fuseval's process compares with the events' interval;
  the host's time to return from each call (timed and watched) is kept too: a watched
  call starts on an idle device, so a call whose launches take longer than its kernels
  spans its launches there, while the timed calls' launches hide behind the L2 flush;
* **empty calls** timed the same way, to subtract what the synchronisation itself costs.
"""
from __future__ import annotations

import random
import time
from typing import Any, Callable, Sequence

import torch

__all__ = ["run_timed", "scale_of", "refresh", "L2_FLUSH_BYTES"]

L2_FLUSH_BYTES = 256 << 20

# bound once, before any implementation is imported into this process
_perf_counter = time.perf_counter
_Random = random.Random
_cuda_synchronize = torch.cuda.synchronize
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
_tensor_copy = torch.Tensor.copy_
_tensor_zero = torch.Tensor.zero_


def scale_of(seed: int, k: int) -> float:
    """The activation scale of call ``k`` of a run seeded ``seed``: in [0.75, 1.25), the
    same in fuseval's process and in the worker."""
    return 0.75 + 0.5 * _Random(seed * 1_000_003 + k).random()


def refresh(target: torch.Tensor, base: torch.Tensor, scale: float) -> None:
    """target <- base * scale, rounded to target's dtype (one elementwise kernel)."""
    _tensor_copy(target, (base.float() * scale).to(target.dtype))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        _cuda_synchronize(device)


def run_timed(fn: Callable[..., Any], sets: Sequence[Sequence[Any]], activation: int | None, seed: int, *,
              device: torch.device, warmup_ms: float, rep_ms: float, min_reps: int, max_reps: int,
              flush: bool, watched: int, keep_bytes: int) -> tuple[dict[str, Any], list[Any]]:
    """Time ``fn`` over the rotation ``sets`` (see the module docstring). Returns (the
    numbers, the outputs of each timed call in order)."""
    bases = [None if activation is None else s[activation].clone() for s in sets]
    inputs = [list(s) for s in sets]
    for s, b in zip(inputs, bases):
        if b is not None:
            s[activation] = torch.empty_like(b)
    flusher = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device) if flush and device.type == "cuda" \
        else None
    counter = [0]

    def prepare() -> list[Any]:
        """Inputs of the next call, its activation rewritten (outside any timed interval)."""
        k = counter[0]
        counter[0] += 1
        args = inputs[k % len(inputs)]
        base = bases[k % len(bases)]
        if base is not None:
            refresh(args[activation], base, scale_of(seed, k))
        if flusher is not None:
            _tensor_zero(flusher)
        return args

    cuda = device.type == "cuda"
    _sync(device)
    # warm-up: compilation, autotuning, the implementation's own caches; a first estimate
    t_end, n, est_ms = _perf_counter() + warmup_ms / 1e3, 0, 0.0
    # every set at least twice: a set's first calls (its allocations, the implementation's
    # caches) are never timed
    while n < 2 * len(inputs) or _perf_counter() < t_end:
        args = prepare()
        if cuda:
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            _event_record(start)
            fn(*args)
            _event_record(end)
            _sync(device)
            est_ms = max(_event_elapsed(start, end), 1e-4)
        else:
            t0 = _perf_counter()
            fn(*args)
            est_ms = max((_perf_counter() - t0) * 1e3, 1e-4)
        n += 1
    warmup_calls = n
    reps = int(min(max_reps, max(min_reps, rep_ms / est_ms)))
    # every timed call's outputs are kept: bounded by keep_bytes (fewer calls, never fewer
    # than min_reps: the later ones then are not kept)
    probe_args = prepare()
    probe = fn(*probe_args)
    # what one call's outputs hold: their storages (outputs that are views of one buffer
    # hold that buffer), each counted once
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in _tensors(probe)}
    out_bytes = sum(storages.values())
    del probe
    if out_bytes:
        reps = max(min(reps, keep_bytes // out_bytes), min(min_reps, reps))
    keep = max(0, min(reps, keep_bytes // out_bytes if out_bytes else reps))
    # the allocator's cache grown to hold every kept output, so that keeping them asks the
    # driver for no memory inside the timed calls
    grown = [torch.empty(n, dtype=torch.uint8, device=device) for _ in range(keep) for n in storages.values()]
    del grown
    first = counter[0]
    kept: list[Any] = []
    _sync(device)
    loop_t0 = _perf_counter()
    if cuda:
        starts = [_Event(enable_timing=True) for _ in range(reps)]
        ends = [_Event(enable_timing=True) for _ in range(reps)]
        launch_ms = []
        for i in range(reps):
            args = prepare()
            _event_record(starts[i])
            h0 = _perf_counter()
            out = fn(*args)
            launch_ms.append((_perf_counter() - h0) * 1e3)
            _event_record(ends[i])
            if i < keep:
                kept.append(out)
            del out
        _sync(device)
        loop_s = _perf_counter() - loop_t0
        times = [_event_elapsed(s, e) for s, e in zip(starts, ends)]
    else:
        times, launch_ms = [], []
        for i in range(reps):
            args = prepare()
            t0 = _perf_counter()
            out = fn(*args)
            times.append((_perf_counter() - t0) * 1e3)
            if i < keep:
                kept.append(out)
            del out
        loop_s = _perf_counter() - loop_t0
    watched_pairs = [_watched(fn, prepare, device) for _ in range(watched)] if cuda else []
    empty_pairs = [_watched(lambda *a: None, prepare, device) for _ in range(watched)] if cuda else []
    return ({"times_ms": times, "first_call": first, "warmup_calls": warmup_calls, "kept": len(kept),
             "loop_s": loop_s, "launch_ms": launch_ms, "watched": watched_pairs, "empty": empty_pairs, "sets": len(sets),
             "output_bytes": out_bytes}, kept)


def _watched(fn, prepare, device) -> list[float]:
    """[events' interval, span to every stream idle, host time to return] of one call, in
    ms, the device idle before it."""
    args = prepare()
    start, end, idle = _Event(enable_timing=True), _Event(enable_timing=True), _Event(enable_timing=True)
    _sync(device)
    _event_record(start)
    h0 = _perf_counter()
    out = fn(*args)
    host_ms = (_perf_counter() - h0) * 1e3
    _event_record(end)
    _sync(device)
    _event_record(idle)
    _sync(device)
    del out
    return [_event_elapsed(start, end), _event_elapsed(start, idle), host_ms]


def _tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []
