"""Export an operator in SOL-ExecBench's layout: <out>/<op>/definition.json and workload.jsonl."""
from __future__ import annotations

import os

from . import add_problem_argument, add_variant_argument, parse_config


def add_arguments(p) -> None:
    add_variant_argument(p)
    p.add_argument("--op", default=None, help="operator name")
    add_problem_argument(p)
    p.add_argument("--config", default="seed", type=parse_config, help="configuration (default: %(default)s)")
    p.add_argument("--out", default="export", help="output folder (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed recorded in the workloads")


def run(args) -> int:
    from ..jsonio import dumps
    from . import operator_definition, writable_folder
    d = operator_definition(args.op, args.config)
    folder = os.path.join(args.out, d.name)
    writable_folder(folder, "--out")
    with open(os.path.join(folder, "definition.json"), "w") as f:
        f.write(dumps(d.to_solexec_definition(), indent=2) + "\n")
    rows = d.to_solexec_workloads(seed=args.seed)
    with open(os.path.join(folder, "workload.jsonl"), "w") as f:
        for row in rows:
            f.write(dumps(row, indent=None) + "\n")
    print(f"wrote {folder}/definition.json and {len(rows)} workloads to {folder}/workload.jsonl")
    return 0
