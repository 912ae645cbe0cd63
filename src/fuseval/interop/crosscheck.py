"""A built-in operator's float64 oracle against a SOL-ExecBench problem's reference.

For each case of the built-in operator (full size by default), on the operator's own
inputs:

1. **oracles agree**: the built-in oracle and the problem's reference lifted to float64
   (:mod:`fuseval.interop.lift`) differ by float64 roundoff only: ``max |a - b|`` at most
   ``ORACLE_RTOL`` times ``max |b|`` per output (two float64 computations of the same
   function differ in summation order, about 1e-13 relative on these sizes; a different
   function differs by far more);
2. **the benchmark's reference passes**: the problem's reference as written
   (``sol_reference``) is within the case's tolerance of the built-in oracle.

The crosscheck fails on the first case where either does not hold, and names it. Where
the problem's reference cannot be lifted, step 1 is reported as skipped (with the lift's
note) and only step 2 decides.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch

from ..operators import implementations as ops
from ..check import compare, resolve_device
from ..operators import load
from ..errors import UsageError
from ..inputs import generate_inputs
from . import workload_inputs as problem_inputs
from . import lift
from .problem_code import run_reference
from .sol_problem import read_problem

__all__ = ["CaseAgreement", "CrossCheck", "crosscheck", "ORACLE_RTOL"]

# two float64 oracles of one function: relative to the output's largest magnitude
ORACLE_RTOL = 1e-9


@dataclass
class CaseAgreement:
    case: int
    axes: dict[str, int]
    oracle_rel_diff: dict[str, float]        # output -> max|builtin - lifted| / max|lifted|
    sol_matched: dict[str, float]            # output -> matched ratio of sol_reference vs the built-in oracle
    sol_max_abs: dict[str, float]
    lifted: bool
    messages: list[str] = field(default_factory=list)
    note: str | None = None

    @property
    def passed(self) -> bool:
        return not self.messages


@dataclass
class CrossCheck:
    op: str
    problem: str
    directory: str
    config: str
    variant: str
    cases: list[CaseAgreement]
    lift: lift.LiftReport | None = None

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def first_failure(self) -> CaseAgreement | None:
        return next((c for c in self.cases if not c.passed), None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        return d


def _interfaces_match(defn, problem) -> None:
    """The problem takes the operator's inputs and gives its outputs: names, order, dtypes."""
    ours = [(s.name, s.dtype, s.is_scalar) for s in defn.inputs]
    theirs = [(n, t["dtype"], t["shape"] is None) for n, t in problem.inputs.items()]
    our_out = [(s.name, s.dtype) for s in defn.outputs]
    their_out = [(n, t["dtype"]) for n, t in problem.outputs.items()]
    problems = []
    if ours != theirs:
        problems.append(f"inputs differ: the operator takes {ours}, the problem {theirs}")
    if our_out != their_out:
        problems.append(f"outputs differ: the operator gives {our_out}, the problem {their_out}")
    if problems:
        raise UsageError(f"crosscheck {defn.name} against {problem.directory}: " + "; ".join(problems))


def _rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.detach().to(torch.float64), b.detach().to(device=a.device, dtype=torch.float64)
    scale = float(b64.abs().max()) if b64.numel() else 0.0
    diff = float((a64 - b64).abs().max()) if b64.numel() else 0.0
    if math.isnan(diff):
        return math.inf
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def _one_case(defn, case, problem, oracle: Callable, seed: int,
              device) -> tuple[CaseAgreement, lift.LiftReport]:
    inputs = generate_inputs(defn, case.axes, seed=seed + case.index, mode="benchmark", device=device)
    ours = oracle(*inputs)
    ours = (ours,) if isinstance(ours, torch.Tensor) else tuple(ours)
    result = run_reference(problem, problem_inputs.to_benchmark(problem, inputs), lifted=True)
    tol = case.tolerance or defn.tolerance
    rel, matched, max_abs, messages = {}, {}, {}, []
    for spec, mine, lifted, native in zip(defn.outputs, ours, result.lifted, result.native):
        if isinstance(native, torch.Tensor) and native.dtype == torch.float4_e2m1fn_x2:
            native, lifted = native.view(torch.uint8), lifted.view(torch.uint8)
        rel[spec.name] = _rel_diff(mine, lifted)
        m = compare(native, mine, tol, spec.name)
        matched[spec.name], max_abs[spec.name] = m.matched_ratio, m.max_abs
        if result.report.lifted and not rel[spec.name] <= ORACLE_RTOL:
            messages.append(f"{spec.name}: the oracles differ by {rel[spec.name]:.3g} of the output's largest "
                            f"magnitude (float64 roundoff allows {ORACLE_RTOL:g})")
        if not m.passed:
            messages.append(f"{spec.name}: the benchmark's reference fails the case's tolerance against the "
                            f"built-in oracle ({', '.join(m.reasons)}, matched {m.matched_ratio:.4%}, "
                            f"required {tol.min_matched_ratio:.2%}, max abs {m.max_abs:.3g})")
    note = None if result.report.lifted else \
        f"the problem's reference could not be lifted ({result.report.note}): the oracles were not compared"
    return CaseAgreement(case.index, dict(case.axes), rel, matched, max_abs, result.report.lifted,
                         messages, note), result.report


def crosscheck(op: str, directory: str, *, cases: Sequence[int] | str | None = None, config: str = "seed",
               seed: int = 0, device: str | torch.device | None = "cpu", variant: str | None = None,
               progress: Callable[[CaseAgreement, int, int], None] | None = None) -> CrossCheck:
    """Cross-check the built-in operator ``op`` (in ``config``, under ``variant``) against the
    problem folder ``directory`` on ``cases`` (module docstring)."""
    defn = load(op, config, variant)
    problem = read_problem(directory)
    _interfaces_match(defn, problem)
    oracle = ops.resolve_impl(defn, "reference")
    dev = resolve_device(device)
    results, first_report = [], None
    selected = defn.cases(cases)
    for n, case in enumerate(selected):
        agreement, report = _one_case(defn, case, problem, oracle, seed, dev)
        first_report = first_report or report
        results.append(agreement)
        if progress:
            progress(agreement, n + 1, len(selected))
    return CrossCheck(defn.name, problem.name, problem.directory, defn.config, defn.variant, results, first_report)
