"""List operators, or one operator's axes, configurations, cases and implementations.

With --op, each input and output is shown as an implementation receives it: its dtype
in the definition, the torch dtype of the tensor that arrives (packed FP4 arrives as
uint8, two codes a byte; FP8 as float8_e4m3fn), Python float for scalars, and its shape
in axis names and with the configuration's constants filled in. --skeleton prints a
skeleton implementation to start from."""
from __future__ import annotations


from . import add_problem_argument, add_variant_argument, parse_config


def add_arguments(p) -> None:
    p.add_argument("--op", default=None, help="show one operator in detail")
    add_problem_argument(p)
    p.add_argument("--config", default="seed", type=parse_config,
                   help="configuration whose axes, shapes and cases to show (default: %(default)s)")
    p.add_argument("--skeleton", action="store_true",
                   help="with --op: print a skeleton implementation (a Python module) instead")
    add_variant_argument(p)


def _shape(d, spec, consts) -> str:
    """The shape in axis names, with the constant axes of the configuration as numbers."""
    if spec.shape is None:
        return "()"
    from ..definitions import evaluate_expression
    dims = []
    for dim in spec.shape:
        try:
            dims.append(str(int(evaluate_expression(dim, consts))))
        except (KeyError, ValueError, TypeError):
            dims.append(dim)
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"


def _consts(d) -> dict[str, int]:
    """Const axes and the expr axes computable from them alone."""
    from ..definitions import evaluate_expression
    bound = dict(d.const_axes)
    for a in d.axes.values():
        if a.kind == "expr":
            try:
                bound[a.name] = int(evaluate_expression(a.expression, bound))
            except (KeyError, ValueError, TypeError):
                continue
    return bound


def _arrives(spec) -> str:
    from ..inputs import TORCH_DTYPES
    if spec.is_scalar:
        return "Python float" + (f" (always {spec.value})" if spec.value is not None else "")
    storage = str(TORCH_DTYPES[spec.dtype]).replace("torch.", "")
    note = " (two e2m1 codes a byte, low nibble = even column)" if spec.dtype == "float4_e2m1fn_x2" else ""
    return f"torch.Tensor {storage}{note}"


def skeleton(d) -> str:
    """A module with one function taking the inputs in order and returning the outputs."""
    consts = _consts(d)
    lines = [f'"""A {d.name} implementation for fuseval (check it with:',
             f"fuseval check --op {d.name} --impl THIS_MODULE:forward --config small)." + '"""',
             "import torch", "", "",
             f"def forward({', '.join(s.name for s in d.inputs)}):"]
    for s in d.inputs:
        lines.append(f"    # {s.name}: {_arrives(s)}" + ("" if s.is_scalar else f", shape {_shape(d, s, consts)}")
                     + f" ({s.dtype})")
    lines.append("    # compute every output; return new tensors on the inputs' device (never an input, "
                 "never a buffer you reuse)")
    for s in d.outputs:
        from ..inputs import TORCH_DTYPES
        lines.append(f"    {s.name} = ...  # {_shape(d, s, consts)} torch.{str(TORCH_DTYPES[s.dtype]).replace('torch.', '')}")
    lines.append(f"    return {', '.join(s.name for s in d.outputs)}")
    return "\n".join(lines) + "\n"


def run(args) -> int:
    from ..operators import load
    from ..operators import names
    from . import operator_definition
    if args.op is None:
        if args.skeleton:
            from ..errors import FusevalError
            raise FusevalError("--skeleton needs --op NAME (the operator to write a skeleton for)")
        for name in names():
            d = load(name)
            print(f"{name:28s} {d.op_type:26s} configs: {', '.join(d.configs)}; "
                  f"variants: {', '.join(d.variant_names)}")
        return 0
    d = operator_definition(args.op, args.config)
    if args.skeleton:
        print(skeleton(d), end="")
        return 0
    print(f"{d.name} [{d.config}] variant {d.variant}  {d.description}")
    for name, spec in d.variants.items():
        print(f"  variant {name}: {spec.get('what', '')}")
    print("axes:", ", ".join(f"{a.name}={a.value if a.kind == 'const' else a.expression or 'var'}"
                             for a in d.axes.values()))
    consts = _consts(d)
    print("inputs (in call order; what arrives):")
    for s in d.inputs:
        print(f"  {s.name}: {s.dtype} -> {_arrives(s)}" + ("" if s.is_scalar else f", shape {_shape(d, s, consts)}"))
    print("outputs (return them in this order):")
    from ..inputs import TORCH_DTYPES
    for s in d.outputs:
        print(f"  {s.name}: {s.dtype} -> torch.Tensor {str(TORCH_DTYPES[s.dtype]).replace('torch.', '')}, "
              f"shape {_shape(d, s, consts)}")
    print("stages:", ", ".join(d.stage_names))
    print("implementations:", ", ".join(d.implementations))
    t = d.tolerance
    print(f"tolerance: |out-ref| <= {t.atol} + {t.rtol}*|ref|, matched >= {t.min_matched_ratio:.0%}"
          + (f", max abs <= {t.max_abs_error}" if t.max_abs_error is not None else ""))
    note = d.raw.get("tolerance", {}).get("note")
    if note:
        print(f"  ({note})")
    for c in d.cases():
        ct = c.tolerance
        print(f"  case {c.index:2d}: {c.label}  atol {ct.atol} rtol {ct.rtol}"
              + (f" matched >= {ct.min_matched_ratio:.0%}" if ct.min_matched_ratio != t.min_matched_ratio else ""))
    print(f"skeleton implementation: fuseval list --op {d.name} --config {d.config} --skeleton")
    return 0
