"""Checking an implementation against the float64 oracle.

The rules are the seed benchmark's, made stricter where it is weak:

* the tolerance rule of the definition (element: |out - ref| <= atol + rtol*|ref|; case:
  matched ratio, optional max-abs bound), in :mod:`fuseval.comparison`;
* NaN or Inf in an output fails (``nonfinite``), unless the oracle has the same
  non-finite value at that position by construction (e.g. a NaN e4m3 scale code);
* an all-zero output against a non-zero oracle fails (``all_zero``);
* the device allocator is poisoned with NaN before each call, so output elements the
  implementation never wrote show up as NaN rather than as stale or zero memory;
* every case draws fresh inputs (seed + case index);
* the implementation may not mutate its inputs (``mutated_input``), return tensors that
  alias them (``aliased_output``), return a cached result (``cached_result``: a later
  call with part of the inputs drawn anew returns the same outputs, or outputs the
  oracle rejects), or hand back buffers it overwrites on the next call (``output_reused``):
  :mod:`fuseval.hygiene`;
* wrong output count, shape or dtype (``bad_outputs``) and exceptions (``raised``).

Each violation is reported by name in :class:`CaseResult.violations`. Each case also
says on which outputs its tolerance is blind (``CaseResult.blind``: an error of 10% of
the output's RMS would pass every element) and where its time went
(``CaseResult.timings``: inputs, oracle, impl, compare, hygiene).

Two rule sets (``RULES``): ``"fuseval"`` (the above, the default) and ``"sol"``, the
benchmark's own (SOL-ExecBench's evaluator): outputs and reference compared in float32,
and any NaN or Inf in the output *or the reference* fails the case, even where both agree.
``check(..., against="sol_reference", rules="sol")`` predicts the benchmark's verdict; a
plain check reports that prediction beside its own verdict (``CaseResult.predicted``).
"""
from __future__ import annotations

import contextlib
import math
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch

from .operators import implementations as _ops
from .comparison import RULES, BlindOutput, OutputMetrics, blind_outputs, compare
from .definitions import Case, Definition, Tolerance
from .errors import VIOLATION_EXIT, NoDeviceError, UsageError, user_input
from .hygiene import (NO_OUTPUTS, draw_hygiene_seed, fingerprint, input_groups, judge_partial_calls, partial_calls,
                      poison_allocator, same_outputs)
from .runner.in_process import Local, as_tuple, sync
from .inputs import generate_inputs
from .oracles import oracle_note, reference_refusal, side_oracles
from .validate import bind_axes, check_outputs_shape, expected_outputs
from . import diagnosis
from .inputs import load_inputs, save_inputs
from .requests import CheckRequest, as_request
from .options import check_cases_in
from .runner import integrity, isolation

__all__ = ["compare", "OutputMetrics", "CaseResult", "CheckReport", "check", "run_case",
           "fingerprint", "poison_allocator", "VIOLATIONS", "RULES", "Prediction", "Local", "run_check", "CheckRequest",
           "input_groups", "BlindOutput", "TIMING_KEYS", "oracle_note"]

# the failing cases of a check whose known mistakes are ranked (each costs a run of every
# mutant from its stage on); later failing cases get the anatomy alone, which runs nothing
DIAGNOSE_MUTANT_CASES = 2

# every violation name, from the one table that also gives each its exit code
VIOLATIONS = tuple(name for name, _ in VIOLATION_EXIT)

# where a case's time goes: drawing its inputs, the oracle (and the benchmark's reference
# when its verdict is predicted), the implementation's first call, comparing its outputs,
# and everything the hygiene rules add (fingerprints, later calls, their inputs and oracle)
TIMING_KEYS = ("inputs", "oracle", "impl", "compare", "hygiene")


class Timings(dict):
    """Seconds by :data:`TIMING_KEYS`; ``with timings("oracle"): ...`` adds a block's time."""

    def __init__(self):
        super().__init__({key: 0.0 for key in TIMING_KEYS})

    @contextlib.contextmanager
    def __call__(self, key: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self[key] += time.perf_counter() - t0


# --------------------------------------------------------------------------- one case
@dataclass
class Prediction:
    """The benchmark's predicted verdict on a case: the outputs compared with
    ``sol_reference`` (the benchmark's reference in its own precision) under its rules."""
    passed: bool
    outputs: list[OutputMetrics]
    violations: list[str]


@dataclass
class CaseResult:
    case: int
    axes: dict[str, int]
    outputs: list[OutputMetrics]
    violations: list[str]
    messages: list[str]
    passed: bool
    impl_seconds: float             # the first call, as the implementation's process timed it
    oracle_seconds: float
    seed: int
    tolerance: dict[str, Any] = field(default_factory=dict)
    predicted: Prediction | None = None
    # seconds by TIMING_KEYS, as fuseval's process saw them
    timings: dict[str, float] = field(default_factory=dict)
    # the outputs on which this case's tolerance is blind (comparison.blind_outputs)
    blind: list[BlindOutput] = field(default_factory=list)
    # None: compared with the oracle the check names; else why the oracle was the reference
    # in its own precision (an imported problem's reference that could not be lifted)
    oracle: str | None = None
    hygiene_seed: int | None = None   # the seed of the later calls' inputs (drawn at random)
    impl_output: str = ""           # what the implementation printed during the first call (its tail)
    # why a failing case failed (fuseval.diagnosis.Diagnosis; None: passed or not diagnosed)
    diagnosis: Any = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _deadline(timeout: float | None) -> float | None:
    return time.monotonic() + float(timeout) if timeout else None


class _Verdict:
    """The violations and messages of one case, in the order found, each violation once."""

    def __init__(self):
        self.violations: list[str] = []
        self.messages: list[str] = []

    def add(self, violations: Sequence[str], messages: Sequence[str]) -> None:
        self.violations += violations
        self.messages += messages

    def names(self) -> list[str]:
        return list(dict.fromkeys(self.violations))


def _predict(defn: Definition, outputs, sol_refs, tol: Tolerance) -> Prediction:
    """The benchmark's verdict on ``outputs``: its reference's outputs under its rules."""
    metrics = [compare(o, r, tol, s.name, rules="sol") for o, r, s in zip(outputs, sol_refs, defn.outputs)]
    violations = list(dict.fromkeys(reason for m in metrics for reason in m.reasons))
    return Prediction(not violations, metrics, violations)


def run_case(defn: Definition, impl: Any, case: Case, *, seed: int, device: torch.device,
             mode: str = "benchmark", reference: Callable | None = None,
             inputs: Sequence[Any] | None = None, hygiene: bool = True, rules: str = "fuseval",
             predictor: Callable | None = None, timeout: float | None = None,
             hygiene_seed: int | None = None, diagnose: str | None = None,
             benchmark_reference: Callable | None = None) -> CaseResult:
    """Check ``impl`` on one case: fresh inputs, oracle, tolerance and hygiene rules.

    ``impl``: a callable (called here, in this process: trusted), a :class:`Local`, or a
    :class:`fuseval.runner.isolation.Worker` (the implementation in its own process).
    ``reference``: what the outputs are compared with (default: the float64 oracle);
    ``rules``: "fuseval" or "sol" (see ``RULES``); ``predictor``: when given (the
    benchmark's ``sol_reference``), the benchmark's verdict is predicted beside.
    ``timeout``: seconds every call of the implementation in this case may take together
    (enforced for a worker only: a call in this process cannot be interrupted).
    ``hygiene_seed``: the seed of the later calls' inputs (None: drawn at random).
    ``diagnose``: when an output fails, say why (:mod:`fuseval.diagnosis`): "anatomy" (reads
    the outputs only), "mutants" (also ranks the operator's known mistakes on these inputs)
    or "full" (also calls the implementation again with one input group drawn anew; runs for
    a passing case too: it was asked for).
    ``benchmark_reference``: run where an output is blind and no ``predictor`` ran, to tell
    whether the benchmark's own reference shows the same (``BlindOutput.in_benchmark``)."""
    runner = impl if hasattr(impl, "call") and hasattr(impl, "recheck_kept") else \
        Local(impl, device, input_names=defn.input_names)
    reference = reference or _ops.resolve_impl(defn, "reference")
    tol = case.tolerance or defn.tolerance
    case_seed = seed + case.index
    hygiene_seed = draw_hygiene_seed() if hygiene and hygiene_seed is None else hygiene_seed
    clock, verdict = Timings(), _Verdict()
    with clock("inputs"):
        if inputs is None:
            inputs = generate_inputs(defn, case.axes, seed=case_seed, mode=mode, device=device)
        bound = bind_axes(defn, inputs, check_values=False)
    expected = expected_outputs(defn, bound)
    out_bytes = sum(math.prod(defn.shape_of(s, bound)) * 4 for s in defn.outputs)
    # the oracles run first, on fuseval's own inputs: what the implementation does to its
    # copy cannot change the question it is asked
    with clock("oracle"):
        t0 = time.perf_counter()
        refs = as_tuple(reference(*inputs))
        sync(device)
        oracle_seconds = time.perf_counter() - t0
        sol_refs = as_tuple(predictor(*inputs)) if predictor is not None else None
    blind = blind_outputs(case.index, refs, defn.outputs, tol, sol_refs)
    if blind and sol_refs is None and benchmark_reference is not None:
        # whether the benchmark's own reference shows the same blindness (run only here)
        with clock("oracle"):
            blind = blind_outputs(case.index, refs, defn.outputs, tol, as_tuple(benchmark_reference(*inputs)))

    deadline = _deadline(timeout)
    with clock("impl"):
        res = runner.call(inputs, keep=hygiene, new_case=True, poison=2 * out_bytes, deadline=deadline,
                          expected=expected)

    def result(metrics=(), predicted=None) -> CaseResult:
        names = verdict.names()
        return CaseResult(case.index, dict(case.axes), list(metrics), names, verdict.messages, not names,
                          res.seconds, oracle_seconds, case_seed, asdict(tol), predicted, dict(clock), blind,
                          hygiene_seed=hygiene_seed, impl_output=getattr(res, "output", "")[-4000:])

    verdict.add(res.violations, res.messages)
    if any(v in NO_OUTPUTS or v in ("bad_outputs", "wrong_device") for v in res.violations):
        runner.forget_kept()
        busy = runner.settle()
        if busy:
            verdict.add(["lingering_thread"], [busy])
        return result()
    outputs = res.outputs
    problems = check_outputs_shape(defn, outputs, bound)
    if problems:
        verdict.add(["bad_outputs"], problems)
        runner.forget_kept()
        return result()

    with clock("compare"):
        metrics = [compare(o, r, tol, s.name, rules) for o, r, s in zip(outputs, refs, defn.outputs)]
        predicted = _predict(defn, outputs, sol_refs, tol) if sol_refs is not None else None
        del sol_refs
    for m in metrics:
        for reason in m.reasons:
            verdict.add([reason], [f"{m.name}: {reason} ({describe_metrics(m)})"])

    if hygiene:
        with clock("hygiene"):
            _hygiene(defn, runner, case, hygiene_seed, mode, device, inputs, res, outputs, refs, bound, reference,
                     tol, rules, all(m.passed for m in metrics), deadline, expected, verdict)
    # ---- diagnosis hook (fuseval.diagnosis): only for a case whose numbers failed
    diagnosis = None
    if diagnose == "full" or (diagnose and not all(m.passed for m in metrics)):
        diagnosis = _diagnose(defn, runner, case, case_seed, mode, device, inputs, outputs, refs, tol, reference,
                              diagnose, deadline, expected, out_bytes)
    # ---- end of the diagnosis hook
    del refs
    busy = runner.settle()
    if busy:
        verdict.add(["lingering_thread"], [busy])
    done = result(metrics, predicted)
    done.diagnosis = diagnosis
    return done


def _diagnose(defn, runner, case, case_seed, mode, device, inputs, outputs, refs, tol, reference, level, deadline,
              expected, out_bytes):
    """The case's :class:`fuseval.diagnosis.Diagnosis`; a failure of the diagnosis itself is
    a note in it, never a changed verdict."""

    def call(changed):
        res = runner.call(changed, keep=False, poison=2 * out_bytes, deadline=deadline, expected=expected)
        return None if res.violations or res.outputs is None else res.outputs

    def redraw(k):
        return generate_inputs(defn, case.axes, seed=case_seed + 1_000_003 * k, mode=mode, device=device)
    try:
        return diagnosis.diagnose_case(defn, inputs, outputs, refs, tol, case=case.index,
                                       mutants=level in ("mutants", "full"), seed=case_seed,
                                       **({"call": call, "reference": reference, "redraw": redraw}
                                          if level == "full" else {}))
    except Exception as exc:  # noqa: BLE001 - the verdict stands whatever the diagnosis does
        return diagnosis.Diagnosis(defn.name, case.index, "unexplained", f"the diagnosis failed: "
                                   f"{type(exc).__name__}: {exc}"[:300], [])


def describe_metrics(m: OutputMetrics) -> str:
    """The numbers a verdict on one output came from, in one line."""
    text = f"max abs {m.max_abs:.3g}, matched {m.matched_ratio:.4%}"
    if m.error_ratio is not None:
        text += f", worst element {m.error_ratio:.3g}x its allowance, error RMS {m.rms_ratio:.3g}x the allowance's"
    return text


def _hygiene(defn, runner, case, hygiene_seed, mode, device, inputs, res, outputs, refs, bound, reference, tol,
             rules, numerics_passed, deadline, expected, verdict: _Verdict) -> None:
    """The hygiene rules after the first call: aliased outputs, the later calls of the
    cached-result rule (each call's inputs verified by the runner), and every answer of the
    case still intact after them."""
    for o_index, i_index in res.aliases:
        verdict.add(["aliased_output"], [f"output {defn.outputs[o_index].name!r} shares memory with input "
                                         f"{defn.inputs[i_index].name!r}"])
    first = [o.detach().clone() for o in outputs]
    calls = partial_calls(defn, case, hygiene_seed, inputs, mode, device)
    judge_partial_calls(defn, runner, calls, first, reference, tol, rules, numerics_passed,
                        "all_zero" in verdict.violations, deadline, expected,
                        lambda out: check_outputs_shape(defn, out, bound), verdict.violations, verdict.messages,
                        first_refs=refs, keep=True)
    del calls
    # every answer of the case must still be what it was when fuseval copied it
    kept = runner.recheck_kept(deadline)
    if kept is not None:
        for k, (then, now) in enumerate(zip(*kept)):
            if not same_outputs([t for t in then if t is not None], [n for n in now if n is not None]):
                which = "the first call" if k == 0 else f"call {k + 1} of the case"
                verdict.add(["output_reused"], [f"a later call overwrote the outputs returned by {which}"])
                break


# --------------------------------------------------------------------------- a whole check
@dataclass
class CheckReport:
    op: str
    impl: str
    config: str
    device: str
    seed: int
    mode: str
    tolerance: dict[str, Any]
    cases: list[CaseResult]
    variant: str = "sol"
    against: str = "reference"
    rules: str = "fuseval"
    isolated: bool = True           # the implementation ran in a worker process of its own
    # the named configuration whose case sizes the cases follow ("seed": full-size cases)
    case_config: str = "seed"
    setup_seconds: float = 0.0      # before the first case: loading, starting the worker
    wall_seconds: float = 0.0       # the whole check
    seed_drawn: bool = False        # the seed was drawn at random (no seed was given)
    confinement: str = ""           # how the implementation's worker was confined

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    @property
    def timings(self) -> dict[str, float]:
        """Seconds by :data:`TIMING_KEYS`, summed over the cases."""
        return {key: sum(c.timings.get(key, 0.0) for c in self.cases) for key in TIMING_KEYS}

    @property
    def blind(self) -> list[BlindOutput]:
        """Every (case, output) on which the tolerance is blind: an error of 10% of the
        output's RMS would pass every element (``atol >= 0.1 * rms``)."""
        return [b for c in self.cases for b in c.blind]

    @property
    def oracle_notes(self) -> list[str]:
        """Why cases were judged against the reference in its own precision (one line each
        distinct reason, naming the cases), when the check was against the float64 oracle."""
        by_note: dict[str, list[int]] = {}
        for c in self.cases:
            if c.oracle:
                by_note.setdefault(c.oracle, []).append(c.case)
        return [f"the reference in its own precision on case(s) {', '.join(map(str, cases))}, because {note}"
                for note, cases in by_note.items()]

    @property
    def predicted_passed(self) -> bool | None:
        """The benchmark's predicted verdict over all cases (None: not predicted)."""
        preds = [c.predicted for c in self.cases]
        if not preds or any(p is None for p in preds):
            return None
        return all(p.passed for p in preds)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["passed"] = self.passed
        d["predicted_passed"] = self.predicted_passed
        d["timings"] = self.timings
        d["blind"] = [asdict(b) for b in self.blind]
        d["oracle_notes"] = self.oracle_notes
        return d

    def rows(self) -> list[dict[str, Any]]:
        """One flat row per (case, output): handy for pandas."""
        rows = []
        for c in self.cases:
            if not c.outputs:
                rows.append({"case": c.case, **c.axes, "output": None, "passed": c.passed,
                             "violations": ",".join(c.violations)})
            for m in c.outputs:
                rows.append({"case": c.case, **c.axes, "output": m.name, "max_abs": m.max_abs,
                             "mean_abs": m.mean_abs, "rel_l2": m.rel_l2, "matched_ratio": m.matched_ratio,
                             "passed": c.passed, "violations": ",".join(c.violations)})
        return rows

    def to_dataframe(self):
        import pandas as pd
        return pd.DataFrame(self.rows())


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise NoDeviceError("device 'cuda' was requested but torch sees no CUDA device "
                         f"(torch {torch.__version__}); use --device cpu")
    return device


def check(op: str | Definition | CheckRequest, impl: str | Callable | None = None, **options: Any) -> CheckReport:
    """Check ``impl`` (name, 'module:function' or callable) on ``op``'s benchmark cases.

    The keyword arguments are the fields of :class:`fuseval.requests.CheckRequest`, and
    ``check(request)`` takes such a request whole (what the command line builds); either
    is validated here, once (a :class:`~fuseval.errors.UsageError`, also a ValueError,
    naming the first bad option), and :func:`run_check` runs it.

    ``seed``: case i draws its inputs from seed + i; None (the default) draws the seed at
    random (``report.seed`` has it, ``report.seed_drawn`` says so), so that an
    implementation cannot know the checked inputs in advance. The later calls of the
    hygiene rules draw from seeds of their own, at random per case (``hygiene_seed``
    fixes them, to replay a case exactly; each case records its own).

    ``config``: "seed" (full size), "small" (the default) or another named scaled-down
    configuration. ``cases``: a selection ("0,3,5-7", a list of indices; None: all).
    ``device``: "cpu" (the default), "cuda", "cuda:N", a torch.device, or None (CUDA when
    there is one). ``mode``: "benchmark" or "realistic" inputs. ``hygiene``: apply the
    hygiene rules. ``progress(result, done, total)``: called after every case.
    ``variant``: a named semantic variant of the operator (default: the benchmark's).
    ``against``: the implementation the outputs are compared with ("reference": the
    float64 oracle; "sol_reference": the benchmark's reference in its own precision);
    ``rules``: "fuseval" or "sol" (the benchmark's evaluator). ``predict``: also predict
    the benchmark's verdict (``sol_reference`` under the "sol" rules) where the operator
    has a ``sol_reference`` and the check is not that prediction already.
    ``isolate`` (None, the default: the process default, :func:`fuseval.runner.isolation.requested`,
    which is True): the implementation runs in a worker process of its own
    (:mod:`fuseval.runner.isolation`) and is never imported here; False runs it in this process,
    trusting it. A Python callable that cannot be sent to a worker (defined in
    ``__main__``, a lambda) runs in this process with an :class:`IsolationWarning`.
    ``timeout``: seconds each case may spend in the implementation (default
    ``isolation.DEFAULT_TIMEOUT``; 0 or None with ``isolate=False``: none); once a case
    timed out, the remaining cases are reported as timed out without being run.
    ``blind_witness``: run the benchmark's own reference where an output is blind, to tell
    whether it shows the same (``BlindOutput.in_benchmark``; the gate's rule asks for it).
    ``save_failing``: a folder; the inputs of every failing case are saved there
    (:func:`fuseval.inputs.save_inputs`, with the case, seed, mode and device) and the
    case's messages name the file. ``replay``: such a file; the check runs that case on
    exactly those inputs (``seed``, ``cases`` and ``mode`` come from the file).
    ``diagnose``: say why each failing case failed (``CaseResult.diagnosis``): the anatomy
    of its error on every failing case, the operator's known mistakes ranked on the first
    :data:`DIAGNOSE_MUTANT_CASES` of them; nothing runs for a passing case. A level of
    :func:`run_case` ("anatomy", "mutants", "full") applies that level to every case.
    Returns a :class:`CheckReport`; ``report.passed`` is True only if every case passed."""
    return run_check(as_request(CheckRequest, op, impl, options).validated())


def run_check(request: CheckRequest) -> CheckReport:
    """Run a validated :class:`~fuseval.requests.CheckRequest` (see :func:`check`). What
    depends on the operator (its configuration, the cases selected, ``against``) is
    checked here, once the operator is loaded, naming the option as the request does."""
    t_start = time.perf_counter()
    r = request
    impl, cases, mode, timeout = r.impl, r.cases, r.mode, r.timeout
    seed_drawn = r.seed is None
    seed = draw_seed() if r.seed is None else r.seed
    with user_input(r.name("config")):
        operator = _ops.get(r.op, r.config, r.variant)
    defn = operator.definition
    if impl == "reference":
        raise UsageError(f"{r.name('impl')} {reference_refusal(defn)}")
    validate_against(defn, impl, r.against, r.name("against"))
    dev = resolve_device(r.device)
    replayed = None
    if r.replay is not None:
        try:
            replayed, meta = read_replay(r.replay, defn, dev)
        except ReplayFileError as exc:
            raise UsageError(f"{r.name('replay')}: {exc}") from None
        cases, seed, mode = [meta["case"]], meta["seed"] - meta["case"], meta.get("mode", mode)
        seed_drawn = False
    check_cases_in(cases, len(defn.seed_cases), r.name("cases"))
    runner, isolated, timeout = _runner(operator, impl, dev, r.isolate, timeout)
    reference = operator.implementation(r.against)
    predictor, benchmark_reference = side_oracles(operator, impl, r.against, r.rules, r.predict, r.blind_witness)
    diagnose, progress, hygiene, save_failing = r.diagnose, r.progress, r.hygiene, r.save_failing
    results = []
    selected = defn.cases(cases)
    setup = time.perf_counter() - t_start
    timed_out = None
    diagnosed = 0
    for n, case in enumerate(selected):
        if timed_out is not None:
            tol = case.tolerance or defn.tolerance
            result = CaseResult(case.index, dict(case.axes), [], ["timeout"],
                                [f"not run: the implementation timed out on case {timed_out} of this run"],
                                False, 0.0, 0.0, seed + case.index, asdict(tol), timings=dict(Timings()))
        else:
            level = diagnose if isinstance(diagnose, str) else None if not diagnose else \
                ("mutants" if diagnosed < DIAGNOSE_MUTANT_CASES else "anatomy")
            oracle_note(reference)
            result = run_case(defn, runner, case, seed=seed, device=dev, mode=mode, reference=reference,
                              inputs=replayed, hygiene=hygiene, rules=r.rules, predictor=predictor, timeout=timeout,
                              hygiene_seed=r.hygiene_seed, diagnose=level, benchmark_reference=benchmark_reference)
            result.oracle = oracle_note(reference)
            diagnosed += result.diagnosis is not None
            if "timeout" in result.violations:
                timed_out = case.index
            if save_failing and not result.passed and replayed is None:
                _save_case_inputs(save_failing, defn, case, seed + case.index, mode, dev, impl, result)
        results.append(result)
        if progress:
            progress(result, n + 1, len(selected))
    return CheckReport(defn.name, _ops.impl_label(impl), defn.config, str(dev), seed, mode,
                       asdict(defn.tolerance), results, defn.variant, r.against, r.rules, isolated=isolated,
                       case_config=defn.case_config, setup_seconds=setup,
                       wall_seconds=time.perf_counter() - t_start, seed_drawn=seed_drawn,
                       confinement=getattr(runner, "confinement_text", "in fuseval's own process (trusted)"))


def draw_seed() -> int:
    """An input seed from the operating system's random source (what ``check`` and the
    gate use unless told a seed): the inputs of a run cannot be known before it."""
    return secrets.randbelow(2 ** 31 - 1)


def validate_against(defn: Definition, impl: Any, against: Any, what: str = "against") -> None:
    """``against`` names one of the operator's own implementations (fuseval's code, run in
    fuseval's process), never a 'module:function' of the user's, and not the
    implementation under check itself."""
    if not isinstance(against, str) or against not in defn.implementations:
        raise UsageError(f"{what}: expected one of the operator's own implementations "
                         f"({', '.join(defn.implementations)}), got {against!r}: what a verdict compares with "
                         "runs in fuseval's process, so it is never an implementation of the user's")
    if isinstance(impl, str) and impl == against:
        raise UsageError(f"{what}: the implementation under check ({impl!r}) cannot be what it is compared with")


def _save_case_inputs(folder: str, defn: Definition, case: Case, case_seed: int, mode: str,
                      device: torch.device, impl, result: CaseResult) -> None:
    """The failing case's inputs (drawn again: the same tensors on the same device) into
    ``folder``, and a message with the file and the command that replays it."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{defn.name}-{defn.config}-case{case.index}-seed{case_seed}.pt")
    inputs = generate_inputs(defn, case.axes, seed=case_seed, mode=mode, device=device)
    save_inputs(path, defn, inputs, case=case.index, seed=case_seed, mode=mode, device=str(device),
                config=defn.config, variant=defn.variant)
    result.messages.append(f"inputs saved to {path}; replay: fuseval check --op {defn.name} --config "
                           f"{defn.config} --impl {_ops.impl_label(impl)} --replay {path}")


class ReplayFileError(ValueError):
    """A ``replay`` file that cannot be read or does not fit the check (the CLI's
    ``--replay`` error)."""


def read_replay(path: str, defn: Definition, device: torch.device):
    """(inputs, meta) of a ``save_failing`` file, on ``device``; a :class:`ReplayFileError`
    (naming the file) for an unreadable file or one of another operator, configuration or
    variant."""
    try:
        inputs, meta = load_inputs(path, defn, device=device)
    except ValueError as exc:
        raise ReplayFileError(str(exc)) from exc
    if not {"case", "seed", "config"} <= set(meta):
        raise ReplayFileError(f"inputs file {path!r}: no case, seed and config recorded (not written by check's "
                         "save_failing)")
    doc_config = meta["config"]
    if doc_config != defn.config or meta.get("variant", defn.variant) != defn.variant:
        raise ReplayFileError(f"inputs file {path!r} holds a case of config {doc_config!r}, variant "
                         f"{meta.get('variant')!r}; this check runs config {defn.config!r}, variant {defn.variant!r}")
    return inputs, meta


def _runner(operator, impl, device: torch.device, isolate: bool | None, timeout: float | None):
    """(what calls the implementation, whether it is isolated, the timeout in force): a
    worker of its own, or (``isolate`` False, or a callable a worker cannot import, with an
    IsolationWarning) this process."""
    if isolation.decide(impl, isolate, warn=True, stacklevel=3):
        worker = isolation.worker_for(impl, operator.definition, str(device))
        return worker, True, isolation.DEFAULT_TIMEOUT if timeout is None else timeout
    baseline = integrity.snapshot()       # before the implementation is imported
    return Local(operator.implementation(impl), device, baseline=baseline,
                 input_names=operator.definition.input_names), False, timeout
