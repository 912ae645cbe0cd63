"""Budget reports: the result objects, their JSON form and the short Markdown summary.

The JSON form is the source of truth: ``BudgetReport.to_dict()`` has a versioned
schema (``schema_version``) with stable keys, and the Markdown and HTML renderers read
only that dict, so a saved report can be rendered again later
(:func:`render_markdown`, :func:`fuseval.budget.html.render_html`).

Non-finite numbers are written as the strings "inf", "-inf" and "nan" so the file is
strict JSON (:mod:`fuseval.jsonio`, whose ``number`` reads them back).

Schema (version 1), top level: ``schema_version``, ``kind`` ("fuseval.budget"), ``op``,
``impl``, ``config``, ``device``, ``device_name``, ``seed``, ``mode``, ``tolerance``,
``budget`` (the budget file as read, with ``source``), ``budget_summary``, ``stages``
(pipeline order), ``stage_parents``, ``staged``, ``passed``, ``first_over_budget``,
``first_over_budget_by_case``, ``summary`` (per stage, worst over cases), ``cases``,
``seconds``, ``torch_version``, ``histogram_edges_log10``. Each case: ``case``, ``axes``,
``seed``, ``staged``, ``passed``, ``first_over_budget``, ``raised``, ``messages``,
``seconds`` (per pass), ``stages`` (one entry per stage: ``stage``, ``parent``, ``dtype``,
``impl_dtype``, ``impl_storage``, ``precision``, ``local``, ``propagated``, ``downstream``, ``naive_local``,
``naive_propagated``, ``fp32_propagated``, ``checks``, ``passed``, ``messages``) and
``end_to_end`` (``impl``, ``staged_vs_forward``, ``naive``, ``reference_fp32``, ``torch``,
``checks``, ``tolerance_passed``, ``passed``). Metric dicts: see
:mod:`fuseval.budget.metrics`.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from ..jsonio import dumps, jsonable, number
from .markdown import render_markdown
from .metrics import HIST_EDGES, METRICS
from .html import render_html

__all__ = ["StageResult", "EndToEnd", "BudgetCase", "BudgetReport", "render_markdown", "load_report",
           "REPORT_SCHEMA_VERSION"]

REPORT_SCHEMA_VERSION = 1
STAGE_KINDS = ("local", "propagated", "downstream", "naive_local", "naive_propagated", "fp32_propagated")
FINAL_KINDS = ("impl", "naive", "reference_fp32", "torch")


@dataclass
class StageResult:
    stage: str
    parent: str | None
    dtype: str                                   # the budget's dtype: the coarsest storage allowed
    impl_dtype: str | None = None                # torch dtype of the implementation's tap
    impl_storage: str | None = None              # precision its values lie on (e.g. tf32 in float32)
    precision: str | None = None                 # judged in: the finer of impl_storage and dtype
    local: dict | None = None
    propagated: dict | None = None
    downstream: dict | None = None
    naive_local: dict | None = None
    naive_propagated: dict | None = None
    fp32_propagated: dict | None = None
    checks: list[dict] = field(default_factory=list)
    passed: bool | None = None                   # None: not judged (no taps)
    messages: list[str] = field(default_factory=list)


@dataclass
class EndToEnd:
    impl: dict | None = None
    staged_vs_forward: float | None = None       # max |staged outputs - forward outputs|
    naive: dict | None = None
    reference_fp32: dict | None = None
    torch: dict | None = None
    checks: list[dict] = field(default_factory=list)
    tolerance_passed: bool | None = None
    passed: bool = False
    # the end-to-end allowances evaluated on each baseline (naive, reference_fp32, torch)
    baseline_checks: dict[str, list[dict]] = field(default_factory=dict)


@dataclass
class BudgetCase:
    case: int
    axes: dict[str, int]
    seed: int
    staged: bool
    stages: list[StageResult]
    end_to_end: EndToEnd
    passed: bool
    first_over_budget: str | None
    raised: bool
    messages: list[str]
    seconds: dict[str, float]

    def stage(self, name: str) -> StageResult:
        for s in self.stages:
            if s.stage == name:
                return s
        raise KeyError(name)


@dataclass
class BudgetReport:
    op: str
    impl: str
    config: str
    device: str
    device_name: str
    seed: int
    mode: str
    tolerance: dict[str, Any]
    budget: dict[str, Any]
    budget_summary: dict[str, Any]
    stages: list[str]
    stage_parents: dict[str, str]
    staged: bool
    cases: list[BudgetCase]
    seconds: float
    torch_version: str = ""
    # what the "torch" baseline runs (an implementation name of the operator's table)
    torch_baseline: str = "torch"

    # ---- verdicts
    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def first_over_budget_by_case(self) -> dict[int, str | None]:
        return {c.case: c.first_over_budget for c in self.cases}

    @property
    def first_over_budget(self) -> str | None:
        """The earliest stage in pipeline order that is the first over budget in some
        case ("end_to_end" when only final verdicts fail; None within budget)."""
        firsts = {c.first_over_budget for c in self.cases if c.first_over_budget}
        for name in self.stages:
            if name in firsts:
                return name
        return "end_to_end" if "end_to_end" in firsts else None

    # ---- JSON
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        cases = d.pop("cases")
        out = {"schema_version": REPORT_SCHEMA_VERSION, "kind": "fuseval.budget", **d,
               "passed": self.passed, "first_over_budget": self.first_over_budget,
               "first_over_budget_by_case": {str(k): v for k, v in self.first_over_budget_by_case.items()},
               "summary": summarize(self.stages, cases),
               "histogram_edges_log10": list(HIST_EDGES), "cases": cases}
        return jsonable(out)

    def to_json(self, indent: int | None = None) -> str:
        return dumps(self.to_dict(), indent=indent)

    def save_json(self, path: str | os.PathLike) -> str:
        with open(path, "w") as f:
            f.write(self.to_json())
            f.write("\n")
        return os.fspath(path)

    # ---- renderings
    def to_markdown(self) -> str:
        return render_markdown(self.to_dict())

    def save_markdown(self, path: str | os.PathLike) -> str:
        with open(path, "w") as f:
            f.write(self.to_markdown())
        return os.fspath(path)

    def to_html(self) -> str:
        return render_html(self.to_dict())

    def save_html(self, path: str | os.PathLike) -> str:
        with open(path, "w") as f:
            f.write(self.to_html())
        return os.fspath(path)

    # ---- tables
    def rows(self) -> list[dict[str, Any]]:
        return report_rows(self.to_dict())

    def to_dataframe(self):
        """One row per (case, stage, kind of error): kinds local, propagated,
        downstream, naive_local, naive_propagated, fp32_propagated; and per (case,
        "end_to_end", kind) for kinds impl, naive, reference_fp32, torch."""
        import pandas as pd
        return pd.DataFrame(self.rows())


def load_report(path: str | os.PathLike) -> dict[str, Any]:
    """A saved JSON report as a dict (for :func:`render_markdown` / ``render_html``)."""
    with open(path) as f:
        d = json.load(f)
    if d.get("kind") != "fuseval.budget" or d.get("schema_version") != REPORT_SCHEMA_VERSION:
        raise ValueError(f"{path}: not a fuseval budget report of schema_version {REPORT_SCHEMA_VERSION} "
                         f"(kind={d.get('kind')!r}, schema_version={d.get('schema_version')!r})")
    return d


def report_rows(d: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for c in d["cases"]:
        base = {"case": c["case"], **c["axes"]}
        for s in c["stages"]:
            usage = max((number(ch["usage"]) for ch in s["checks"]), default=math.nan)
            for kind in STAGE_KINDS:
                m = s.get(kind)
                if not m:
                    continue
                row = {**base, "stage": s["stage"], "parent": s["parent"], "kind": kind, "dtype": s["dtype"],
                       "impl_dtype": s["impl_dtype"], "impl_storage": s["impl_storage"],
                       "precision": s["precision"]}
                row.update({k: number(m.get(k)) for k in METRICS + ("scale",) if k in m})
                if "matched_ratio" in m:
                    row["matched_ratio"] = number(m["matched_ratio"])
                    row["tolerance_passed"] = m["tolerance_passed"]
                row["stage_passed"] = s["passed"]
                row["stage_usage"] = usage
                rows.append(row)
        e = c["end_to_end"]
        for kind in FINAL_KINDS:
            m = e.get(kind)
            if not m:
                continue
            row = {**base, "stage": "end_to_end", "parent": None, "kind": kind}
            row.update({k: number(m.get(k)) for k in METRICS + ("scale", "matched_ratio") if k in m})
            row["tolerance_passed"] = m["tolerance_passed"]
            row["stage_passed"] = e["passed"] if kind == "impl" else None
            rows.append(row)
    return rows


# --------------------------------------------------------------------------- summary
def _worst(values):
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return max(vals) if vals else math.nan


def _least(values):
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return min(vals) if vals else math.nan


def _worst_usage(entries: list[tuple[int, dict]]) -> tuple[float, int | None]:
    """The largest budget usage (value / limit over every check) among (case, judged
    entry) pairs, and the case it happens in; (NaN, None) when nothing was judged."""
    usage = [(max((number(ch["usage"]) for ch in e["checks"]), default=math.nan), i) for i, e in entries]
    judged = [(u, i) for u, i in usage if not math.isnan(u)]
    return max(judged) if judged else (math.nan, None)


def summarize(stages: list[str], cases: list[dict]) -> dict[str, Any]:
    """Per stage (and end to end), the worst over cases: budget usage (value / limit,
    the largest over the stage's checks) and the case where it happens, the largest
    local / propagated / naive-local max abs, downstream rel L2, fp32 propagated max abs,
    and the cases over budget."""
    out: dict[str, Any] = {}
    for name in stages:
        entries = [(c["case"], next(s for s in c["stages"] if s["stage"] == name)) for c in cases]
        worst_usage, worst_case = _worst_usage(entries)
        def worst(kind, key):
            return _worst(number(s[kind][key]) if s.get(kind) else None for _, s in entries)
        out[name] = {
            "usage": worst_usage, "worst_case": worst_case,
            "local_max_abs": worst("local", "max_abs"),
            "local_ulp_p99": worst("local", "ulp_p99"),
            "propagated_max_abs": worst("propagated", "max_abs"),
            "naive_local_max_abs": worst("naive_local", "max_abs"),
            "fp32_propagated_max_abs": worst("fp32_propagated", "max_abs"),
            "downstream_rel_l2": worst("downstream", "rel_l2"),
            "downstream_max_abs": worst("downstream", "max_abs"),
            "scale": worst("local", "scale") if any(s.get("local") for _, s in entries) else worst("propagated", "scale"),
            "cases_over": [i for i, s in entries if s["passed"] is False],
            "judged": any(s["passed"] is not None for _, s in entries),
            "precision": "/".join(sorted({s["precision"] for _, s in entries if s.get("precision")})) or None,
        }
    e2e = [(c["case"], c["end_to_end"]) for c in cases]
    worst_usage, worst_case = _worst_usage(e2e)
    def wf(kind, key, fn=_worst):
        return fn(number(e[kind][key]) if e.get(kind) else None for _, e in e2e)
    out["end_to_end"] = {
        "usage": worst_usage, "worst_case": worst_case,
        "max_abs": wf("impl", "max_abs"),
        "min_matched_ratio": wf("impl", "matched_ratio", _least),
        "naive_max_abs": wf("naive", "max_abs"),
        "reference_fp32_max_abs": wf("reference_fp32", "max_abs"),
        "torch_max_abs": wf("torch", "max_abs"),
        "torch_min_matched_ratio": wf("torch", "matched_ratio", _least),
        "cases_over": [i for i, e in e2e if not e["passed"]],
        "tolerance_failed": [i for i, e in e2e if e.get("tolerance_passed") is False],
    }
    return out
