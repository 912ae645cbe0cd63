"""Subcommands of the ``fuseval`` CLI, one module each (see fuseval.cli)."""
from __future__ import annotations


def add_common_arguments(p, *, impl_default: str | None = "torch", config_default: str = "small") -> None:
    """The options most commands share: --op, --impl, --config, --cases, --device, --seed, --mode."""
    from ..definitions import list_operators
    p.add_argument("--op", required=True, help=f"operator name ({', '.join(list_operators())})")
    if impl_default is not None:
        p.add_argument("--impl", default=impl_default,
                       help="implementation: a name of the operator's table (reference, torch, fast...) "
                            "or 'module:function' (default: %(default)s)")
    p.add_argument("--config", default=config_default,
                   help="'seed' for the full benchmark sizes or a scaled-down configuration such as "
                        "'small' (default: %(default)s)")
    p.add_argument("--cases", default=None, help="subset of cases, e.g. '0,3,5-7' (default: all 16)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="input seed; case i uses seed + i (default: %(default)s)")
    p.add_argument("--mode", default="benchmark", choices=["benchmark", "realistic"],
                   help="input distribution (default: %(default)s)")
