"""Renderings of a :class:`~fuseval.gate.results.GateReport`: the terminal summary, plain
text (pytest), JUnit XML (CI systems), JSON and Markdown, and the files ``save`` writes."""
from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, Any, Iterator, TextIO
from ..check import TIMING_KEYS
from ..errors import EXIT_INTERNAL
from ..jsonio import jsonable
from ..terminal import console, fmt_number

if TYPE_CHECKING:        # annotations only: the report objects call these renderings
    from .results import ComponentResult, GateReport

def _num(x: float, digits: int = 3) -> str:
    return fmt_number(x, digits - 1, "g")


def _percent(x: float) -> str:
    return _num(100 * x, 6) + "%"


def verdict(report: GateReport) -> str:
    text = "PASSED" if report.passed else f"FAILED (exit code {report.exit_code})"
    if report.passed and report.warnings:
        text += f" with {len(report.warnings)} warning(s)"
    if report.not_run:
        text += f", {len(report.not_run)} component(s) not run"
    return text


def timing_line(c: ComponentResult) -> str:
    """"check: T s (inputs T, oracle T, impl T, compare T, hygiene T)", T in seconds: the
    component's wall time and, where it has one, the breakdown by activity."""
    line = f"{c.name}: {_num(c.seconds)} s"
    if c.timings:
        keys = [k for k in TIMING_KEYS if k in c.timings] + sorted(set(c.timings) - set(TIMING_KEYS))
        line += " (" + ", ".join(f"{k} {_num(c.timings[k])}" for k in keys) + ")"
    return line


def report_dict(report: GateReport) -> dict[str, Any]:
    return jsonable({
        "schema_version": 1, "tool": "fuseval gate", "ops": report.ops, "impl": report.impl,
        "profile": report.profile, "device": report.device, "strict": report.strict,
        "started": report.started, "seconds": round(report.seconds, 3), "passed": report.passed,
        "exit_code": report.exit_code, "files": report.files, "seeds": report.seeds,
        "seed_drawn": report.seed_drawn,
        "not_run": [{"op": c.op, "component": c.name, "reason": c.tests[0].message if c.tests else c.summary}
                    for c in report.not_run],
        "components": [c.to_dict() for c in report.components],
    })


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _margin_rows(report: GateReport) -> list[str]:
    judged = [(c.op, m) for c in report.components if c.name == "check"
              for m in c.data.get("metrics", []) if m.get("threshold") is not None]
    if not judged:
        return []
    lines = ["", "## Margins over seeds (check)", "",
             "| operator | output | metric | min | median | max | rule | worst at | allowance left | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for op, m in judged:
        f = _percent if m["metric"] == "matched_ratio" else _num
        left = m.get("margin_fraction")
        if left is None:
            left = "all"
        else:
            left = float(left)        # JSON-safe data holds non-finite numbers as strings
            left = f"{_num(100 * left)}%" if math.isfinite(left) else "none"
        rule = (">= " if m["direction"] == "min" else "<= ") + f(m["threshold"])
        lines.append(f"| {op} | {m['output']} | {m['metric']} | {f(float(m['min']))} | {f(float(m['median']))} | "
                     f"{f(float(m['max']))} | {rule} | case {m['worst_case']}, seed {m['worst_seed']} | "
                     f"{left} | {m['verdict']} |")
    return lines


def markdown(report: GateReport) -> str:
    lines = [f"# fuseval gate: {verdict(report)}", "",
             f"impl `{report.impl}`, profile `{report.profile}`, device `{report.device}`, "
             f"{_num(report.seconds)} s, started {report.started}", "",
             "| operator | component | status | time | summary |", "| --- | --- | --- | --- | --- |"]
    for c in report.components:
        lines.append(f"| {c.op} | {c.name} | {c.status} | {_md(timing_line(c).partition(': ')[2])} | "
                     f"{_md(c.summary)} |")
    lines += _margin_rows(report)
    for c in report.components:
        if c.messages and c.status not in ("pass", "skipped"):
            lines += ["", f"## {c.op} / {c.name}: {c.status}", ""]
            lines += [f"- {_md(m)}" for m in c.messages[:40]]
            if len(c.messages) > 40:
                lines.append(f"- ... {len(c.messages) - 40} more")
    return "\n".join(lines) + "\n"


def _clean(text: str) -> str:
    """Text safe for XML 1.0 (no control characters)."""
    return "".join(ch for ch in str(text) if ch in "\t\n\r" or ord(ch) >= 32)


def junit_xml(report: GateReport) -> str:
    root = ET.Element("testsuites", name="fuseval gate")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for c in report.components:
        tests = c.test_results()
        suite = ET.SubElement(root, "testsuite", name=f"fuseval.{c.op}.{c.name}")
        counts = {"tests": len(tests), "failures": 0, "errors": 0, "skipped": 0}
        for t in tests:
            case = ET.SubElement(suite, "testcase", classname=f"fuseval.{c.op}.{c.name}",
                                 name=t.name, time=f"{t.seconds:.3f}")
            if t.status in ("fail", "error"):
                tag = "failure" if t.status == "fail" else "error"
                counts[tag + "s"] += 1
                el = ET.SubElement(case, tag, message=_clean(t.message)[:500])
                el.text = _clean(t.details or t.message)
            elif t.status == "skipped":
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=_clean(t.message)[:500])
            if t.output:
                ET.SubElement(case, "system-out").text = _clean(t.output)
        for k, v in counts.items():
            suite.set(k, str(v))
            totals[k] += v
        suite.set("time", f"{c.seconds:.3f}")
    for k, v in totals.items():
        root.set(k, str(v))
    root.set("time", f"{report.seconds:.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def save(report: GateReport, out: str) -> dict[str, str]:
    """Write junit.xml, gate.json and gate.md into the folder ``out``."""
    os.makedirs(out, exist_ok=True)
    paths = {"junit": os.path.join(out, "junit.xml"), "json": os.path.join(out, "gate.json"),
             "markdown": os.path.join(out, "gate.md")}
    report.files.update(paths)
    with open(paths["junit"], "w") as f:
        f.write(junit_xml(report))
    with open(paths["json"], "w") as f:
        f.write(report.to_json() + "\n")
    with open(paths["markdown"], "w") as f:
        f.write(markdown(report))
    return paths


def _short(message: str, width: int = 200) -> list[str]:
    """A finding in at most two lines: its first line and, if any, how to reproduce it."""
    lines = str(message).splitlines() or [""]
    keep = [lines[0]] + [ln.strip() for ln in lines[1:] if ln.strip().startswith("reproduce")][:1]
    return [ln if len(ln) <= width else ln[:width - 3] + "..." for ln in keep]


def findings(report: GateReport, max_findings: int) -> Iterator[tuple[ComponentResult, list[str]]]:
    """(component, lines) for each component with problems: its first findings, at most
    4 per component and ``max_findings`` in all, each shortened by :func:`_short`."""
    shown = 0
    for c in report.components:
        if c.status in ("pass", "skipped") or not c.messages:
            continue
        found = []
        for m in c.messages[:4]:
            if shown >= max_findings:
                break
            found += _short(m)
            shown += 1
        yield c, found


def text(report: GateReport, max_findings: int = 12) -> str:
    lines = [f"fuseval gate {verdict(report)}: impl={report.impl} profile={report.profile} device={report.device}"]
    for c in report.components:
        lines.append(f"  {c.op:24s} {c.name:10s} {c.status:7s} {c.seconds:6.1f}s  {c.summary}")
    for c, found in findings(report, max_findings):
        lines.append(f"{c.op} / {c.name} ({c.status}):")
        lines += ["  " + line for line in found]
    return "\n".join(lines)


def print_summary(report: GateReport, stream: TextIO | None = None, max_findings: int = 12) -> None:
    """One screen: a table of components, a timing line per component run, the first
    findings of each problem, the traceback of a component that crashed (a bug in fuseval)."""
    from rich.markup import escape
    from rich.table import Table
    out = console(stream)
    plain = dict(markup=False, highlight=False)
    table = Table(title=f"fuseval gate: impl={report.impl} profile={report.profile} device={report.device}",
                  title_justify="left")
    for col in ("operator", "component", "status", "time", "summary"):
        table.add_column(col, overflow="fold")
    colors = {"pass": "green", "warn": "yellow", "fail": "red", "error": "red", "skipped": "dim"}
    for c in report.components:
        status = "not run" if c.status == "skipped" else c.status
        seconds = "-" if c.status == "skipped" else f"{_num(c.seconds)} s"
        table.add_row(c.op, c.name, f"[{colors[c.status]}]{status}[/]", seconds, escape(c.summary))
    out.print(table)
    if report.seeds:
        how = "drawn at random" if report.seed_drawn else "as given"
        out.print(f"seeds {', '.join(map(str, report.seeds))} ({how}; --seed {report.seeds[0]} repeats them)", **plain)
    for c in report.components:
        if c.status != "skipped":
            out.print(f"time {c.op} {timing_line(c)}", **plain)
    for c, found in findings(report, max_findings):
        out.print(f"{c.op} / {c.name} ({c.status}):", **plain)
        for line in found:
            out.print("  " + line, **plain)
        if len(c.messages) > 4:
            out.print(f"  ... {len(c.messages) - 4} more (see the reports)", **plain)
        if c.status == "error" and c.exit_code == EXIT_INTERNAL and c.data.get("traceback"):
            out.print(c.data["traceback"].rstrip(), **plain)
            out.print(f"  {c.op} / {c.name} crashed: this is a bug in fuseval; please report it", **plain)
    if report.files:
        folders = sorted({os.path.dirname(p) or "." for p in report.files.values()})
        main = [os.path.basename(report.files[k]) for k in ("junit", "json", "markdown") if k in report.files]
        others = len(report.files) - len(main)
        out.print(f"reports in {', '.join(folders)}: {', '.join(main)}"
                  + (f" and {others} component report(s)" if others else ""), **plain)
    # "GATE PASSED with 1 warning(s) in T s", "GATE FAILED (exit code 10) in T s"
    head = "[green]GATE PASSED[/]" if report.passed else "[red]GATE FAILED[/]"
    out.print(f"{head}{escape(verdict(report).partition('ED')[2])} in {_num(report.seconds)} s")
