"""Implementations from SOL-ExecBench ``solution.json`` files.

A solution names its problem (``definition``), its languages, an entry point
``"file::function"`` and its sources (``[{path, content}]``). fuseval writes the sources
to a folder of their own (under ``FUSEVAL_SOLUTION_CACHE``, default
``~/.cache/fuseval/solutions/<hash>``), then:

* Python languages (``pytorch``, ``triton``, ``cute_dsl``, ``cutile``,
  ``cudnn_frontend``): imports the entry file as a module (the folder on ``sys.path``, so
  it may import its sibling files; Triton reads kernel sources from these files);
* C++ languages (``cuda_cpp``, ``cutlass``, ``cudnn``, ``cublas``): builds the sources with
  torch's extension builder (``torch.utils.cpp_extension.load``, the solution's compile
  options) where ``nvcc`` is found, and raises an :class:`ImplementationError` otherwise.

The callable returned takes fuseval's inputs and returns the outputs; with
``destination_passing_style`` (the benchmark's default) it allocates the outputs (floats
filled with NaN, so an element the solution never writes cannot pass) and passes them
after the inputs.
"""
from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from typing import Any, Callable

import torch

from ..errors import ImplementationError
from .sol_problem import Problem
from ..definitions import evaluate_expression
from .workload_inputs import TORCH_DTYPES, to_benchmark

__all__ = ["find_solutions", "load_solution", "PYTHON_LANGUAGES", "CPP_LANGUAGES"]

PYTHON_LANGUAGES = ("pytorch", "triton", "cute_dsl", "cutile", "cudnn_frontend", "python")
CPP_LANGUAGES = ("cuda_cpp", "cutlass", "cudnn", "cublas")
_RESERVED = ("reference", "sol_reference", "torch")


def find_solutions(directory: str) -> list[tuple[str, str]]:
    """(implementation name, path) of the ``solution*.json`` files in a problem folder and in
    its ``solutions/`` subfolder: the solution's ``name``, prefixed ``solution:`` where it
    would shadow one of the problem's own implementations or another solution."""
    paths = sorted(glob.glob(os.path.join(directory, "solution*.json"))
                   + glob.glob(os.path.join(directory, "solutions", "*.json")))
    found: list[tuple[str, str]] = []
    for path in paths:
        try:
            with open(path) as f:
                name = json.load(f).get("name")
        except (OSError, json.JSONDecodeError, AttributeError):
            name = None
        name = name if isinstance(name, str) and name else os.path.splitext(os.path.basename(path))[0]
        if name in _RESERVED or name in {n for n, _ in found}:
            name = f"solution:{os.path.relpath(path, directory)}"
        found.append((name, path))
    return found


def _read(path: str, problem: Problem) -> dict[str, Any]:
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as exc:
        raise ImplementationError(f"solution {path!r}: cannot be read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ImplementationError(f"solution {path!r}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ImplementationError(f"solution {path!r}: expected a JSON object, got {type(doc).__name__}")
    for key, kind in (("name", str), ("definition", str), ("spec", dict), ("sources", list)):
        if not isinstance(doc.get(key), kind):
            raise ImplementationError(f"solution {path!r}: field {key!r} must be {kind.__name__}, "
                                      f"got {type(doc.get(key)).__name__}")
    if doc["definition"] != problem.name:
        raise ImplementationError(f"solution {path!r} solves {doc['definition']!r}, not problem {problem.name!r}")
    spec = doc["spec"]
    entry = spec.get("entry_point")
    if not isinstance(entry, str) or "::" not in entry:
        raise ImplementationError(f"solution {path!r}: spec.entry_point must be 'file::function', got {entry!r}")
    languages = spec.get("languages")
    if not isinstance(languages, list) or not languages or not all(isinstance(x, str) for x in languages):
        raise ImplementationError(f"solution {path!r}: spec.languages must be a non-empty list of names, "
                                  f"got {languages!r}")
    unknown = [x for x in languages if x not in PYTHON_LANGUAGES + CPP_LANGUAGES]
    if unknown:
        raise ImplementationError(f"solution {path!r}: unknown languages {unknown}; expected "
                                  f"{', '.join(PYTHON_LANGUAGES + CPP_LANGUAGES)}")
    if any(x in CPP_LANGUAGES for x in languages) and any(x in PYTHON_LANGUAGES for x in languages):
        raise ImplementationError(f"solution {path!r}: C++ and Python languages cannot be mixed ({languages})")
    paths = []
    for s in doc["sources"]:
        p = s.get("path") if isinstance(s, dict) else None
        if not isinstance(p, str) or not p or os.path.isabs(p) or ".." in p.replace("\\", "/").split("/") \
                or not isinstance(s.get("content"), str):
            raise ImplementationError(f"solution {path!r}: every source needs a relative 'path' (no '..') and a "
                                      f"'content' string, got {s!r:.80}")
        paths.append(p)
    if len(set(paths)) != len(paths):
        raise ImplementationError(f"solution {path!r}: sources repeat a path ({paths})")
    if entry.split("::")[0] not in paths:
        raise ImplementationError(f"solution {path!r}: the entry point's file {entry.split('::')[0]!r} is not "
                                  f"among the sources ({', '.join(paths)})")
    return doc


def _write_sources(doc: dict[str, Any]) -> str:
    text = json.dumps(doc["sources"], sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    root = os.environ.get("FUSEVAL_SOLUTION_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "fuseval",
                                                                  "solutions")
    folder = os.path.join(root, digest)
    for s in doc["sources"]:
        target = os.path.join(folder, s["path"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target) or open(target).read() != s["content"]:
            with open(target, "w") as f:
                f.write(s["content"])
    return folder


def _python_entry(folder: str, file: str, function: str, path: str) -> Callable:
    module_name = "fuseval_solution_" + os.path.basename(folder) + "_" + \
        os.path.splitext(file)[0].replace("/", "_").replace(".", "_")
    if module_name in sys.modules:
        module = sys.modules[module_name]
    else:
        if folder not in sys.path:
            sys.path.insert(0, folder)
        spec = importlib.util.spec_from_file_location(module_name, os.path.join(folder, file))
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[module_name]
            raise ImplementationError(f"solution {path!r}: {file} does not import: "
                                      f"{type(exc).__name__}: {exc}") from exc
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ImplementationError(f"solution {path!r}: {file} has no function {function!r}")
    return fn


def _cpp_entry(folder: str, doc: dict[str, Any], function: str, path: str) -> Callable:
    from torch.utils import cpp_extension
    if shutil.which("nvcc") is None and not (cpp_extension.CUDA_HOME and
                                             os.path.exists(os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc"))):
        raise ImplementationError(f"solution {path!r} is C++/CUDA ({', '.join(doc['spec']['languages'])}): building "
                                  "it needs nvcc (the CUDA toolkit), which this machine does not have")
    options = doc["spec"].get("compile_options") or {}
    sources = [os.path.join(folder, s["path"]) for s in doc["sources"]
               if os.path.splitext(s["path"])[1] in (".cu", ".cpp", ".cc", ".cxx", ".c")]
    cutlass = os.environ.get("CUTLASS_DIR", "/usr/local/cutlass")
    try:
        module = cpp_extension.load(
            name="fuseval_solution_" + os.path.basename(folder), sources=sources,
            extra_cflags=list(options.get("cflags", [])),
            extra_cuda_cflags=list(options.get("cuda_cflags", ["-O3", "--use_fast_math"])),
            extra_ldflags=list(options.get("ld_flags", ["-lcuda"])),
            extra_include_paths=[folder, f"{cutlass}/include", f"{cutlass}/tools/util/include"],
            build_directory=folder, verbose=False)
    except Exception as exc:  # noqa: BLE001 - any build failure is the solution's
        raise ImplementationError(f"solution {path!r}: the build failed: {type(exc).__name__}: "
                                  f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}") from exc
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ImplementationError(f"solution {path!r}: the built extension has no function {function!r}")
    return fn


def _axes(problem: Problem, args) -> dict[str, int]:
    bound = {n: a["value"] for n, a in problem.axes.items() if a["type"] == "const"}
    for (name, spec), value in zip(problem.inputs.items(), args):
        if spec["shape"] and isinstance(value, torch.Tensor):
            for axis, size in zip(spec["shape"], value.shape):
                if axis in problem.axes and problem.axes[axis]["type"] == "var":
                    bound.setdefault(axis, int(size))
    for n, a in problem.axes.items():
        if a["type"] == "expr":
            bound[n] = int(evaluate_expression(a["expression"], bound))
    return bound


def _allocate(problem: Problem, args, device) -> list[torch.Tensor]:
    bound = _axes(problem, args)
    outs = []
    for spec in problem.outputs.values():
        shape = tuple(int(evaluate_expression(d, bound)) for d in spec["shape"])
        dtype = TORCH_DTYPES[spec["dtype"]]
        if dtype == torch.float4_e2m1fn_x2:
            outs.append(torch.full(shape, 0xFF, dtype=torch.uint8, device=device).view(dtype))
        elif dtype.is_floating_point:
            outs.append(torch.full(shape, float("nan"), dtype=dtype, device=device))
        else:
            outs.append(torch.empty(shape, dtype=dtype, device=device))
    return outs


def load_solution(path: str, problem: Problem) -> Callable:
    """The implementation of the solution file ``path`` for ``problem`` (module docstring)."""
    if not os.path.isfile(path):
        raise ImplementationError(f"solution {path!r}: not a file")
    doc = _read(path, problem)
    folder = _write_sources(doc)
    file, function = doc["spec"]["entry_point"].split("::", 1)
    if any(x in CPP_LANGUAGES for x in doc["spec"]["languages"]):
        fn = _cpp_entry(folder, doc, function, path)
    else:
        if "triton" in doc["spec"]["languages"]:
            from .. import fast  # noqa: F401 - chooses Triton's interpreter on a machine without CUDA
        fn = _python_entry(folder, file, function, path)
    dps = doc["spec"].get("destination_passing_style", True)

    def implementation(*inputs):
        args = to_benchmark(problem, inputs)
        if dps:
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
            outs = _allocate(problem, args, device)
            fn(*args, *outs)
        else:
            result = fn(*args)
            outs = list(result) if isinstance(result, (tuple, list)) else [result]
        return tuple(o.view(torch.uint8) if isinstance(o, torch.Tensor) and o.dtype == torch.float4_e2m1fn_x2
                     else o for o in outs)

    implementation.__name__ = implementation.__qualname__ = doc["name"]
    implementation.solution = doc
    return implementation

