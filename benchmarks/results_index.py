#!/usr/bin/env python3
"""The results index: the "Latest official run per operator" table of benchmarks/results/README.md.

An *official run* is a ``bench.json`` written by ``fuseval bench`` (any ``*.json`` under the
results folder that holds an ``op`` and its ``cases``, and was not skipped) together with the
``bench.txt`` beside it. The table has one row per operator, its latest official run by date;
every figure in it is computed here from that run's ``cases`` (nothing is copied by hand):
the suite mean of each implementation (mean of the case medians) and its ratio to the fast
path, the floor mean (at the cost model's rate, the other rates the run measured, the
sustained rate), the fast path's share of the floor, and the verdicts of the check.

The table sits between two marker lines (:data:`BEGIN`, :data:`END`); the text outside them
is left as it is.

    python3 benchmarks/results_index.py            # rewrite the table from the files
    python3 benchmarks/results_index.py --check    # exit 1 if the README's table differs (CI)
    python3 benchmarks/results_index.py record DIR [--command CMD] [--date YYYY-MM-DD]

``record DIR`` makes the bench outputs in DIR (``bench.json``, ``bench.txt``, ``bench.log``;
``benchmarks/run_gpu.sh`` with ``RECORD=1`` calls it) the operator's official run: it copies
``bench.json`` (with a ``record`` entry: date, command, device) and ``bench.txt`` to
``RESULTS/<device>-<date>-<op>/``, removes the operator's previous official run (history is
in git) and rewrites the table. The command and the date come from the first line of
``bench.log`` that run_gpu.sh writes (``# run_gpu.sh <UTC time>: <command>``), else from
``--command`` / ``--date`` (the date defaults to today, UTC). It refuses a skipped bench or
one without cases.

Runs written before the ``record`` entry existed get their date from their folder's name
and a command rebuilt from the settings in their bench.json (marked as such).

Exit status: 0; 1 with ``--check`` when the table is out of date, or when ``record`` refuses
its input; 2 on a usage error (no markers in the README, no official run, unreadable JSON).
Standard library only: it runs where fuseval is not installed.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import difflib
import json
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BEGIN = "<!-- results-index: begin; written by benchmarks/results_index.py from the runs' bench.json, do not edit -->"
END = "<!-- results-index: end -->"
LOG_HEADER = re.compile(r"^# run_gpu\.sh (?P<started>\S+): (?P<command>.+)$")
DATE = re.compile(r"\b(\d{4}-\d{2}-\d{2})\b")

# `fuseval bench`'s option defaults (src/fuseval/commands/bench.py; a test keeps them equal),
# to rebuild the command of a run recorded without one
BENCH_DEFAULTS = {"warmup_ms": 30.0, "rep_ms": 150.0, "min_reps": 10, "max_reps": 500, "sustained_s": 4.0,
                  "config": "seed", "mode": "benchmark"}


class IndexProblem(Exception):
    """A usage error: exit status 2."""


# --------------------------------------------------------------------------- reading the runs
def is_official(data) -> bool:
    return isinstance(data, dict) and isinstance(data.get("op"), str) and bool(data.get("cases")) \
        and "skipped" not in data


def find_runs(results: Path) -> list[tuple[Path, dict]]:
    """(path, bench.json data) of every official run under ``results``, sorted by path."""
    runs = []
    for path in sorted(results.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise IndexProblem(f"{path}: not readable JSON ({exc})") from exc
        if is_official(data):
            runs.append((path, data))
    return runs


def run_date(path: Path, data: dict, results: Path) -> str:
    """The run's date: its ``record``'s, else the first date in its folder's path."""
    date = (data.get("record") or {}).get("date")
    if date:
        return date
    m = DATE.search(path.parent.relative_to(results).as_posix())
    return m.group(1) if m else "unknown"


def latest_per_operator(runs: list[tuple[Path, dict]], results: Path) -> dict[str, tuple[Path, dict]]:
    """Operator -> its latest run (by date, then the recorded start time, then path)."""
    def key(run):
        path, data = run
        return (run_date(path, data, results), (data.get("record") or {}).get("started_utc") or "", str(path))
    latest: dict[str, tuple[Path, dict]] = {}
    for run in sorted(runs, key=key):
        latest[run[1]["op"]] = run
    return dict(sorted(latest.items()))


# --------------------------------------------------------------------------- the figures
def _mean(values):
    values = list(values)
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def _fmt(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.4g}"


def _median(case: dict, impl: str):
    return ((case.get("timings") or {}).get(impl) or {}).get("median_ms")


def suite_means(data: dict) -> dict[str, float | None]:
    return {impl: _mean(_median(c, impl) for c in data["cases"]) for impl in data.get("impls", [])}


def floor_dtype(data: dict) -> str | None:
    """The matmul dtype whose measured rate the floors divide the FLOPs by (from a compute-bound case)."""
    rates = ((data.get("ceilings") or {}).get("matmul_flops_per_s") or {})
    for c in data["cases"]:
        if c.get("bound") == "compute" and c.get("flops") and c.get("floor_ms"):
            rate = c["flops"] / (c["floor_ms"] / 1e3)
            for dtype, r in rates.items():
                if r and abs(rate / r - 1) < 1e-6:
                    return dtype
    return None


def _ratio(x: float) -> str:
    return f"{x:.2f}" if x >= 0.1 else f"{x:.2g}"


def _sci(x: float) -> str:
    return re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{x:.1e}")


def _tflops(rate: float | None) -> str:
    return f"{rate / 1e12:.0f} TFLOP/s"


def _cases_arg(indices: list[int]) -> str:
    spans, start = [], None
    for i, x in enumerate(indices):
        if start is None:
            start = x
        if i + 1 == len(indices) or indices[i + 1] != x + 1:
            spans.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ",".join(spans)


def rebuilt_command(data: dict) -> str:
    """The `fuseval bench` command of a run, rebuilt from its bench.json's settings."""
    s, ceil = data.get("settings") or {}, data.get("ceilings") or {}
    args = ["fuseval bench", f"--op {data['op']}", f"--impls {','.join(data.get('impls', []))}",
            f"--cases {_cases_arg([c['case'] for c in data['cases']])}"]
    for key in ("config", "mode"):
        if data.get(key, BENCH_DEFAULTS[key]) != BENCH_DEFAULTS[key]:
            args.append(f"--{key} {data[key]}")
    if s.get("check"):
        args.append("--check" + ("" if s.get("hygiene", True) else " --no-hygiene"))
    if s.get("l2_flush_bytes") == 0:
        args.append("--no-flush")
    for key in ("warmup_ms", "rep_ms", "min_reps", "max_reps"):
        if key in s and s[key] != BENCH_DEFAULTS[key]:
            args.append(f"--{key.replace('_', '-')} {s[key]:g}")
    if "sustained_s" in ceil and ceil["sustained_s"] != BENCH_DEFAULTS["sustained_s"]:
        args.append(f"--sustained-s {ceil['sustained_s']:g}")
    return " ".join(args)


def _code(text: str) -> str:
    return f"`{text.replace('|', chr(92) + '|')}`"


def row(path: Path, data: dict, results: Path, readme_dir: Path) -> list[str]:
    """The table's cells for one run."""
    cases, impls, fast = data["cases"], list(data.get("impls", [])), data.get("fast")
    n = len(cases)
    record = data.get("record") or {}
    operator = _code(data["op"]) + ("" if data.get("config", "seed") == "seed" else f", config {data['config']}") \
        + ("" if data.get("mode", "benchmark") == "benchmark" else f", {data['mode']} inputs")
    device = record.get("device") or data.get("device") or (data.get("ceilings") or {}).get("device_name") or "-"
    command = _code(record["command"]) if record.get("command") else \
        f"{_code(rebuilt_command(data))} (rebuilt from its settings)"

    means = suite_means(data)
    order = ([fast] if fast in means else []) + [i for i in impls if i != fast]
    parts = []
    for impl in order:
        m = means[impl]
        if impl == fast:
            parts.append(f"{impl} **{_fmt(m)}**")
        else:
            ratio = f" ({_ratio(m / means[fast])}x)" if means.get(fast) and m else ""
            parts.append(f"{impl} {_fmt(m)}{ratio}")
    suite = ", ".join(parts)

    ceil = data.get("ceilings") or {}
    floor = _mean(c.get("floor_ms") for c in cases)
    fl, share = "-", "-"
    if floor is not None:
        dtype = floor_dtype(data)
        rate = (ceil.get("matmul_flops_per_s") or {}).get(dtype) if dtype else None
        fl = _fmt(floor) + (f" ({dtype} {_tflops(rate)})" if rate else "")
        also = sorted({d for c in cases for d in (c.get("floors_at_ms") or {})})
        for d in also:
            fa = _mean((c.get("floors_at_ms") or {}).get(d) for c in cases)
            if fa is not None:
                fl += f"; {_fmt(fa)} at the {d} rate"
        sustained = _mean(c.get("floor_sustained_ms") for c in cases)
        srate = (ceil.get("sustained_matmul_flops_per_s") or {}).get(dtype) if dtype else None
        if sustained is not None and srate:
            clock = ((((data.get("settings") or {}).get("clocks") or {}).get("sustained_ceilings") or {})
                     .get(dtype) or {}).get("sm_mhz_median")
            fl += f"; {_fmt(sustained)} at the sustained {dtype} rate ({_tflops(srate)}" \
                  + (f" at {clock:.0f} MHz)" if clock else ")")
        if fast in means and means[fast]:
            share = f"{100 * floor / means[fast]:.1f}%"
            if sustained is not None and srate:
                share += f" ({100 * sustained / means[fast]:.1f}% of the sustained floor)"

    checked = any(c.get("check") for c in cases)
    if checked:
        verdicts = ", ".join(f"{impl} {sum(1 for c in cases if ((c.get('check') or {}).get(impl) or {}).get('passed'))}"
                             f"/{n}" for impl in order)
        errors = [m["max_abs"] for c in cases for m in
                  ((((c.get("check") or {}).get(fast) or {}).get("outputs")) or {}).values()]
        if errors:
            span = _sci(min(errors)) + ("" if _sci(min(errors)) == _sci(max(errors)) else f" to {_sci(max(errors))}")
            verdicts += f"; {fast}'s max abs error {span}"
        compared = []
        for b in order:
            if b == fast:
                continue
            total = no_larger = 0
            for c in cases:
                f, o = (c.get("check") or {}).get(fast), (c.get("check") or {}).get(b)
                if not f or not o:
                    continue
                for name, mf in (f.get("outputs") or {}).items():
                    mo = (o.get("outputs") or {}).get(name)
                    if mo is not None:
                        total += 1
                        no_larger += mf["max_abs"] <= mo["max_abs"]
            if total:
                compared.append(f"{b}'s in {no_larger}/{total}")
        if compared:
            verdicts += f", no larger than {' and '.join(compared)} (case, output) pairs"
    else:
        verdicts = "not checked"

    stem = path.stem
    rel = path.parent.relative_to(results).as_posix()
    txt = path.with_suffix(".txt").exists()
    sub = "" if path.parent == results else rel + "/"
    name = f"{stem}.{{json,txt}}" if txt else f"{stem}.json"
    link = path.parent.relative_to(readme_dir).as_posix() if path.parent != readme_dir else "."
    files = f"[`{sub}{name}`]({link}/)"
    return [operator, run_date(path, data, results), device, command, suite, fl, share, verdicts, files]


HEADER = ["operator", "date", "device", "command", "suite mean (ms)", "floor mean (ms)", "fast % floor",
          "verdicts (checks passed / cases)", "files"]
ALIGN = ["---", "---", "---", "---", "---", "---:", "---:", "---", "---"]


def table(results: Path, readme: Path) -> str:
    """The marked block (markers included) that the README should hold."""
    latest = latest_per_operator(find_runs(results), results)
    if not latest:
        raise IndexProblem(f"no official run (a bench.json with cases) under {results}")
    lines = [BEGIN, "", "| " + " | ".join(HEADER) + " |", "|" + "|".join(ALIGN) + "|"]
    for path, data in latest.values():
        lines.append("| " + " | ".join(row(path, data, results, readme.parent)) + " |")
    lines += ["", END]
    return "\n".join(lines)


def _split(text: str, readme: Path) -> tuple[str, str, str]:
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise IndexProblem(f"{readme}: expected one marker line {BEGIN!r} and, after it, one {END!r}")
    head, rest = text.split(BEGIN, 1)
    block, tail = rest.split(END, 1)
    return head, BEGIN + block + END, tail


def write_index(results: Path, readme: Path) -> bool:
    """Rewrite the marked table; True if the file changed."""
    text = readme.read_text()
    head, old, tail = _split(text, readme)
    new = table(results, readme)
    if new != old:
        readme.write_text(head + new + tail)
    return new != old


def check_index(results: Path, readme: Path, out=None) -> bool:
    """True if the README's table is the one the files give; else print the difference."""
    out = out or sys.stdout
    _, old, _ = _split(readme.read_text(), readme)
    new = table(results, readme)
    if old != new:
        out.write(f"{readme}: the results table differs from what the runs' bench.json give "
                  f"(run `python3 benchmarks/results_index.py`):\n")
        out.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                            "README.md (as it is)", "from the bench.json files"))
        out.write("\n")
    return old == new


# --------------------------------------------------------------------------- record
def device_slug(device: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower().replace("nvidia", "")).strip("-")
    return slug or "device"


def record(src: Path, results: Path, readme: Path, *, command: str | None = None, date: str | None = None,
           out=None) -> Path:
    """Make the bench outputs in ``src`` the operator's official run; return its folder."""
    out = out or sys.stdout
    try:
        _split(readme.read_text(), readme)                 # an index to write, before anything moves
    except OSError as exc:
        raise IndexProblem(f"{readme}: {exc}") from exc
    try:
        data = json.loads((src / "bench.json").read_text())
    except (OSError, ValueError) as exc:
        raise RecordRefused(f"{src / 'bench.json'}: {exc}") from exc
    if "skipped" in data:
        raise RecordRefused(f"the bench was skipped ({data['skipped']}): nothing to record")
    if not is_official(data):
        raise RecordRefused(f"{src / 'bench.json'} holds no operator and cases")
    try:
        table_text = (src / "bench.txt").read_text()      # read now: src may be the run that is replaced
    except OSError as exc:
        raise RecordRefused(f"{src / 'bench.txt'}: {exc}") from exc
    started = None
    log = src / "bench.log"
    if log.exists():
        first = log.read_text().split("\n", 1)[0]
        m = LOG_HEADER.match(first)
        if m:
            started, command = m.group("started"), command or m.group("command")
    if not command:
        raise RecordRefused("no command: give --command, or record what benchmarks/run_gpu.sh wrote (bench.log)")
    date = date or (started[:10] if started else _dt.datetime.now(_dt.timezone.utc).date().isoformat())
    if not DATE.fullmatch(date):
        raise RecordRefused(f"date {date!r} is not YYYY-MM-DD")
    device = data.get("device") or (data.get("ceilings") or {}).get("device_name") or "device"
    op = data["op"]
    dest = results / f"{device_slug(device)}-{date}-{op}"

    # the operator's previous official runs leave the tree (history is in git)
    runs = find_runs(results)
    for path, old in runs:
        if old["op"] != op or not path.exists():
            continue
        folder = path.parent
        others = [p for p, d in runs if d["op"] != op and (p.parent == folder or folder in p.parents)]
        if others or folder == results:
            for f in folder.glob(path.stem + ".*"):
                f.unlink()
            out.write(f"removed {path.with_suffix('.*')} (the previous run of {op})\n")
        else:
            shutil.rmtree(folder)
            out.write(f"removed {folder} (the previous run of {op})\n")
            parent = folder.parent
            while parent != results and results in parent.parents and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent

    dest.mkdir(parents=True, exist_ok=True)
    data["record"] = {"date": date, "started_utc": started, "command": command, "device": device,
                      "recorded_by": "benchmarks/results_index.py record"}
    (dest / "bench.json").write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    (dest / "bench.txt").write_text(table_text)
    out.write(f"recorded {op}'s official run in {dest}\n")
    if write_index(results, readme):
        out.write(f"rewrote the table of {readme}\n")
    return dest


class RecordRefused(Exception):
    """``record`` cannot make its input an official run: exit status 1."""


# --------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS, help="the results folder (default: %(default)s)")
    p.add_argument("--readme", type=Path, default=None, help="the index (default: RESULTS/README.md)")
    p.add_argument("--check", action="store_true", help="exit 1 if the README's table differs from the files'")
    sub = p.add_subparsers(dest="action")
    r = sub.add_parser("record", help="make the bench outputs in DIR the operator's official run")
    r.add_argument("dir", type=Path, help="the folder with bench.json, bench.txt (and run_gpu.sh's bench.log)")
    r.add_argument("--command", default=None, help="the command that ran the bench (default: bench.log's header)")
    r.add_argument("--date", default=None, help="YYYY-MM-DD (default: bench.log's header, else today UTC)")
    args = p.parse_args(argv)
    results = args.results.resolve()
    readme = (args.readme or results / "README.md").resolve()
    try:
        if args.action == "record":
            if args.check:
                p.error("--check and record do not go together")
            record(args.dir.resolve(), results, readme, command=args.command, date=args.date)
            return 0
        if args.check:
            return 0 if check_index(results, readme) else 1
        print(f"{readme}: " + ("table rewritten" if write_index(results, readme) else "table up to date"))
        return 0
    except RecordRefused as exc:
        print(f"results_index.py record: not recorded: {exc}", file=sys.stderr)
        return 1
    except IndexProblem as exc:
        print(f"results_index.py: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
