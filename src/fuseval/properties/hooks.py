"""What an operator tells the property engine about itself: :class:`PropertyHooks`.

The engine (strategies, ``check_implementation``, the mutant machinery) never names an
operator. Everything operator-specific comes from the operator's package through its spec:
``OperatorSpec.properties = ".properties:HOOKS"`` names a :class:`PropertyHooks` and
``OperatorSpec.mutants = ".mutants:catalogue"`` its mutant catalogue (see
:mod:`fuseval.operators.mutants`). Every field has a default, so an operator may leave
its spec's ``properties`` out altogether and still get

* bindings drawn from its definition: its ``small`` configuration (or the seed one) for the
  scaled-down spaces, batch and sequence lengths over the profile's ranges for the var
  axes, filtered by the definition's constraints;
* inputs in the benchmark, realistic and adversarial modes, the adversarial features
  being those its inputs allow (magnitudes and zero rows of its activations, norm weights
  away from 1, non-contiguous views);
* the ``tolerance`` property and batch independence; no ``tight_bound`` (it is a derived
  bound and needs the operator's precision and factor) and no mutants.

Example (a package's ``properties.py``)::

    from fuseval.properties.hooks import Magnitudes, PropertyHooks, TightBound

    HOOKS = PropertyHooks(
        gqa_axes=("num_heads", "num_kv_heads"),
        axis_values={"small": {"head_dim": (16, 32), "hidden_size": (32, 40, 64)}},
        activation_input="x", eps_input="eps",
        magnitudes=Magnitudes(tiny=-12, huge=12, mixed=(-20, 0, 12)),
        tight_bound=TightBound("float32", 8.0),
    )
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from ..definitions import Definition
from ..operators import OperatorRecord, load

if TYPE_CHECKING:                     # annotations only: strategies imports this module
    from hypothesis.strategies import SearchStrategy

    from .strategies import Example, Recipe

__all__ = ["PropertyHooks", "TightBound", "Magnitudes", "RecipeFeature", "ExtraExample", "VarSpace",
           "MetamorphicCheck", "AdversarialHook", "hooks_of", "definition_of", "record_of"]


# the generic fields of an adversarial recipe (fuseval.properties.strategies.Recipe, which
# checks at import that it has exactly these): an operator's own features take other names
GENERIC_RECIPE_FIELDS = ("magnitude", "zero_rows", "eps", "rotary", "noncontiguous", "norm_weights", "features")


@dataclass(frozen=True)
class TightBound:
    """The ``tight_bound`` property: on well-conditioned draws (benchmark and realistic
    modes), every output's ``||out - ref||_2 / ||ref||_2 <= factor * unit_roundoff(precision)``.

    ``precision`` is a name of :data:`fuseval.precision.PRECISIONS` (aliases accepted),
    the working precision a correct implementation of the operator is expected to meet;
    ``check_implementation(precision=...)`` replaces it and keeps the factor."""
    precision: str
    factor: float


@dataclass(frozen=True)
class Magnitudes:
    """Exponents of two of the adversarial ``magnitude`` feature: every activation row is
    scaled by ``2**tiny`` / ``2**huge``, or (``mixed``) each row by one of ``2**mixed``.
    Powers of two move no bits in any float format."""
    tiny: int = -10
    huge: int = 8
    mixed: tuple[int, ...] = (-12, -6, 0, 4, 8)


@dataclass(frozen=True)
class RecipeFeature:
    """An adversarial feature of one operator (a field of its :class:`~.strategies.Recipe`
    beyond the generic ones): ``default`` means "no change" and must be what ``values``
    shrinks towards; the operator's ``adversarial`` hook applies it."""
    default: Any
    values: "SearchStrategy"
    what: str = ""


@dataclass(frozen=True)
class ExtraExample:
    """An explicit example beyond the generic five: on explicit binding ``binding`` (0 or 1),
    input ``mode``, ``seed`` and, in adversarial mode, the recipe fields ``recipe``."""
    binding: int
    mode: str
    seed: int
    recipe: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VarSpace:
    """The var axes of one axis space given as data (an imported problem's workloads):
    each axis drawn from ``ranges[axis]`` (inclusive; an axis without a range keeps the
    profile's), or one of the exact ``bindings``; a draw whose tensor inputs hold more than
    ``max_elements`` elements in all is rejected (None: no limit), and so is one that breaks
    the definition's constraints.

    The domain the data shows: ``steps[axis]``: the axis is drawn as a multiple of this
    (every workload's value is one); ``ties[axis] = (base, factor, offset)``: the axis is
    ``factor * base + offset`` (every workload has it so), not drawn; ``relations``:
    expressions over the var axes every draw must satisfy (orderings and divisibility the
    workloads all show), the others rejected."""
    ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    bindings: tuple[Mapping[str, int], ...] = ()
    max_elements: int | None = None
    steps: Mapping[str, int] = field(default_factory=dict)
    ties: Mapping[str, tuple[str, int, int]] = field(default_factory=dict)
    relations: tuple[str, ...] = ()


# (example, its inputs, the implementation, the definition) -> (what it checks, a thunk
# that raises InvariantViolation when the invariant does not hold), or None where the
# invariant does not apply to this example (e.g. a causality check on one token)
MetamorphicCheck = Callable[["Example", Sequence[Any], Callable, "Definition"],
                            "tuple[str, Callable[[], Any]] | None"]
# (input values by name, edited in place; the recipe; the example's seed; the definition)
AdversarialHook = Callable[[dict, "Recipe", int, "Definition"], None]


@dataclass(frozen=True)
class PropertyHooks:
    """An operator's facts for the property engine. Every field is optional.

    Axis space
        ``batch_axis``: the var axis of independent batch items (batch independence,
        the profile's batch range); every other var axis takes the sequence range.
        ``gqa_axes``: (query heads, kv heads) const axes drawn as kv heads x GQA ratio
        from the profile's space. ``axis_values``: {space name: {const axis: values}},
        drawn in that order after the heads, simplest value first (Hypothesis shrinks
        towards it); a space without an entry keeps the configuration's values.
        ``var_offsets``: {var axis: (base var axis, offsets)}: the axis is drawn as the base
        axis plus one of the offsets (e.g. tables longer than the sequence).
        ``explicit_bindings``: the two scaled-down bindings, (const axes, var axes) each,
        every non-full property run starts with (see ``explicit_examples``);
        ``extra_examples``: explicit examples beyond the generic five.
        ``var_space``: {space name: :class:`VarSpace`}: the var axes of that space drawn
        from data instead of the profile's ranges; its first two bindings are then the
        explicit ones of the space.
    Inputs
        ``input_modes``: the input modes the operator has (None: benchmark, realistic and
        adversarial); the others are not drawn.
        ``activation_input``: the input whose rows the ``magnitude`` and ``zero_rows``
        features scale and zero (None: the first floating-point input whose shape starts
        with the batch axis). ``eps_input``: the scalar the ``eps`` feature replaces (None:
        no such feature). ``rotary_inputs``: the cos/sin tables the ``rotary`` feature
        replaces by arbitrary values. ``norm_weight_inputs`` (None: the inputs whose
        names end in ``norm_weight``, the rule of :mod:`fuseval.inputs`).
        ``magnitudes``: the feature's exponents. ``noncontiguous``: whether the
        ``noncontiguous`` feature applies (False: the operator's contract gives its
        implementations contiguous tensors, as SOL-ExecBench's evaluator does). ``recipe_features``: the operator's own
        adversarial features, applied by ``adversarial`` after the generic ones.
    Verdict
        ``case_tolerance``: judge each example under the tolerance of the benchmark case
        nearest its binding (:meth:`~fuseval.definitions.Definition.nearest_case`) instead of
        the definition's (an imported problem: a tolerance per workload).
        ``scale_atol_with_magnitude``: an adversarial draw whose activations were scaled up
        (``huge``, ``mixed``) is judged with atol (and the max-abs bound) times the factor
        its oracle's outputs grew by against the same draw at unit magnitude (at least 1):
        an absolute tolerance written for the benchmark's magnitudes (an imported problem's).
        ``outside_domain``: exceptions that mean "the operator's own code refuses these
        inputs" (raised while drawing an example's inputs or computing its oracle): such a
        draw is outside the operator's domain and rejected, not a failure (an imported
        problem: what its reference or its input generator raises).
        ``precision_baseline``: the implementation whose own error is the yardstick on a
        draw where the tolerance fails (an imported problem: the benchmark's reference in
        its own precision, ``sol_reference``). Where that baseline misses the tolerance on
        the same draw too, the tolerance cannot judge the draw: an implementation within
        :data:`~fuseval.properties.fast_vs_reference.BASELINE_ERROR_FACTOR` times the
        baseline's error (max abs and relative L2, per output) is reported there, not
        failed. None: every tolerance miss fails.
        ``tight_bound``: see :class:`TightBound` (None: no such property).
        ``invariants``: the metamorphic checks run after batch independence. Each is
        called as ``invariant(example, inputs, impl, defn)`` and returns None (not
        applicable) or ``(name, check)``; building it may run the oracle but never the
        implementation (an allocation failure there is fuseval's, and lowers the memory
        bound per draw); ``check()`` runs the implementation.
    """
    batch_axis: str = "batch_size"
    gqa_axes: tuple[str, str] | None = None
    axis_values: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    var_offsets: Mapping[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    explicit_bindings: tuple[tuple[Mapping[str, int], Mapping[str, int]], ...] = ()
    extra_examples: tuple[ExtraExample, ...] = ()
    var_space: Mapping[str, VarSpace] = field(default_factory=dict)
    input_modes: tuple[str, ...] | None = None
    activation_input: str | None = None
    eps_input: str | None = None
    rotary_inputs: tuple[str, ...] = ()
    norm_weight_inputs: tuple[str, ...] | None = None
    magnitudes: Magnitudes = Magnitudes()
    noncontiguous: bool = True
    recipe_features: Mapping[str, RecipeFeature] = field(default_factory=dict)
    adversarial: AdversarialHook | None = None
    case_tolerance: bool = False
    scale_atol_with_magnitude: bool = False
    outside_domain: tuple[type[BaseException], ...] = ()
    precision_baseline: str | None = None
    tight_bound: TightBound | None = None
    invariants: tuple[MetamorphicCheck, ...] = ()

    def __post_init__(self) -> None:
        if self.explicit_bindings and len(self.explicit_bindings) != 2:
            raise ValueError(f"PropertyHooks.explicit_bindings: expected two (consts, var axes) "
                             f"pairs, got {len(self.explicit_bindings)}")
        if self.recipe_features:
            clash = sorted(set(GENERIC_RECIPE_FIELDS) & set(self.recipe_features))
            if clash:
                raise ValueError(f"PropertyHooks.recipe_features: {clash} are generic recipe fields; "
                                 f"name the operator's own features differently")
        if self.recipe_features and self.adversarial is None:
            raise ValueError(f"PropertyHooks: recipe features {sorted(self.recipe_features)} need an "
                             f"'adversarial' hook that applies them, got none")


_DEFAULT = PropertyHooks()


def definition_of(op: str | Definition) -> Definition:
    """``op`` itself where it is a Definition (what the layers below pass), else the
    operator the name resolves to (a caller of the Python API's)."""
    return op if isinstance(op, Definition) else load(op)


def record_of(op: str | Definition | OperatorRecord) -> OperatorRecord:
    """The record of ``op``: ``op`` itself, a Definition's, or that of the operator a name
    resolves to (through :func:`definition_of`, the engine's one lookup by name)."""
    return op if isinstance(op, OperatorRecord) else definition_of(op).operator


def hooks_of(op: Definition | OperatorRecord) -> PropertyHooks:
    """The property hooks of the operator of ``op``, a definition or its record (its spec's
    ``properties``; the defaults when it names none)."""
    record = op.operator if isinstance(op, Definition) else op
    found = record.property_hooks
    if found is None:
        return _DEFAULT
    if not isinstance(found, PropertyHooks):
        raise TypeError(f"operator {record.name!r}: properties={record.spec.properties!r} names a "
                        f"{type(found).__name__}, expected a fuseval.properties.hooks.PropertyHooks")
    return found
