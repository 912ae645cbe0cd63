"""Terminal output shared by the commands: progress lines and result tables (rich)."""
from __future__ import annotations

import datetime
import math
import sys
from typing import TextIO

from .definitions import axes_label
from .operators import load

__all__ = ["case_progress", "case_verdict", "print_check_report", "console", "fmt_err", "fmt_number",
           "config_label", "timing_line", "utc_timestamp"]


def utc_timestamp() -> str:
    """Now, in UTC, as the reports record it: 2025-01-31T12:00:00Z."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def console(stream: TextIO | None = None):
    from rich.console import Console
    return Console(file=stream or sys.stdout, width=200, soft_wrap=False)


def fmt_number(x: float | None, digits: int = 3, style: str = "e") -> str:
    """The one number formatter of tables: ``-`` for None, ``inf``/``nan`` as such, else
    ``digits`` digits in ``style`` ("e": 1.234e-03, "g": 0.001234)."""
    if x is None:
        return "-"
    x = float(x)
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.{digits}e}" if style == "e" else f"{x:.{digits + 1}g}"


def fmt_err(x: float | None) -> str:
    """An error value in a table: 3 digits after the point, exponent form."""
    return fmt_number(x, 3, "e")


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


def _span(values: list, fmt) -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)} per case"


def tolerance_rule(t: dict, cases: list[dict] | None = None) -> str:
    """A tolerance as one line; ``cases``: the cases' own tolerances (an imported problem's
    workloads give one each), shown as ranges where they differ."""
    tols = [c for c in (cases or []) if c] or [t]
    atol = _span([c["atol"] for c in tols], str)
    rtol = _span([c["rtol"] for c in tols], str)
    ratio = _span([c["min_matched_ratio"] for c in tols], lambda r: f"{r:.0%}" if r * 100 == int(r * 100) else f"{r:.2%}")
    rule = f"|out-ref| <= {atol} + {rtol}*|ref|, matched >= {ratio}"
    caps = [c["max_abs_error"] for c in tols if c.get("max_abs_error") is not None]
    if caps:
        rule += f", max abs <= {_span(caps, str)}"
    return rule


def print_check_report(report, stream: TextIO | None = None) -> None:
    from rich.table import Table

    t = report.tolerance
    rule = tolerance_rule(t, [c.tolerance for c in report.cases])
    note = load(report.op).raw.get("tolerance", {}).get("note", "")
    if "required_match_ratio" in note:
        rule += " (the benchmark's workload file says 0.98 under a key its evaluator ignores: 0.99 applies)"
    against = "float64 oracle" if report.against == "reference" else report.against
    predicting = any(c.predicted is not None for c in report.cases)
    # the header as plain lines above the table: a table title wraps at the table's width,
    # and as rich markup would drop "[small]" as a style tag
    seed_note = " (drawn at random)" if getattr(report, "seed_drawn", False) else ""
    header = [f"{report.op} [{config_label(report)}] variant={report.variant} impl={report.impl} "
              f"device={report.device} seed={report.seed}{seed_note} mode={report.mode}",
              f"against {against}, {report.rules} rules: {rule}"]
    if report.rules == "fuseval" and (t.get("max_error_ratio") or t.get("max_rms_ratio")):
        header.append(f"fuseval's own bounds: worst element <= {t.get('max_error_ratio')}x its allowance "
                      f"(atol + rtol*|ref|), error RMS <= {t.get('max_rms_ratio')}x the allowance's RMS")
    if getattr(report, "confinement", ""):
        header.append(f"implementation worker: {report.confinement}")
    if predicting:
        header.append("predicted benchmark verdict: against sol_reference, sol rules")
    header += [f"oracle: {note}" for note in report.oracle_notes]
    table = Table()
    bounded = any(m.error_ratio is not None for c in report.cases for m in c.outputs)
    cols = ["case", "axes", "output", "max abs", "rel L2"] + (["worst/allow", "RMS/allow"] if bounded else []) \
        + ["matched", "margin", "verdict"]
    if predicting:
        cols += ["bench matched", "bench margin", "bench verdict"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("axes", "output", "verdict", "bench verdict") else "right",
                         no_wrap=col in ("axes", "output"))
    for c in report.cases:
        axes = axes_label(c.axes)
        verdict = "[green]pass[/]" if c.passed else "[red]FAIL[/] " + ",".join(c.violations)
        ratio = c.tolerance.get("min_matched_ratio", t["min_matched_ratio"]) if c.tolerance else t["min_matched_ratio"]
        pred = c.predicted
        if not c.outputs:
            table.add_row(str(c.case), axes, "-", "-", "-", *(["-", "-"] if bounded else []), "-", "-", verdict,
                          *(["-"] * 3 if predicting else []))
        for i, m in enumerate(c.outputs):
            row = [str(c.case) if i == 0 else "", axes if i == 0 else "", m.name, fmt_err(m.max_abs),
                   fmt_err(m.rel_l2)]
            if bounded:
                row += ["-" if m.error_ratio is None else fmt_err(m.error_ratio),
                        "-" if m.rms_ratio is None else fmt_err(m.rms_ratio)]
            row += [f"{m.matched_ratio:.4%}", f"{m.matched_ratio - ratio:+.4%}", verdict if i == 0 else ""]
            if predicting:
                if pred is None or i >= len(pred.outputs):
                    row += ["-", "-", ""]
                else:
                    pm = pred.outputs[i]
                    pv = "[green]pass[/]" if pred.passed else "[red]FAIL[/] " + ",".join(pred.violations)
                    row += [f"{pm.matched_ratio:.4%}", f"{pm.matched_ratio - ratio:+.4%}", pv if i == 0 else ""]
            table.add_row(*row)
    out = console(stream)
    for line in header:
        out.print(line, markup=False, highlight=False)
    out.print(table)
    for c in report.cases:
        for msg in c.messages:
            out.print(f"case {c.case}: {msg}", markup=False, highlight=False)
        # diagnosis hook (fuseval.diagnosis): the short form, the top findings per output
        if getattr(c, "diagnosis", None) is not None:
            for line in c.diagnosis.short_lines():
                out.print(f"case {c.case}: {line}", markup=False, highlight=False)
        printed = getattr(c, "impl_output", "").strip()
        if printed and not c.passed:
            lines = printed.splitlines()
            out.print(f"case {c.case}: the implementation printed ({len(lines)} line(s), the last shown):",
                      markup=False, highlight=False)
            for line in lines[-12:]:
                out.print(f"  | {line[:300]}", markup=False, highlight=False)
    n_pass = sum(c.passed for c in report.cases)
    line = f"{report.op}: {n_pass}/{len(report.cases)} cases passed"
    if predicting:
        n_pred = sum(bool(c.predicted and c.predicted.passed) for c in report.cases)
        line += f"; the benchmark would pass {n_pred}/{len(report.cases)} (predicted)"
    out.print(line, markup=False, highlight=False)
    for b in report.blind:
        out.print(f"warning: {b.describe()}", markup=False, highlight=False)
    out.print(timing_line(report), markup=False, highlight=False)


def config_label(report) -> str:
    """The configuration as given; a JSON object alone is the seed plus overrides, whose
    cases stay full-size, which the label says."""
    if report.config.lstrip().startswith("{"):
        return f"{report.config}: seed + overrides, full-size cases"
    return report.config


def timing_line(report) -> str:
    """Where a check's time went, one line: each part summed over the cases."""
    parts = ", ".join(f"{key} {seconds:.2f}s" for key, seconds in report.timings.items())
    return (f"time: {parts}; setup {report.setup_seconds:.2f}s, wall {report.wall_seconds:.2f}s "
            f"({len(report.cases)} cases)")
