"""The one place where fuseval runs a problem folder's own code.

A problem folder is data (``definition.json``, ``workload.jsonl``) plus code: its
reference (``run``) and, for some, a ``custom_inputs_entrypoint``. Reading, listing,
importing and exporting a problem use the data only; the code runs only through the
functions here:

* :func:`reference_module`: the reference source executed as a module (cached);
* :func:`run_reference`: the reference on one set of inputs, as written and (``lifted``)
  lifted to float64 (:mod:`fuseval.interop.lift`), optionally under a torch function mode
  of fuseval's own (the diagnosis's generic mistakes);
* :func:`custom_inputs`: the problem's custom input entry point.

**Where it runs.** A problem folder is code from elsewhere, so it gets what an
implementation under test gets: when fuseval isolates (:func:`fuseval.runner.isolation.requested`:
always in the CLI, ``--in-process`` included, which trusts the implementation, not the
problem), each function above sends its request to a confined worker of the problem's own
(:mod:`fuseval.runner.isolation`: its own session, no capabilities, seccomp, Landlock, standard
output and error captured), which runs the code there and hands back tensors and a small JSON note (the lift report, the
custom inputs' names, the mode's summary, or the error). What the worker breaks (a child
left running, a hang past :data:`TIMEOUT`, a crash, a reply that is not fuseval's) is a
:class:`ProblemCodeViolation`, exit code by the violation. Inside a worker (an
implementation's or the problem's own) the code runs in place.

What the problem's code raises leaves as a :class:`ProblemCodeError` (it names the
function and the exception), so the callers can tell "the problem refused these inputs"
from a bug in fuseval; running out of memory leaves as what it is (torch's error, a
MemoryError), for the callers that treat memory as a budget.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import random
import sys
import types
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from ..errors import exit_code_for, is_out_of_memory
from ..inputs import input_generator
from .sol_problem import Problem, ProblemError, read_problem
from ..runner import in_worker, isolation
from ..runner.in_worker import note
from . import lift
from .lift import LiftReport, LiftResult

__all__ = ["ProblemCodeError", "ProblemCodeViolation", "reference_module", "run_reference", "custom_inputs",
           "worker_device", "serve", "TIMEOUT"]

# seconds one request to a problem's confined worker may take (its reference at the
# largest workload, lifted, on a CPU)
TIMEOUT = 1800.0


class ProblemCodeError(ProblemError):
    """The problem's own code (its reference or its custom input generator) raised.

    ``what``: which of its functions; ``cause``: the exception it raised. On a binding a
    workload gives this is a broken problem folder (exit 5); on a binding the property
    engine drew between the workloads' it is the problem refusing an input outside its
    domain (a rejected draw)."""

    def __init__(self, problem: Problem, what: str, cause: BaseException):
        first = (str(cause).strip().splitlines() or [""])[0][:300]
        super().__init__(f"problem {problem.name!r}: {what} raised {type(cause).__name__}: {first}")
        self.what = what
        self.cause = cause


class ProblemCodeViolation(ProblemError):
    """The problem's code broke a rule of its confined worker (``violation``: the name
    :mod:`fuseval.runner.isolation` gives it: ``child_process``, ``timeout``, ``crashed``...)."""

    def __init__(self, problem: Problem, violation: str, message: str):
        super().__init__(f"problem {problem.name!r}: its code ran confined and broke a rule: {violation}: {message}",
                         exit_code_for([violation]))
        self.violation = violation


class _RemoteError(Exception):
    """An exception the problem's code raised in its worker, rebuilt from its type's name
    and its text (never unpickled)."""


# --------------------------------------------------------------------------- in place
def reference_module(problem: Problem) -> types.ModuleType:
    """The problem's reference source executed as a module of its own
    (``<problem module>.source``), once per process (the process this runs in: call it
    only where the problem's code may run, :func:`runs_here`)."""
    name = problem.module + ".source"
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name, f"the reference of SOL-ExecBench problem {problem.name}")
    module.__file__ = problem.reference_file
    sys.modules[name] = module
    try:
        exec(compile(problem.reference, problem.reference_file, "exec"), module.__dict__)
    except Exception as exc:
        del sys.modules[name]
        raise ProblemError(f"problem {problem.name!r}: its reference does not import: "
                           f"{type(exc).__name__}: {exc}") from exc
    return module


def _guarded(problem: Problem, what: str, fn, *args):
    try:
        return fn(*args)
    except ProblemError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the problem's code raises, named as such
        if is_out_of_memory(exc):
            raise
        raise ProblemCodeError(problem, what, exc) from exc


def _mode_from(path: str, args: Sequence[Any]):
    """A torch function mode of fuseval's own, named ``fuseval.<module>:<class>``."""
    module, _, attr = str(path).partition(":")
    if not module.startswith("fuseval.") or not attr:
        raise ValueError(f"a problem's code runs under fuseval's own modes only, not {path!r}")
    return getattr(importlib.import_module(module), attr)(*args)


def _reference_here(problem: Problem, inputs: Sequence[Any], lifted: bool, mode: tuple | None):
    source = reference_module(problem)
    if not lifted:
        return _guarded(problem, "its reference", lift.run_native, source.run, inputs), None
    if mode is None:
        return _guarded(problem, "its reference", lift.run_lifted, source.run, inputs, list(problem.inputs)), None
    active = _mode_from(*mode)
    with active:
        result = _guarded(problem, "its reference", lift.run_lifted, source.run, inputs, list(problem.inputs))
    return result, active.summary()


@contextlib.contextmanager
def seeded_global_generators(seed: int, device: torch.device):
    """torch's, Python's and numpy's global generators seeded for a custom entry point,
    and restored afterwards."""
    import numpy as np
    import torch
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    py_state, np_state = random.getstate(), np.random.get_state()
    derived = int(input_generator(seed, "custom").initial_seed())
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(derived)
            random.seed(derived)
            np.random.seed(derived % (1 << 32))
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)


def _custom_inputs_here(problem: Problem, axes_and_scalars: Mapping[str, Any], device, seed: int) -> dict:
    import torch

    fn = getattr(reference_module(problem), problem.custom_inputs_entrypoint)
    where = f"{problem.custom_inputs_entrypoint}()"
    with torch.no_grad(), seeded_global_generators(seed, torch.device(device)):
        values = _guarded(problem, where, fn, dict(axes_and_scalars), torch.device(device))
    if not isinstance(values, dict):
        raise ProblemError(f"problem {problem.name!r}: {where} returned {type(values).__name__}, "
                           "expected a dict of inputs by name")
    return values


# --------------------------------------------------------------------------- the public three
def run_reference(problem: Problem, inputs: Sequence[Any], *, lifted: bool, mode: tuple | None = None):
    """The reference's ``run`` on ``inputs`` (benchmark format, definition order).

    ``lifted`` False: its outputs as written (a tuple); True: the
    :class:`~fuseval.interop.lift.LiftResult` of the run as written and lifted to float64.
    ``mode`` ("fuseval.module:Class", args), lifted runs only: the run under that torch
    function mode; the result is then (LiftResult, the mode's ``summary()``).
    The run as written raising is a :class:`ProblemCodeError`; the lifted run failing is
    reported in the result (``report.lifted`` False and why), never hidden."""
    if runs_here():
        result, summary = _reference_here(problem, inputs, lifted, mode)
    else:
        result, summary = _confined(problem, {"kind": "reference", "lifted": bool(lifted),
                                              "mode": list(mode) if mode else None}, inputs)
    return (result, summary) if mode is not None else result


def custom_inputs(problem: Problem, axes_and_scalars: Mapping[str, Any], device, seed: int) -> dict:
    """``custom_inputs_entrypoint(axes_and_scalars, device)`` of the problem, with the
    global generators seeded from ``seed`` (a dict of its inputs by name)."""
    if runs_here():
        return _custom_inputs_here(problem, axes_and_scalars, device, seed)
    import torch
    return _confined(problem, {"kind": "custom_inputs", "axes": dict(axes_and_scalars), "seed": int(seed),
                               "device": str(torch.device(device))}, [], device=str(device))[0]


def runs_here() -> bool:
    """Whether a problem's code runs in this process: inside a worker, or when a Python
    caller turned isolation off (:func:`fuseval.runner.isolation.default_isolation`)."""
    return in_worker.IN_WORKER or not isolation.requested(None)


# --------------------------------------------------------------------------- confined
@dataclass(frozen=True)
class ProblemCode:
    """What a problem's worker serves (in the place of an operator's definition): the
    folder, named so that each problem has a worker of its own."""
    directory: str
    name: str
    variant: str | None = None
    implementations: dict = field(default_factory=dict)
    inputs: tuple = ()
    outputs: tuple = ()
    output_names: tuple = ()
    stage_names: tuple = ()


_SCALAR_TYPES = {"int": int, "float": float, "bool": bool}


def _pack(values: Sequence[Any], device: str | None = None) -> tuple[list[Any], list[str]]:
    """Tensors to send, and what each was: "tensor", "fp4" (sent as its bytes), "none",
    or a Python scalar's type (sent as a 0-d tensor). ``device`` (the worker's side): the
    device answers travel on; a tensor on another one is moved there and its kind marked
    ``@cpu``, to be moved back (a reference may hand some outputs back on the CPU)."""
    import torch
    tensors, kinds = [], []
    for v in values:
        if isinstance(v, torch.Tensor):
            fp4 = v.dtype == torch.float4_e2m1fn_x2
            kind = "fp4" if fp4 else "tensor"
            v = v.as_subclass(torch.Tensor) if type(v) is not torch.Tensor else v   # a Parameter travels as its data
            v = v.view(torch.uint8) if fp4 else v
            if device is not None and v.device.type != torch.device(device).type:
                v, kind = v.to(device), kind + "@cpu"
            tensors.append(v)
            kinds.append(kind)
        elif v is None:
            tensors.append(torch.empty(0, device=device))
            kinds.append("none")
        elif type(v) in (int, float, bool):
            tensors.append(torch.tensor(v, device=device))
            kinds.append(type(v).__name__)
        else:
            raise TypeError(f"a value of type {type(v).__name__} cannot leave a problem's worker "
                            "(tensors, numbers and None can)")
    return tensors, kinds


def _unpack(tensors: Sequence[Any], kinds: Sequence[str]) -> list[Any]:
    import torch
    out = []
    for t, k in zip(tensors, kinds):
        kind, _, where = k.partition("@")
        if where == "cpu" and isinstance(t, torch.Tensor):
            t = t.cpu()
        if kind == "fp4":
            out.append(t.view(torch.float4_e2m1fn_x2))
        elif kind == "none":
            out.append(None)
        elif kind in _SCALAR_TYPES:
            out.append(_SCALAR_TYPES[kind](t.item()))
        else:
            out.append(t)
    return out


def _request_tensor(request: Mapping[str, Any]):
    import torch
    return torch.frombuffer(bytearray(json.dumps(request).encode()), dtype=torch.uint8)


def serve(request, *tensors):
    """The worker's side (the function a problem's worker serves): run one request and
    return its tensors; what it says besides goes in the reply's note
    (:func:`fuseval.runner.in_worker.note`). Errors of the problem's code travel in the
    note; running out of memory raises, for the worker to report as such."""
    req = json.loads(bytes(request.numpy()).decode())
    try:
        problem = read_problem(req["directory"])
        values = _unpack(tensors, req["kinds"])
        if req["kind"] == "custom_inputs":
            produced = _custom_inputs_here(problem, req["axes"], req["device"], req["seed"])
            names = [n for n in produced if isinstance(n, str)]
            sent, kinds = _pack([produced[n] for n in names], req["worker"])
            note({"names": names, "kinds": kinds})
            return tuple(sent)
        result, summary = _reference_here(problem, values, req["lifted"], tuple(req["mode"]) if req["mode"] else None)
        if not req["lifted"]:
            sent, kinds = _pack(result, req["worker"])
            note({"kinds": kinds})
            return tuple(sent)
        native, native_kinds = _pack(result.native, req["worker"])
        lifted, lifted_kinds = _pack(result.lifted, req["worker"])
        note({"kinds": native_kinds + lifted_kinds, "n_native": len(native), "report": asdict(result.report),
              "summary": summary})
        return tuple(native + lifted)
    except Exception as exc:  # noqa: BLE001 - every failure but memory travels as data
        if is_out_of_memory(exc):
            raise
        cause = exc.cause if isinstance(exc, ProblemCodeError) else exc
        note({"error": {"problem_code": isinstance(exc, ProblemCodeError), "message": str(exc)[:2000],
                        "what": getattr(exc, "what", ""), "type": type(cause).__name__[:100],
                        "text": str(cause)[:2000]}})
        return ()


def worker_device(inputs: Sequence[Any]) -> str:
    """Where a problem's worker runs its code on ``inputs``: on a GPU when any input is on
    one (a problem may keep small inputs on the CPU), and when no input is a tensor at all
    on a machine with a GPU (such a reference makes its tensors on the device it names,
    'cuda' in the benchmark, whose own runs are on a GPU); else on the CPU."""
    import torch
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    found = next((str(t.device) for t in tensors if t.device.type == "cuda"), None)
    if found is not None:
        return found
    return "cuda" if not tensors and torch.cuda.is_available() else "cpu"


def _confined(problem: Problem, request: dict, inputs: Sequence[Any], device: str | None = None):
    """Send ``request`` with ``inputs`` to the problem's worker; (result, mode summary)."""
    import time

    import torch

    if device is None:
        device = worker_device(inputs)
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    tensors, kinds = _pack(inputs)
    request = {**request, "directory": problem.directory, "kinds": kinds, "worker": kind}
    worker = isolation.worker_for("fuseval.interop.problem_code:serve", ProblemCode(problem.directory, problem.name),
                                  kind)
    res = worker.call([_request_tensor(request)] + tensors, deadline=time.monotonic() + TIMEOUT)
    said = res.note if isinstance(res.note, dict) else {}
    # a reference that updates its inputs in place (a KV cache) wrote its worker's private
    # copies: its own semantics, not a violation, and fuseval's copies are unchanged
    keep = [k for k, v in enumerate(res.violations) if v != "mutated_input"]
    res.violations, res.messages = [res.violations[k] for k in keep], [res.messages[k] for k in keep]
    if res.violations:
        if res.violations[0] == "out_of_memory":
            raise torch.OutOfMemoryError(f"problem {problem.name!r}: its code ran out of memory: {res.error}")
        printed = f"; it printed: {res.output.strip()[-600:]!r}" if res.output.strip() else ""
        raise ProblemCodeViolation(problem, res.violations[0], "; ".join(res.messages)[:1500] + printed)
    error = said.get("error")
    if isinstance(error, dict):
        if error.get("problem_code"):
            cause = type(str(error.get("type") or "Exception"), (_RemoteError,), {})(str(error.get("text")))
            raise ProblemCodeError(problem, str(error.get("what")), cause)
        raise ProblemError(str(error.get("message")))
    kinds_back = [str(k) for k in said.get("kinds", [])]
    outputs = list(res.outputs or ())
    if len(kinds_back) != len(outputs):
        raise ProblemCodeViolation(problem, "tampered", f"its worker answered {len(outputs)} values and "
                                   f"described {len(kinds_back)}")
    values = _unpack(outputs, kinds_back)
    if request["kind"] == "custom_inputs":
        return dict(zip([str(n) for n in said.get("names", [])], values)), None
    if not request["lifted"]:
        return tuple(values), None
    n = int(said.get("n_native", 0))
    report = LiftReport(**{k: v for k, v in (said.get("report") or {}).items()
                           if k in LiftReport.__dataclass_fields__})
    return LiftResult(tuple(values[:n]), tuple(values[n:]), report), said.get("summary")
