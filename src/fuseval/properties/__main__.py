"""Reproduce one property example: ``python -m fuseval.properties --op ... --seed N``.

Every failure of :func:`fuseval.properties.check_implementation` prints this command with
the example's configuration (a name or a JSON mapping of the const axes), var axes, input
mode, adversarial recipe and seed. It rebuilds exactly those inputs, runs the
implementation and the float64 oracle, and prints the per-output metrics and the verdict
of the ``tolerance`` and ``tight_bound`` properties. Exit code 0 when both hold, 1 when
not (2 on a usage error)."""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fuseval.properties", description=__doc__)
    p.add_argument("--op", required=True)
    p.add_argument("--problem", dest="problems", action="append", default=[], metavar="DIR",
                   help="a SOL-ExecBench problem folder to register as an operator first (repeatable)")
    p.add_argument("--impl", default="torch", help="name, 'module:function' or 'mutant:<name>'")
    p.add_argument("--config", required=True, help="configuration name or JSON mapping of const axes")
    p.add_argument("--axes", required=True, help='JSON mapping of var axes, e.g. {"batch_size":1,"seq_len":3}')
    p.add_argument("--mode", default="benchmark", choices=["benchmark", "realistic", "adversarial"])
    p.add_argument("--recipe", default=None, help="JSON adversarial recipe")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default=None, help="working precision for the tight bound "
                   "(a name of fuseval.precision.PRECISIONS, e.g. float32, tf32, bf16)")
    args = p.parse_args(argv)
    if args.problems:
        from ..operators import register_problem
        for folder in args.problems:
            register_problem(folder)

    from ..operators import load
    from ..check import resolve_device
    from .fast_vs_reference import evaluate
    from .strategies import Binding, Example, Recipe

    base = load(args.op)
    config = args.config
    if config.lstrip().startswith("{"):
        consts = {**base.const_axes, **json.loads(config)}
    else:
        consts = base.with_config(config).const_axes
    binding = Binding.make(args.op, consts, json.loads(args.axes))
    recipe = Recipe.from_json(args.recipe, args.op) if args.mode == "adversarial" else None
    example = Example(binding, args.mode, args.seed, recipe)
    if args.impl.startswith("mutant:"):
        from .mutants import get
        impl = get(args.op, args.impl.split(":", 1)[1])
    else:
        from ..ops import resolve_impl
        impl = resolve_impl(base, args.impl)
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


if __name__ == "__main__":
    sys.exit(main())
