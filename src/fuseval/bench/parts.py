"""The fast path's parts, timed apart by ``fuseval bench``.

An operator whose spec names ``fast_parts`` gives, for one case's inputs, its fast path's
pieces of GPU work (:class:`Part`: a zero-argument callable running that piece as the
production call runs it, and the piece's least work). The bench captures each part into
a CUDA graph and times the replays with the one timer (:func:`fuseval.bench.ceilings.time_call`),
so what is shown is GPU time with the host's launch work left out, against the part's own
floor max(FLOPs / matmul rate, bytes / copy bandwidth). The parts need not add up to the
whole call: fused launches overlap, and the whole call's time includes its host work.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch
from ..fast._graphs import capture
from .ceilings import floor_seconds, time_call

if TYPE_CHECKING:
    from .ceilings import Timing

__all__ = ["Part", "time_parts", "time_graph_replay"]


@dataclass
class Part:
    """One piece of a fast path's work on fixed inputs: ``run()`` does it; ``flops`` and
    ``bytes`` are the least it must compute and move (its floor), at ``matmul_dtype``'s rate."""
    run: Callable[[], Any]
    flops: float = 0.0
    bytes: float = 0.0
    matmul_dtype: str = "bf16"
    what: str = ""


def time_graph_replay(fn: Callable[[], Any], *, device: torch.device | str = "cuda", **timer) -> Timing:
    """GPU time of ``fn``'s launches, the host's launch work left out: ``fn`` run once
    (its kernels compiled), captured into a CUDA graph (``fast._graphs.capture``), and the
    graph's replays timed by :func:`time_call` (``timer``: its keyword arguments)."""
    device = torch.device(device)
    fn()
    graph, _ = capture(fn, device)
    try:
        return time_call(graph.replay, device=device, **timer)
    finally:
        del graph


def time_parts(parts: Mapping[str, Part], ceilings: Any, device: torch.device, **timer) -> dict[str, dict]:
    """{name: {"median_ms", "floor_ms", "bound", "flops", "bytes", "what", "error"}} for each
    part: its graph replays timed by ``time_graph_replay(**timer)``; a part that fails is reported
    with its error, not raised."""
    out: dict[str, dict] = {}
    for name, part in parts.items():
        row: dict[str, Any] = {"flops": part.flops, "bytes": part.bytes, "what": part.what,
                               "median_ms": None, "floor_ms": None, "bound": None, "error": None}
        if ceilings is not None:
            floor, row["bound"] = floor_seconds({"flops": part.flops, "bytes": part.bytes,
                                                 "matmul_dtype": part.matmul_dtype}, ceilings)
            row["floor_ms"] = floor * 1e3
        try:
            row["median_ms"] = time_graph_replay(part.run, device=device, **timer).median_ms
        except Exception as exc:  # noqa: BLE001 - one part that cannot be timed is reported
            row["error"] = f"{type(exc).__name__}: {exc}"
        out[name] = row
    return out
