"""The gate's input: profiles, and everything a run needs resolved and validated before
any work (operators, device, configurations, case selections, seeds, the budget file, the
implementation). A mistake in any of them is a :class:`~fuseval.errors.FusevalError`
with its exit code, raised here, before a component runs."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from ..errors import EXIT_NO_DEVICE, BadFileError, ImplementationError, NoDeviceError, UnknownOperatorError, user_input
from .. import operators
from ..budget import load_budget
from ..check import draw_seed, resolve_device as check_device
from ..operators import load
from ..operators.implementations import impl_label, resolve_impl
from ..runner.isolation import decide, requested, worker_for
from ..stats import DEFAULT_WARN_MARGIN, seed_list
from ..options import check_cases_in
from .profiles import COMPONENTS, Profile, profile_of
from .request import GateRequest

@dataclass
class GateContext:
    """One operator's share of a gate run, every field resolved and validated."""
    op: str
    impl: str | Callable
    impl_label: str
    profile: Profile
    device: str
    config: str | Mapping[str, int]
    cases: str | list[int] | None
    seeds: int | list[int]
    mode: str
    warn_margin: float
    strict: bool
    budget_config: str | Mapping[str, int]
    budget_cases: str | list[int] | None
    budget: Any                 # a loaded fuseval.budget.Budget, or None: the operator's own
    out: str | None
    progress: Callable[[str], None]
    extra_seed_cases: list[int] | None = None
    isolate: bool = True
    timeout: float | None = None
    not_run: dict[str, str] | None = None     # component -> why it is not run for this operator
    check_runs: bool = False    # the check component runs in the same gate


@dataclass(frozen=True)
class Settings:
    """The options of a run that do not depend on the operator, validated."""
    profile: Profile
    device: str
    config: str | Mapping[str, int] | None
    cases: str | Sequence[int] | None
    seeds: int | list[int]
    mode: str
    warn_margin: float
    strict: bool
    budget_config: str | Mapping[str, int] | None
    budget_cases: str | Sequence[int] | None
    budget_from_profile: bool
    budget: Any
    out: str | None
    progress: Callable[[str], None]
    isolate: bool
    timeout: float | None
    components: tuple[str, ...] = COMPONENTS    # the components this run makes


def resolve_ops(op: str | Sequence[str]) -> list[str]:
    """Operator names from "all", one name, a comma list or a list; an unknown name is an
    :class:`~fuseval.errors.UnknownOperatorError` naming the known ones."""
    known = operators.names()
    if isinstance(op, str):
        names = known if op == "all" else [p.strip() for p in op.split(",") if p.strip()]
    else:
        names = list(op)
    if not names:
        raise UnknownOperatorError(f"no operator given; known operators: {', '.join(known)} (or 'all')")
    for name in names:
        operators.record(name)          # UnknownOperatorError names the known operators
    return names


def resolve_device(device: str) -> str:
    """The device after the check's resolution; no CUDA device is the gate's own error."""
    try:
        resolved = check_device(device)
    except NoDeviceError:
        raise NoDeviceError(f"device {device!r} was requested but torch {torch.__version__} sees no CUDA "
                            "device; use --device cpu or a CPU profile (ci, thorough)", EXIT_NO_DEVICE) from None
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise NoDeviceError(f"device {device!r}: torch sees {torch.cuda.device_count()} CUDA device(s) "
                            f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return str(resolved)


def settings(request: GateRequest, progress: Callable[[str], None] | None = None) -> Settings:
    """The options of a validated request that do not depend on the operator, resolved:
    the profile, the device as torch sees it, and a number of seeds become the seeds
    themselves here, once: ``seed``, seed + 1000, ..., with ``seed`` drawn at random when
    not given, so that no run's inputs can be known before it. ``progress``: instead of
    the request's (a pool process relays its messages)."""
    r = request
    prof = profile_of(r.profile)
    dev = resolve_device(r.device or prof.device)
    margin = DEFAULT_WARN_MARGIN if r.warn_margin is None else r.warn_margin
    seeds = prof.seeds if r.seeds is None else r.seeds
    if isinstance(seeds, int):
        seeds = seed_list(seeds, draw_seed() if r.seed is None else r.seed)
    return Settings(prof, dev, r.config, r.cases, list(seeds), r.mode,
                    float(margin), bool(r.strict), r.budget_config, r.budget_cases, r.budget_cases == "profile",
                    r.budget, r.out, progress or r.progress or (lambda message: None), requested(r.isolate),
                    r.timeout, tuple(r.components))


def _selection(given: Any, n: int, what: str) -> Any:
    """A case selection the user gave, checked against the operator's ``n`` cases."""
    check_cases_in(given, n, what)
    return given


def _profile_cases(cases: tuple[int, ...] | None, n: int) -> list[int] | None:
    return None if cases is None else [i for i in cases if i < n]


def _budget_for(op: str, s: Settings, defn: Any) -> tuple[Any, str | None]:
    """(the budget to hand to run_budget, why the budget is not run for ``op`` or None)."""
    if s.budget is None:
        return None, (None if defn.operator.budget_path else "the operator ships no budget file")
    try:
        return load_budget(s.budget, defn), None
    except (ValueError, OSError) as exc:
        raise BadFileError(f"{op}: budget {s.budget!r} is malformed or does not apply: {exc}") from exc


def context(op: str, impl: str | Callable, s: Settings) -> GateContext:
    """The context of ``op``: its configurations, case selections and budget validated,
    and the implementation loaded (in its worker when isolated), so that a mistake in any
    of them is found before the run."""
    config = s.config or s.profile.config
    budget_config = s.budget_config or s.config or s.profile.budget_config
    with user_input("config"):
        defn = load(op, config)
    with user_input("budget config"):
        budget_defn = load(op, budget_config)
    n = len(defn.seed_cases)
    if s.cases is not None:
        cases, extra = _selection(s.cases, n, "cases"), None       # explicit cases apply to every seed
    else:
        cases, extra = _profile_cases(s.profile.cases, n), _profile_cases(s.profile.extra_seed_cases, n)
    if s.budget_from_profile:
        budget_cases = _profile_cases(s.profile.budget_cases, len(budget_defn.seed_cases))
    else:
        budget_cases = None if s.budget_cases in (None, "all") else \
            _selection(s.budget_cases, len(budget_defn.seed_cases), "budget cases")
    budget, no_budget = _budget_for(op, s, budget_defn)
    load_implementation(defn, impl, s.device, s.isolate)
    if s.out:
        os.makedirs(s.out, exist_ok=True)
    return GateContext(op=op, impl=impl, impl_label=impl_label(impl), profile=s.profile, device=s.device,
                       config=config, cases=cases, seeds=s.seeds, mode=s.mode, warn_margin=s.warn_margin,
                       strict=s.strict, budget_config=budget_config, budget_cases=budget_cases, budget=budget,
                       out=s.out, progress=s.progress, extra_seed_cases=extra, isolate=s.isolate,
                       timeout=s.timeout, not_run={"budget": no_budget} if no_budget else {},
                       check_runs="check" in s.components)


def load_implementation(defn: Any, impl: str | Callable, device: str, isolate: bool) -> None:
    """Fail early when the implementation does not import (ImplementationError, exit 4):
    isolated, by starting its worker (which imports it there and then serves the run),
    otherwise here."""
    try:
        if decide(impl, isolate):
            worker_for(impl, defn, device)
        else:
            resolve_impl(defn, impl)
    except ImplementationError as exc:
        message = str(exc)
        raise ImplementationError(message if message.startswith(defn.name) else f"{defn.name}: {message}") from exc
