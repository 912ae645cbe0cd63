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
    p.add_argument("--config", default=config_default, type=parse_config,
                   help="'seed' for the full benchmark sizes, a scaled-down configuration such as "
                        "'small', or a JSON mapping of const-axis overrides, e.g. "
                        "'{\"hidden_size\": 48, \"head_dim\": 16}' (default: %(default)s)")
    p.add_argument("--cases", default=None, help="subset of cases, e.g. '0,3,5-7' (default: all 16)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="input seed; case i uses seed + i (default: %(default)s)")
    p.add_argument("--mode", default="benchmark", choices=["benchmark", "realistic"],
                   help="input distribution (default: %(default)s)")
    add_variant_argument(p)


def add_variant_argument(p) -> None:
    p.add_argument("--variant", default=None,
                   help="a named semantic variant of the operator, e.g. hf_mrope (op A with HF "
                        "Qwen2-VL's mRoPE layout) or w4a16 (op B with bf16 activations); default: "
                        "the benchmark's semantics ('sol'). `fuseval list --op NAME` lists them")


def parse_config(value: str):
    """A configuration name, or a JSON object of const-axis overrides (what the property
    suite prints when it drew a custom configuration)."""
    import argparse
    import json
    text = value.strip()
    if not text.startswith("{"):
        return text
    try:
        mapping = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--config {value!r} is not valid JSON: {exc}") from exc
    if not isinstance(mapping, dict):
        raise argparse.ArgumentTypeError(f"--config JSON must be an object, got {type(mapping).__name__}")
    return mapping
