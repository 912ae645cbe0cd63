"""The implementation called in fuseval's own process (``--in-process``, ``isolate=False``).

Such a run trusts the implementation: it could change anything in this process, the
verdict included. :class:`Local` has the interface of :class:`fuseval.runner.isolation.Worker`
(``call``, ``recheck_kept``) and makes the same integrity checks after each call, but cannot
stop a call that hangs or ends the process.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import torch

from . import integrity
from ..hygiene import fingerprint, overlaps, poison_allocator
from .isolation import CallResult, describe_exception, is_oom

__all__ = ["Local", "as_tuple", "sync"]


def as_tuple(outputs: Any) -> Any:
    """An implementation's answer as a tuple (a lone tensor, a list); anything else as it is."""
    if isinstance(outputs, torch.Tensor):
        return (outputs,)
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else outputs


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Local:
    """The implementation called in fuseval's own process (``--in-process``): it is trusted,
    since it could change anything in this process, the verdict included. Same interface
    as :class:`fuseval.runner.isolation.Worker` (``call``, ``recheck_kept``), minus the isolation."""

    def __init__(self, fn: Callable, device: torch.device, baseline: dict[str, int] | None = None,
                 input_names: Sequence[str] = ()):
        self.fn, self.device = fn, torch.device(device)
        self.kept: list = []
        self.baseline = baseline
        self.input_names = list(input_names)

    def call(self, inputs, *, keep: bool = False, new_case: bool = False, poison: int = 0,
             deadline: float | None = None, expected=None):
        if new_case:
            self.kept = []
        # with the hygiene rules (``keep``), every call's inputs are verified after it
        prints = [fingerprint(t) for t in inputs] if keep else None
        poison_allocator(self.device, poison)
        before = integrity.threads()
        t0 = time.perf_counter()
        try:
            outputs = as_tuple(self.fn(*inputs))
            sync(self.device)
        except SystemExit as exc:
            return CallResult("exited", violations=["exited"],
                              messages=[f"the implementation called sys.exit({exc.code!r})"],
                              seconds=time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - an implementation's failure is a verdict, not a crash
            line, where = describe_exception(exc)
            return CallResult("raised", violations=["out_of_memory" if is_oom(exc) else "raised"],
                              messages=[f"implementation raised: {line}" + (f" (at {where})" if where else "")],
                              seconds=time.perf_counter() - t0, where=where, error=line)
        res = CallResult("ok", outputs=outputs, seconds=time.perf_counter() - t0)
        for i, (a, t) in enumerate(zip(prints or (), inputs)):
            if a != fingerprint(t):
                name = self.input_names[i] if i < len(self.input_names) else str(i)
                res.add("mutated_input", f"input {name!r} was modified by the implementation")
        if self.baseline is not None:
            tampered = integrity.changed(self.baseline)
            if tampered:
                res.violations.append("tampered")
                res.messages.append("the implementation replaced functions a verdict relies on: "
                                    + ", ".join(tampered[:8]))
        threads = integrity.new_threads(before)
        if threads:
            res.violations.append("lingering_thread")
            res.messages.append("the implementation left threads running after it returned: " + ", ".join(threads[:8]))
        if isinstance(outputs, (tuple, list)):
            for i, o in enumerate(outputs):
                if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor:
                    res.violations.append("bad_outputs")
                    res.messages.append(f"output {i} is a {type(o).__module__}.{type(o).__qualname__}, a subclass "
                                        "of torch.Tensor; expected exactly torch.Tensor")
                elif isinstance(o, torch.Tensor) and o.device.type != self.device.type:
                    res.violations.append("wrong_device")
                    res.messages.append(f"output {i} is on device {o.device}, expected {self.device}")
            for i, o in enumerate(outputs):
                for j, t in enumerate(inputs):
                    if isinstance(o, torch.Tensor) and isinstance(t, torch.Tensor) and overlaps(o, t):
                        res.aliases.append((i, j))
        if keep and isinstance(outputs, (tuple, list)):
            self.kept.append((outputs, [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outputs]))
        return res

    def recheck_kept(self, deadline=None):
        """(each kept answer as it was returned, what it holds now), as the worker's."""
        kept, self.kept = self.kept, []
        if not kept:
            return None
        return [then for _, then in kept], [[o.detach().clone() if isinstance(o, torch.Tensor) else o for o in now]
                                            for now, _ in kept]

    def forget_kept(self) -> None:
        self.kept = []

    def settle(self, window: float = 0.0) -> str | None:
        """Nothing to watch: the implementation runs in this very process."""
        return None
