"""Terminal output shared by the commands: progress lines and result tables (rich)."""
from __future__ import annotations

import math
import sys
from typing import TextIO

from .definitions import axes_label

__all__ = ["case_progress", "case_verdict", "print_check_report", "console", "fmt_err"]


def console(stream: TextIO | None = None):
    from rich.console import Console
    return Console(file=stream or sys.stdout, width=140, soft_wrap=False)


def fmt_err(x: float) -> str:
    if x is None:
        return "-"
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.3e}"


def case_verdict(result) -> str:
    """A checked case in a progress line: "ok" or "FAIL" and its violations."""
    return "ok" if result.passed else "FAIL " + ",".join(result.violations)


def case_progress(stream: TextIO = sys.stderr):
    """A progress callback: one line per finished case, so long runs show they are alive."""
    def report(result, done: int, total: int) -> None:
        print(f"[{done}/{total}] case {result.case} ({axes_label(result.axes)}): {case_verdict(result)} "
              f"(impl {result.impl_seconds:.2f}s, oracle {result.oracle_seconds:.2f}s)",
              file=stream, flush=True)
    return report


def print_check_report(report, stream: TextIO | None = None) -> None:
    from rich.table import Table
    t = report.tolerance
    rule = f"|out-ref| <= {t['atol']} + {t['rtol']}*|ref|, matched >= {t['min_matched_ratio']:.0%}"
    if t.get("max_abs_error") is not None:
        rule += f", max abs <= {t['max_abs_error']}"
    table = Table(title=f"{report.op} [{report.config}] impl={report.impl} device={report.device} "
                        f"seed={report.seed} mode={report.mode}\n{rule}")
    for col in ("case", "axes", "output", "max abs", "rel L2", "matched", "verdict"):
        table.add_column(col, justify="right" if col not in ("axes", "output", "verdict") else "left")
    for c in report.cases:
        axes = axes_label(c.axes)
        verdict = "[green]pass[/]" if c.passed else "[red]FAIL[/] " + ",".join(c.violations)
        if not c.outputs:
            table.add_row(str(c.case), axes, "-", "-", "-", "-", verdict)
        for i, m in enumerate(c.outputs):
            table.add_row(str(c.case) if i == 0 else "", axes if i == 0 else "", m.name, fmt_err(m.max_abs),
                          fmt_err(m.rel_l2), f"{m.matched_ratio:.4%}", verdict if i == 0 else "")
    out = console(stream)
    out.print(table)
    for c in report.cases:
        for msg in c.messages:
            out.print(f"case {c.case}: {msg}", markup=False, highlight=False)
    n_pass = sum(c.passed for c in report.cases)
    out.print(f"{report.op}: {n_pass}/{len(report.cases)} cases passed", markup=False, highlight=False)
