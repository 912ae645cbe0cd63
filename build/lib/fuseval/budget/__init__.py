"""Error budgets that track each fused stage separately (``fuseval budget``).

For every case, each named stage of an implementation is compared with the float64
oracle's tap of that stage three ways (local, propagated, downstream impact), next to
a naive implementation in the same precision and the float32 / plain-torch baselines,
and judged against a declarative per-operator budget (``budget/<op>.json``).
docs/budget.md explains the protocol, the budget format and the default derivation.

    report = run_budget("nvfp4_qkv_rope", "fast", config="seed", device="cuda")
    report.passed, report.first_over_budget
    print(report.to_markdown()); report.save_html("budget.html"); report.to_dataframe()
"""
from __future__ import annotations

from .budgetfile import Allowance, Budget, EndToEndBudget, StageBudget, default_budget_path, load_budget
from .report import BudgetCase, BudgetReport, EndToEnd, StageResult, load_report, render_markdown
from .runner import run_budget, run_until, staged_of

__all__ = ["run_budget", "load_budget", "default_budget_path", "BudgetReport", "BudgetCase", "StageResult",
           "EndToEnd", "Budget", "StageBudget", "EndToEndBudget", "Allowance", "load_report",
           "render_markdown", "run_until", "staged_of"]
