"""SOL-ExecBench interop: a problem folder as a fuseval operator.

* :mod:`~fuseval.interop.sol_problem`: reading and validating a problem folder
  (``definition.json``, ``workload.jsonl``) and its definition in fuseval's format;
* :mod:`~fuseval.interop.workload_inputs`: the workloads' inputs by the benchmark's rules;
* :mod:`~fuseval.interop.lift`: the reference as written and lifted to float64;
* :mod:`~fuseval.interop.emulate`: ``torch._scaled_mm`` by exact dequantization;
* :mod:`~fuseval.interop.problems`: the module made for each imported problem, and
  :func:`~fuseval.interop.problems.operator_spec` (what the operator registry registers);
* :mod:`~fuseval.interop.solution`: implementations from ``solution.json`` files;
* :mod:`~fuseval.interop.tolerance_use`: how much of each workload's tolerance the benchmark's
  own reference uses;
* :mod:`~fuseval.interop.crosscheck`: a built-in operator's oracle against a problem's
  reference.
"""
