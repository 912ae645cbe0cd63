"""Export an operator in SOL-ExecBench's layout: <out>/<op>/definition.json and workload.jsonl."""
from __future__ import annotations

import json
import os


from . import add_variant_argument


def add_arguments(p) -> None:
    add_variant_argument(p)
    p.add_argument("--op", required=True, help="operator name")
    p.add_argument("--config", default="seed", help="configuration (default: %(default)s)")
    p.add_argument("--out", default="export", help="output folder (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed recorded in the workloads")


def run(args) -> int:
    from ..definitions import load
    d = load(args.op, args.config)
    folder = os.path.join(args.out, d.name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "definition.json"), "w") as f:
        json.dump(d.to_solexec_definition(), f, indent=2)
        f.write("\n")
    rows = d.to_solexec_workloads(seed=args.seed)
    with open(os.path.join(folder, "workload.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    print(f"wrote {folder}/definition.json and {len(rows)} workloads to {folder}/workload.jsonl")
    return 0
