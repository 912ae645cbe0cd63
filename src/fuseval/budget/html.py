"""A self-contained HTML page for a budget report: tables plus plots as inline PNGs.

Plots (matplotlib's Agg canvas through the object API, so a notebook's backend is left
alone):

1. per-stage error bars, worst case over the cases: local, propagated and the naive's
   local error, each as max |err| / max |oracle| of the stage, with the allowance's limit
   on local max abs marked;
2. error histograms per stage (log10 |err|, summed over cases), local against propagated;
3. error against sequence length and against batch across the cases: the final outputs'
   max abs error of the implementation and of the baselines, and each stage's budget
   usage against sequence length.

The page reads only the report's JSON dict, so ``render_html(load_report(path))`` works
on a saved report.
"""
from __future__ import annotations

import base64
import html
import io
import math
import threading
from typing import Any

import numpy as np

from ..jsonio import number
from .markdown import _cases, _e, _pct, render_markdown

__all__ = ["render_html"]

_COLORS = {"local": "#1f77b4", "propagated": "#ff7f0e", "naive_local": "#7f7f7f", "fp32": "#2ca02c",
           "torch": "#9467bd", "naive": "#7f7f7f", "impl": "#d62728"}


def _figure(w: float, h: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(w, h), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _log_scale(ax, *, x: bool = False, y: bool = False) -> None:
    """Log axes (x in base 2: token counts) labelled in plain text ("0.001", "256", and the
    minor ticks of a span too short for two labels): matplotlib's default log labels are
    mathtext, whose layout took a large share of a page's rendering time."""
    from matplotlib.ticker import LogFormatter
    for on, set_scale, axis, base in ((x, ax.set_xscale, ax.xaxis, 2), (y, ax.set_yscale, ax.yaxis, 10)):
        if on:
            set_scale("log", base=base)
            axis.set_major_formatter(LogFormatter(base=base))
            axis.set_minor_formatter(LogFormatter(base=base, labelOnlyBase=False))


def _positive(v: float) -> float:
    """Log axes cannot show 0 or NaN: map them to NaN so nothing is drawn."""
    return v if v > 0 and math.isfinite(v) else math.nan


def _stage_rows(d: dict, name: str) -> list[dict]:
    return [next(s for s in c["stages"] if s["stage"] == name) for c in d["cases"]]


def _bars(d: dict) -> str | None:
    names = d["stages"]
    if not d["staged"]:
        return None
    series = {"local": [], "propagated": [], "naive_local": [], "limit": []}
    for name in names:
        worst = {k: math.nan for k in series}
        for s in _stage_rows(d, name):
            for kind in ("local", "propagated", "naive_local"):
                m = s.get(kind)
                if m and number(m["scale"]) > 0:
                    v = number(m["max_abs"]) / number(m["scale"])
                    worst[kind] = v if math.isnan(worst[kind]) else max(worst[kind], v)
            for ch in s["checks"]:
                if ch["metric"] == "max_abs" and ch["applies_to"] == "local" and s.get("local") \
                        and number(s["local"]["scale"]) > 0:
                    v = number(ch["limit"]) / number(s["local"]["scale"])
                    worst["limit"] = v if math.isnan(worst["limit"]) else min(worst["limit"], v)
        for k in series:
            series[k].append(worst[k])
    fig = _figure(max(6.0, 0.9 * len(names) + 2), 3.6)
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(names))
    w = 0.27
    for i, (kind, label) in enumerate((("local", "local"), ("propagated", "propagated"),
                                       ("naive_local", "naive (local)"))):
        ax.bar(x + (i - 1) * w, [_positive(v) for v in series[kind]], w, label=label, color=_COLORS[kind])
    ax.scatter(x - w, [_positive(v) for v in series["limit"]], marker="_", s=400, color="black", zorder=3,
               label="allowance (local max abs)")
    _log_scale(ax, y=True)
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel("max |err| / max |oracle|")
    ax.set_title("Per-stage error, worst case over the cases")
    ax.legend(fontsize=8, ncol=4, loc="lower left", bbox_to_anchor=(0, 1.08), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def _histograms(d: dict) -> str | None:
    if not d["staged"]:
        return None
    edges = d["histogram_edges_log10"]
    centers = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
    names = d["stages"]
    totals = {}
    for name in names:
        for kind in ("local", "propagated"):
            counts = [0] * (len(edges) - 1)
            for s in _stage_rows(d, name):
                m = s.get(kind)
                if m and m.get("hist"):
                    counts = [a + b for a, b in zip(counts, m["hist"])]
            totals[name, kind] = counts
    used = [i for counts in totals.values() for i, c in enumerate(counts) if c]
    if not used:
        return None
    lo, hi = edges[max(0, min(used) - 2)], edges[min(len(edges) - 1, max(used) + 3)]
    cols = min(5, len(names))
    rows = -(-len(names) // cols)
    fig = _figure(3.0 * cols, 2.2 * rows)
    legend_drawn = False
    for i, name in enumerate(names):
        ax = fig.add_subplot(rows, cols, i + 1)
        for kind in ("local", "propagated"):
            if any(totals[name, kind]):
                ax.step(centers, totals[name, kind], where="mid", color=_COLORS[kind], label=kind)
        ax.set_xlim(lo, hi)
        ax.set_title(name, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("log10 |err|", fontsize=7)
        if not legend_drawn and ax.get_legend_handles_labels()[0]:   # the first panel with a curve
            ax.legend(fontsize=7)
            legend_drawn = True
    # fixed gaps for the panels' titles and labels (tight_layout measured every label of
    # every panel: a third of the page's time); savefig's tight box trims the margins
    fig.subplots_adjust(hspace=0.75, wspace=0.3)
    return _png(fig)


def _against_cases(d: dict) -> str | None:
    cases = d["cases"]
    if not cases:
        return None
    axes_names = list(cases[0]["axes"])
    if not axes_names:
        return None
    seq = next((a for a in ("seq_len", "kv_seq_len") if a in axes_names), axes_names[0])
    batch = "batch_size" if "batch_size" in axes_names else None
    panels = [seq] + ([batch] if batch else [])
    fig = _figure(4.2 * (len(panels) + (1 if d["staged"] else 0)), 3.4)
    for p, axis in enumerate(panels):
        ax = fig.add_subplot(1, len(panels) + (1 if d["staged"] else 0), p + 1)
        drawn: list[float] = []
        for kind, label in (("impl", "implementation"), ("naive", "naive"), ("reference_fp32", "float32 ref"),
                            ("torch", "plain torch")):
            xs, ys = [], []
            for c in cases:
                m = c["end_to_end"].get(kind)
                if m:
                    xs.append(c["axes"][axis])
                    ys.append(_positive(number(m["max_abs"])))
            drawn += [y for y in ys if not math.isnan(y)]
            if xs:
                ax.scatter(xs, ys, label=label, s=18, color=_COLORS.get(kind if kind != "reference_fp32" else "fp32"),
                           marker="o" if kind == "impl" else "x")
        if drawn:                  # every error exactly 0: nothing to put on log axes
            _log_scale(ax, x=True, y=True)
        ax.set_xlabel(axis)
        ax.set_ylabel("final max |err|")
        ax.grid(alpha=0.3)
        if p == 0:
            ax.legend(fontsize=7)
    if d["staged"]:
        ax = fig.add_subplot(1, len(panels) + 1, len(panels) + 1)
        for name in d["stages"]:
            pts = sorted((c["axes"][seq], max((number(ch["usage"]) for ch in s["checks"]), default=math.nan))
                         for c, s in zip(cases, _stage_rows(d, name)))
            ax.plot([x for x, _ in pts], [_positive(u) for _, u in pts], marker=".", label=name)
        ax.axhline(1.0, color="black", lw=1)
        _log_scale(ax, x=True, y=True)
        ax.set_xlabel(seq)
        ax.set_ylabel("budget usage (error / allowance)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.subplots_adjust(wspace=0.35)        # room for each panel's y label (see _histograms)
    return _png(fig)


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


# matplotlib is not thread-safe: one page's plots at a time (the gate may run budgets in threads)
_RENDERING = threading.Lock()


def render_html(d: dict[str, Any]) -> str:
    with _RENDERING:
        return _render_html(d)


def _render_html(d: dict[str, Any]) -> str:
    esc = html.escape
    s = d["summary"]
    bs = d["budget_summary"]
    verdict_cls = "ok" if d["passed"] else "bad"
    first = d["first_over_budget"]
    verdict = "within budget" if d["passed"] else f"OVER BUDGET (first at {first})"
    parts = [f"<h1>fuseval budget: {esc(d['op'])} &middot; {esc(d['impl'])}</h1>",
             f"<p class='{verdict_cls}'>{esc(verdict)}</p>",
             f"<p>config <code>{esc(d['config'])}</code>, {esc(d['mode'])} inputs, seed {d['seed']}, "
             f"device {esc(d['device'])} ({esc(d['device_name'])}), torch {esc(d['torch_version'])}, "
             f"{len(d['cases'])} cases in {number(d['seconds']):.1f} s; budget <code>{esc(str(d['budget'].get('source')))}</code>.</p>"]
    if d["staged"]:
        rows = []
        for name in d["stages"]:
            st = s[name]
            over = st["cases_over"]
            rows.append([esc(name), esc(bs[name]["dtype"]), esc(bs[name]["operand_dtype"]),
                         esc("; ".join(bs[name]["allowances"])), _pct(st["usage"]), str(st["worst_case"]),
                         _e(st["local_max_abs"]), _e(st["local_ulp_p99"]), _e(st["naive_local_max_abs"]),
                         _e(st["propagated_max_abs"]), _e(st["fp32_propagated_max_abs"]),
                         _e(st["downstream_rel_l2"]),
                         "<span class='ok'>pass</span>" if not over else
                         f"<span class='bad'>OVER</span> ({esc(_cases(over))})"])
        parts.append("<h2>Stages (worst case over the cases)</h2>")
        parts.append(_table(["stage", "dtype", "naive operands", "allowance", "used", "worst case",
                             "local max abs", "local p99 ulp", "naive local", "propagated", "fp32 ref (prop.)",
                             "downstream rel L2", "verdict"], rows))
    else:
        parts.append("<p>The implementation exposes no stage taps: end-to-end verdict only.</p>")
    for title, png in (("Per-stage error: local vs propagated", _bars(d)),
                       ("Error histograms", _histograms(d)),
                       ("Error across cases", _against_cases(d))):
        if png:
            parts.append(f"<h2>{esc(title)}</h2><img src='{png}' alt='{esc(title)}'>")
    rows = []
    for c in d["cases"]:
        e = c["end_to_end"]
        m = e.get("impl") or {}
        rows.append([str(c["case"]), esc(" ".join(f"{k}={v}" for k, v in c["axes"].items())),
                     "<span class='ok'>pass</span>" if c["passed"] else f"<span class='bad'>{esc(str(c['first_over_budget'] or 'raised'))}</span>",
                     _e(m.get("max_abs")), _pct(m.get("matched_ratio")),
                     _e((e.get("naive") or {}).get("max_abs")), _e((e.get("reference_fp32") or {}).get("max_abs")),
                     _e((e.get("torch") or {}).get("max_abs")), f"{sum(number(v) for v in c['seconds'].values()):.2f}"])
    parts.append("<h2>Cases</h2>")
    parts.append(_table(["case", "axes", "verdict / first over budget", "final max abs", "matched",
                         "naive", "fp32 ref", "torch", "seconds"], rows))
    parts.append("<h2>Markdown summary</h2><pre>" + esc(render_markdown(d)) + "</pre>")
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}"
             "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;"
             "text-align:right}th{background:#f4f4f4}td:first-child{text-align:left}"
             ".ok{color:#1a7f37;font-weight:600}.bad{color:#cf222e;font-weight:600}img{max-width:100%}"
             "pre{background:#f6f8fa;padding:1em;overflow-x:auto;font-size:12px}")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>fuseval budget {esc(d['op'])} {esc(d['impl'])}</title><style>{style}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")
