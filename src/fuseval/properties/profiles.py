"""Hypothesis profiles of the property suite, and the axis space each one draws from.

Four profiles, registered under these names with Hypothesis (``settings.load_profile``):

``ci``
    The CPU suite. ``database=None`` (no example database, so a failure seen on one run
    can never be replayed into the next and make CI flaky) and ``derandomize=True``: the
    examples are a fixed function of the test, so every CI run draws the same inputs.
    Small scaled-down axes, a dozen examples per property (plus the explicit examples
    every property run starts with).
``dev``
    Local iteration: like ``ci`` but random and with an in-memory database, so a failure
    found in this Python process is replayed first on the next call.
``thorough``
    Nightly: random (a new seed each run, printed on failure), a few hundred examples,
    bigger axes (longer sequences, more hidden sizes and head dims).
``gpu``
    Full-size const axes (the seed configuration), short var axes, run on ``cuda``.

The example counts of this package's properties are :data:`PROPERTY_EXAMPLES` (applied
by :func:`property_settings` and ``check_implementation``); the registered profiles keep
Hypothesis' default count for other suites' tests (``thorough`` raises it to 1000).

Every profile sets ``deadline=None`` (the Triton interpreter is slow and its first call
compiles) and suppresses the ``too_slow`` / ``data_too_large`` health checks, which only
say that an example takes long to run, not that the strategy is wrong.

Seeds. ``FUSEVAL_PROPERTY_SEED=N`` turns derandomization off and seeds every property
run by this package (``check_implementation`` and the tests decorated with
:func:`seeded`) with ``N``: that is how the "no false alarm over 20 seeds" run varies
the draws while staying reproducible.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Callable

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import InMemoryExampleDatabase
from hypothesis import seed as hypothesis_seed

__all__ = ["Space", "SPACES", "PROFILE_SPACE", "PROFILE_DEVICE", "PROPERTY_EXAMPLES", "register_profiles",
           "load_profile", "profile_settings", "property_settings", "active_profile", "property_seed",
           "seeded", "no_shrink", "PROFILE_NAMES"]

PROFILE_NAMES = ("ci", "dev", "thorough", "gpu")


@dataclass(frozen=True)
class Space:
    """Which const configurations and var-axis ranges a profile draws.

    The generic part of an axis space: the kv-head counts and GQA ratios (for operators
    whose hooks name their head axes), the batch range and the range of every other var
    axis. Per-operator values (head dims, hidden sizes...) are the operators' own
    (``PropertyHooks.axis_values[space.name]``); an operator without them keeps the const
    axes of its ``config`` (or of the seed configuration when it has no such config).
    Lists are ordered simplest first: Hypothesis shrinks a ``sampled_from`` towards its
    first element, so a counterexample ends up with the smallest configuration that still
    fails. ``full=True`` keeps the definition's own (seed) const axes."""
    name: str
    full: bool = False
    config: str = "small"
    kv_heads: tuple[int, ...] = (1, 2)
    gqa_ratios: tuple[int, ...] = (1, 2, 4, 7)
    batch: tuple[int, int] = (1, 3)
    seq_len: tuple[int, int] = (1, 12)

    def with_(self, **changes) -> "Space":
        return replace(self, **changes)


_SMALL = Space(name="small", batch=(1, 3), seq_len=(1, 12))
_MEDIUM = _SMALL.with_(name="medium", batch=(1, 4), seq_len=(1, 70))
_FULL = Space(name="full", full=True, batch=(1, 2), seq_len=(1, 160))

SPACES = {"small": _SMALL, "medium": _MEDIUM, "full": _FULL}
PROFILE_SPACE = {"ci": "small", "dev": "small", "thorough": "medium", "gpu": "full"}
PROFILE_DEVICE = {"ci": "cpu", "dev": "cpu", "thorough": None, "gpu": "cuda"}

_COMMON = dict(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
    print_blob=False,
    report_multiple_bugs=False,
)


def property_seed() -> int | None:
    """The seed from ``FUSEVAL_PROPERTY_SEED`` (None when unset)."""
    value = os.environ.get("FUSEVAL_PROPERTY_SEED", "").strip()
    return int(value) if value else None


# examples per property of this package (check_implementation and the tests decorated with
# property_settings()); the registered Hypothesis profiles leave other suites' counts alone
PROPERTY_EXAMPLES = {"ci": 12, "dev": 12, "thorough": 300, "gpu": 10}


def _build() -> dict[str, settings]:
    seeded_run = property_seed() is not None
    return {
        "ci": settings(database=None, derandomize=not seeded_run, **_COMMON),
        "dev": settings(database=InMemoryExampleDatabase(), **_COMMON),
        "thorough": settings(max_examples=1000, database=None, **_COMMON),
        "gpu": settings(database=None, derandomize=not seeded_run, **_COMMON),
    }


_REGISTERED: dict[str, settings] = {}


def register_profiles() -> None:
    """Register ``ci``, ``dev``, ``thorough`` and ``gpu`` with Hypothesis (idempotent)."""
    if _REGISTERED:
        return
    for name, s in _build().items():
        settings.register_profile(name, s)
        _REGISTERED[name] = s


def profile_settings(name: str) -> settings:
    """The settings object of one of this package's profiles."""
    register_profiles()
    if name not in _REGISTERED:
        raise ValueError(f"unknown property profile {name!r}; expected one of {PROFILE_NAMES}")
    return _REGISTERED[name]


def property_settings(name: str | None = None, **overrides) -> settings:
    """Settings for one property of this package under profile ``name`` (default: the
    active one): the profile with the property suite's example count. Usable as a
    decorator: ``@property_settings()``."""
    name = name or active_profile()
    return settings(profile_settings(name), max_examples=PROPERTY_EXAMPLES[name], **overrides)


def active_profile() -> str:
    """The profile named by ``HYPOTHESIS_PROFILE`` (default ``ci`` when ``CI`` is set,
    else ``dev``)."""
    name = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    if name not in PROFILE_NAMES:
        raise ValueError(f"HYPOTHESIS_PROFILE={name!r} is not a fuseval profile; "
                         f"expected one of {PROFILE_NAMES}")
    return name


def load_profile(name: str | None = None) -> str:
    """Register the profiles and make ``name`` (default :func:`active_profile`) the
    Hypothesis default for every ``@given`` test. Returns the profile's name."""
    register_profiles()
    name = name or active_profile()
    profile_settings(name)
    settings.load_profile(name)
    return name


def seeded(test: Callable) -> Callable:
    """Apply ``FUSEVAL_PROPERTY_SEED`` (when set) to a ``@given`` test as its seed."""
    value = property_seed()
    return hypothesis_seed(value)(test) if value is not None else test


def no_shrink(s: settings) -> settings:
    """The same settings without the shrink phase (the mutation self-test only needs the
    verdict, not a minimal counterexample)."""
    return settings(s, phases=[Phase.explicit, Phase.reuse, Phase.generate])
