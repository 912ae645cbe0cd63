"""Statistical verdicts: a check repeated over several seeds, judged by its margin.

One check run says pass or fail for one draw of the inputs. A kernel whose matched ratio
sits at 98.9% against a 98% rule passes today and fails on next week's seed, and a gate
that only reports "pass" hides that. So the gate runs the check over N seeds and, for
every output and every metric that has a threshold, reports

* the distribution over all (seed, case) samples: min / median / max,
* the worst sample and where it happened (case, seed),
* the margin to the threshold, absolute and as a fraction of the *allowance*,

and turns that into a three-way verdict:

``fail``  any sample breaks a rule (or any case failed for another reason: NaN, hygiene,
          wrong outputs, an exception);
``warn``  every sample passes, but the worst one uses up more than ``1 - warn_margin``
          of the allowance (default ``warn_margin = 0.5``: a warning once more than half
          of the allowed failures are used);
``pass``  otherwise.

The allowance of the matched-ratio rule is the fraction of elements allowed to fail,
``1 - min_matched_ratio`` (2% for a 98% rule); 98.9% matched uses 1.1 of those 2 points,
leaving a margin fraction of 0.45 < 0.5: a warning. The allowance of the max-abs rule is
the bound itself: a max error of 0.6 against a bound of 1.0 leaves a margin fraction 0.4.

A warning does not fail a gate unless the gate runs with ``strict``; it says "this passes,
but not by enough to trust it on the next seed". Metrics without a threshold (max abs
error when the rule has no bound, mean abs, relative L2) are reported as information.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence
from .check import run_check
from .requests import CheckRequest
from .options import check_fraction, check_seeds, check_selection
from .terminal import fmt_number

__all__ = ["MetricStats", "StatsReport", "check_over_seeds", "judge", "seed_list", "seed_values",
           "DEFAULT_WARN_MARGIN", "VERDICTS"]

DEFAULT_WARN_MARGIN = 0.5
VERDICTS = ("pass", "warn", "fail")
# seeds are spread apart so that case i of seed s (which draws with seed s + i) never
# meets case j of another seed with the same input seed
SEED_STRIDE = 1000


def seed_list(n: int, base: int = 0) -> list[int]:
    """``n`` seeds for a repeated check: base, base + 1000, base + 2000, ... (``n`` >= 1:
    :func:`fuseval.options.check_seeds`)."""
    check_seeds(n)
    return [base + SEED_STRIDE * k for k in range(n)]


def seed_values(seeds: int | Sequence[int]) -> list[int]:
    """Seeds given as a count (``seed_list(n)``) or explicitly."""
    return seed_list(seeds) if isinstance(seeds, int) else [int(s) for s in seeds]


def _worse(verdict_a: str, verdict_b: str) -> str:
    return verdict_a if VERDICTS.index(verdict_a) >= VERDICTS.index(verdict_b) else verdict_b


# --------------------------------------------------------------------------- one metric
@dataclass
class MetricStats:
    """The distribution of one metric of one output over (seed, case) samples."""
    output: str
    metric: str                    # matched_ratio | max_abs | mean_abs | rel_l2
    direction: str                 # "min": must stay >= threshold; "max": must stay <= threshold
    threshold: float | None        # None: informational, no verdict of its own
    n: int
    min: float
    median: float
    max: float
    worst: float
    worst_case: int | None
    worst_seed: int | None
    margin: float | None           # signed distance of the worst sample to the threshold
    margin_fraction: float | None  # margin / allowance (1: nothing used, 0: at the limit)
    verdict: str                   # pass | warn | fail | info

    def describe(self) -> str:
        if self.metric == "matched_ratio":
            fmt = lambda x: fmt_number(100 * x, 5, "g") + "%"
        else:
            fmt = lambda x: fmt_number(x, 2, "g")
        text = (f"{self.output} {self.metric}: min {fmt(self.min)} / median {fmt(self.median)} / "
                f"max {fmt(self.max)} over {self.n} samples")
        if self.threshold is not None:
            rel = ">=" if self.direction == "min" else "<="
            left = self.margin_fraction
            left = "inf" if left is None or math.isinf(left) else fmt_number(100 * left, 2, "g") + "%"
            text += (f"; rule {rel} {fmt(self.threshold)}, worst {fmt(self.worst)} "
                     f"(case {self.worst_case}, seed {self.worst_seed}), margin {left}"
                     f" of the allowance -> {self.verdict}")
        return text


def judge(values: Sequence[float], *, direction: str, threshold: float | None,
          warn_margin: float = DEFAULT_WARN_MARGIN, allowance: float | None = None,
          where: Sequence[tuple[int | None, int | None]] | None = None,
          output: str = "output", metric: str = "metric") -> MetricStats:
    """Summarise ``values`` (one per sample) and judge the worst against ``threshold``.

    ``direction`` "min": values must be >= threshold (matched ratio); "max": values must be
    <= threshold (errors). ``allowance``: the room the rule grants, against which the margin
    is measured (default: ``1 - threshold`` for "min", ``threshold`` for "max").
    ``where``: (case, seed) of each sample, to name the worst one."""
    if direction not in ("min", "max"):
        raise ValueError(f"direction must be 'min' or 'max', got {direction!r}")
    check_fraction(warn_margin, "warn_margin")
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError(f"{output} {metric}: no samples to judge")
    # NaN counts as the worst possible value in either direction
    bad = -math.inf if direction == "min" else math.inf
    clean = [bad if math.isnan(v) else v for v in vals]
    pick = min if direction == "min" else max
    worst_i = clean.index(pick(clean))
    worst = clean[worst_i]
    case, seed = (where[worst_i] if where else (None, None))
    if threshold is None:
        return MetricStats(output, metric, direction, None, len(vals), min(clean),
                           statistics.median(clean), max(clean), worst, case, seed, None, None, "info")
    margin = (worst - threshold) if direction == "min" else (threshold - worst)
    if allowance is None:
        allowance = (1.0 - threshold) if direction == "min" else abs(threshold)
    if math.isinf(margin) or math.isnan(margin):
        fraction = -math.inf if margin < 0 or math.isnan(margin) else math.inf
    elif allowance > 0:
        fraction = margin / allowance
    else:   # a rule without room (e.g. 100% must match): either exactly met or failed
        fraction = math.inf if margin >= 0 else -math.inf
    if margin < 0 or math.isnan(margin):
        verdict = "fail"
    elif fraction < warn_margin:
        verdict = "warn"
    else:
        verdict = "pass"
    return MetricStats(output, metric, direction, threshold, len(vals), min(clean),
                       statistics.median(clean), max(clean), worst, case, seed, margin,
                       None if math.isinf(fraction) and fraction > 0 else fraction, verdict)


# --------------------------------------------------------------------------- a repeated check
@dataclass
class CaseFailure:
    seed: int
    case: int
    violations: list[str]
    messages: list[str]


@dataclass
class StatsReport:
    op: str
    impl: str
    config: str
    device: str
    mode: str
    seeds: list[int]
    warn_margin: float
    tolerance: dict[str, Any]
    metrics: list[MetricStats]
    failures: list[CaseFailure]
    n_runs: int                    # case runs over all seeds
    reports: list[Any] = field(default_factory=list, repr=False)   # the CheckReport of each seed

    @property
    def verdict(self) -> str:
        verdict = "fail" if self.failures else "pass"
        for m in self.metrics:
            if m.verdict in VERDICTS:
                verdict = _worse(verdict, m.verdict)
        return verdict

    @property
    def passed(self) -> bool:
        """True unless something failed (a warning still passes)."""
        return self.verdict != "fail"

    @property
    def violations(self) -> list[str]:
        return list(dict.fromkeys(v for f in self.failures for v in f.violations))

    @property
    def timings(self) -> dict[str, float]:
        """Seconds by activity (inputs, oracle, impl, compare, hygiene) over every seed."""
        total: dict[str, float] = {}
        for rep in self.reports:
            for k, v in rep.timings.items():
                total[k] = total.get(k, 0.0) + v
        return total

    def case_timings(self) -> list[dict[str, Any]]:
        """One row per case run: seed, case and its seconds by activity."""
        return [{"seed": rep.seed, "case": c.case, **c.timings} for rep in self.reports for c in rep.cases]

    @property
    def blind(self) -> list[dict[str, Any]]:
        """The outputs whose tolerance cannot see an error of 10% of their RMS, per seed:
        {seed, case, output, rms, atol, in_benchmark} (from each seed's ``CheckReport.blind``;
        ``in_benchmark``: the benchmark's own reference shows the same)."""
        return [{"seed": rep.seed, "case": b.case, "output": b.output, "rms": b.rms, "atol": b.atol,
                 "in_benchmark": b.in_benchmark} for rep in self.reports for b in rep.blind]

    def warnings(self) -> list[MetricStats]:
        return [m for m in self.metrics if m.verdict == "warn"]

    def summary(self) -> str:
        n_runs = self.n_runs
        failed = len(self.failures)
        text = f"{n_runs - failed}/{n_runs} case runs passed over {len(self.seeds)} seeds"
        judged = [m for m in self.metrics if m.threshold is not None and m.margin_fraction is not None]
        broken = [m for m in self.metrics if m.verdict == "fail"]
        if broken:
            text += "; rules broken: " + ", ".join(f"{m.output} {m.metric}" for m in broken[:4])
        elif judged:
            tight = min(judged, key=lambda m: m.margin_fraction)
            text += (f"; tightest: {tight.output} {tight.metric} with "
                     f"{fmt_number(100 * tight.margin_fraction, 2, 'g')}% of its allowance left")
        if self.warnings():
            text += f"; {len(self.warnings())} metric(s) near the threshold"
        return text

    def lines(self) -> list[str]:
        """Human-readable findings: failures first, then each judged metric."""
        out = []
        for f in self.failures:
            for msg in (f.messages or [",".join(f.violations)]):
                out.append(f"seed {f.seed} case {f.case}: {msg}")
        for m in self.metrics:
            if m.threshold is not None or m.metric == "max_abs":
                out.append(m.describe())
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "impl": self.impl, "config": self.config, "device": self.device,
            "mode": self.mode, "seeds": list(self.seeds), "warn_margin": self.warn_margin,
            "tolerance": dict(self.tolerance), "n_runs": self.n_runs, "verdict": self.verdict,
            "metrics": [asdict(m) for m in self.metrics],
            "failures": [asdict(f) for f in self.failures],
            "timings": self.timings, "blind": self.blind,
        }

    def to_dataframe(self):
        import pandas as pd
        return pd.DataFrame([asdict(m) for m in self.metrics])


def _samples(reports: Iterable[Any]) -> dict[str, dict[str, list[tuple[float, int, int]]]]:
    """output -> metric -> [(value, case, seed)] over every case that produced metrics."""
    found: dict[str, dict[str, list[tuple[float, int, int]]]] = {}
    for rep in reports:
        for c in rep.cases:
            for m in c.outputs:
                per = found.setdefault(m.name, {})
                for metric in ("matched_ratio", "max_abs", "mean_abs", "rel_l2"):
                    per.setdefault(metric, []).append((float(getattr(m, metric)), c.case, rep.seed))
    return found


def stats_from_reports(reports: Sequence[Any], *, warn_margin: float = DEFAULT_WARN_MARGIN) -> StatsReport:
    """Build a :class:`StatsReport` from :class:`fuseval.check.CheckReport` s of one operator
    and implementation over different seeds."""
    if not reports:
        raise ValueError("stats_from_reports needs at least one check report")
    first = reports[0]
    tol = first.tolerance
    metrics: list[MetricStats] = []
    for output, per in _samples(reports).items():
        for metric, samples in per.items():
            values = [v for v, _, _ in samples]
            where = [(c, s) for _, c, s in samples]
            if metric == "matched_ratio":
                threshold, direction = tol["min_matched_ratio"], "min"
            elif metric == "max_abs":
                threshold, direction = tol.get("max_abs_error"), "max"
            else:
                threshold, direction = None, "max"
            metrics.append(judge(values, direction=direction, threshold=threshold,
                                 warn_margin=warn_margin, where=where, output=output, metric=metric))
    failures = [CaseFailure(rep.seed, c.case, list(c.violations), list(c.messages))
                for rep in reports for c in rep.cases if not c.passed]
    return StatsReport(first.op, first.impl, first.config, first.device, first.mode,
                       [r.seed for r in reports], warn_margin, dict(tol), metrics, failures,
                       sum(len(r.cases) for r in reports), list(reports))


def check_over_seeds(op, impl, *, config="small", cases=None, device="cpu", seeds: int | Sequence[int] = 3,
                     mode: str = "benchmark", hygiene: str | bool = "first",
                     warn_margin: float = DEFAULT_WARN_MARGIN, extra_seed_cases=None,
                     progress: Callable[..., None] | None = None, isolate: bool | None = None,
                     timeout: float | None = None, blind_witness: bool = False) -> StatsReport:
    """Run :func:`fuseval.check.check` once per seed and judge the distribution.

    ``seeds``: a count (``seed_list(n)``) or explicit seeds. ``hygiene``: True (every seed),
    False, or "first" (only the first seed runs the mutation / aliasing / caching checks,
    which call the implementation twice; numerics need every seed, hygiene does not).
    ``extra_seed_cases``: the cases of the seeds after the first (default: ``cases``); a
    CPU gate repeats the small cases, whose matched ratio over few elements varies most,
    and leaves the slow large ones to the first seed.
    ``progress(seed, result, done, total)`` is called after every case. ``isolate`` and
    ``timeout`` and ``blind_witness``: as in :func:`fuseval.check.check` (one worker serves
    every seed). The options are validated once (:class:`fuseval.requests.CheckRequest`)."""
    request = CheckRequest(op, impl, config=config, cases=cases, device=device, mode=mode, isolate=isolate,
                           timeout=timeout, blind_witness=blind_witness).validated()
    extra = None if extra_seed_cases is None else check_selection(extra_seed_cases, "extra_seed_cases")
    return over_seeds(request, seed_values(check_seeds(seeds)), hygiene=hygiene, warn_margin=warn_margin,
                      extra_seed_cases=extra, progress=progress)


def over_seeds(request: CheckRequest, seeds: Sequence[int], *, hygiene: str | bool = "first",
               warn_margin: float = DEFAULT_WARN_MARGIN, extra_seed_cases=None,
               progress: Callable[..., None] | None = None) -> StatsReport:
    """:func:`check_over_seeds` of a validated request, trusted: one check per seed of
    ``seeds`` (the request's own seed and progress are replaced)."""
    reports = []
    for k, s in enumerate(seeds):
        cb = None
        if progress is not None:
            cb = (lambda result, done, total, _s=s: progress(_s, result, done, total))
        use_hygiene = bool(hygiene) if hygiene != "first" else k == 0
        selection = request.cases if k == 0 or extra_seed_cases is None else extra_seed_cases
        reports.append(run_check(replace(request, seed=s, cases=selection, hygiene=use_hygiene, progress=cb)))
    return stats_from_reports(reports, warn_margin=warn_margin)
