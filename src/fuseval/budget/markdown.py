"""The budget report as Markdown (and the cell formats the HTML report shares)."""
from __future__ import annotations

import math
from typing import Any

from ..jsonio import number
from ..terminal import fmt_number

__all__ = ["render_markdown"]


def _e(x: Any) -> str:
    """An error in a table: 3 significant digits; "-" when missing (NaN), "0" when exact."""
    v = number(x)
    if math.isnan(v):
        return "-"
    return "0" if v == 0 else fmt_number(v, 2, "e")


def _pct(x: Any) -> str:
    v = number(x)
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return "inf"
    return f"{100 * v:.0f}%"


def _cases(ids: list) -> str:
    ids = list(ids)
    return ", ".join(str(i) for i in ids[:8]) + (f" (+{len(ids) - 8})" if len(ids) > 8 else "")


def _torch_label(d: dict[str, Any]) -> str:
    label = d.get("torch_baseline") or "torch"
    return "plain torch" if label == "torch" else f"`{label}`"


def _case_table(d: dict[str, Any]) -> list[str]:
    """Per case, how much of the end-to-end allowance the implementation and each baseline
    spend (an operator without stages, e.g. an imported problem, whose budget is end to end)."""
    torch_label = d.get("torch_baseline") or "torch"
    kinds = [k for k in ("torch", "reference_fp32", "naive")
             if any(c["end_to_end"].get("baseline_checks", {}).get(k) for c in d["cases"])]
    label = {"torch": f"`{torch_label}`", "reference_fp32": "float32 reference", "naive": "naive"}
    head = "| case | axes | impl used | impl max abs | " + " | ".join(f"{label[k]} used | {label[k]} max abs"
                                                                    for k in kinds)
    out = [head + " |", "|---:|---|---:|---:|" + "---:|---:|" * len(kinds)]
    for c in d["cases"]:
        e = c["end_to_end"]
        used = lambda checks: max((number(ch["usage"]) for ch in checks), default=math.nan)
        row = [str(c["case"]), " ".join(f"{k}={v}" for k, v in c["axes"].items()) or "-",
               _pct(used(e.get("checks") or [])), _e((e.get("impl") or {}).get("max_abs", math.nan))]
        for k in kinds:
            row += [_pct(used(e.get("baseline_checks", {}).get(k) or [])),
                    _e((e.get(k) or {}).get("max_abs", math.nan))]
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    out.append("*used*: the largest value / limit over the end-to-end allowances, per case (with the "
               "allowance `tolerance_used <= 1`: the share of the case's own tolerance spent; over 100%: fails).")
    return out


def render_markdown(d: dict[str, Any]) -> str:
    """A short Markdown report (fits a PR comment): verdict, per-stage table, end to end."""
    s = d["summary"]
    n = len(d["cases"])
    first = d["first_over_budget"]
    if d["passed"]:
        verdict = "**within budget**"
    else:
        where = "end to end" if first == "end_to_end" else f"`{first}`" if first else "?"
        cases = [k for k, v in d["first_over_budget_by_case"].items() if v == first]
        raised = [c["case"] for c in d["cases"] if c["raised"]]
        verdict = f"**OVER BUDGET**: first at {where}" + (f" (cases {_cases(cases)})" if cases else "")
        if raised:
            verdict += f"; raised in cases {_cases(raised)}"
    dev = d["device"] + (f" ({d['device_name']})" if d["device_name"] not in ("cpu", d["device"]) else "")
    lines = [f"### fuseval budget: `{d['op']}`, impl `{d['impl']}`: {verdict}", "",
             f"{n} cases (config `{d['config']}`, {d['mode']} inputs, seed {d['seed']}) on {dev} in "
             f"{number(d['seconds']):.1f} s. Errors against the float64 oracle; worst case over the cases. "
             f"*local*: the stage fed the oracle's inputs; *propagated*: the implementation's own pipeline; "
             f"*downstream*: final-output error of the implementation up to this stage, the oracle after; "
             f"*naive*: float32 reference in the stage's precision (the implementation's storage, never coarser "
             f"than the budget allows); *used*: error / allowance.", ""]
    bs = d["budget_summary"]
    if d["staged"]:
        # allowances are long and repeat: the table names them by letter, listed below it
        legend: dict[str, str] = {}
        for name in d["stages"]:
            text = "; ".join(bs[name]["allowances"]) or "none"
            legend.setdefault(text, chr(ord("A") + len(legend)))
        lines += ["| stage | precision | budget | used | local max abs | naive local | propagated "
                  "| downstream rel L2 | fp32 ref (prop.) | verdict |",
                  "|---|---|:-:|---:|---:|---:|---:|---:|---:|:---|"]
        for name in d["stages"]:
            st = s[name]
            label = f"{d['stage_parents'][name]}.{name}" if name in d["stage_parents"] else name
            over = st["cases_over"]
            verdict = "pass" if not over else f"**OVER** ({_cases(over)})"
            if not st["judged"]:
                verdict = "-"
            prec = st["precision"] or bs[name]["dtype"]
            if prec != bs[name]["dtype"]:
                prec += f" (allowed: {bs[name]['dtype']})"
            lines.append(f"| {label} | {prec} | {legend['; '.join(bs[name]['allowances']) or 'none']} | "
                         f"{_pct(st['usage'])} | {_e(st['local_max_abs'])} | {_e(st['naive_local_max_abs'])} | "
                         f"{_e(st['propagated_max_abs'])} | {_e(st['downstream_rel_l2'])} | "
                         f"{_e(st['fp32_propagated_max_abs'])} | {verdict} |")
        lines.append("")
        lines += [f"Budget {letter}: {text} (local error)." for text, letter in legend.items()] + [""]
    elif not d["stages"]:
        lines += ["The operator has no stages (an imported problem's reference names none: docs/interop.md), "
                  "so its budget is end to end.", ""]
    else:
        lines += ["The implementation exposes no stage taps (`forward.staged`), so only the final outputs "
                  "are judged (see docs/budget.md for the protocol).", ""]
    e = s["end_to_end"]
    over = e["cases_over"]
    allow = "; ".join((["benchmark tolerance"] if bs["end_to_end"]["tolerance"] else []) +
                      bs["end_to_end"]["allowances"]) or "-"
    matched = number(e["min_matched_ratio"])
    lines.append(f"**End to end** ({allow}): {'pass' if not over else f'**OVER** (cases {_cases(over)})'}; "
                 f"used {_pct(e['usage'])}. Max abs error: impl {_e(e['max_abs'])} "
                 f"(matched >= {'-' if math.isnan(matched) else f'{100 * matched:.2f}%'}"
                 f"{', tolerance failed in cases ' + _cases(e['tolerance_failed']) if e['tolerance_failed'] else ''}); "
                 f"baselines: naive {_e(e['naive_max_abs'])}, float32 reference {_e(e['reference_fp32_max_abs'])}, "
                 f"{_torch_label(d)} {_e(e['torch_max_abs'])}.")
    if not d["stages"]:
        lines += ["", *_case_table(d)]
    msgs = []
    for c in d["cases"]:
        for m in c["messages"]:
            if "exposes no stage taps" not in m:
                msgs.append(f"- case {c['case']}: {m}")
        for st in c["stages"]:
            for m in st["messages"]:
                msgs.append(f"- case {c['case']}, {st['stage']}: {m}")
    if msgs:
        lines += ["", *msgs[:10]] + ([f"- ... {len(msgs) - 10} more in the JSON report"] if len(msgs) > 10 else [])
    return "\n".join(lines) + "\n"
