"""What a run is asked to do, as one immutable object per entry point, validated once.

:class:`CheckRequest` is the check's (:func:`fuseval.check.check`); the budget's, the
bench's and the gate's extend :class:`Request` in their packages
(:mod:`fuseval.budget.request`, :mod:`fuseval.bench.request`, :mod:`fuseval.gate.request`).
The Python API and the command line build the same request: the Python API from its
keyword arguments, the command line from its options (``cli=True``, so that an error
names ``--timeout`` rather than ``timeout``). ``request.validated()`` checks every option
that does not depend on the operator with the helpers of :mod:`fuseval.options` and
returns the request normalised; what depends on the operator (its configuration, whether
the selected cases exist) is checked where the operator is loaded, by the same helpers,
naming the option the same way. The code a request is handed trusts it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .comparison import RULES
from .inputs import MODES
from .options import check_device, check_one_of, check_seed, check_selection, check_timeout, option_name

__all__ = ["CheckRequest", "Request", "DIAGNOSE_LEVELS", "as_request"]

# the levels of fuseval.check.run_case's ``diagnose``
DIAGNOSE_LEVELS = ("anatomy", "mutants", "full")


@dataclass(frozen=True)
class Request:
    """The options every entry point shares; a subclass adds its own and extends
    :meth:`_checked`. ``cli``: built by the command line (errors name its options)."""
    cli: bool = field(default=False, kw_only=True, compare=False, repr=False)

    def name(self, field_name: str) -> str:
        """The option ``field_name`` as the user spelled it (``--field-name`` on the command line)."""
        return option_name(field_name, self.cli)

    def validated(self):
        """This request with every option checked (a UsageError naming the first bad one)
        and normalised; the code it is handed to trusts it."""
        return dataclasses.replace(self, **self._checked())

    def _checked(self) -> dict[str, Any]:
        """{field: its checked value} for the fields this class checks."""
        return {}

    def _common(self, *names: str) -> dict[str, Any]:
        """The checked values of the shared options among ``names``."""
        rules = {"cases": check_selection, "device": check_device, "seed": check_seed, "timeout": check_timeout,
                 "hygiene_seed": check_seed}
        out = {n: rules[n](getattr(self, n), self.name(n)) for n in names if n in rules}
        if "mode" in names:
            out["mode"] = check_one_of(self.mode, MODES, self.name("mode"))
        return out


def as_request(kind: type, first: Any, second: Any, options: Mapping[str, Any]):
    """The request an entry point was called with: ``first`` itself when it is a ``kind``
    (then nothing else may be given), else ``kind(first, second, **options)``."""
    if isinstance(first, kind):
        if second is not None or options:
            raise TypeError(f"a {kind.__name__} is given whole: no other arguments with it")
        return first
    return kind(first, second, **options)


@dataclass(frozen=True)
class CheckRequest(Request):
    """A check of ``impl`` (a name of the operator's table, 'module:function' or a
    callable) on ``op``'s benchmark cases; the fields are :func:`fuseval.check.check`'s
    keyword arguments (its docstring says what each does)."""
    op: Any                         # an operator name or a Definition
    impl: str | Callable
    config: str | Mapping[str, int] = "small"
    cases: Sequence[int] | str | None = None
    device: Any = "cpu"             # 'cpu', 'cuda', 'cuda:N', a torch.device, or None: CUDA when there is one
    seed: int | None = None
    mode: str = "benchmark"
    hygiene: bool = True
    progress: Callable[..., None] | None = None
    variant: str | None = None
    against: str = "reference"
    rules: str = "fuseval"
    predict: bool = True
    isolate: bool | None = None
    timeout: float | None = None
    blind_witness: bool = False
    save_failing: str | None = None
    replay: str | None = None
    hygiene_seed: int | None = None
    diagnose: bool | str = True

    def _checked(self) -> dict[str, Any]:
        out = self._common("cases", "device", "seed", "mode", "timeout", "hygiene_seed")
        out["rules"] = check_one_of(self.rules, RULES, self.name("rules"))
        if isinstance(self.diagnose, str):
            check_one_of(self.diagnose, DIAGNOSE_LEVELS, self.name("diagnose"))
        return out
