"""How much memory a device has left for one drawn example: :func:`available_bytes`.

The property engine bounds the size of each draw by it (:func:`draw_budget`), so a
property run over a problem whose workloads reach gigabytes draws only sizes that fit.

* CUDA: the free memory torch's driver query reports (``torch.cuda.mem_get_info``), plus
  what torch's caching allocator holds but does not use; where this process was given a
  share of the GPU (:func:`apply_cuda_share`, e.g. by ``fuseval sweep`` running several
  problems on one GPU), no more than that share leaves room for;
* CPU: the smallest of the system's available memory (``MemAvailable``), the room left
  under this process's address-space limit (``RLIMIT_AS``, e.g. ``prlimit --as``) and the
  room left in its cgroup (``memory.max``); None where none can be read.
"""
from __future__ import annotations

import math
import os
import resource
from typing import Callable, Mapping

import torch

from .errors import UsageError

__all__ = ["available_bytes", "draw_budget", "draw_bytes", "DrawBound", "DRAW_SHARE", "DRAW_COPIES",
           "CUDA_SHARE_ENV", "cuda_share", "apply_cuda_share"]

# the share of the available memory one draw may plan for (the oracle's float64 copies and
# intermediates, the implementation and the comparison come on top of what it counts)
DRAW_SHARE = 0.5


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _address_space_left() -> int | None:
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, ValueError, OSError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/status") as f:
            used = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return None
    return max(0, soft - used)


def _cgroup_left() -> int | None:
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        return max(0, int(limit) - used)
    except (OSError, ValueError):
        return None


# the share of each GPU's memory this process may use, set for it by its parent (the sweep);
# torch's caching allocator enforces it (``set_per_process_memory_fraction``): an allocation
# beyond it is an out-of-memory error in this process, whatever the other processes hold
CUDA_SHARE_ENV = "FUSEVAL_CUDA_MEMORY_SHARE"
_applied_share: float | None = None


def cuda_share() -> float | None:
    """The share of GPU memory :data:`CUDA_SHARE_ENV` gives this process; None: unset."""
    text = os.environ.get(CUDA_SHARE_ENV, "").strip()
    if not text:
        return None
    try:
        share = float(text)
    except ValueError:
        share = math.nan
    if not 0 < share <= 1:
        raise UsageError(f"{CUDA_SHARE_ENV}: expected a share of GPU memory in (0, 1], got {text!r}")
    return share


def apply_cuda_share() -> float | None:
    """Cap torch's allocator on every GPU this process sees at :func:`cuda_share` (no-op
    where unset or without a GPU); the share applied, or None."""
    global _applied_share
    share = cuda_share()
    if share is None or not torch.cuda.is_available():
        return None
    if _applied_share != share:
        for index in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(share, index)
        _applied_share = share
    return share


_CPU_SOURCES: tuple[Callable[[], int | None], ...] = (_meminfo_available, _address_space_left, _cgroup_left)


def available_bytes(device: str | torch.device) -> int | None:
    """Bytes ``device`` can still allocate (module docstring); None where unknown."""
    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        allocated = torch.cuda.memory_allocated(device)
        room = free + max(0, torch.cuda.memory_reserved(device) - allocated)
        share = apply_cuda_share()
        if share is not None:
            room = min(room, max(0, int(share * total) - allocated))
        return int(room)
    found = [v for v in (source() for source in _CPU_SOURCES) if v is not None]
    return min(found) if found else None


def draw_budget(device: str | torch.device) -> int | None:
    """Bytes one drawn example may plan for on ``device`` (``DRAW_SHARE`` of what is
    available); None: no bound known."""
    free = available_bytes(device)
    return None if free is None else int(free * DRAW_SHARE)


# float64 copies of the inputs and outputs one example holds at its peak, roughly
DRAW_COPIES = 4


def draw_bytes(defn, axes: Mapping[str, int]) -> int:
    """What one example of a full axis binding of the definition ``defn`` plans for: every
    tensor input and output in float64 (the lifted oracle's copies), times
    :data:`DRAW_COPIES` (the inputs as drawn, the oracle's intermediates, the
    implementation's outputs, the comparison)."""
    elements = sum(math.prod(defn.shape_of(spec, axes)) for spec in (*defn.inputs, *defn.outputs)
                   if not spec.is_scalar)
    return elements * 8 * DRAW_COPIES


class DrawBound:
    """The bytes one draw may plan for (:func:`draw_bytes`; None: no bound), lowered during
    a property run when a draw within it still ran out of memory in the oracle: the
    planned bytes count the inputs and outputs, not what the oracle holds in between.
    ``start`` is what the device offered (the strategies draw within it); the run rejects
    the draws above ``bytes``."""

    def __init__(self, bytes_: int | None):
        self.start = self.bytes = bytes_

    def lower_below(self, planned: int) -> None:
        """Draws of ``planned`` bytes or more no longer fit."""
        self.bytes = planned - 1 if self.bytes is None else min(self.bytes, planned - 1)

    @property
    def lowered(self) -> bool:
        return self.bytes != self.start
