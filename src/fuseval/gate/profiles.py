"""The gate's profiles and components, and its rule for a device's name: data only, so that
the command line can offer them without importing the harness."""
from __future__ import annotations

from dataclasses import dataclass

from ..options import check_device, check_one_of

__all__ = ["COMPONENTS", "PROFILES", "Profile", "device_name", "profile_of"]

COMPONENTS = ("check", "properties", "budget")


@dataclass(frozen=True)
class Profile:
    """How much work a gate run does. Case lists given here are indices an operator may
    not all have (a small operator has fewer cases): each operator runs those it has."""
    name: str
    config: str                 # configuration of the check
    device: str
    seeds: int                  # seeds of the statistical check
    cases: tuple[int, ...] | None           # cases of the check (None: all)
    properties: str             # profile name handed to fuseval.properties
    budget_config: str
    budget_cases: tuple[int, ...] | None    # cases of the budget (None: all)
    extra_seed_cases: tuple[int, ...] | None = None   # cases of the seeds after the first (None: the same)
    hygiene: str | bool = "first"


PROFILES: dict[str, Profile] = {
    # ci: every case on the first seed; the two more seeds repeat cases 0-11 (the slow
    # long sequences 12-15 run once); the budget on four cases of increasing size
    "ci": Profile("ci", config="small", device="cpu", seeds=3, cases=None, properties="ci",
                  budget_config="small", budget_cases=(0, 5, 10, 13), extra_seed_cases=tuple(range(12))),
    "thorough": Profile("thorough", config="small", device="cpu", seeds=5, cases=None,
                        properties="thorough", budget_config="small", budget_cases=None),
    "gpu": Profile("gpu", config="seed", device="cuda", seeds=3, cases=None, properties="gpu",
                   budget_config="seed", budget_cases=None),
}


def profile_of(profile: str | Profile, what: str = "profile") -> Profile:
    """The profile named ``profile`` (a UsageError naming ``what`` for an unknown name)."""
    if isinstance(profile, Profile):
        return profile
    return PROFILES[check_one_of(profile, PROFILES, what)]


def device_name(value: str) -> str:
    """'cpu', 'cuda' or 'cuda:N'; anything else (tpu, meta, a typo) is a usage error
    (:func:`fuseval.options.check_device`)."""
    return check_device(value)
