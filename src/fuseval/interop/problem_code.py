"""The one place where fuseval runs a problem folder's own code.

A problem folder is data (``definition.json``, ``workload.jsonl``) plus code: its
reference (``run``) and, for some, a ``custom_inputs_entrypoint``. Reading, listing,
importing and exporting a problem use the data only; the code runs only through the three
functions here, so that a confined process can run it instead of fuseval's own by
replacing them:

* :func:`reference_module`: the reference source executed as a module (cached);
* :func:`run_reference`: the reference on one set of inputs, as written and (``lifted``)
  lifted to float64 (:mod:`fuseval.interop.lift`);
* :func:`custom_inputs`: the problem's custom input entry point.

What the problem's code raises leaves as a :class:`ProblemCodeError` (it names the
function and the exception), so the callers can tell "the problem refused these inputs"
from a bug in fuseval; running out of memory leaves as what it is (torch's error, a
MemoryError), for the callers that treat memory as a budget.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Mapping, Sequence

from ..errors import is_out_of_memory
from .sol_problem import Problem, ProblemError

__all__ = ["ProblemCodeError", "reference_module", "run_reference", "custom_inputs"]


class ProblemCodeError(ProblemError):
    """The problem's own code (its reference or its custom input generator) raised.

    ``what``: which of its functions; ``cause``: the exception it raised. On a binding a
    workload gives this is a broken problem folder (exit 5); on a binding the property
    engine drew between the workloads' it is the problem refusing an input outside its
    domain (a rejected draw)."""

    def __init__(self, problem: Problem, what: str, cause: BaseException):
        first = (str(cause).strip().splitlines() or [""])[0][:300]
        super().__init__(f"problem {problem.name!r}: {what} raised {type(cause).__name__}: {first}")
        self.what = what
        self.cause = cause


def reference_module(problem: Problem) -> types.ModuleType:
    """The problem's reference source executed as a module of its own
    (``<problem module>.source``), once per process."""
    name = problem.module + ".source"
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name, f"the reference of SOL-ExecBench problem {problem.name}")
    module.__file__ = problem.reference_file
    sys.modules[name] = module
    try:
        exec(compile(problem.reference, problem.reference_file, "exec"), module.__dict__)
    except Exception as exc:
        del sys.modules[name]
        raise ProblemError(f"problem {problem.name!r}: its reference does not import: "
                           f"{type(exc).__name__}: {exc}") from exc
    return module


def _guarded(problem: Problem, what: str, fn, *args):
    try:
        return fn(*args)
    except ProblemError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the problem's code raises, named as such
        if is_out_of_memory(exc):
            raise
        raise ProblemCodeError(problem, what, exc) from exc


def run_reference(problem: Problem, inputs: Sequence[Any], *, lifted: bool):
    """The reference's ``run`` on ``inputs`` (benchmark format, definition order).

    ``lifted`` False: its outputs as written (a tuple); True: the
    :class:`~fuseval.interop.lift.LiftResult` of the run as written and lifted to float64.
    The run as written raising is a :class:`ProblemCodeError`; the lifted run failing is
    reported in the result (``report.lifted`` False and why), never hidden."""
    from . import lift
    source = reference_module(problem)
    if not lifted:
        return _guarded(problem, "its reference", lift.run_native, source.run, inputs)
    return _guarded(problem, "its reference", lift.run_lifted, source.run, inputs, list(problem.inputs))


def custom_inputs(problem: Problem, axes_and_scalars: Mapping[str, Any], device) -> Any:
    """``custom_inputs_entrypoint(axes_and_scalars, device)`` of the problem (the caller
    seeds the global generators)."""
    fn = getattr(reference_module(problem), problem.custom_inputs_entrypoint)
    return _guarded(problem, f"{problem.custom_inputs_entrypoint}()", fn, dict(axes_and_scalars), device)
