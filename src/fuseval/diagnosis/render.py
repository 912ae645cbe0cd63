"""A diagnosis as text (short for ``fuseval check``, full for ``fuseval diagnose``), as
plots of the error over each axis (PNG, matplotlib) and as one HTML page."""
from __future__ import annotations

import base64
import html
import io
import os
from typing import Sequence

__all__ = ["short_lines", "full_lines", "plot_axes", "write_html", "write_png"]


def _finding_text(f) -> str:
    return f"{f.text} [{f.agreement:.1%}]"


def short_lines(d, top: int = 2) -> list[str]:
    lines = [f"diagnosis: {d.verdict}: {d.summary}"]
    for a in d.outputs:
        if not a.failing:
            continue
        found = [f for f in a.findings][:top]
        text = "; ".join(_finding_text(f) for f in found) if found else "no structure fits"
        lines.append(f"  {a.name}: {a.failing}/{a.numel} elements fail, {a.location()}; {text}")
    return lines


def full_lines(d) -> list[str]:
    lines = [f"{d.op} case {d.case}: {d.verdict}", f"  {d.summary}"]
    for a in d.outputs:
        lines.append(f"output {a.name} {list(a.shape)} ({', '.join(a.axis_names)}): {a.failing}/{a.numel} elements "
                     f"fail ({1 - a.matched_ratio:.2%}); relative RMS error {a.rel_rms:.3g} ({a.level} level)")
        for loc in a.axes:
            lines.append(f"  along {loc.name} ({loc.size}): {loc.describe()}")
        if a.failing:
            lines.append(f"  region fitted: {a.region} (the oracle agrees on {a.baseline:.1%} of it)")
        for f in a.findings:
            lines.append(f"  - {f.kind}: {_finding_text(f)}")
    if d.matches:
        lines.append("known mistakes, by agreement with the output (the oracle itself: "
                     f"{d.oracle_agreement:.2%}):")
        for k, m in enumerate(d.matches):
            status = m.error if m.error else ("" if m.visible else "  (not visible on these inputs: passes)")
            stage = m.stage or m.kind
            lines.append(f"  {k + 1:2d}. {m.name:34s} {stage:12s} {m.agreement:8.2%}  rel L2 {m.rel_l2:.3g}{status}")
    for dep in d.dependence:
        lines.append(f"input dependence: {dep.text}")
    for n in d.notes:
        lines.append(f"note: {n}")
    if d.seconds:
        lines.append("time: " + ", ".join(f"{k} {v:.2f}s" for k, v in d.seconds.items()))
    return lines


def plot_axes(d, output: str | None = None):
    """A matplotlib figure: for each failing output (or ``output``), the share of failing
    elements along each axis (bars), the confined slices highlighted."""
    # a Figure of its own (no pyplot): no backend is chosen or changed for the caller
    from matplotlib.figure import Figure
    outs = [a for a in d.outputs if (output is None and a.failing) or a.name == output] or d.outputs[:1]
    n_axes = max(len(a.axes) for a in outs) or 1
    fig = Figure(figsize=(3.2 * n_axes, 2.4 * len(outs)))
    axs = fig.subplots(len(outs), n_axes, squeeze=False)
    for row, a in enumerate(outs):
        for col in range(n_axes):
            ax = axs[row][col]
            if col >= len(a.axes):
                ax.axis("off")
                continue
            loc = a.axes[col]
            colors = ["tab:red" if (loc.confined and i in loc.slices) else "tab:gray" for i in range(loc.size)]
            ax.bar(range(loc.size), loc.profile, color=colors, width=1.0)
            ax.set_title(f"{a.name}: {loc.name}", fontsize=8)
            ax.set_xlabel(loc.label, fontsize=7)
            ax.set_ylabel("share of failing", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.suptitle(f"{d.op} case {d.case}: {d.verdict}", fontsize=9)
    fig.tight_layout()
    return fig


def write_png(d, path: str) -> str:
    plot_axes(d).savefig(path, dpi=110)
    return path


def write_html(d, path: str, png: str | None = None) -> str:
    """One self-contained page: the full text and the plot embedded."""
    if png is None:
        buf = io.BytesIO()
        plot_axes(d).savefig(buf, format="png", dpi=110)
        data = buf.getvalue()
    else:
        with open(png, "rb") as f:
            data = f.read()
    img = base64.b64encode(data).decode()
    rows = "".join(f"<tr><td>{k + 1}</td><td>{html.escape(m.name)}</td><td>{html.escape(m.stage or m.kind)}</td>"
                   f"<td>{m.agreement:.2%}</td><td>{'' if m.visible else 'passes here'}</td></tr>"
                   for k, m in enumerate(d.matches))
    text = html.escape("\n".join(full_lines(d)))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(d.op)} case {d.case}</title>"
            "<style>body{font-family:sans-serif;margin:2em} pre{background:#f4f4f4;padding:1em}"
            "td{padding:2px 8px}</style></head><body>"
            f"<h1>{html.escape(d.op)} case {d.case}: {html.escape(d.verdict)}</h1><p>{html.escape(d.summary)}</p>"
            f"<img alt='error over each axis' src='data:image/png;base64,{img}'>"
            f"<h2>Known mistakes</h2><table><tr><th>#</th><th>mistake</th><th>stage</th><th>agreement</th><th></th></tr>"
            f"{rows}</table><h2>Full diagnosis</h2><pre>{text}</pre></body></html>")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(page)
    return path


def matches_table(rows: Sequence[dict]) -> str:
    """The rank table (benchmarks/diagnosis_ranks.py) as Markdown."""
    head = "| operator | mutant | stage | case | rank | top 1 | top-1 stage | agreement | verdict |\n|---|---|---|---|---|---|---|---|---|\n"
    return head + "".join(f"| {r['op']} | {r['mutant']} | {r['stage']} | {r['case']} | {r['rank']} | {r['top1']} | "
                          f"{r['top1_stage']} | {r['agreement']} | {r['verdict']} |\n" for r in rows)
