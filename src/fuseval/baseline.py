"""Regression baselines: an implementation's error metrics (and GPU latencies) recorded in a
small versioned JSON file, and a noise-aware comparison against a later run.

``collect(op, impl, ...)`` measures, for each case and over several seeds,

* per **output**: the check's metrics against the float64 oracle (``max_abs``,
  ``mean_abs``, ``rel_l2`` and ``fail_fraction`` = 1 - matched ratio), and whether the
  case passed on every seed;
* per **stage**: when the implementation has the stage-tap protocol, the budget's
  per-stage metrics (``<comparison>.<metric>``, e.g. ``local.max_abs``);
* on a GPU: the median latency of the implementation, timed as ``fuseval bench`` times
  (in its worker, rotating inputs, judged by :mod:`fuseval.runner.timing`), under ``timer``.

Every metric is stored as its distribution over the seeds: ``median``, ``max`` and
``spread`` (= max - min). The file (``schema_version`` 1) is meant to be committed next
to the kernel; ``save`` writes it with sorted keys and rounded numbers so diffs stay small.

``compare(baseline, current)`` flags

* ``error_growth``: a metric (higher is worse) whose median grew past
  ``max(factor * base, base + k * spread, base + floor)``; the spread over seeds is the
  noise model and ``floor`` ignores changes far below the tolerance's scale (a metric at
  1e-9 that becomes 3e-9 is not a regression anyone should see);
* ``new_failure``: a case that passed on every seed of the baseline and now fails;
* ``slowdown`` (GPU): a median latency above ``base * (1 + slowdown)`` and above
  ``base + k * spread``;

and lists, without flagging, cases that still fail, cases that now pass, and cases
present on only one side. Runs of an unchanged implementation on the same machine draw the
same inputs (the seeds are stored), so they reproduce the baseline; the margins above keep
the comparison quiet on a different but equivalent machine as well.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from .errors import EXIT_BAD_FILE, FusevalError, TimingRefused
from .jsonio import jsonable, number
from .terminal import fmt_number
from ._version import __version__
from .bench import MAX_REPS, MIN_REPS, REP_MS, WARMUP_MS, timer_rules
from .budget import run_budget, staged_of
from .check import check, resolve_device
from . import operators
from .operators.implementations import get, impl_label
from .runner.isolation import decide, worker_for
from .runner.timing import time_impl
from .stats import seed_values
from .terminal import case_verdict, console, utc_timestamp

__all__ = ["SCHEMA_VERSION", "collect", "save", "load", "validate", "compare", "Comparison", "Finding",
           "DEFAULT_FACTOR", "DEFAULT_K", "DEFAULT_SLOWDOWN"]

SCHEMA_VERSION = 1
DEFAULT_FACTOR = 2.0       # an error may grow by this factor before it is a regression
DEFAULT_K = 3.0            # ... or by this many seed-spreads, whichever is larger
DEFAULT_SLOWDOWN = 0.10    # a latency may grow by 10% (and k spreads) before it is a slowdown
OUTPUT_METRICS = ("max_abs", "mean_abs", "rel_l2", "fail_fraction")


# --------------------------------------------------------------------------- distributions
def summarize(values: Sequence[float]) -> dict[str, float]:
    """median / max / spread (max - min) of a metric over seeds (NaN counts as +inf: worst)."""
    vals = [math.inf if (v is None or (isinstance(v, float) and math.isnan(v))) else float(v) for v in values]
    lo, hi = min(vals), max(vals)
    spread = hi - lo if math.isfinite(hi) and math.isfinite(lo) else math.inf
    return {"median": statistics.median(vals), "max": hi, "spread": spread}


def floor_for(metric: str, tolerance: Mapping[str, Any]) -> float:
    """The smallest growth of ``metric`` worth flagging, whatever the factor says."""
    name = metric.rsplit(".", 1)[-1]
    atol = float(tolerance.get("atol") or 1e-3)
    if name == "fail_fraction":
        return 1e-3                       # a tenth of a percent of the elements
    if "ulp" in name:
        return 1.0                        # one ulp
    if name.startswith("rel") or name.endswith("_rel"):
        return 1e-6
    if name in ("nonfinite",):
        return 0.5
    return 0.01 * atol                    # absolute errors: a hundredth of the tolerance's atol


# --------------------------------------------------------------------------- budget adapter
# the implementation's own per-stage errors kept in a baseline (the budget report also has
# the naive and float32 references' errors: context for a reader, not this kernel's metrics)
STAGE_METRICS = {"local": ("max_abs", "rel_l2"), "propagated": ("max_abs", "rel_l2"),
                 "downstream": ("rel_l2",)}


def budget_stage_metrics(report: Any) -> dict[int, dict[str, dict[str, float]]]:
    """case -> stage -> {"<kind>.<metric>": value} from a budget report (a
    :class:`fuseval.budget.BudgetReport` or its JSON dict), kinds local / propagated /
    downstream. Stages without taps (an implementation without ``.staged``) are absent."""
    d = report if isinstance(report, Mapping) else report.to_dict()
    out: dict[int, dict[str, dict[str, float]]] = {}
    for c in d.get("cases", []):
        for s in c.get("stages", []):
            metrics = {}
            for kind, names in STAGE_METRICS.items():
                m = s.get(kind)
                if not isinstance(m, Mapping):
                    continue
                for name in names:
                    if m.get(name) is not None:
                        metrics[f"{kind}.{name}"] = number(m[name])
            if metrics:
                out.setdefault(int(c["case"]), {})[str(s["stage"])] = metrics
    return out


# --------------------------------------------------------------------------- collect
@dataclass
class _Subject:
    """The implementation a baseline measures, resolved once: how it is called (``fn``: a
    callable, or the name a worker process resolves when ``isolate``) and whether it has
    stage taps."""
    operator: Any
    fn: Any
    isolate: bool
    staged: bool


def _subject(operator, impl: str | Callable, device, isolate: bool | None) -> _Subject:
    defn = operator.definition
    if decide(impl, isolate):
        worker = worker_for(impl, defn, str(device))   # ImplementationError early, before any work
        return _Subject(operator, impl, True, worker.staged)
    fn = operator.implementation(impl)
    return _Subject(operator, fn, False, staged_of(defn, impl, fn) is not None)


def _samples_of_check(rep, per_case: dict, samples: dict, seed: int) -> None:
    """Add one seed's check report: verdicts, violations, per-output metrics."""
    for c in rep.cases:
        entry = per_case[c.case]
        entry["passed_per_seed"].append(bool(c.passed))
        entry["violations"] = sorted(set(entry["violations"]) | set(c.violations))
        if c.violations and c.messages:
            entry.setdefault("messages", []).extend(f"seed {seed}: {m}" for m in c.messages[:3])
        for m in c.outputs:
            slot = samples[c.case]["outputs"].setdefault(m.name, {})
            values = {"max_abs": m.max_abs, "mean_abs": m.mean_abs, "rel_l2": m.rel_l2,
                      "fail_fraction": 1.0 - m.matched_ratio}
            for k, v in values.items():
                slot.setdefault(k, []).append(v)


def _samples_of_budget(brep, samples: dict) -> None:
    """Add one seed's per-stage metrics from a budget report."""
    for case, stages in budget_stage_metrics(brep).items():
        if case not in samples:
            continue
        for stage, metrics in stages.items():
            slot = samples[case]["stages"].setdefault(stage, {})
            for k, v in metrics.items():
                slot.setdefault(k, []).append(v)


def _latencies(subject: _Subject, impl, selected, seed: int, mode: str, device, per_case: dict) -> None:
    """One seed's median latency per case, timed as ``fuseval bench`` times: in the
    implementation's worker, over rotating inputs, judged by :func:`fuseval.runner.timing.time_impl`
    (a refused timing is an error: a baseline never records a time that was not earned)."""
    operator, defn = subject.operator, subject.operator.definition
    runner = worker_for(impl, defn, str(device)) if subject.isolate else subject.fn
    rules = {"warmup_ms": WARMUP_MS, "rep_ms": REP_MS, "min_reps": MIN_REPS, "max_reps": MAX_REPS, "flush": True}
    for c in selected:
        run = time_impl(runner, defn, c, seed=seed, mode=mode, device=device, reference=operator.reference,
                        tolerance=c.tolerance or defn.tolerance, rules=rules)
        if not run.valid:
            raise TimingRefused(f"case {c.index}: the timing of {impl_label(impl)} was refused: {run.summary()}")
        per_case[c.index]["latency_ms"].append(run.timing["median_ms"])



def _case_documents(per_case: dict, samples: dict) -> dict[str, Any]:
    """The ``cases`` of a baseline: each case's verdicts and its metrics' distributions."""
    def distributions(group: Mapping[str, Mapping[str, list]]) -> dict:
        return {name: {k: summarize(v) for k, v in metrics.items()} for name, metrics in group.items()}
    docs = {}
    for index, entry in per_case.items():
        docs[str(index)] = {
            "axes": entry["axes"], "passed": all(entry["passed_per_seed"]),
            "passed_per_seed": entry["passed_per_seed"], "violations": entry["violations"],
            **({"messages": entry["messages"][:6]} if entry.get("messages") else {}),
            "outputs": distributions(samples[index]["outputs"]),
            "stages": distributions(samples[index]["stages"]),
            "latency_ms": summarize(entry["latency_ms"]) if entry["latency_ms"] else None}
    return docs


def collect(op: str, impl: str | Callable, *, config: str = "small", cases: str | Sequence[int] | None = None,
            device: str = "cpu", seeds: int | Sequence[int] = 3, mode: str = "benchmark",
            stages: bool | None = None, latency: bool | None = None,
            progress: Callable[[str], None] | None = None, isolate: bool | None = None,
            timeout: float | None = None) -> dict[str, Any]:
    """Measure ``impl`` on ``op`` and return a baseline document (a dict; see the module doc).

    ``seeds``: a count (0, 1000, 2000, ...) or explicit seeds, at least 3 for a spread that
    means something. ``stages``: add the budget's per-stage metrics (default: when the
    implementation has stage taps; True without taps is an error). ``latency``: time the
    implementation (default: on CUDA only). ``isolate``, ``timeout``: as in
    :func:`fuseval.check.check` (latencies are measured in this process: a timing needs
    the kernel here)."""

    seeds = seed_values(seeds)
    operator = get(op, config)
    defn = operator.definition
    dev = resolve_device(device)
    subject = _subject(operator, impl, dev, isolate)
    selected = defn.cases(cases)
    say = progress or (lambda message: None)
    # per-stage metrics need the stage-tap protocol; without it the budget is end to end
    # only, which the per-output metrics already cover
    if stages and not subject.staged:
        raise FusevalError(f"{defn.name}: implementation {impl_label(impl)!r} has no stage taps "
                           "(forward.staged), so there are no per-stage metrics to record")
    use_stages = subject.staged if stages is None else stages
    use_latency = dev.type == "cuda" if latency is None else latency
    if use_latency and dev.type != "cuda":
        raise FusevalError("latency baselines need a CUDA device (CPU timings say nothing about a kernel)")

    per_case: dict[int, dict[str, Any]] = {
        c.index: {"axes": dict(c.axes), "passed_per_seed": [], "violations": [], "latency_ms": []}
        for c in selected}
    samples: dict[int, dict[str, dict]] = {c.index: {"outputs": {}, "stages": {}} for c in selected}
    indices = [c.index for c in selected]
    for s in seeds:
        say(f"{defn.name} baseline: check seed {s}")
        rep = check(defn.name, subject.fn, config=config, cases=indices, device=dev, seed=s, mode=mode,
                    hygiene=False, isolate=subject.isolate, timeout=timeout,
                    progress=lambda r, done, total, _s=s: say(
                        f"{defn.name} check seed {_s} [{done}/{total}] case {r.case}: {case_verdict(r)}"))
        _samples_of_check(rep, per_case, samples, s)
        if use_stages:
            say(f"{defn.name} baseline: budget seed {s}")
            brep = run_budget(defn.name, impl, config=config, cases=indices, device=str(dev), seed=s, mode=mode,
                              baselines=False, isolate=subject.isolate, timeout=timeout,
                              progress=lambda r, done, total, _s=s: say(
                                  f"{defn.name} budget seed {_s} [{done}/{total}] case {r.case}"))
            _samples_of_budget(brep, samples)
        if use_latency:
            _latencies(subject, impl, selected, s, mode, dev, per_case)
    sources = ["check"] + (["budget"] if use_stages else []) + (["latency"] if use_latency else [])
    return {**_header(defn, impl_label(impl), dev, mode, seeds, sources),
            **({"timer": timer_rules()} if use_latency else {}),
            "cases": _case_documents(per_case, samples)}


def _header(defn, impl: str, dev, mode: str, seeds: list[int], sources: list[str]) -> dict[str, Any]:
    """What a baseline was measured with: tool versions, operator, implementation, device."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "fuseval baseline",
        "fuseval_version": __version__,
        "torch_version": torch.__version__,
        "created": utc_timestamp(),
        "op": defn.name,
        "variant": defn.variant,
        "impl": impl,
        "config": defn.config,
        "device": dev.type,
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "mode": mode,
        "seeds": seeds,
        "tolerance": asdict(defn.tolerance),
        "sources": sources,
    }


# --------------------------------------------------------------------------- files
def save(doc: Mapping[str, Any], path: str) -> str:
    """Write a baseline: numbers to 6 significant digits (:func:`fuseval.jsonio.jsonable`),
    keys sorted, one line per distribution, so a diff shows what changed."""
    validate(doc, source="the baseline to save")
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
        f.write(document_text(jsonable(dict(doc), digits=6)) + "\n")
    return path


def document_text(obj: Any, indent: int = 0) -> str:
    """JSON text of an already JSON-safe object with sorted keys, one line per object of
    plain values (a metric's distribution, a case's axes): readable, and a change shows
    as one line of a diff."""
    pad, inner = " " * indent, " " * (indent + 1)
    if isinstance(obj, Mapping) and obj and any(isinstance(v, (Mapping, list)) and v for v in obj.values()):
        items = [f"{inner}{json.dumps(str(k))}: {document_text(obj[k], indent + 1)}" for k in sorted(obj)]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    return json.dumps(obj, sort_keys=True, allow_nan=False)


def load(path: str) -> dict[str, Any]:
    """Read and validate a baseline file; any problem is a FusevalError (EXIT_BAD_FILE)
    that names the file and what is wrong."""
    if not os.path.isfile(path):
        raise FusevalError(f"baseline file {path!r} does not exist", EXIT_BAD_FILE)
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FusevalError(f"baseline file {path!r} is not valid JSON: {exc}", EXIT_BAD_FILE) from exc
    validate(doc, source=f"baseline file {path!r}")
    return doc


def _bad(source: str, what: str) -> FusevalError:
    return FusevalError(f"{source}: {what}", EXIT_BAD_FILE)


def validate(doc: Any, *, source: str = "baseline") -> None:
    """Check the structure of a baseline document (raises FusevalError, EXIT_BAD_FILE)."""
    if not isinstance(doc, Mapping):
        raise _bad(source, f"expected a JSON object, got {type(doc).__name__}")
    version = doc.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise _bad(source, f"schema_version: expected an integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise _bad(source, f"schema_version {version} is newer than this fuseval understands "
                           f"({SCHEMA_VERSION}); upgrade fuseval")
    if version < 1:
        raise _bad(source, f"schema_version: expected >= 1, got {version}")
    for key, kind in (("op", str), ("impl", str), ("config", str), ("device", str), ("mode", str),
                      ("seeds", list), ("tolerance", dict), ("cases", dict)):
        if key not in doc:
            raise _bad(source, f"missing key {key!r}")
        if not isinstance(doc[key], kind):
            raise _bad(source, f"{key}: expected {kind.__name__}, got {type(doc[key]).__name__}")
    if doc["op"] not in operators.names():
        raise _bad(source, f"op: unknown operator {doc['op']!r}; known: {', '.join(operators.names())}")
    if not doc["seeds"] or not all(isinstance(s, int) and not isinstance(s, bool) for s in doc["seeds"]):
        raise _bad(source, f"seeds: expected a non-empty list of integers, got {doc['seeds']!r}")
    if not doc["cases"]:
        raise _bad(source, "cases: no cases recorded")
    for key, case in doc["cases"].items():
        where = f"cases.{key}"
        if not str(key).isdigit():
            raise _bad(source, f"{where}: case keys must be case indices, got {key!r}")
        if not isinstance(case, Mapping):
            raise _bad(source, f"{where}: expected an object")
        if not isinstance(case.get("passed"), bool):
            raise _bad(source, f"{where}.passed: expected true or false, got {case.get('passed')!r}")
        for group in ("outputs", "stages"):
            entries = case.get(group, {})
            if not isinstance(entries, Mapping):
                raise _bad(source, f"{where}.{group}: expected an object")
            for name, metrics in entries.items():
                if not isinstance(metrics, Mapping):
                    raise _bad(source, f"{where}.{group}.{name}: expected an object of metrics")
                for metric, dist in metrics.items():
                    _check_dist(dist, source, f"{where}.{group}.{name}.{metric}")
        if case.get("latency_ms") is not None:
            _check_dist(case["latency_ms"], source, f"{where}.latency_ms")


def _check_dist(dist: Any, source: str, where: str) -> None:
    if not isinstance(dist, Mapping):
        raise _bad(source, f"{where}: expected an object with median, max, spread")
    for k in ("median", "spread"):
        if k not in dist:
            raise _bad(source, f"{where}: missing {k!r}")
        v = dist[k]
        try:
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise TypeError
            x = number(v)            # "inf" and "nan" strings are how the file writes non-finite values
        except (TypeError, ValueError):
            raise _bad(source, f"{where}.{k}: expected a number, got {v!r}") from None
        if math.isnan(x) or x < 0 and k == "spread":
            raise _bad(source, f"{where}.{k}: expected a non-negative number, got {v!r}")


# --------------------------------------------------------------------------- compare
@dataclass
class Finding:
    case: int
    group: str              # outputs | stages | case | latency
    name: str               # output or stage name ("-" for case-level findings)
    metric: str
    kind: str               # error_growth | new_failure | slowdown | still_failing | fixed |
                            # missing_case | new_case | ok
    baseline: float | None
    current: float | None
    limit: float | None
    flagged: bool
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.current is None:
            return None
        if self.baseline == 0:
            return math.inf if self.current > 0 else 1.0
        return self.current / self.baseline


@dataclass
class Comparison:
    op: str
    baseline_impl: str
    current_impl: str
    config: str
    device: str
    factor: float
    k: float
    slowdown: float
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Finding]:
        return [f for f in self.findings if f.flagged]

    @property
    def passed(self) -> bool:
        return not self.regressions

    def summary(self) -> str:
        n = len({f.case for f in self.findings})
        compared = sum(1 for f in self.findings if f.kind in ("ok", "error_growth", "slowdown"))
        if self.passed:
            return f"{self.op}: no regression ({compared} metrics over {n} cases compared)"
        kinds = {}
        for f in self.regressions:
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
        return (f"{self.op}: {len(self.regressions)} regression(s): "
                + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in sorted(kinds.items())))

    def rows(self, *, everything: bool = False) -> list[dict[str, Any]]:
        out = []
        for f in self.findings:
            if not everything and f.kind == "ok":
                continue
            d = asdict(f)
            d["ratio"] = f.ratio
            out.append(d)
        return out

    def to_dict(self) -> dict[str, Any]:
        return jsonable({"op": self.op, "baseline_impl": self.baseline_impl, "current_impl": self.current_impl,
                         "config": self.config, "device": self.device, "factor": self.factor, "k": self.k,
                         "slowdown": self.slowdown, "passed": self.passed, "summary": self.summary(),
                         "notes": self.notes, "findings": self.rows(everything=True)})

    def to_dataframe(self, everything: bool = True):
        import pandas as pd
        return pd.DataFrame(self.rows(everything=everything))

    def _table_rows(self, limit: int | None) -> list[list[str]]:
        interesting = [f for f in self.findings if f.kind != "ok"]
        interesting.sort(key=lambda f: (not f.flagged, f.case, f.group, f.name, f.metric))
        rows = []
        for f in interesting[:limit]:
            ratio = f.ratio
            rows.append([str(f.case), f.group, f.name, f.metric, fmt_number(f.baseline, 3, "g"),
                         fmt_number(f.current, 3, "g"),
                         "-" if ratio is None else ("inf" if math.isinf(ratio) else fmt_number(ratio, 2, "g") + "x"),
                         fmt_number(f.limit, 3, "g"), ("REGRESSION " if f.flagged else "") + f.kind.replace("_", " ")
                         + (f" ({f.note})" if f.note else "")])
        return rows

    HEADER = ["case", "group", "name", "metric", "baseline", "current", "ratio", "limit", "finding"]

    def to_markdown(self, limit: int | None = 200) -> str:
        lines = [f"# fuseval baseline compare: {self.op}", "",
                 f"baseline impl `{self.baseline_impl}`, current impl `{self.current_impl}`, config "
                 f"`{self.config}`, device `{self.device}`; flag errors past max({self.factor} x base, "
                 f"base + {self.k} x spread), slowdowns past {self.slowdown:.0%}", "", f"**{self.summary()}**", ""]
        lines += [f"- {n}" for n in self.notes]
        rows = self._table_rows(limit)
        if rows:
            lines += ["", "| " + " | ".join(self.HEADER) + " |", "|" + " --- |" * len(self.HEADER)]
            lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        return "\n".join(lines) + "\n"

    def print_table(self, stream=None, limit: int = 40) -> None:
        from rich.table import Table
        out = console(stream)
        rows = self._table_rows(limit)
        if rows:
            table = Table(title=f"{self.op}: baseline {self.baseline_impl} -> current {self.current_impl} "
                                f"[{self.config}, {self.device}]", title_justify="left")
            for col in self.HEADER:
                table.add_column(col, justify="right" if col in ("case", "baseline", "current", "ratio", "limit")
                                 else "left", overflow="fold")
            for r in rows:
                style = "red" if r[-1].startswith("REGRESSION") else None
                table.add_row(*r, style=style)
            out.print(table)
            hidden = sum(1 for f in self.findings if f.kind != "ok") - len(rows)
            if hidden > 0:
                out.print(f"... {hidden} more rows (see --markdown / --json)", markup=False, highlight=False)
        for n in self.notes:
            out.print(f"note: {n}", markup=False, highlight=False)
        color = "green" if self.passed else "red"
        out.print(f"[{color}]{self.summary()}[/]")


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any], *, factor: float = DEFAULT_FACTOR,
            k: float = DEFAULT_K, slowdown: float = DEFAULT_SLOWDOWN,
            floors: Mapping[str, float] | None = None) -> Comparison:
    """Compare two baseline documents (see the module doc for what is flagged).

    ``factor`` >= 1, ``k`` >= 0, ``slowdown`` >= 0 (a fraction: 0.1 = 10%). ``floors``:
    per-metric overrides of the smallest growth worth flagging."""
    if factor < 1:
        raise ValueError(f"factor must be >= 1 (an error may not shrink to pass), got {factor}")
    if k < 0 or slowdown < 0:
        raise ValueError(f"k and slowdown must be >= 0, got k={k}, slowdown={slowdown}")
    validate(baseline, source="baseline")
    validate(current, source="current measurement")
    if baseline.get("variant", "sol") != current.get("variant", "sol"):
        raise ValueError(f"the baseline is of variant {baseline.get('variant', 'sol')!r}, the current "
                         f"measurement of variant {current.get('variant', 'sol')!r}: they are different functions")
    if baseline["op"] != current["op"]:
        raise FusevalError(f"the baseline is for operator {baseline['op']!r} but the current measurement is "
                           f"for {current['op']!r}", EXIT_BAD_FILE)
    notes = []
    for key in ("config", "device", "mode"):
        if baseline[key] != current[key]:
            notes.append(f"{key} differs: baseline {baseline[key]!r}, current {current[key]!r}")
    if baseline.get("timer") != current.get("timer") and "latency" in baseline.get("sources", []) \
            and "latency" in current.get("sources", []):
        notes.append(f"latencies were timed under different rules: baseline {baseline.get('timer')}, "
                     f"current {current.get('timer')}")
    if baseline["seeds"] != current["seeds"]:
        notes.append(f"seeds differ: baseline {baseline['seeds']}, current {current['seeds']} "
                     "(the comparison then includes the spread between input draws)")
    same_device = baseline.get("device_name") == current.get("device_name") and baseline["device"] == current["device"]
    tol = baseline["tolerance"]
    floors = dict(floors or {})
    findings: list[Finding] = []
    base_cases, cur_cases = baseline["cases"], current["cases"]
    for key in sorted(set(base_cases) | set(cur_cases), key=int):
        case = int(key)
        if key not in cur_cases:
            findings.append(Finding(case, "case", "-", "-", "missing_case", None, None, None, False,
                                    "in the baseline, not measured now"))
            continue
        if key not in base_cases:
            findings.append(Finding(case, "case", "-", "-", "new_case", None, None, None, False,
                                    "measured now, not in the baseline"))
            continue
        b, c = base_cases[key], cur_cases[key]
        if b["passed"] and not c["passed"]:
            findings.append(Finding(case, "case", "-", "passed", "new_failure", 1.0, 0.0, None, True,
                                    ", ".join(c.get("violations") or []) or "failed"))
        elif not b["passed"] and not c["passed"]:
            findings.append(Finding(case, "case", "-", "passed", "still_failing", 0.0, 0.0, None, False,
                                    ", ".join(c.get("violations") or [])))
        elif not b["passed"] and c["passed"]:
            findings.append(Finding(case, "case", "-", "passed", "fixed", 0.0, 1.0, None, False))
        for group in ("outputs", "stages"):
            for name in sorted(set(b.get(group, {})) | set(c.get(group, {}))):
                bm, cm = b.get(group, {}).get(name), c.get(group, {}).get(name)
                if bm is None or cm is None:
                    if group == "stages" and (bm is None) != (cm is None):
                        side = "baseline" if cm is None else "current run"
                        findings.append(Finding(case, group, name, "-", "missing_case" if cm is None else "new_case",
                                                None, None, None, False, f"only in the {side}"))
                    continue
                for metric in sorted(set(bm) & set(cm)):
                    base_v, spread = number(bm[metric]["median"]), number(bm[metric]["spread"])
                    cur_v = number(cm[metric]["median"])
                    floor = floors.get(metric, floors.get(metric.rsplit(".", 1)[-1], floor_for(metric, tol)))
                    noise = spread * k if math.isfinite(spread) else 0.0
                    limit = max(factor * base_v, base_v + noise, base_v + floor)
                    grew = cur_v > limit or (math.isnan(cur_v) and not math.isnan(base_v))
                    findings.append(Finding(case, group, name, metric, "error_growth" if grew else "ok",
                                            base_v, cur_v, limit, grew))
        bl, cl = b.get("latency_ms"), c.get("latency_ms")
        if bl is not None and cl is not None:
            base_v, spread, cur_v = number(bl["median"]), number(bl["spread"]), number(cl["median"])
            limit = max(base_v * (1 + slowdown), base_v + k * spread, base_v + 0.002)
            slow = cur_v > limit
            flag = slow and same_device
            findings.append(Finding(case, "latency", "-", "median_ms", "slowdown" if slow else "ok", base_v, cur_v,
                                    limit, flag, "" if same_device or not slow else "not flagged: other device"))
    if not same_device and any(f.group == "latency" for f in findings):
        notes.append("the device differs from the baseline's: latencies are shown but not flagged")
    return Comparison(baseline["op"], baseline["impl"], current["impl"], baseline["config"], baseline["device"],
                      factor, k, slowdown, findings, notes)


def default_path(op: str, config: str, device: str, folder: str = "baselines") -> str:
    return os.path.join(folder, f"{op}.{config}.{device}.json")
