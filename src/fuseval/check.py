"""Checking an implementation against the float64 oracle.

The rules are the seed benchmark's, made stricter where it is weak:

* the tolerance rule of the definition (element: |out - ref| <= atol + rtol*|ref|; case:
  matched ratio, optional max-abs bound);
* NaN or Inf in an output fails (``nonfinite``), unless the oracle has the same
  non-finite value at that position by construction (e.g. a NaN e4m3 scale code);
* an all-zero output against a non-zero oracle fails (``all_zero``);
* the device allocator is poisoned with NaN before each call, so output elements the
  implementation never wrote show up as NaN rather than as stale or zero memory;
* every case draws fresh inputs (seed + case index);
* the implementation may not mutate its inputs (``mutated_input``), return tensors that
  alias them (``aliased_output``), return a cached result (``cached_result``: a second
  call on different inputs returns the same outputs), or hand back buffers it overwrites
  on the next call (``output_reused``);
* wrong output count, shape or dtype (``bad_outputs``) and exceptions (``raised``).

Each violation is reported by name in :class:`CaseResult.violations`.

Two rule sets (``RULES``): ``"fuseval"`` (the above, the default) and ``"sol"``, the
benchmark's own (SOL-ExecBench's evaluator): outputs and reference compared in float32,
and any NaN or Inf in the output *or the reference* fails the case, even where both agree.
``check(..., against="sol_reference", rules="sol")`` predicts the benchmark's verdict; a
plain check reports that prediction beside its own verdict (``CaseResult.predicted``).
"""
from __future__ import annotations

import math
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from . import ops as _ops
from .definitions import Case, Definition, Tolerance
from .errors import VIOLATION_EXIT, NoDeviceError
from .inputs import TORCH_DTYPES, generate_inputs
from .validate import bind_axes, check_outputs_shape

__all__ = ["compare", "OutputMetrics", "CaseResult", "CheckReport", "check", "run_case",
           "fingerprint", "poison_allocator", "VIOLATIONS", "RULES", "Prediction", "Local",
           "input_groups", "validate_selection"]

# "fuseval": float64 comparison, a NaN both sides have by construction may match;
# "sol": the benchmark's evaluator (float32 comparison, any NaN/Inf on either side fails)
RULES = ("fuseval", "sol")
# what the benchmark compares against: the implementation name of its reference
SOL_REFERENCE = "sol_reference"

# every violation name, from the one table that also gives each its exit code
VIOLATIONS = tuple(name for name, _ in VIOLATION_EXIT)


# --------------------------------------------------------------------------- comparison
@dataclass
class OutputMetrics:
    name: str
    max_abs: float
    mean_abs: float
    rel_l2: float
    matched_ratio: float
    numel: int
    nonfinite: int          # elements where output and oracle disagree on being finite
    all_zero: bool
    passed: bool
    reasons: list[str] = field(default_factory=list)
    worst_index: tuple[int, ...] | None = None

    def margin(self, tol: Tolerance) -> float:
        """Matched ratio minus the required ratio (negative: failing)."""
        return self.matched_ratio - tol.min_matched_ratio


def compare(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, name: str = "output",
            rules: str = "fuseval") -> OutputMetrics:
    """Compare an implementation's output with the oracle's under ``tol`` and ``rules``."""
    if rules not in RULES:
        raise ValueError(f"rules: expected one of {RULES}, got {rules!r}")
    if rules == "sol":
        return _compare_sol(out, ref, tol, name)
    o = out.detach().to(torch.float64)
    r = ref.detach().to(device=o.device, dtype=torch.float64)
    o_fin, r_fin = torch.isfinite(o), torch.isfinite(r)
    # a non-finite output is acceptable only where the oracle has the very same value
    same_nonfinite = (~o_fin) & (~r_fin) & ((o == r) | (torch.isnan(o) & torch.isnan(r)))
    # ... and a finite output where the oracle is NaN/Inf (e.g. a NaN scale code decoded as
    # some number) silently repairs a value the format defines as poisoned: also a failure
    bad_nonfinite = int(((~o_fin) & ~same_nonfinite).sum()) + int(((~r_fin) & o_fin).sum())
    both = o_fin & r_fin
    inf = torch.full_like(o, math.inf)
    diff = torch.where(both, (o - r).abs(), torch.where(same_nonfinite, torch.zeros_like(o), inf))
    ok = same_nonfinite | (both & (diff <= tol.atol + tol.rtol * r.abs()))
    all_zero = bool(o.numel()) and bool((o == 0).all()) and bool((r[r_fin] != 0).any())
    return _metrics(name, o, r, diff, ok, both, bad_nonfinite, all_zero, tol)


def _compare_sol(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, name: str) -> OutputMetrics:
    """The benchmark's comparison: both sides in float32, the bound atol + rtol*|ref| in
    float32, every non-finite element of either side a failure, an all-zero output against
    a reference of non-zero norm a failure."""
    o = out.detach().to(torch.float32)
    r = ref.detach().to(device=o.device, dtype=torch.float32)
    o_fin, r_fin = torch.isfinite(o), torch.isfinite(r)
    bad_nonfinite = int((~o_fin).sum()) + int((~r_fin).sum())
    both = o_fin & r_fin
    diff = torch.where(both, (o - r).abs(), torch.full_like(o, math.inf))
    ok = both & (diff <= tol.atol + tol.rtol * r.abs())
    all_zero = bool(torch.linalg.vector_norm(r[r_fin]) > 0) and bool(torch.linalg.vector_norm(o[o_fin]) == 0) \
        and not bad_nonfinite
    return _metrics(name, o, r, diff, ok, both, bad_nonfinite, all_zero, tol)


def _metrics(name, o, r, diff, ok, both, bad_nonfinite, all_zero, tol) -> OutputMetrics:
    """The summary of one comparison: error statistics and the reasons it fails."""
    numel = o.numel()
    matched = float(ok.sum()) / numel if numel else 1.0
    finite_diff = diff[both].to(torch.float64)
    max_abs = float(finite_diff.max()) if finite_diff.numel() else 0.0
    if bad_nonfinite:
        max_abs = math.inf
    mean_abs = float(finite_diff.mean()) if finite_diff.numel() else 0.0
    ref_norm = float(torch.linalg.vector_norm(r[both].to(torch.float64))) if both.any() else 0.0
    err_norm = float(torch.linalg.vector_norm(finite_diff)) if finite_diff.numel() else 0.0
    rel_l2 = err_norm / ref_norm if ref_norm > 0 else (0.0 if err_norm == 0 else math.inf)
    reasons = []
    if bad_nonfinite:
        reasons.append("nonfinite")
    if all_zero:
        reasons.append("all_zero")
    if matched < tol.min_matched_ratio:
        reasons.append("tolerance")
    if tol.max_abs_error is not None and max_abs > tol.max_abs_error:
        reasons.append("max_abs")
    worst = None
    if numel:
        worst = tuple(int(i) for i in torch.unravel_index(torch.argmax(diff.flatten()), o.shape))
    return OutputMetrics(name, max_abs, mean_abs, rel_l2, matched, numel, bad_nonfinite, all_zero,
                         not reasons, reasons, worst)


# --------------------------------------------------------------------------- hygiene checks
def fingerprint(t: Any) -> Any:
    """A cheap content fingerprint (bitwise) of a tensor, computed where it lives."""
    if not isinstance(t, torch.Tensor):
        return t
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    bits = t.detach().contiguous().view(width).flatten().to(torch.int64)
    weights = torch.arange(1, bits.numel() + 1, device=bits.device, dtype=torch.int64) % 1_000_003
    return (tuple(t.shape), t.dtype, int(bits.sum()), int((bits * weights).sum()))


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device:
        return False
    a0, a1 = _storage_span(a)
    b0, b1 = _storage_span(b)
    return a0 < b1 and b0 < a1 and a1 > a0 and b1 > b0


def poison_allocator(device: torch.device, nbytes: int) -> None:
    """Fill the memory the caching allocator will hand out next with NaN.

    On CUDA, a freed block stays in torch's cache and is reused for the next allocations,
    so outputs an implementation allocates but never fully writes show NaN. The allocator
    hands out the smallest cached block that fits, and a segment that still holds a live
    tensor keeps its free fragments in the cache even through ``empty_cache``: so every
    free block in the cache is taken, filled with NaN and given back (small-pool
    fragments in pieces of at most 1 MiB, the largest request that pool serves), and then
    one fresh block of ``nbytes`` for outputs larger than anything cached. On the CPU,
    large allocations come fresh from the OS (zeros); unwritten elements are then caught
    by the comparison with the oracle and the all-zero rule."""
    if device.type != "cuda" or nbytes <= 0:
        return
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()                      # whole free segments go back to the driver
    index = device.index if device.index is not None else torch.cuda.current_device()
    small_max = 1 << 20
    requests = []
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device", index) != index:
            continue
        for block in segment.get("blocks", []):
            if block.get("state") != "inactive":
                continue
            size = int(block["size"])
            if segment.get("segment_type") == "small":
                requests += [small_max] * (size // small_max) + ([size % small_max] if size % small_max else [])
            else:
                requests.append(size)
    held = []
    for size in sorted(requests):
        held.append(torch.empty(max(size // 4, 1), dtype=torch.float32, device=device).fill_(float("nan")))
    try:
        held.append(torch.empty(int(nbytes) // 4 + 1, dtype=torch.float32, device=device).fill_(float("nan")))
    except torch.cuda.OutOfMemoryError:           # no room for a fresh block: the cache is poisoned
        pass
    del held


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
    impl_seconds: float
    oracle_seconds: float
    seed: int
    tolerance: dict[str, Any] = field(default_factory=dict)
    predicted: Prediction | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _as_tuple(outputs: Any) -> tuple:
    if isinstance(outputs, torch.Tensor):
        return (outputs,)
    return tuple(outputs) if isinstance(outputs, (tuple, list)) else outputs


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _predict(defn: Definition, outputs, inputs, tol: Tolerance, predictor: Callable) -> Prediction:
    """The benchmark's verdict on ``outputs``: ``predictor`` (its reference) under its rules."""
    refs = _as_tuple(predictor(*inputs))
    metrics = [compare(o, r, tol, s.name, rules="sol") for o, r, s in zip(outputs, refs, defn.outputs)]
    violations = list(dict.fromkeys(reason for m in metrics for reason in m.reasons))
    return Prediction(not violations, metrics, violations)


def input_groups(defn: Definition) -> dict[str, list[int]]:
    """Input indices by group: ``activations`` (tensors whose shape depends on a var axis:
    what changes from call to call in a model) and ``weights`` (every other input a
    generator draws: weights, scales, norm weights, drawn scalars). Fixed-value scalars
    (an epsilon) are in neither."""
    var = set(defn.var_axes)
    changed = True
    while changed:                       # expr axes computed from var axes vary too
        changed = False
        for a in defn.axes.values():
            if a.kind == "expr" and a.name not in var and _names(a.expression) & var:
                var.add(a.name)
                changed = True
    groups: dict[str, list[int]] = {"activations": [], "weights": []}
    for i, spec in enumerate(defn.inputs):
        if spec.is_scalar:
            if spec.value is None:
                groups["weights"].append(i)
        elif any(_names(d) & var for d in spec.shape):
            groups["activations"].append(i)
        else:
            groups["weights"].append(i)
    return groups


def _names(expression: str) -> set[str]:
    import ast
    return {n.id for n in ast.walk(ast.parse(str(expression), mode="eval")) if isinstance(n, ast.Name)}


class Local:
    """The implementation called in fuseval's own process (``--in-process``): it is trusted,
    since it could change anything in this process, the verdict included. Same interface
    as :class:`fuseval.isolation.Worker` (``call``, ``recopy``), minus the isolation."""

    def __init__(self, fn: Callable, device: torch.device, baseline: dict[str, int] | None = None):
        self.fn, self.device, self.kept = fn, torch.device(device), None
        self.baseline = baseline

    def call(self, inputs, *, keep: bool = False, poison: int = 0, deadline: float | None = None,
             expected=None):
        from . import integrity
        from .isolation import CallResult, _is_oom, describe_exception
        poison_allocator(self.device, poison)
        before = integrity.threads()
        t0 = time.perf_counter()
        try:
            outputs = _as_tuple(self.fn(*inputs))
            _sync(self.device)
        except SystemExit as exc:
            return CallResult("exited", violations=["exited"],
                              messages=[f"the implementation called sys.exit({exc.code!r})"],
                              seconds=time.perf_counter() - t0)
        except Exception as exc:  # noqa: BLE001 - an implementation's failure is a verdict, not a crash
            line, where = describe_exception(exc)
            return CallResult("raised", violations=["out_of_memory" if _is_oom(exc) else "raised"],
                              messages=[f"implementation raised: {line}" + (f" (at {where})" if where else "")],
                              seconds=time.perf_counter() - t0, where=where, error=line)
        res = CallResult("ok", outputs=outputs, seconds=time.perf_counter() - t0)
        if self.baseline is not None:
            tampered = integrity.changed(self.baseline)
            if tampered:
                res.violations.append("tampered")
                res.messages.append("the implementation replaced functions a verdict relies on: "
                                    + ", ".join(tampered[:8]))
        threads = integrity.new_threads(before)
        if threads:
            res.violations.append("lingering_thread")
            res.messages.append("the implementation left threads running after it returned: " + ", ".join(threads[:8]))
        if isinstance(outputs, (tuple, list)):
            for i, o in enumerate(outputs):
                if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor:
                    res.violations.append("bad_outputs")
                    res.messages.append(f"output {i} is a {type(o).__module__}.{type(o).__qualname__}, a subclass "
                                        "of torch.Tensor; expected exactly torch.Tensor")
                elif isinstance(o, torch.Tensor) and o.device.type != self.device.type:
                    res.violations.append("wrong_device")
                    res.messages.append(f"output {i} is on device {o.device}, expected {self.device}")
            for i, o in enumerate(outputs):
                for j, t in enumerate(inputs):
                    if isinstance(o, torch.Tensor) and isinstance(t, torch.Tensor) and _overlaps(o, t):
                        res.aliases.append((i, j))
        if keep:
            self.kept = outputs
        return res

    def recopy(self, like, deadline=None):
        kept, self.kept = self.kept, None
        return None if kept is None else [o.detach().clone() for o in kept]


# violations after which a case's outputs are not there to compare
_NO_OUTPUTS = ("timeout", "exited", "crashed", "raised", "out_of_memory")


def _deadline(timeout: float | None) -> float | None:
    return time.monotonic() + float(timeout) if timeout else None


def _same(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return all(torch.equal(x.to(torch.float64).nan_to_num(1.5), y.to(torch.float64).nan_to_num(1.5))
               for x, y in zip(a, b))


def run_case(defn: Definition, impl: Any, case: Case, *, seed: int, device: torch.device,
             mode: str = "benchmark", reference: Callable | None = None,
             inputs: Sequence[Any] | None = None, hygiene: bool = True, rules: str = "fuseval",
             predictor: Callable | None = None, timeout: float | None = None) -> CaseResult:
    """Check ``impl`` on one case: fresh inputs, oracle, tolerance and hygiene rules.

    ``impl``: a callable (called here, in this process: trusted), a :class:`Local`, or a
    :class:`fuseval.isolation.Worker` (the implementation in its own process).
    ``reference``: what the outputs are compared with (default: the float64 oracle);
    ``rules``: "fuseval" or "sol" (see ``RULES``); ``predictor``: when given (the
    benchmark's ``sol_reference``), the benchmark's verdict is predicted beside.
    ``timeout``: seconds every call of the implementation in this case may take together
    (enforced for a worker only: a call in this process cannot be interrupted)."""
    runner = impl if hasattr(impl, "call") and hasattr(impl, "recopy") else Local(impl, device)
    reference = reference or _ops.resolve_impl(defn, "reference")
    tol = case.tolerance or defn.tolerance
    tol_dict = asdict(tol)
    case_seed = seed + case.index
    if inputs is None:
        inputs = generate_inputs(defn, case.axes, seed=case_seed, mode=mode, device=device)
    bound = bind_axes(defn, inputs, check_values=False)
    # fingerprints (a full int64 pass over every input) only when the hygiene rules use them;
    # taken before the oracle runs, so an oracle that mutated its inputs would show too
    before = [fingerprint(t) for t in inputs] if hygiene else None
    violations: list[str] = []
    messages: list[str] = []
    expected = [(defn.shape_of(s, bound), TORCH_DTYPES[s.dtype]) for s in defn.outputs]

    out_bytes = sum(math.prod(defn.shape_of(s, bound)) * 4 for s in defn.outputs)
    # the oracle runs first, on the untouched inputs: an implementation that mutates its
    # inputs is then compared with the answer to the question it was asked
    t0 = time.perf_counter()
    refs = reference(*inputs)
    _sync(device)
    oracle_seconds = time.perf_counter() - t0

    deadline = _deadline(timeout)
    res = runner.call(inputs, keep=hygiene, poison=2 * out_bytes, deadline=deadline, expected=expected)
    impl_seconds = res.seconds

    def result(metrics=(), predicted=None) -> CaseResult:
        v = list(dict.fromkeys(violations))
        return CaseResult(case.index, dict(case.axes), list(metrics), v, messages, not v,
                          impl_seconds, oracle_seconds, case_seed, tol_dict, predicted)

    violations += res.violations
    messages += res.messages
    if any(v in _NO_OUTPUTS or v in ("bad_outputs", "wrong_device") for v in res.violations):
        return result()
    outputs = res.outputs
    problems = check_outputs_shape(defn, outputs, bound)
    if problems:
        violations.append("bad_outputs")
        messages.extend(problems)
        return result()

    metrics = [compare(o, r, tol, s.name, rules) for o, r, s in zip(outputs, refs, defn.outputs)]
    del refs
    predicted = _predict(defn, outputs, inputs, tol, predictor) if predictor is not None else None
    for m in metrics:
        for reason in m.reasons:
            violations.append(reason)
            messages.append(f"{m.name}: {reason} (max abs {m.max_abs:.3g}, matched {m.matched_ratio:.4%})")
    numerics_passed = all(m.passed for m in metrics)

    if hygiene:
        after = [fingerprint(t) for t in inputs]
        for spec, a, b in zip(defn.inputs, before, after):
            if a != b:
                violations.append("mutated_input")
                messages.append(f"input {spec.name!r} was modified by the implementation")
        for o_index, i_index in res.aliases:
            violations.append("aliased_output")
            messages.append(f"output {defn.outputs[o_index].name!r} shares memory with input "
                            f"{defn.inputs[i_index].name!r}")
        first = [o.detach().clone() for o in outputs]
        _hygiene_calls(defn, runner, case, case_seed, mode, device, inputs, bound, first, reference, tol,
                       rules, numerics_passed, "all_zero" in violations, deadline, expected,
                       violations, messages)
        # the first answer must still be what it was after all those calls
        now = runner.recopy(first, deadline)
        if now is not None and not _same(first, now):
            violations.append("output_reused")
            messages.append("a later call overwrote the outputs returned by the first")
        del first, now
    return result(metrics, predicted)


def _hygiene_calls(defn, runner, case, case_seed, mode, device, inputs, bound, first, reference, tol, rules,
                   numerics_passed, all_zero, deadline, expected, violations, messages) -> None:
    """More calls, each of which must change the outputs: only the activations drawn anew,
    then only the weights (the rest kept). A cache keyed on the weights hits on the first,
    one keyed on the activations on the second, an answer cached under no key on both; a
    cache keyed on every input never hits and returns fresh answers, which is fine. The
    partial calls are compared with the oracle on their own inputs when the first call
    passed: a stale answer that differs from the first is still wrong. An operator whose
    inputs are all of one group gets one call with every input drawn anew instead."""
    other = generate_inputs(defn, case.axes, seed=case_seed + 7_919_993, mode=mode, device=device)
    groups = input_groups(defn)
    calls = []
    for name in ("activations", "weights"):
        idx = set(groups[name])
        if idx and len(idx) < len(inputs):
            mixed = [other[i] if i in idx else inputs[i] for i in range(len(inputs))]
            calls.append((f"only the {name} changed", mixed, True))
    if len(calls) < 2:
        calls = [("every input changed", other, False)]
    for what, args, judge in calls:
        res = runner.call(args, deadline=deadline, expected=expected)
        if res.violations:
            violations.extend(res.violations)
            messages.extend(f"call with {what}: {m}" for m in res.messages)
            if any(v in _NO_OUTPUTS for v in res.violations):
                return
            continue
        if check_outputs_shape(defn, res.outputs, bound):
            continue
        # an all-zero answer is the same for any input: it is reported as all_zero, not
        # as a cached result (that rule is for answers that are right once, then stale)
        if not all_zero and _same(first, res.outputs):
            violations.append("cached_result")
            messages.append(f"a call with {what} returned identical outputs")
            continue
        if judge and numerics_passed:
            refs = reference(*args)
            bad = [m for m in (compare(o, r, tol, s.name, rules) for o, r, s in zip(res.outputs, refs, defn.outputs))
                   if not m.passed]
            if bad:
                violations.append("cached_result")
                messages.append(f"a call with {what} returned outputs that do not match the oracle on its inputs "
                                f"({bad[0].name}: {', '.join(bad[0].reasons)}, matched {bad[0].matched_ratio:.4%}): "
                                "a result cached on part of the inputs")


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

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

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


def validate_selection(selection: Any, n: int) -> None:
    """Reject a case selection that selects nothing or a case twice (``ValueError`` naming
    the selection); the definition's parser does the rest."""
    from .definitions import parse_selection
    if selection is None or selection == "all":
        return
    if isinstance(selection, str) and not selection.strip(" ,"):
        raise ValueError(f"case selection {selection!r} is empty; give indices such as '0,3,5-7' or 'all'")
    idx = parse_selection(selection, n)
    if not idx:
        raise ValueError(f"case selection {list(selection)!r} selects no case (cases are 0..{n - 1})")
    dup = sorted({i for i in idx if idx.count(i) > 1})
    if dup:
        raise ValueError(f"case selection {selection!r} selects case(s) {dup} more than once")


def check(op: str | Definition, impl: str | Callable, *, config: str | Mapping[str, int] = "small",
          cases: Sequence[int] | str | None = None, device: str | torch.device | None = "cpu",
          seed: int = 0, mode: str = "benchmark", hygiene: bool = True,
          progress: Callable[[CaseResult, int, int], None] | None = None,
          variant: str | None = None, against: str = "reference", rules: str = "fuseval",
          predict: bool = True, isolate: bool | None = None, timeout: float | None = None) -> CheckReport:
    """Check ``impl`` (name, 'module:function' or callable) on ``op``'s benchmark cases.

    ``config``: "seed" (full size), "small" or another named scaled-down configuration.
    ``variant``: a named semantic variant of the operator (default: the benchmark's).
    ``against``: the implementation the outputs are compared with ("reference": the
    float64 oracle; "sol_reference": the benchmark's reference in its own precision);
    ``rules``: "fuseval" or "sol" (the benchmark's evaluator). ``predict``: also predict
    the benchmark's verdict (``sol_reference`` under the "sol" rules) where the operator
    has a ``sol_reference`` and the check is not that prediction already.
    ``isolate`` (default, None: ``isolation.ISOLATE``, True): the implementation runs in a worker process of its own
    (:mod:`fuseval.isolation`) and is never imported here; False runs it in this process,
    trusting it. A Python callable that cannot be sent to a worker (defined in
    ``__main__``, a lambda) runs in this process with an :class:`IsolationWarning`.
    ``timeout``: seconds each case may spend in the implementation (default
    ``isolation.DEFAULT_TIMEOUT``; 0 or None with ``isolate=False``: none); once a case
    timed out, the remaining cases are reported as timed out without being run.
    Returns a :class:`CheckReport`; ``report.passed`` is True only if every case passed."""
    from . import integrity, isolation
    if rules not in RULES:
        raise ValueError(f"rules: expected one of {', '.join(RULES)}, got {rules!r}")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0 or math.isnan(timeout)):
        raise ValueError(f"timeout: expected a number of seconds >= 0 (0: none), got {timeout!r}")
    operator = _ops.get(op, config, variant)
    defn = operator.definition
    if impl == "reference":
        raise ValueError("'reference' is the float64 oracle itself (its outputs are float64, unrounded); "
                         "check 'reference_fp32' for the float32 reference, or another implementation")
    validate_selection(cases, len(defn.seed_cases))
    isolate = isolation.default_isolate(isolate)
    if isolate:
        ok, why = isolation.can_isolate(impl)
        if not ok:
            warnings.warn(isolation.IsolationWarning(
                f"implementation {_ops.impl_label(impl)!r} runs in fuseval's own process (trusted): {why}"),
                stacklevel=2)
            isolate = False
    dev = resolve_device(device)
    if isolate:
        runner: Any = isolation.worker_for(impl, defn, str(dev))
        timeout = isolation.DEFAULT_TIMEOUT if timeout is None else timeout
    else:
        baseline = integrity.snapshot()       # before the implementation is imported
        runner = Local(operator.implementation(impl), dev, baseline=baseline)
    reference = operator.implementation(against)
    predictor = None
    if predict and SOL_REFERENCE in defn.implementations and impl != SOL_REFERENCE \
            and (against, rules) != (SOL_REFERENCE, "sol"):
        predictor = operator.implementation(SOL_REFERENCE)
    results = []
    selected = defn.cases(cases)
    timed_out = None
    for n, case in enumerate(selected):
        if timed_out is not None:
            tol = case.tolerance or defn.tolerance
            result = CaseResult(case.index, dict(case.axes), [], ["timeout"],
                                [f"not run: the implementation timed out on case {timed_out} of this run"],
                                False, 0.0, 0.0, seed + case.index, asdict(tol))
        else:
            result = run_case(defn, runner, case, seed=seed, device=dev, mode=mode, reference=reference,
                              hygiene=hygiene, rules=rules, predictor=predictor, timeout=timeout)
            if "timeout" in result.violations:
                timed_out = case.index
        results.append(result)
        if progress:
            progress(result, n + 1, len(selected))
    return CheckReport(defn.name, _ops.impl_label(impl), defn.config, str(dev), seed, mode,
                       asdict(defn.tolerance), results, defn.variant, against, rules, isolated=bool(isolate))
