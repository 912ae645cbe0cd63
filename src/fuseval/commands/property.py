"""Reproduce one property example: ``fuseval property --op ... --config ... --axes ... --seed N``.

Every failure of the property suite (:func:`fuseval.properties.check_implementation`) prints
this command with the example's configuration (a name or a JSON mapping of the const axes),
var axes, input mode, adversarial recipe and seed. It rebuilds exactly those inputs, runs
the implementation and the float64 oracle in this process, and prints the per-output
metrics and the verdict of the ``tolerance`` and ``tight_bound`` properties. Exit code 0
when both hold, 1 when not."""
from __future__ import annotations

import json

from . import add_problem_argument, parse_device, parse_seed, user_input


def _json_object(what: str):
    def parse(value: str) -> dict:
        import argparse
        try:
            mapping = json.loads(value)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{what} {value!r}: not valid JSON: {exc}") from exc
        if not isinstance(mapping, dict):
            raise argparse.ArgumentTypeError(f"{what} {value!r}: expected a JSON object, got {type(mapping).__name__}")
        return mapping
    return parse


def add_arguments(p) -> None:
    add_problem_argument(p)
    p.add_argument("--op", default=None, help="the operator (with one --problem: that problem's)")
    p.add_argument("--impl", default="torch", help="name, 'module:function' or 'mutant:<name>'")
    p.add_argument("--config", required=True, help="configuration name or JSON mapping of const axes")
    p.add_argument("--axes", required=True, type=_json_object("--axes"),
                   help='JSON mapping of var axes, e.g. {"batch_size":1,"seq_len":3}')
    p.add_argument("--mode", default="benchmark", choices=["benchmark", "realistic", "adversarial"])
    p.add_argument("--recipe", default=None, help="JSON adversarial recipe")
    p.add_argument("--seed", type=parse_seed, required=True)
    p.add_argument("--device", type=parse_device, default="cpu")
    p.add_argument("--precision", default=None, help="working precision for the tight bound "
                   "(a name of fuseval.precision.PRECISIONS, e.g. float32, tf32, bf16)")


def run(args) -> int:
    from ..check import resolve_device
    from ..operators import load
    from ..operators.implementations import resolve_impl
    from ..properties.fast_vs_reference import evaluate
    from ..operators.mutants import get
    from ..properties.strategies import Binding, Example, Recipe

    base = load(args.op)
    with user_input("--config"):
        if args.config.lstrip().startswith("{"):
            consts = {**base.const_axes, **_json_object("--config")(args.config)}
        else:
            consts = base.with_config(args.config).const_axes
    with user_input("--axes"):
        binding = Binding.make(base, consts, args.axes)
    with user_input("--recipe"):
        recipe = Recipe.from_json(args.recipe, base) if args.mode == "adversarial" else None
    example = Example(binding, args.mode, args.seed, recipe)
    impl = get(args.op, args.impl.split(":", 1)[1]) if args.impl.startswith("mutant:") \
        else resolve_impl(base, args.impl)
    verdict, messages, metrics = evaluate(example, impl, device=resolve_device(args.device),
                                          precision=args.precision)
    print(example.describe())
    for m in metrics:
        print(f"  {m['output']}: max abs {m['max_abs']:.3g}, rel L2 {m['rel_l2']:.3g}, "
              f"matched {m['matched_ratio']:.4%}")
    if verdict:
        print(f"FAILED: {verdict}")
        for msg in messages:
            print(f"  {msg}")
        return 1
    print("passed")
    return 0
