"""Rendering of a benchmark report (:class:`fuseval.bench.BenchReport`): the terminal
table, the error comparison, the summary lines (suite means, floors, sustained ceilings,
clocks, the fast path's options), the latency plot and the files of ``--out``.

Everything here reads a finished report; nothing measures.
"""
from __future__ import annotations

import io
import os
import statistics
from typing import TYPE_CHECKING

from ..jsonio import dumps
from ..terminal import console, fmt_err, fmt_number

if TYPE_CHECKING:
    from . import BenchReport

__all__ = ["print_bench_report", "summary_lines", "sustained_lines", "clock_lines", "fast_options_lines",
           "plot_report", "write_outputs"]


def _ms(x: float | None) -> str:
    """A latency in milliseconds: four significant digits."""
    return fmt_number(x, 3, "g")


def _ratio(x: float | None) -> str:
    """A ratio of latencies: three significant digits."""
    return fmt_number(x, 2, "g")


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def print_bench_report(report: BenchReport, stream=None) -> None:
    """The per-case table, the error comparison (when checked) and the summary lines."""
    from rich.markup import escape
    from rich.table import Table

    out = console(stream)
    c = report.ceilings
    title = f"{report.op} [{report.config}] on {report.device}, mode={report.mode}, seed={report.seed}"
    if c:
        rates = ", ".join(f"{k} {v / 1e12:.0f}" for k, v in c["matmul_flops_per_s"].items())
        title += f"\nceilings: copy {c['copy_bytes_per_s'] / 1e12:.2f} TB/s; matmul TFLOP/s: {rates}"
        if c.get("sustained_matmul_flops_per_s"):
            title += f"; sustained for {c['sustained_s']:g} s: " + ", ".join(
                f"{k} {v / 1e12:.0f}" for k, v in c["sustained_matmul_flops_per_s"].items())
    table = Table(title=escape(title))
    table.add_column("case", justify="right")
    table.add_column(",".join(report.cases[0].axes) if report.cases else "axes")
    for i in report.impls:
        table.add_column(f"{i} ms", justify="right")
    table.add_column("floor ms", justify="right")
    fast = report.fast
    show_sustained = bool(fast) and any(cb.floor_sustained_ms for cb in report.cases)
    if fast:
        table.add_column(f"{fast} % floor", justify="right")
        if show_sustained:
            table.add_column(f"{fast} % sust. floor", justify="right")
        for b in report.impls:
            if b != fast:
                table.add_column(f"x vs {b}", justify="right")
    show_mhz = bool(fast) and any(cb.clocks.get(fast) for cb in report.cases)
    if show_mhz:
        table.add_column(f"{fast} MHz", justify="right")
    if report.checked:
        table.add_column("check")
    for cb in report.cases:
        row = [str(cb.case), ",".join(str(v) for v in cb.axes.values())]
        row += ["REFUSED" if i in getattr(cb, "refused", {}) else _ms(cb.median(i)) for i in report.impls]
        row.append(_ms(cb.floor_ms))
        if fast:
            f = cb.median(fast)
            row.append(_percent(cb.floor_ms / f) if f and cb.floor_ms else "-")
            if show_sustained:
                row.append(_percent(cb.floor_sustained_ms / f) if f and cb.floor_sustained_ms else "-")
            for b in report.impls:
                if b != fast:
                    t = cb.median(b)
                    row.append(_ratio(t / f) if t and f else "-")
        if show_mhz:
            c = cb.clocks.get(fast)
            row.append(f"{c['sm_mhz_median']:.0f}" if c else "-")
        if report.checked:
            failed = [k for k, v in cb.check.items() if not v["passed"]]
            row.append("FAIL " + ",".join(failed) if failed else "ok")
        table.add_row(*row)
    s = report.summary()
    means = s["suite_mean_ms"]
    table.add_row("mean", "", *[_ms(means[i]) for i in report.impls], _ms(s["floor_mean_ms"]),
                  *([_percent((s.get("fraction_of_floor") or {}).get(fast))] if fast else []),
                  *([_percent((s.get("fraction_of_sustained_floor") or {}).get(fast))] if show_sustained else []),
                  *([_ratio((s.get("speedup_of_fast") or {}).get(b)) for b in report.impls if b != fast]
                    if fast else []),
                  *([""] if show_mhz else []), *([""] if report.checked else []))
    out.print(table)
    for cb in report.cases:
        for impl, err in cb.errors.items():
            refusals = getattr(cb, "refused", {}).get(impl)
            if refusals:
                for reason, message in refusals:
                    out.print(f"case {cb.case}: {impl}: timing refused ({reason}): {message}", markup=False,
                              highlight=False)
            else:
                out.print(f"case {cb.case}: {impl} was not timed: {err}", markup=False, highlight=False)
    if report.checked:
        _print_error_table(report, out)
    _print_parts_table(report, out)
    for line in summary_lines(report):
        out.print(line, markup=False, highlight=False)


def _print_parts_table(report: BenchReport, out) -> None:
    """The fast path's parts per case: GPU time (graph replay), each against its own floor."""
    from rich.table import Table
    names = list(dict.fromkeys(n for cb in report.cases for n in cb.parts))
    if not names:
        return
    table = Table(title=f"{report.fast}: its parts timed apart (GPU time of CUDA-graph replays, host work left "
                        "out; % of each part's own floor)")
    table.add_column("case", justify="right")
    for n in names:
        table.add_column(f"{n} ms", justify="right")
        table.add_column("% floor", justify="right")
    table.add_column("sum ms", justify="right")
    table.add_column(f"{report.fast} ms", justify="right")
    for cb in report.cases:
        if not cb.parts:
            continue
        row, total = [str(cb.case)], 0.0
        for n in names:
            p = cb.parts.get(n) or {}
            t, floor = p.get("median_ms"), p.get("floor_ms")
            total = total + t if t is not None and total is not None else None
            row += [_ms(t), _percent(floor / t) if t and floor else "-"]
        table.add_row(*row, _ms(total), _ms(cb.median(report.fast)))
    out.print(table)
    for cb in report.cases:
        for n, p in cb.parts.items():
            if p.get("error"):
                out.print(f"case {cb.case}: part {n} was not timed: {p['error']}", markup=False, highlight=False)
    whats = {n: p.get("what") for cb in report.cases for n, p in cb.parts.items() if p.get("what")}
    for n, what in whats.items():
        out.print(f"part {n}: {what}", markup=False, highlight=False)


def _print_error_table(report: BenchReport, out) -> None:
    from rich.table import Table
    table = Table(title="errors against the float64 oracle (max abs / matched ratio)")
    table.add_column("case", justify="right")
    table.add_column("output")
    for i in report.impls:
        table.add_column(i, justify="right")
    for cb in report.cases:
        names = next((list(v["outputs"]) for v in cb.check.values() if v["outputs"]), [])
        for j, o in enumerate(names):
            cells = []
            for i in report.impls:
                m = cb.check.get(i, {}).get("outputs", {}).get(o)
                cells.append("-" if m is None else f"{fmt_err(m['max_abs'])} / {m['matched_ratio']:.4%}")
            table.add_row(str(cb.case) if j == 0 else "", o, *cells)
    out.print(table)
    for cb in report.cases:
        for impl, v in cb.check.items():
            for msg in v["messages"]:
                out.print(f"case {cb.case}: {impl}: {msg}", markup=False, highlight=False)


def summary_lines(report: BenchReport) -> list[str]:
    s = report.summary()
    lines = [f"{report.op}: suite mean over {len(report.cases)} cases: " + ", ".join(
        f"{i} {_ms(m)} ms" for i, m in s["suite_mean_ms"].items())
        + (f", floor {_ms(s['floor_mean_ms'])} ms" if s["floor_mean_ms"] is not None else "")]
    if s.get("fraction_of_floor") and report.fast and s["fraction_of_floor"].get(report.fast):
        lines.append(f"{report.fast} reaches {_percent(s['fraction_of_floor'][report.fast])} of the floor "
                     "(floor mean / suite mean)")
    for dtype, floor in (s.get("floor_mean_at_ms") or {}).items():
        rate = ((report.ceilings or {}).get("matmul_flops_per_s") or {}).get(dtype)
        frac = (s["fraction_of_floor_at"].get(dtype) or {}).get(report.fast) if report.fast else None
        lines.append(f"floor at the {dtype} rate" + (f" ({rate / 1e12:.0f} TFLOP/s)" if rate else "")
                     + f": {_ms(floor)} ms (suite mean)" + (f"; {report.fast} reaches {_percent(frac)} of it"
                                                             if frac else ""))
    lines.extend(sustained_lines(report))
    if s.get("speedup_of_fast"):
        lines.append(f"{report.fast} is " + ", ".join(
            f"{_ratio(v)}x faster than {k}" for k, v in s["speedup_of_fast"].items() if v) + " (ratio of suite means)")
    if s.get("cases_passed"):
        lines.append("check: " + ", ".join(f"{i} {n}/{s['cases']} cases passed"
                                           for i, n in s["cases_passed"].items()))
        if report.fast:
            lines.extend(_error_comparison(report))
    lines.extend(clock_lines(report))
    lines.extend(fast_options_lines(report))
    lines.extend(timing_lines(report))
    return lines


def timing_lines(report: BenchReport) -> list[str]:
    """How the times were taken and judged, and which were refused."""
    t = (report.settings or {}).get("timing")
    if not t:
        return []
    lines = [f"timing: each implementation in its own confined worker; calls rotate over {t['rotation_sets']} "
             f"input sets with every call's activations rescaled, {t['checked_calls']} timed calls per case "
             f"checked against the oracle after the loop, {t['watched_calls']} calls watched on every stream; "
             f"a median below the floor by more than {t['floor_margin']:.0%} is refused"]
    for impl in report.impls:
        over = [cb.timed[impl]["overhead_ms"] for cb in report.cases
                if impl in getattr(cb, "timed", {}) and cb.timed[impl].get("overhead_ms") is not None]
        if over:
            lines.append(f"{impl}: outside the timed interval (flush, rotation, host) {_ms(sorted(over)[len(over) // 2])} "
                         "ms per call (median over the cases), never inside it")
    refused = sorted({(impl, r) for cb in report.cases for impl, rs in getattr(cb, "refused", {}).items()
                      for r, _ in rs})
    if refused:
        lines.append("TIMING REFUSED: " + ", ".join(f"{impl} ({r})" for impl, r in refused))
    return lines


def fast_options_lines(report: BenchReport, width: int = 80) -> list[str]:
    """The fast path's options in force while it was timed (tile tables, precision
    policy), as its operator declares them, in one line: each option whose value is
    short as ``key=value``, the long ones (tile tables) by name only, their values being
    in bench.json. Nothing when no fast path was timed."""
    if not report.fast or report.fast_options is None:
        return []
    if not report.fast_options:
        return [f"fast options: none declared (the operator's spec names no fast_options for {report.fast!r})"]
    shown, by_name = [], []
    for key in sorted(report.fast_options):
        value = report.fast_options[key]
        text = value if isinstance(value, str) else dumps(value, indent=None, sort_keys=True)
        if len(text) <= width:
            shown.append(f"{key}={text}")
        else:
            by_name.append(key)
    parts = shown + ([f"in bench.json: {', '.join(by_name)}"] if by_name else [])
    return ["fast options: " + "; ".join(parts)]


def sustained_lines(report: BenchReport) -> list[str]:
    """The sustained matmul ceilings against the burst ones, with the clock and power they
    ran at, and the fast path's fraction of the floor at that rate."""
    c = report.ceilings or {}
    steady = c.get("sustained_matmul_flops_per_s") or {}
    if not steady:
        return []
    clocks = ((report.settings.get("clocks") or {}).get("sustained_ceilings")) or {}
    parts = []
    for dtype, rate in steady.items():
        burst = c["matmul_flops_per_s"].get(dtype)
        w = clocks.get(dtype)
        where = f" at {w['sm_mhz_median']:.0f} MHz, {w['power_w_median'] or 0:.0f} W" if w else ""
        parts.append(f"{dtype} {rate / 1e12:.0f} TFLOP/s" + (f" ({_percent(rate / burst)} of the burst ceiling)"
                                                            if burst else "") + where)
    lines = [f"sustained ceilings (second half of {c['sustained_s']:g} s of back-to-back products): "
             + "; ".join(parts)]
    s = report.summary()
    frac = (s.get("fraction_of_sustained_floor") or {}).get(report.fast) if report.fast else None
    if s.get("sustained_floor_mean_ms") is not None:
        lines.append(f"floor at the sustained rate: {_ms(s['sustained_floor_mean_ms'])} ms (suite mean)"
                     + (f"; {report.fast} reaches {_percent(frac)} of it" if frac else "")
                     + ". It binds only the cases whose kernels draw the GPU to its power cap (their clock "
                       "falls below the ceilings'); a kernel that runs at full clock can go below it")
    return lines


def clock_lines(report: BenchReport) -> list[str]:
    """What the SM clock was while the ceilings and each implementation were timed: a
    floor measured in a burst at a high clock is not what a power-capped case runs at."""
    clocks = report.settings.get("clocks") or {}
    if not clocks.get("sampled"):
        why = clocks.get("unavailable")
        return [f"GPU clocks not sampled ({why})"] if why else []
    def span(summaries):
        got = [c for c in summaries if c]
        if not got:
            return None
        return (min(c["sm_mhz_min"] for c in got), statistics.median(c["sm_mhz_median"] for c in got),
                max(c["sm_mhz_max"] for c in got), max((c["power_w_max"] or 0) for c in got))
    parts = []
    ceil = span([clocks.get("ceilings")])
    if ceil:
        parts.append(f"ceilings {ceil[1]:.0f} MHz (median; {ceil[0]:.0f}-{ceil[2]:.0f})")
    for impl in report.impls:
        sp = span([cb.clocks.get(impl) for cb in report.cases])
        if sp:
            parts.append(f"{impl} {sp[1]:.0f} MHz ({sp[0]:.0f}-{sp[2]:.0f}, up to {sp[3]:.0f} W)")
    if not parts:
        return ["GPU clocks sampled, but no sample fell inside a timing (intervals shorter than the sampling period)"]
    limit = clocks.get("power_limit_w")
    return ["SM clock while timed: " + "; ".join(parts) + (f"; power limit {limit:.0f} W" if limit else "")]


def _error_comparison(report: BenchReport) -> list[str]:
    """Per baseline: in how many (case, output) pairs the fast path's max abs error is no
    larger and its matched ratio no smaller than the baseline's."""
    lines = []
    for b in report.impls:
        if b == report.fast:
            continue
        total = not_worse_max = not_worse_ratio = 0
        for cb in report.cases:
            f, o = cb.check.get(report.fast), cb.check.get(b)
            if not f or not o:
                continue
            for name, mf in f["outputs"].items():
                mo = o["outputs"].get(name)
                if mo is None:
                    continue
                total += 1
                not_worse_max += mf["max_abs"] <= mo["max_abs"]
                not_worse_ratio += mf["matched_ratio"] >= mo["matched_ratio"]
        if total:
            lines.append(f"errors: {report.fast} vs {b}: max abs error no larger in {not_worse_max}/{total}, "
                         f"matched ratio no smaller in {not_worse_ratio}/{total} (case, output) pairs")
    return lines


def plot_report(report: BenchReport, path: str) -> str:
    """Latency per case (log scale) of every implementation, and the floor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{c.case}\n" + "\n".join(f"{v}" for v in c.axes.values()) for c in report.cases]
    xs = list(range(len(report.cases)))
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(xs) + 3), 5))
    for impl in report.impls:
        ys = [c.median(impl) for c in report.cases]
        ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None],
                marker="o", label=f"{impl} (mean {_ms(report.suite_mean(impl))} ms)")
    floors = [c.floor_ms for c in report.cases]
    if any(f is not None for f in floors):
        ax.plot([x for x, f in zip(xs, floors) if f is not None], [f for f in floors if f is not None],
                linestyle="--", color="black", label=f"floor (mean {_ms(report.floor_mean())} ms)")
    sustained = [c.floor_sustained_ms for c in report.cases]
    if any(f is not None for f in sustained):
        ax.plot([x for x, f in zip(xs, sustained) if f is not None], [f for f in sustained if f is not None],
                linestyle=":", color="gray",
                label=f"floor at the sustained matmul rate (mean {_ms(report.floor_mean(sustained=True))} ms)")
    ax.set_yscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_xlabel("case (" + ", ".join(report.cases[0].axes) + ")" if report.cases else "case")
    ax.set_ylabel("median latency (ms, log)")
    ax.set_title(f"{report.op} on {report.device}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_outputs(report: BenchReport, out_dir: str, *, plot: bool = True) -> list[str]:
    """bench.json (everything, strict JSON), bench.txt (the terminal table) and bench.png under out_dir."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    p = os.path.join(out_dir, "bench.json")
    with open(p, "w") as f:
        f.write(dumps(report.to_dict(), indent=1) + "\n")
    paths.append(p)
    buf = io.StringIO()
    print_bench_report(report, buf)
    p = os.path.join(out_dir, "bench.txt")
    with open(p, "w") as f:
        f.write(buf.getvalue())
    paths.append(p)
    if plot and report.cases:
        paths.append(plot_report(report, os.path.join(out_dir, "bench.png")))
    return paths
