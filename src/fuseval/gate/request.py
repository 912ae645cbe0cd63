"""What a gate run is asked: :class:`GateRequest`, built by :func:`fuseval.gate.run_gate`
(and :func:`~fuseval.gate.run_component`) from their keyword arguments and by ``fuseval
gate`` from its options, validated once (:mod:`fuseval.requests`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from ..errors import UsageError
from ..requests import Request
from ..options import check_fraction, check_jobs, check_one_of, check_seeds, check_selection
from .profiles import COMPONENTS, Profile, profile_of

__all__ = ["GateRequest"]


@dataclass(frozen=True)
class GateRequest(Request):
    """A gate run of ``impl`` on ``op`` (one name, "a,b", a list or "all"); the fields
    are :func:`fuseval.gate.run_gate`'s keyword arguments (its docstring says what each
    does). Validated, ``components`` is a tuple and ``seeds`` a count or a list.

    It crosses into the gate's pool processes (:mod:`fuseval.gate.parallel`) pickled, with
    its seeds resolved and without ``progress``."""
    op: str | Sequence[str]
    impl: str | Callable
    profile: str | Profile = "ci"
    device: str | None = None
    config: str | None = None
    cases: str | Sequence[int] | None = None
    seeds: int | Sequence[int] | None = None
    mode: str = "benchmark"
    components: Iterable[str] = COMPONENTS
    warn_margin: float | None = None
    strict: bool = False
    budget_config: str | None = None
    budget_cases: str | Sequence[int] | None = "profile"
    budget: Any = None
    out: str | None = None
    progress: Callable[[str], None] | None = None
    isolate: bool | None = None
    timeout: float | None = None
    jobs: int | str = 1
    warmup: bool = True
    seed: int | None = None

    def _checked(self) -> dict[str, Any]:
        out = self._common("device", "cases", "mode", "timeout", "seed")
        out["profile"] = profile_of(self.profile, self.name("profile"))
        out["components"] = self._components()
        out["warn_margin"] = check_fraction(self.warn_margin, self.name("warn_margin"))
        out["seeds"] = seeds = check_seeds(self.seeds, self.name("seeds"))
        if isinstance(seeds, list) and self.seed is not None:
            raise UsageError(f"{self.name('seed')}: give either a list of seeds ({seeds!r}) or a first seed, "
                             "not both")
        if self.budget_cases not in (None, "all", "profile"):
            check_selection(self.budget_cases, self.name("budget_cases"))
        out["jobs"] = check_jobs(self.jobs, self.name("jobs"))
        return out

    def _components(self) -> tuple[str, ...]:
        what = self.name("components")
        chosen = (self.components,) if isinstance(self.components, str) else tuple(self.components)
        for c in chosen:
            check_one_of(c, COMPONENTS, what)
        if not chosen:
            raise UsageError(f"{what}: the gate would run nothing: no component selected (of {', '.join(COMPONENTS)})")
        return chosen

    @property
    def seeds_given(self) -> bool:
        """Whether the seeds were given as a list (else drawn from ``seed`` or at random)."""
        return isinstance(self.seeds, (list, tuple, range))
