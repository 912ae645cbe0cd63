"""The hygiene rules of a check: what an implementation may not do besides computing wrong numbers.

* ``mutated_input``: an input written by a call, any call of the case (the worker's runner
  sees it from fuseval's side, :mod:`fuseval.runner.isolation`; in fuseval's own process a
  bitwise ``fingerprint`` before and after each call);
* ``aliased_output``: an output sharing memory with an input (``overlaps``);
* ``cached_result``: later calls, each with one group of inputs drawn anew
  (``input_groups``: the activations, then the weights), that return the first answer, or
  an answer to the first call's question: it fails the oracle of its own inputs and passes
  the first call's (a result cached on part of the inputs). A later answer that is merely
  wrong (it matches neither) is a ``tolerance`` failure of that call, not a cache;
* ``output_reused``: any answer of the case overwritten by a later call (every answer is
  kept and compared at the end of the case with fuseval's copy of it), seen for rings of
  buffers smaller than the case's number of calls (:data:`CALLS_PER_CASE`).

Every oracle of a later call is computed before that call, on fuseval's own inputs.

``poison_allocator`` fills the memory the CUDA caching allocator hands out next with NaN,
so output elements an implementation never wrote show up as NaN.

The later calls draw only the inputs they change, from a hygiene seed of their own, drawn
at random for each case (recorded in the report, never derived from the case's seed), so
an implementation cannot tell from an input which call of the case it is in.
"""
from __future__ import annotations

import ast
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .comparison import compare
from .definitions import Case, Definition, Tolerance
from .inputs import draw_inputs

__all__ = ["fingerprint", "overlaps", "poison_allocator", "input_groups", "same_outputs", "PartialCall",
           "partial_calls", "judge_partial_calls", "NO_OUTPUTS", "CALLS_PER_CASE", "draw_hygiene_seed"]

# violations after which a call's outputs are not there to compare
NO_OUTPUTS = ("timeout", "exited", "crashed", "raised", "out_of_memory")

# calls of one case with hygiene: the first, the first inputs again, the activations
# anew, the weights anew
CALLS_PER_CASE = 4


def fingerprint(t: Any) -> Any:
    """A cheap content fingerprint (bitwise) of a tensor, computed where it lives."""
    if not isinstance(t, torch.Tensor):
        return t
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    bits = t.detach().contiguous().view(width).flatten().to(torch.int64)
    weights = torch.arange(1, bits.numel() + 1, device=bits.device, dtype=torch.int64) % 1_000_003
    return (tuple(t.shape), t.dtype, int(bits.sum()), int((bits * weights).sum()))


def _storage_span(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors' storages share memory."""
    if a.device != b.device:
        return False
    a0, a1 = _storage_span(a)
    b0, b1 = _storage_span(b)
    return a0 < b1 and b0 < a1 and a1 > a0 and b1 > b0


def poison_allocator(device: torch.device, nbytes: int) -> None:
    """Fill the memory the caching allocator will hand out next with NaN.

    On CUDA, a freed block stays in torch's cache and is reused for the next allocations,
    so outputs an implementation allocates but never fully writes show NaN. The allocator
    hands out the smallest cached block that fits, and a segment that still holds a live
    tensor keeps its free fragments in the cache even through ``empty_cache``: so every
    free block in the cache is taken, filled with NaN and given back (small-pool
    fragments in pieces of at most 1 MiB, the largest request that pool serves), and then
    one fresh block of ``nbytes`` for outputs larger than anything cached. On the CPU,
    large allocations come fresh from the OS (zeros); unwritten elements are then caught
    by the comparison with the oracle and the all-zero rule."""
    if device.type != "cuda" or nbytes <= 0:
        return
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()                      # whole free segments go back to the driver
    index = device.index if device.index is not None else torch.cuda.current_device()
    small_max = 1 << 20
    requests = []
    for segment in torch.cuda.memory_snapshot():
        if segment.get("device", index) != index:
            continue
        for block in segment.get("blocks", []):
            if block.get("state") != "inactive":
                continue
            size = int(block["size"])
            if segment.get("segment_type") == "small":
                requests += [small_max] * (size // small_max) + ([size % small_max] if size % small_max else [])
            else:
                requests.append(size)
    held = []
    for size in sorted(requests):
        held.append(torch.empty(max(size // 4, 1), dtype=torch.float32, device=device).fill_(float("nan")))
    try:
        held.append(torch.empty(int(nbytes) // 4 + 1, dtype=torch.float32, device=device).fill_(float("nan")))
    except torch.cuda.OutOfMemoryError:           # no room for a fresh block: the cache is poisoned
        pass
    del held


def input_groups(defn: Definition) -> dict[str, list[int]]:
    """Input indices by group: ``activations`` (tensors whose shape depends on a var axis:
    what changes from call to call in a model) and ``weights`` (every other input a
    generator draws: weights, scales, norm weights, drawn scalars). Fixed-value scalars
    (an epsilon) are in neither."""
    var = set(defn.var_axes)
    changed = True
    while changed:                       # expr axes computed from var axes vary too
        changed = False
        for a in defn.axes.values():
            if a.kind == "expr" and a.name not in var and _names(a.expression) & var:
                var.add(a.name)
                changed = True
    groups: dict[str, list[int]] = {"activations": [], "weights": []}
    for i, spec in enumerate(defn.inputs):
        if spec.is_scalar:
            if spec.value is None:
                groups["weights"].append(i)
        elif any(_names(d) & var for d in spec.shape):
            groups["activations"].append(i)
        else:
            groups["weights"].append(i)
    return groups


def _names(expression: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(str(expression), mode="eval")) if isinstance(n, ast.Name)}


def same_outputs(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    """Whether two answers are identical, NaN where NaN included."""
    return all(torch.equal(x.to(torch.float64).nan_to_num(1.5), y.to(torch.float64).nan_to_num(1.5))
               for x, y in zip(a, b))


@dataclass
class PartialCall:
    """One later call of the cached-result rule: ``what`` changed, and its inputs
    (``repeat``: the first call's own)."""
    what: str
    inputs: list[Any]
    repeat: bool = False


def draw_hygiene_seed() -> int:
    """A seed for a case's later calls, from the operating system's random source."""
    return secrets.randbelow(2 ** 31 - 1) + 1


def partial_calls(defn: Definition, case: Case, hygiene_seed: int, inputs: Sequence[Any], mode: str,
                  device: torch.device, repeat: bool = True) -> list[PartialCall]:
    """The later calls of a case: only the activations drawn anew, then only the weights
    (the rest kept: the very tensors of the first call). A cache keyed on the weights hits
    on the first, one keyed on the activations on the second, an answer cached under no
    key on both; a cache keyed on every input never hits and returns fresh answers, which
    is fine. An operator whose inputs are all of one group gets one call with every
    drawn input anew instead (fixed-value scalars kept). Only the inputs a call changes
    are drawn, all in one draw (from ``hygiene_seed``); a call whose new draw equals the
    old (a group of fixed-rule inputs, such as norm weights of ones) is left out.
    ``repeat``: a last call on the first call's very inputs, which must answer as the
    first did (a result that depends on how often it was called, or a ring of output
    buffers, shows there)."""
    groups = {name: set(idx) for name, idx in input_groups(defn).items() if idx}
    drawn = set().union(*groups.values()) if groups else set()
    partial = {name: idx for name, idx in groups.items() if len(idx) < len(drawn)}
    plan = [(f"only the {name} changed", idx) for name, idx in partial.items()]
    if len(plan) < 2:
        plan = [("every input changed", drawn)]
    need = set().union(*(idx for _, idx in plan))
    fresh = draw_inputs(defn, case.axes, seed=hygiene_seed, mode=mode, device=device,
                        names={defn.inputs[i].name for i in need})
    # an input drawn by a fixed rule (norm weights of ones) comes out the same: a call whose
    # inputs all came out the same changes nothing, and its identical answer is no cache
    changed = {i for i in need if not _same_value(fresh[defn.inputs[i].name], inputs[i])}
    calls = [PartialCall(what, [fresh[s.name] if i in idx else inputs[i] for i, s in enumerate(defn.inputs)])
             for what, idx in plan if idx & changed]
    # the repeat comes first: a ring of buffers then hands the first call's buffer to a
    # call whose answer differs from the first's
    if repeat:
        calls.insert(0, PartialCall("the first call's inputs again", list(inputs), repeat=True))
    return calls


def _same_value(a: Any, b: Any) -> bool:
    """Bitwise equality of two input values (tensors, or scalars as Python numbers)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))
    return type(a) is type(b) and a == b


def judge_partial_calls(defn: Definition, runner: Any, calls: Sequence[PartialCall], first: Sequence[torch.Tensor],
                        reference: Callable, tol: Tolerance, rules: str, judge: bool, all_zero: bool,
                        deadline: float | None, expected, check_shapes: Callable,
                        violations: list[str], messages: list[str], first_refs: Sequence[torch.Tensor] | None = None,
                        keep: bool = False) -> None:
    """Make the later calls and apply the cached-result rule to each. The oracle of each
    call is computed first, on fuseval's inputs. A changed-input call's answer must
    differ from the ``first``; when the first passed the tolerance (``judge``) it must
    also pass the oracle on its own inputs: one that fails it but passes the first call's
    oracle (``first_refs``) answers the first question again (``cached_result``), one that
    passes neither is wrong (``tolerance``). The repeat call's answer must pass the first
    call's oracle. ``keep``: the runner keeps every answer for the end-of-case check."""
    for call in calls:
        refs = None
        if judge and not call.repeat:
            refs = reference(*call.inputs)
            refs = (refs,) if isinstance(refs, torch.Tensor) else tuple(refs)
        res = runner.call(call.inputs, deadline=deadline, expected=expected, keep=keep)
        if res.violations:
            violations.extend(res.violations)
            messages.extend(f"call with {call.what}: {m}" for m in res.messages)
            if any(v in NO_OUTPUTS for v in res.violations):
                return
            if any(v in ("bad_outputs", "wrong_device") for v in res.violations):
                continue
        problems = check_shapes(res.outputs)
        if problems:
            violations.append("bad_outputs")
            messages.extend(f"call with {call.what}: {m}" for m in problems)
            continue
        if call.repeat:
            if judge and first_refs is not None:
                bad = _failing(defn, res.outputs, first_refs, tol, rules)
                if bad:
                    violations.append("cached_result")
                    messages.append(f"a call with {call.what} returned outputs the first call's oracle rejects "
                                    f"({_describe_failure(bad[0])}): the answer depends on the calls before it")
            continue
        # an all-zero answer is the same for any input: it is reported as all_zero, not
        # as a cached result (that rule is for answers that are right once, then stale)
        if not all_zero and same_outputs(first, res.outputs):
            if first_refs is not None:
                # an answer that does not depend on what changed is the right answer again
                # (a gradient independent of a weight): a cache only where the oracle's moved
                theirs = refs if refs is not None else reference(*call.inputs)
                theirs = (theirs,) if isinstance(theirs, torch.Tensor) else tuple(theirs)
                if same_outputs(first_refs, theirs):
                    continue
            violations.append("cached_result")
            messages.append(f"a call with {call.what} returned identical outputs")
            continue
        if refs is None:
            continue
        bad = _failing(defn, res.outputs, refs, tol, rules)
        if not bad:
            continue
        stale = first_refs is not None and not _failing(defn, res.outputs, first_refs, tol, rules)
        if stale:
            violations.append("cached_result")
            messages.append(f"a call with {call.what} returned outputs that fail the oracle on its own inputs "
                            f"({_describe_failure(bad[0])}) but pass the first call's: a result cached on part of "
                            "the inputs")
        else:
            violations.append("tolerance")
            messages.append(f"a call with {call.what} fails the tolerance ({_describe_failure(bad[0])})")


def _failing(defn: Definition, outputs, refs, tol: Tolerance, rules: str):
    return [m for m in (compare(o, r, tol, s.name, rules) for o, r, s in zip(outputs, refs, defn.outputs))
            if not m.passed]


def _describe_failure(m) -> str:
    return f"{m.name}: {', '.join(m.reasons)}, matched {m.matched_ratio:.4%}"
