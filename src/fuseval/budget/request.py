"""What a budget run is asked: :class:`BudgetRequest`, built by
:func:`fuseval.budget.run_budget` from its keyword arguments and by ``fuseval budget``
from its options, validated once (:mod:`fuseval.requests`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..requests import Request
from ..options import check_at_least

__all__ = ["BudgetRequest"]


@dataclass(frozen=True)
class BudgetRequest(Request):
    """A per-stage error budget of ``impl`` on ``op``'s benchmark cases; the fields are
    :func:`fuseval.budget.run_budget`'s keyword arguments (its docstring says what each
    does)."""
    op: Any                         # an operator name or a Definition
    impl: str | Callable
    config: str | Mapping[str, int] = "small"
    cases: Sequence[int] | str | None = None
    device: Any = "cpu"
    seed: int = 0
    mode: str = "benchmark"
    budget: Any = None              # a path, a mapping, a loaded Budget, or None: the operator's own
    progress: Callable[..., None] | None = None
    baselines: bool = True
    cpu_threads: int | None = None
    prefetch: int | None = None
    isolate: bool | None = None
    timeout: float | None = None
    hygiene: bool = True

    def _checked(self) -> dict[str, Any]:
        out = self._common("cases", "device", "seed", "mode", "timeout")
        if out["seed"] is None:
            out["seed"] = 0
        if self.cpu_threads is not None:
            check_at_least(self.cpu_threads, 1, self.name("cpu_threads"), int)
        if self.prefetch is not None:
            check_at_least(self.prefetch, 0, self.name("prefetch"), int)
        return out
