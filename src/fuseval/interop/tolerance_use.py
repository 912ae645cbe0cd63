"""How much of each workload's tolerance the benchmark's own reference uses.

For every selected workload and seed, the problem's reference as written
(``sol_reference``, what the benchmark compares solutions against) is compared with the
lifted oracle on the same inputs, under the workload's tolerance and fuseval's
comparison (float64). Per workload, over the seeds:

* ``matched``: the lowest matched ratio; ``required``: the workload's ratio;
* ``used``: the share of the allowed mismatches the reference already spends,
  ``(1 - matched) / (1 - required)`` (over 100%: the reference fails its own tolerance,
  so the benchmark would reject an exact kernel there);
* ``bound at ratio``: the required-ratio quantile of ``|err| / (atol + rtol*|oracle|)``
  (over 1: failing; how close the typical element sits to its bound);
* ``max abs``: the largest error; ``failing``: on how many seeds the reference fails.

Rows come worst first (``used``, then ``bound at ratio``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from ..check import compare
from ..definitions import Tolerance, axes_label
from ..terminal import fmt_number
from ..options import check_at_least
from . import workload_inputs as problem_inputs
from . import lift
from .sol_problem import Problem, Workload, fuseval_tolerance, read_problem
from ..definitions import evaluate_expression
from .problem_code import run_reference

__all__ = ["WorkloadUse", "ToleranceUse", "tolerance_use", "select_workloads", "workload_size"]


@dataclass
class WorkloadUse:
    line: int                    # of workload.jsonl
    axes: dict[str, int]
    output: str                  # the output that spends the most
    tolerance: dict[str, Any]
    matched: float
    required: float
    used: float
    bound_at_ratio: float
    max_abs: float
    failing: int
    seeds: int
    lifted: bool
    note: str | None = None

    @property
    def passed(self) -> bool:
        return self.failing == 0


@dataclass
class ToleranceUse:
    problem: str
    directory: str
    rows: list[WorkloadUse]
    warnings: list[str] = field(default_factory=list)
    lift: lift.LiftReport | None = None

    @property
    def flagged(self) -> list[WorkloadUse]:
        """Workloads on which the benchmark's reference fails its own tolerance."""
        return [r for r in self.rows if not r.passed]

    def to_dict(self) -> dict[str, Any]:
        return {"problem": self.problem, "directory": self.directory, "warnings": self.warnings,
                "lift": None if self.lift is None else asdict(self.lift),
                "rows": [{**asdict(r), "passed": r.passed} for r in self.rows]}

    def to_markdown(self) -> str:
        head = ("| line | axes | output | matched | required | used | bound at ratio | max abs | failing |\n"
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        body = [f"| {r.line} | {axes_label(r.axes)} | {r.output} | {r.matched:.4%} | {r.required:.2%} | "
                f"{r.used:.1%} | {fmt_number(r.bound_at_ratio, 3, 'g')} | {fmt_number(r.max_abs)} | "
                f"{r.failing}/{r.seeds}{'' if r.lifted else ' (not lifted)'} |" for r in self.rows]
        return "\n".join([f"**{self.problem}**", "", head, *body])


def workload_size(problem: Problem, workload: Workload) -> int:
    """Elements of all tensor inputs of a workload (to pick the smallest)."""
    axes = {n: a["value"] for n, a in problem.axes.items() if a["type"] == "const"}
    axes.update(workload.axes)
    for n, a in problem.axes.items():
        if a["type"] == "expr":
            axes[n] = int(evaluate_expression(a["expression"], axes))
    return sum(math.prod(int(evaluate_expression(d, axes)) for d in t["shape"])
               for t in problem.inputs.values() if t["shape"] is not None)


def select_workloads(problem: Problem, *, smallest: int | None = None,
                     lines: Sequence[int] | None = None) -> list[Workload]:
    """The supported workloads: all, the ``smallest`` N by input size, or those at ``lines``."""
    pool = problem.drawable()
    if lines is not None:
        by_line = {w.line: w for w in pool}
        missing = [n for n in lines if n not in by_line]
        if missing:
            raise ValueError(f"problem {problem.name!r}: no supported workload at lines {missing} of "
                             f"workload.jsonl (supported lines: {sorted(by_line)})")
        return [by_line[n] for n in lines]
    if smallest is not None:
        if smallest < 1:
            raise ValueError(f"smallest: expected a number of workloads >= 1, got {smallest}")
        return sorted(pool, key=lambda w: (workload_size(problem, w), w.line))[:smallest]
    return list(pool)


def _compact(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both outputs without the axes both broadcast (stride 0: an ``expand``ed view repeats
    every element equally often, so ratios and maxima are those of the compact tensors,
    which need not be materialized at the expanded size)."""
    for dim in range(a.dim()):
        if a.shape[dim] > 1 and a.shape == b.shape and a.stride(dim) == 0 and b.stride(dim) == 0:
            a, b = a.narrow(dim, 0, 1), b.narrow(dim, 0, 1)
    return a, b


def _bound_use(native: torch.Tensor, oracle: torch.Tensor, tol: Tolerance) -> float:
    o = native.detach().to(torch.float64)
    r = oracle.detach().to(device=o.device, dtype=torch.float64)
    ratio = (o - r).abs() / (tol.atol + tol.rtol * r.abs())
    ratio = torch.where(torch.isfinite(o) & torch.isfinite(r), ratio, torch.full_like(ratio, math.inf))
    if ratio.numel() == 0:
        return 0.0
    k = min(ratio.numel() - 1, max(0, math.ceil(tol.min_matched_ratio * ratio.numel()) - 1))
    return float(ratio.flatten().kthvalue(k + 1).values) if ratio.numel() else 0.0


def _one_workload(problem: Problem, workload: Workload, seeds: Sequence[int],
                  device: torch.device) -> tuple[WorkloadUse, lift.LiftReport]:
    tol = Tolerance(**fuseval_tolerance(workload.tolerance))
    worst: dict[str, Any] | None = None
    failing, report = 0, None
    for seed in seeds:
        values = problem_inputs.draw_inputs(problem, workload, seed, device)
        result = run_reference(problem, list(values.values()), lifted=True)
        report = report or result.report
        failed = False
        for name, native, oracle in zip(problem.outputs, result.native, result.lifted):
            if not isinstance(native, torch.Tensor):
                continue
            if native.dtype == torch.float4_e2m1fn_x2:
                native, oracle = native.view(torch.uint8), oracle.view(torch.uint8)
            native, oracle = _compact(native, oracle)
            m = compare(native, oracle, tol, name)
            failed |= not m.passed
            allowed = 1.0 - tol.min_matched_ratio
            used = (1.0 - m.matched_ratio) / allowed if allowed > 0 else (0.0 if m.matched_ratio >= 1 else math.inf)
            row = {"output": name, "matched": m.matched_ratio, "used": used, "max_abs": m.max_abs,
                   "bound_at_ratio": _bound_use(native, oracle, tol)}
            if worst is None or (row["used"], row["bound_at_ratio"]) > (worst["used"], worst["bound_at_ratio"]):
                worst = row
        failing += failed
    assert worst is not None and report is not None
    return WorkloadUse(workload.line, dict(workload.axes), worst["output"], dict(workload.tolerance),
                       worst["matched"], tol.min_matched_ratio, worst["used"], worst["bound_at_ratio"],
                       worst["max_abs"], failing, len(seeds), report.lifted, report.note), report


def tolerance_use(directory: str, *, smallest: int | None = None, lines: Sequence[int] | None = None,
                  seeds: int = 1, seed: int = 0, device: str | torch.device = "cpu",
                  progress=None) -> ToleranceUse:
    """The report of the module docstring for the problem folder ``directory``: the
    selected workloads (:func:`select_workloads`), each on ``seeds`` seeds from ``seed``."""
    check_at_least(seeds, 1, "seeds", int)
    problem = read_problem(directory)
    device = torch.device(device)
    rows, first = [], None
    chosen = select_workloads(problem, smallest=smallest, lines=lines)
    for n, workload in enumerate(chosen):
        row, report = _one_workload(problem, workload, range(seed, seed + seeds), device)
        first = first or report
        rows.append(row)
        if progress:
            progress(row, n + 1, len(chosen))
    rows.sort(key=lambda r: (-r.used, -r.bound_at_ratio, r.line))
    return ToleranceUse(problem.name, problem.directory, rows, list(problem.warnings), first)
