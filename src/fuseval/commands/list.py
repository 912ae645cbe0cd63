"""List operators, or one operator's axes, configurations, cases and implementations."""
from __future__ import annotations


from . import add_variant_argument


def add_arguments(p) -> None:
    p.add_argument("--op", default=None, help="show one operator in detail")
    p.add_argument("--config", default="seed", help="configuration whose axes and cases to show")
    add_variant_argument(p)


def run(args) -> int:
    from ..definitions import list_operators, load
    if args.op is None:
        for name in list_operators():
            d = load(name)
            print(f"{name:28s} {d.op_type:26s} configs: {', '.join(d.configs)}; "
                  f"variants: {', '.join(d.variant_names)}")
        return 0
    d = load(args.op, args.config)
    print(f"{d.name} [{d.config}] variant {d.variant}  {d.description}")
    for name, spec in d.variants.items():
        print(f"  variant {name}: {spec.get('what', '')}")
    print("axes:", ", ".join(f"{a.name}={a.value if a.kind == 'const' else a.expression or 'var'}"
                             for a in d.axes.values()))
    print("inputs:", ", ".join(f"{s.name}:{s.dtype}" for s in d.inputs))
    print("outputs:", ", ".join(f"{s.name}:{s.dtype}" for s in d.outputs))
    print("stages:", ", ".join(d.stage_names))
    print("implementations:", ", ".join(d.implementations))
    t = d.tolerance
    print(f"tolerance: |out-ref| <= {t.atol} + {t.rtol}*|ref|, matched >= {t.min_matched_ratio:.0%}"
          + (f", max abs <= {t.max_abs_error}" if t.max_abs_error is not None else ""))
    note = d.raw.get("tolerance", {}).get("note")
    if note:
        print(f"  ({note})")
    for c in d.cases():
        print(f"  case {c.index:2d}: {c.label}  atol {c.tolerance.atol}")
    return 0
