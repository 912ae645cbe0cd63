"""Replay small calls from CUDA graphs, so that the host's launch work does not set their pace.

A fused operator issues several kernel launches per call; each costs tens of microseconds
of Python and driver work on the host. For small inputs the GPU finishes a kernel before
the host has issued the next one, and the call takes as long as the host needs (why:
docs/design/harness.md#cuda-graphs-for-small-calls).

``GraphCache`` records the launches of a call into a CUDA graph the second time it sees the
same inputs (same storage addresses, shapes, strides and dtypes, same scalar arguments)
and replays the graph from then on. Correctness rests on three facts:

* the graph reads the inputs through the addresses they had at capture, and the key
  holds those addresses, so a replay always reads the tensors it is given (their
  current values: an input changed in place is seen);
* the intermediates live in the graph's private memory pool, which nothing else uses;
* the outputs the graph writes are cloned before they are returned, so a result the
  caller keeps is never overwritten by a later replay.

It is used only on CUDA tensors, outside a stream capture of the caller's own, and can be
switched off with FUSEVAL_NO_GRAPHS=1. Not thread-safe: one cache per operator module,
used from one thread.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Callable, Hashable, Sequence

import torch

DISABLE_ENV = "FUSEVAL_NO_GRAPHS"


def tensor_key(values: Sequence[Any]) -> tuple:
    """What a graph depends on: each tensor's address, shape, strides, dtype and device;
    other values as they are (they must be hashable)."""
    key = []
    for v in values:
        if isinstance(v, torch.Tensor):
            key.append((v.data_ptr(), tuple(v.shape), v.stride(), v.dtype, v.device))
        else:
            key.append(v)
    return tuple(key)


class GraphCache:
    """Graphs of recent calls, keyed by ``tensor_key`` and whatever else shapes the launches.

    ``capacity`` graphs are kept (least recently used dropped first, with their memory);
    a key is captured on its ``min_sightings``-th call, so one-off calls never pay for a
    capture. ``clone_outputs=False`` exists for the tests only: it returns the graph's own
    output buffers, which the next replay overwrites."""

    def __init__(self, capacity: int = 4, min_sightings: int = 2, clone_outputs: bool = True):
        self.capacity = capacity
        self.min_sightings = min_sightings
        self.clone_outputs = clone_outputs
        self._graphs: OrderedDict[Hashable, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = OrderedDict()
        self._seen: OrderedDict[Hashable, int] = OrderedDict()
        self.captures = 0
        self.replays = 0

    def clear(self) -> None:
        self._graphs.clear()
        self._seen.clear()

    @staticmethod
    def usable(device: torch.device) -> bool:
        return (device.type == "cuda" and os.environ.get(DISABLE_ENV, "") in ("", "0")
                and not torch.cuda.is_current_stream_capturing())

    def __call__(self, key: Hashable, device: torch.device,
                 run: Callable[[], tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
        """``run()`` launches the call's kernels and returns its outputs."""
        if not self.usable(device):
            return run()
        entry = self._graphs.get(key)
        if entry is None:
            seen = self._seen.pop(key, 0) + 1
            if seen < self.min_sightings:
                self._seen[key] = seen
                while len(self._seen) > 4 * self.capacity:
                    self._seen.popitem(last=False)
                return run()                      # also compiles the kernels before a capture
            entry = self._capture(device, run)
            self._graphs[key] = entry
            while len(self._graphs) > self.capacity:
                self._graphs.popitem(last=False)
        else:
            self._graphs.move_to_end(key)
        graph, outputs = entry
        graph.replay()
        self.replays += 1
        return tuple(t.clone() for t in outputs) if self.clone_outputs else outputs

    def _capture(self, device: torch.device, run) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
        graph, outputs = capture(run, device)
        self.captures += 1
        return graph, tuple(outputs)


def capture(run: Callable[[], Any], device: torch.device) -> tuple[torch.cuda.CUDAGraph, Any]:
    """``run()``'s launches recorded into a CUDA graph on a side stream (after the work the
    caller's stream has queued); returns (the graph, what ``run`` returned during capture).
    ``run`` must have run once before, so that its kernels are compiled."""
    graph = torch.cuda.CUDAGraph()
    caller = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(caller)                      # inputs written on the caller's stream are ready
    with torch.cuda.stream(side):
        graph.capture_begin()
        try:
            outputs = run()
        finally:
            graph.capture_end()
    caller.wait_stream(side)
    return graph, outputs
