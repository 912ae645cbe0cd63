"""Property: any implementation of an operator agrees with the float64 oracle.

:func:`check_implementation` draws examples (axis binding x input mode x seed x
adversarial recipe, see :mod:`.strategies`) under a Hypothesis profile, runs the
implementation and the oracle on each, and checks

``tolerance``
    the definition's rule (elementwise atol + rtol|ref|, matched ratio, max-abs bound,
    no NaN/Inf the oracle does not have, not all-zero), through :func:`fuseval.check.run_case`
    (which also poisons the CUDA allocator with NaN before the call and rejects wrong
    output shapes / dtypes and exceptions);
``tight_bound``
    on well-conditioned draws (benchmark and realistic modes) a normwise bound far tighter
    than the rule: ``rel_l2 = |out - ref|_2 / |ref|_2 <= factor * u`` per output, where u
    is the unit roundoff (:func:`fuseval.precision.unit_roundoff`) of the implementation's
    working precision; the operator's hooks give the precision and the factor
    (:class:`~fuseval.properties.hooks.TightBound`; docs/properties.md derives them).
    Passing ``precision=`` changes u. Operators whose hooks give no bound skip it;
``metamorphic``
    implementation-level invariants on a few draws: batch items independent (every
    operator with a batch axis), then the operator's own (its hooks' ``invariants``, e.g.
    causality, NaN poisoning patterns).

It returns a :class:`PropertyReport`; each :class:`Failure` carries the axis binding, the
input mode (and recipe), the seed and a command that reproduces it.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch
from hypothesis import Verbosity, example as hyp_example, given, reject, settings
from hypothesis import seed as hyp_seed
from hypothesis.errors import Flaky, Unsatisfiable

from ..operators import implementations as _ops
from ..check import resolve_device, run_case
from ..definitions import Case, Definition, Tolerance
from ..operators import OperatorRecord, variant_scope
from ..errors import OutOfMemory, is_out_of_memory
from ..memory import DrawBound, draw_budget
from ..precision import unit_roundoff
from ..validate import bind_axes, expected_outputs
from . import invariants as inv
from .hooks import hooks_of, record_of
from .profiles import PROFILE_DEVICE, PROFILE_SPACE, no_shrink, property_seed, property_settings
from .satisfiable import UnsatisfiableAxes, check_satisfiable, smallest_valid_bytes
from .strategies import INPUT_MODES, Example, _valid, examples, explicit_examples, input_modes

__all__ = ["check_implementation", "evaluate", "PropertyReport", "Failure", "tight_bound",
           "has_tight_bound"]


def has_tight_bound(op: str | Definition | OperatorRecord) -> bool:
    """Whether ``op``'s hooks give a ``tight_bound`` property."""
    return hooks_of(record_of(op)).tight_bound is not None


def tight_bound(op: str | Definition | OperatorRecord, precision: str | None = None) -> float:
    """``factor * unit_roundoff(precision)`` of ``op``'s hooks' :class:`TightBound`
    (``precision`` replaces the hooks' working precision; a ValueError names an unknown
    one, and an operator whose hooks give no bound)."""
    op = record_of(op)
    bound = hooks_of(op).tight_bound
    if bound is None:
        raise ValueError(f"{op.name}: its property hooks give no tight bound (PropertyHooks.tight_bound is None)")
    return bound.factor * unit_roundoff(precision or bound.precision)


# --------------------------------------------------------------------------- results
@dataclass
class Failure:
    """One falsified property, with everything needed to reproduce it."""
    property: str
    op: str
    impl: str
    example: Example
    device: str
    messages: list[str]
    metrics: list[dict[str, Any]] = field(default_factory=list)

    @property
    def command(self) -> str:
        return self.example.command(self.impl, self.device)

    @property
    def check_command(self) -> str:
        return self.example.check_command(self.impl, self.device)

    def __str__(self) -> str:
        ex = self.example
        lines = [f"property {self.property!r} falsified for {self.op} / {self.impl} on {self.device}",
                 ex.describe(),
                 *(f"  {m}" for m in self.messages),
                 f"reproduce: {self.command}",
                 f"closest fuseval check: {self.check_command}"
                 + ("" if ex.binding.config_arg.isidentifier() else
                    "  (needs --config to accept a JSON mapping)")
                 + ("" if ex.mode != "adversarial" else "  (no adversarial mode there)")]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        ex = self.example
        return {"property": self.property, "op": self.op, "impl": self.impl, "device": self.device,
                "config": ex.binding.config, "axes": ex.binding.axes, "mode": ex.mode,
                "recipe": json.loads(ex.recipe.to_json()) if ex.recipe else None, "seed": ex.seed,
                "messages": self.messages, "metrics": self.metrics, "command": self.command}


@dataclass
class PropertyReport:
    op: str
    impl: str
    profile: str
    device: str
    failures: list[Failure]
    examples_run: int
    seconds: float
    properties: list[str]
    # draws where the tolerance failed but the precision baseline missed it too and the
    # implementation stayed within its error (PropertyHooks.precision_baseline)
    excused: list[Failure] = field(default_factory=list)
    # the memory bound per draw, where the run lowered it (the oracle ran out of memory)
    lowered_bound: int | None = None

    @property
    def passed(self) -> bool:
        return not self.failures

    def notes(self) -> list[str]:
        """What the verdict leaves aside, one line each."""
        out = []
        if self.excused:
            out.append(f"{len(self.excused)} draw(s) where the tolerance failed and the benchmark's own reference "
                       f"missed it too; judged by that reference's error instead (first: "
                       f"{self.excused[0].example.describe().splitlines()[0]}; {self.excused[0].messages[0]})")
        if self.lowered_bound is not None:
            out.append(f"the oracle ran out of memory on a draw: draws above {_mib(self.lowered_bound)} were "
                       f"not run")
        return out

    def __str__(self) -> str:
        head = (f"{self.op} / {self.impl}: properties {', '.join(self.properties)} "
                f"({self.profile} profile, {self.device}): "
                f"{'passed' if self.passed else 'FAILED'} after {self.examples_run} examples "
                f"in {self.seconds:.1f} s")
        return "\n\n".join([head] + [f"note: {n}" for n in self.notes()] + [str(f) for f in self.failures])

    def to_dict(self) -> dict[str, Any]:
        return {"op": self.op, "impl": self.impl, "profile": self.profile, "device": self.device,
                "passed": self.passed, "examples_run": self.examples_run, "seconds": self.seconds,
                "properties": self.properties, "failures": [f.to_dict() for f in self.failures],
                "excused": [f.to_dict() for f in self.excused], "lowered_bound": self.lowered_bound,
                "notes": self.notes()}


class _Falsified(AssertionError):
    pass


class _OutOfMemoryHere(BaseException):
    """(example, the allocation failure): a BaseException, so Hypothesis neither shrinks
    nor replays it but lets it through at once."""


def _fits_memory(example: Example, max_bytes: int | None) -> bool:
    return max_bytes is None or example.binding.planned_bytes() <= max_bytes


# --------------------------------------------------------------------------- one example
# a draw where the precision baseline (the benchmark's reference in its own precision)
# misses the tolerance too is judged by its error: at most this many times it, per output
# (flash-attention's rule: the kernel's error at most twice the naive implementation's)
BASELINE_ERROR_FACTOR = 2.0
# failure reasons about the numbers (comparison.compare); any other (raised, nonfinite,
# all-zero, bad outputs...) fails whatever the baseline does
_NUMERIC_REASONS = frozenset({"tolerance", "max_abs", "worst_element", "error_rms"})


def _oracle_side(fn: Callable, *args):
    """``fn(*args)``, a computation of fuseval's own side of a draw (the oracle), with an
    allocation failure raised as :class:`OracleOutOfMemory`."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - only out of memory is told apart
        if is_out_of_memory(exc) or isinstance(exc, OutOfMemory):
            raise OracleOutOfMemory(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from exc
        raise


class _OracleOnce:
    """The oracle of one draw, computed on the first call and handed back on the next (the
    implementation and the precision baseline are compared with the same outputs; both
    calls get the draw's unchanged inputs)."""

    def __init__(self, oracle: Callable):
        self.oracle, self.outputs = oracle, None

    def __call__(self, *inputs):
        if self.outputs is None:
            self.outputs = _oracle_side(self.oracle, *inputs)
        return self.outputs


class OutsideDomain(Exception):
    """A draw the operator's own reference does not answer as its definition says: a
    rejected draw (for operators whose hooks declare an ``outside_domain``), not a verdict."""


class OracleOutOfMemory(RuntimeError):
    """The oracle of a draw (fuseval's side, not the implementation) ran out of memory:
    the draw is larger than the device holds, which the planned bytes did not foresee."""


def _baseline_verdict(example: Example, defn, hooks, x, dev: torch.device, case: Case, mode: str,
                      oracle: Callable, result) -> tuple[bool, list[str]]:
    """Whether a draw that failed the tolerance is excused by the precision baseline (see
    :class:`~fuseval.properties.hooks.PropertyHooks`), and the lines that say why or why not."""
    if hooks.precision_baseline is None or not set(result.violations) <= _NUMERIC_REASONS:
        return False, []
    base = run_case(defn, _ops.resolve_impl(defn, hooks.precision_baseline), case, seed=example.seed,
                    device=dev, mode=mode, inputs=x, hygiene=False, reference=oracle)
    who = f"the precision baseline ({hooks.precision_baseline})"
    if base.passed:
        return False, [f"{who} meets the tolerance on this draw: "
                       + ", ".join(f"{b.name} matched {b.matched_ratio:.2%}" for b in base.outputs)]
    lines, excused = [], True
    for m, b in zip(result.outputs, base.outputs):
        if m.passed:
            continue
        within = (not b.passed and math.isfinite(m.max_abs) and math.isfinite(m.rel_l2)
                  and m.max_abs <= BASELINE_ERROR_FACTOR * b.max_abs
                  and m.rel_l2 <= BASELINE_ERROR_FACTOR * b.rel_l2)
        excused = excused and within
        lines.append(f"{m.name}: {who} {'misses the tolerance here too' if not b.passed else 'meets it'} "
                     f"(matched {b.matched_ratio:.2%}, max abs {b.max_abs:.3g}, rel L2 {b.rel_l2:.3g}); "
                     f"this implementation: matched {m.matched_ratio:.2%}, max abs {m.max_abs:.3g}, "
                     f"rel L2 {m.rel_l2:.3g}: {'within' if within else 'beyond'} "
                     f"{BASELINE_ERROR_FACTOR:g}x the baseline's error")
    return excused, lines


def evaluate(example: Example, impl: Callable, *, device: torch.device | str = "cpu",
             precision: str | None = None, tight: bool = True) -> tuple[str | None, list[str], list[dict]]:
    """Run ``impl`` and the oracle on one example. Returns (falsified property or None,
    messages, per-output metrics). With no property falsified, the messages (if any) say
    why a tolerance miss was excused (the precision baseline misses it too)."""
    dev = torch.device(device)
    defn = example.definition()
    hooks = hooks_of(defn)
    x = example.tensors(dev)
    mode = example.mode if example.mode != "adversarial" else "benchmark"
    # the tolerance: the definition's, or (an imported problem) its nearest workload's
    tol = defn.nearest_case(example.binding.axes).tolerance if hooks.case_tolerance else None
    if hooks.scale_atol_with_magnitude and example.recipe is not None and example.recipe.magnitude in SCALED_UP:
        tol = magnitude_scaled(tol or defn.tolerance, _oracle_side(magnitude_factor, example, x, dev))
    case = Case(0, example.binding.axes, tol)
    oracle = _OracleOnce(_ops.resolve_impl(defn, "reference"))   # the oracle: the definition's reference
    result = run_case(defn, impl, case, seed=example.seed, device=dev, mode=mode, inputs=x, hygiene=False,
                      reference=oracle)
    metrics = [{"output": m.name, "max_abs": m.max_abs, "rel_l2": m.rel_l2,
                "matched_ratio": m.matched_ratio, "passed": m.passed} for m in result.outputs]
    if "bad_outputs" in result.violations and hooks.outside_domain and oracle.outputs is not None:
        # the problem's own reference answers this binding in other shapes than its
        # definition gives (inputs its code reads another size from): outside its domain
        expected = expected_outputs(defn, bind_axes(defn, x, check_values=False))
        wrong = [f"{spec.name} has shape {tuple(out.shape)}, its definition gives {shape}"
                 for spec, out, (shape, _) in zip(defn.outputs, _as_tuple(oracle.outputs), expected)
                 if isinstance(out, torch.Tensor) and tuple(out.shape) != shape]
        if wrong:
            raise OutsideDomain(f"the reference's own outputs: {'; '.join(wrong)}")
    if not result.passed:
        excused, lines = _baseline_verdict(example, defn, hooks, x, dev, case, mode, oracle, result)
        if excused:
            return None, lines, metrics
        return "tolerance", list(result.messages) + lines, metrics
    if tight and example.well_conditioned and has_tight_bound(example.binding.operator):
        bound = tight_bound(example.binding.operator, precision)
        over = [m for m in result.outputs if not m.rel_l2 <= bound]
        if over:
            return "tight_bound", [f"{m.name}: relative L2 error {m.rel_l2:.3g} > {bound:.3g} "
                                   f"(well-conditioned {example.mode} input; max abs {m.max_abs:.3g})"
                                   for m in over], metrics
    return None, [], metrics


# recipe magnitudes that scale the activations up (their outputs grow with them)
SCALED_UP = ("huge", "mixed")


def magnitude_factor(example: Example, inputs: Sequence[Any], device: torch.device) -> float:
    """How much larger the oracle's outputs on ``inputs`` (an adversarial draw) are than on
    the same draw at unit magnitude: the largest ratio of the outputs' max |value| (at
    least 1). An output that is zero at unit magnitude does not count."""
    defn = example.definition()
    oracle = _ops.resolve_impl(defn, "reference")
    twin = Example(example.binding, example.mode, example.seed, replace(example.recipe, magnitude="unit"))
    ours, unit = (_as_tuple(oracle(*xs)) for xs in (inputs, twin.tensors(device)))
    factor = 1.0
    for a, b in zip(ours, unit):
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.numel():
            top, base = float(a.abs().max()), float(b.abs().max())
            if base > 0 and math.isfinite(top):
                factor = max(factor, top / base)
    return factor


def magnitude_scaled(tol: Tolerance, factor: float) -> Tolerance:
    """``tol`` with its absolute parts (atol, the max-abs bound) times ``factor``: an
    absolute tolerance written for the benchmark's magnitudes, on outputs ``factor`` times
    larger."""
    if factor <= 1:
        return tol
    return replace(tol, atol=tol.atol * factor,
                   max_abs_error=None if tol.max_abs_error is None else tol.max_abs_error * factor)


def _as_tuple(out) -> tuple:
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def _metamorphic(example: Example, impl: Callable, device: torch.device) -> list[str]:
    """Implementation-level invariants on one example (messages of the violated ones):
    batch independence, then the operator's own (its hooks' ``invariants``)."""
    x = example.tensors(device)
    defn = example.definition()
    hooks = hooks_of(defn)
    problems = []
    checks: list[tuple[str, Callable[[], Any]]] = []
    tol = defn.nearest_case(example.binding.axes).tolerance if hooks.case_tolerance else defn.tolerance
    if example.binding.axes.get(hooks.batch_axis, 1) > 1:
        checks.append(("batch items independent",
                       lambda: inv.batch_independence(defn, x, impl=impl, tolerance=tol)))
    for invariant in hooks.invariants:
        # building a check runs the oracle at most (the implementation runs in ``fn`` below)
        check = _oracle_side(invariant, example, x, impl, defn)
        if check is not None:
            checks.append(check)
    for name, fn in checks:
        try:
            fn()
        except inv.InvariantViolation as exc:
            problems.append(f"{name}: {exc}")
        except Exception as exc:  # noqa: BLE001 - an implementation raising is a verdict
            problems.append(f"{name}: implementation raised {type(exc).__name__}: {exc}")
    return problems


# --------------------------------------------------------------------------- the property run
@dataclass
class _PropertyRun:
    """What the property runs of one :func:`check_implementation` share: each falsified
    property is appended to ``failures``, each draw a tolerance miss was excused on to
    ``excused``, each example run counted in ``counter``. ``bound`` is the memory bound per
    draw, lowered where the oracle of a draw within it ran out of memory."""
    operator: OperatorRecord
    label: str
    dev: torch.device
    seed: int | None
    outside_domain: tuple[type[BaseException], ...]
    bound: DrawBound
    space: str
    failures: list
    excused: list
    counter: dict
    ooms: list = field(default_factory=list)   # (planned bytes, message) of each draw the oracle ran out of memory on

    def run(self, name: str, strategy, check: Callable[[Example], tuple[str | None, list[str], list]],
            starters: list[Example], settings_: settings) -> None:
        op, label, dev, seed, bound, failures, counter = (self.operator.name, self.label, self.dev, self.seed,
                                                          self.bound, self.failures, self.counter)
        state: dict[str, Any] = {}

        def prop(ex: Example) -> None:
            if bound.lowered and ex.binding.planned_bytes() > bound.bytes:
                reject()          # larger than a draw the oracle already ran out of memory on
            try:
                verdict, messages, metrics = check(ex)
            except OracleOutOfMemory as exc:
                # fuseval's side of the draw did not fit: smaller draws only, from here on
                planned = ex.binding.planned_bytes()
                bound.lower_below(planned)
                self.ooms.append((planned, str(exc)))
                reject()
            except (OutsideDomain, *self.outside_domain) as exc:
                state["outside"] = state.get("outside", 0) + 1
                state["why_outside"] = str(exc)
                reject()          # the operator's own code refuses this draw: outside its domain
            except Exception as exc:  # noqa: BLE001 - only out of memory is kept, the rest re-raised
                if not is_out_of_memory(exc):
                    raise
                # not a verdict on the implementation, and not a failure Hypothesis may
                # replay (the rerun would fit or not at random): it ends the run here
                raise _OutOfMemoryHere(ex, exc) from exc
            counter["n"] += 1
            if verdict:
                state["failure"] = Failure(verdict, op, label, ex, str(dev), messages, metrics)
                raise _Falsified(f"{verdict}: {'; '.join(messages)}")
            if messages:
                self.excused.append(Failure("excused", op, label, ex, str(dev), messages, metrics))

        test = settings_(given(strategy)(prop))
        for ex in reversed(starters):
            test = hyp_example(ex)(test)
        if seed is not None:
            test = hyp_seed(seed)(test)
        try:
            test()
        except _Falsified:
            failures.append(state["failure"])
        except _OutOfMemoryHere as oom:
            ex, exc = oom.args
            raise OutOfMemory(f"{op}: property {name!r}: out of memory on the example {ex!r} (planned "
                              f"{ex.binding.planned_bytes() / 2**20:.0f} MiB; the bound per draw on {dev} was "
                              f"{_mib(bound.bytes)}): "
                              f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        except Unsatisfiable as exc:
            smallest = smallest_valid_bytes(self.operator, self.space)
            if bound.lowered or (bound.bytes is not None and smallest is not None and smallest > bound.bytes):
                ooms = self.ooms
                raise OutOfMemory(
                    f"{op}: property {name!r}: no draw fits the memory of {dev}: the bound per draw is "
                    f"{_mib(bound.bytes)}"
                    + (f" (lowered from {_mib(bound.start)} after the oracle ran out of memory on "
                       f"{len(ooms)} draw(s), the smallest planned {_mib(min(p for p, _ in ooms))}: "
                       f"{ooms[-1][1]})" if ooms else "")
                    + (f", the smallest binding the space allows plans {_mib(smallest)}" if smallest else "")
                    + " (expected at least one draw within the bound; run on a device with more memory)") from None
            outside = (f"; {state['outside']} draws were outside the operator's domain (last: "
                       f"{state['why_outside']})" if state.get("outside") else "")
            raise UnsatisfiableAxes(f"{op}: property {name!r}: Hypothesis found no example its strategy accepts "
                                    f"(every drawn axis binding broke the definition's constraints, the "
                                    f"space's size limit or the memory bound per draw){outside}: {exc}") from None
        except Flaky as exc:
            f = state.get("failure")
            if f is None:
                raise
            f.messages.append(f"(flaky: the failure did not reproduce on a rerun: {exc})")
            failures.append(f)


def _mib(n: int | None) -> str:
    return "none" if n is None else f"{n / 2**20:.0f} MiB"


def _impl_label(impl: str | Callable) -> str:
    if isinstance(impl, str):
        return impl
    name = getattr(impl, "mutant_name", None) or getattr(getattr(impl, "fn", None), "mutant_name", None)
    return f"mutant:{name}" if name else _ops.impl_label(impl)


def check_implementation(op: str | Definition | OperatorRecord, impl: str | Callable, profile: str = "ci",
                         device: str | torch.device | None = None, *,
                         max_examples: int | None = None, seed: int | None = None,
                         shrink: bool = True, precision: str | None = None,
                         modes: Sequence[str] = INPUT_MODES, metamorphic: bool = True,
                         explicit: bool = True) -> PropertyReport:
    """Check ``impl`` (a name of the operator's table such as ``"fast"`` or ``"torch"``,
    ``"module:function"``, or a callable) against the float64 oracle with the properties
    ``tolerance``, ``tight_bound`` and (``metamorphic=True``) ``metamorphic``.

    ``profile``: ``ci`` / ``dev`` / ``thorough`` (CPU, scaled-down axes; ``thorough``
    uses CUDA when present) or ``gpu`` (CUDA, full-size const axes). ``device`` overrides
    the profile's device. ``seed`` (or env ``FUSEVAL_PROPERTY_SEED``) makes the draws
    random but reproducible; otherwise ``ci``/``gpu`` are derandomized. ``shrink=False``
    skips shrinking (faster; the failure is then not minimal). ``precision`` is the
    implementation's working precision for the tight bound (a name of
    :data:`fuseval.precision.PRECISIONS`: float32 / fp32, tf32, bfloat16 / bf16, float16...).
    The properties checked are in the report's ``properties``: ``tight_bound`` only for
    operators whose hooks give one.

    ``op``: the operator's name, its record, or a Definition of it; the configuration drawn
    from is the profile's, the semantics those of the Definition's variant (else the one
    :func:`~fuseval.operators.variant_scope` sets)."""
    record = record_of(op)
    own = {record.name: op.variant} if isinstance(op, Definition) and op.variant != record.load().variant else {}
    with variant_scope(own):
        return _check_implementation(record, impl, profile, device, max_examples=max_examples, seed=seed,
                                     shrink=shrink, precision=precision, modes=modes, metamorphic=metamorphic,
                                     explicit=explicit)


def _check_implementation(op: OperatorRecord, impl: str | Callable, profile: str, device, *,
                          max_examples: int | None, seed: int | None, shrink: bool, precision: str | None,
                          modes: Sequence[str], metamorphic: bool, explicit: bool) -> PropertyReport:
    start = time.perf_counter()
    base = op.load()
    if precision is not None:
        tight_bound(op, precision)      # an unknown precision, or an operator without the bound, fails here
    fn = _ops.resolve_impl(base, impl)
    label = _impl_label(impl)
    # a callable of the operator's own table is named as the table names it (a command
    # that reproduces a failure must be able to import it)
    label = next((name for name, path in base.implementations.items() if path == label), label)
    dev = resolve_device(device if device is not None else PROFILE_DEVICE[profile])
    hooks = hooks_of(base)
    bound = DrawBound(draw_budget(dev))
    space = PROFILE_SPACE[profile]
    s = property_settings(profile)
    # no example database here: every call builds a new test from the same inner function,
    # so a stored failure of one implementation would be replayed into another's run; the
    # failure's reproduction command is what persists
    overrides: dict[str, Any] = {"verbosity": Verbosity.quiet, "database": None}
    if max_examples is not None:
        overrides["max_examples"] = max_examples
    seed = seed if seed is not None else property_seed()
    if seed is not None:
        overrides["derandomize"] = False
    s = settings(s, **overrides)
    if not shrink:
        s = no_shrink(s)

    failures: list[Failure] = []
    excused: list[Failure] = []
    counter = {"n": 0}
    properties = (["tolerance"] + (["tight_bound"] if has_tight_bound(op) else [])
                  + (["metamorphic"] if metamorphic else []))

    run = _PropertyRun(op, label, dev, seed, hooks.outside_domain, bound, space, failures, excused, counter)
    run_property = run.run

    allowed = input_modes(op, modes)
    if not allowed:
        raise ValueError(f"{op.name}: modes: none of {list(modes)} is an input mode of the operator "
                         f"(its modes: {input_modes(op)})")
    check_satisfiable(op, space)
    # (an explicit binding that breaks the constraints is left out: check_satisfiable found others)
    starters = [e for e in explicit_examples(op, space) if e.mode in allowed and _valid(e.binding)
                and _fits_memory(e, bound.bytes)] if explicit else []
    run_property("tolerance", examples(op, space, allowed, max_bytes=bound.start),
                 lambda ex: evaluate(ex, fn, device=dev, precision=precision), starters, s)

    if metamorphic and not failures:
        meta_settings = settings(s, max_examples=max(2, s.max_examples // 4))
        meta_modes = [m for m in allowed if m != "adversarial"] or allowed
        meta_starters = [e for e in starters if e.mode in meta_modes][:2]

        def meta(ex: Example):
            problems = _metamorphic(ex, fn, dev)
            return ("metamorphic" if problems else None), problems, []
        meta_starters = [e for e in meta_starters if _fits_memory(e, bound.bytes)]
        run_property("metamorphic", examples(op, space, meta_modes, max_bytes=bound.start), meta, meta_starters,
                     meta_settings)

    return PropertyReport(op.name, label, profile, str(dev), failures, counter["n"],
                          time.perf_counter() - start, properties, excused,
                          None if not bound.lowered else bound.bytes)
