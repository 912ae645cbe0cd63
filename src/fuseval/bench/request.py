"""What a bench run is asked: :class:`BenchRequest`, built by :func:`fuseval.bench.run_bench`
from its keyword arguments and by ``fuseval bench`` from its options, validated once
(:mod:`fuseval.requests`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..errors import UsageError
from ..requests import Request
from ..options import check_at_least
from .ceilings import MAX_REPS, MIN_REPS, REP_MS, WARMUP_MS, Ceilings

__all__ = ["BenchRequest"]


@dataclass(frozen=True)
class BenchRequest(Request):
    """A latency run of ``impls`` (None: the operator's default set) on ``op``'s benchmark
    cases; the fields are :func:`fuseval.bench.run_bench`'s keyword arguments (its
    docstring says what each does)."""
    op: Any                         # an operator name or a Definition
    impls: Sequence[str] | None = None
    cases: Sequence[int] | str | None = None
    config: str = "seed"
    device: Any = "cuda"
    seed: int | None = None
    mode: str = "benchmark"
    check: bool = False
    hygiene: bool = True
    flush: bool = True
    warmup_ms: float = WARMUP_MS
    rep_ms: float = REP_MS
    min_reps: int = MIN_REPS
    max_reps: int = MAX_REPS
    ceilings: Ceilings | None = None
    monitor_clocks: bool = True
    sustained_s: float = 0.0
    parts: bool = True
    progress: Callable[[str], None] | None = None

    def _checked(self) -> dict[str, Any]:
        out = self._common("cases", "device", "seed", "mode")
        if self.impls is not None and (isinstance(self.impls, str) or not all(isinstance(i, str) for i in self.impls)):
            raise UsageError(f"{self.name('impls')}: expected a list of implementation names, got {self.impls!r}")
        for field_name in ("warmup_ms", "rep_ms"):
            check_at_least(getattr(self, field_name), 0, self.name(field_name))
        check_at_least(self.sustained_s, 0, self.name("sustained_s"), unit="seconds")
        for field_name in ("min_reps", "max_reps"):
            check_at_least(getattr(self, field_name), 1, self.name(field_name), int)
        if self.min_reps > self.max_reps:
            raise UsageError(f"{self.name('min_reps')} {self.min_reps} is more than "
                             f"{self.name('max_reps')} {self.max_reps}")
        return out
