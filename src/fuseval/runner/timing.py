"""fuseval's judgement of a timed run: the numbers come from the implementation's worker
(:mod:`fuseval.runner.clock`), the verdict on them from here, in fuseval's process.

A timed run is **refused** (its time is not reported as a time) when:

* ``replayed_output``: one of the timed calls, picked at random after the loop, returned
  outputs that are not the operator's on that call's inputs (each call's activations are
  unique: a cache or a replay answers with a stale result);
* ``unwatched_stream``: on the watched calls, work went on after the call's end event
  (work on another stream, or launched from a thread, that the events did not cover);
* ``unwatched_faster``: the timed calls were much faster than the device's work in the
  same calls watched on every stream (what a watched call spans beyond the host's time to
  launch it: a launch-bound call is no offence), or the watched calls took the host much
  longer to return than the timed ones (an implementation that behaves only when watched);
* ``uneven_calls``: the calls' mean (the slowest 2% left out: a stall now and then is not
  work) is well above their median: work batched into some calls, the others answering
  from it;
* ``timer``: the events add up to more than the loop's own duration (a timer that lies);
* ``below_floor``: the median is below the operator's floor, the least time its FLOPs and
  bytes need at this device's measured rates (minus a noise margin): impossible;
* any violation of the runner (a patched timer or verdict function is ``tampered``;
  ``lingering_thread``, ``child_process``, ``mutated_input``, a crash, a timeout).
"""
from __future__ import annotations

import secrets
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence
from ..comparison import compare
from ..hygiene import input_groups
from ..inputs import generate_inputs
from . import clock
from .worker import Worker


__all__ = ["TimedRun", "time_impl", "judge", "ROTATION_SETS", "CHECKED_CALLS", "WATCHED_CALLS", "FLOOR_MARGIN",
           "REFUSALS", "rotation_sets", "activation_index", "Timing"]

ROTATION_SETS = 3          # input sets the calls cycle over (distinct weights and addresses)
CHECKED_CALLS = 3          # timed calls whose outputs are checked against the oracle
WATCHED_CALLS = 10         # calls timed with every stream watched, and as many empty ones
FLOOR_MARGIN = 0.03        # a median this far below the floor is impossible, not noise
UNEVEN_FACTOR = 1.5        # mean of the calls (the slowest 2% left out) over their median that
                           # means work batched into some of the calls
UNWATCHED_SLACK_MS = 0.02  # what the device's synchronisation may add to a watched call
HOST_FACTOR = 3.0          # a watched call's host time over a timed call's, plus HOST_SLACK_MS,
HOST_SLACK_MS = 0.1        # that means the call behaves differently when watched

@dataclass
class Timing:
    """Latency of one implementation on one case, in milliseconds."""
    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    reps: int

    @classmethod
    def from_samples(cls, samples: Sequence[float]) -> "Timing":
        s = sorted(samples)
        q = lambda f: s[min(len(s) - 1, int(round(f * (len(s) - 1))))]
        return cls(statistics.median(s), q(0.2), q(0.8), s[0], len(s))


REFUSALS = {
    "replayed_output": "a timed call answered with outputs that are not the operator's on its inputs (a cache, "
                       "a replay of an earlier result, or work left unfinished)",
    "unwatched_stream": "work went on after the timed interval ended (another stream, or a thread)",
    "unwatched_faster": "the timed calls were much faster than the same calls watched on every stream",
    "uneven_calls": "most of the time went to a few calls (work batched into one call, or computed ahead)",
    "timer": "the timer's readings add up to more than the loop's own duration",
    "below_floor": "faster than the operator's floor at this device's measured rates: impossible",
}


@dataclass
class TimedRun:
    """One implementation timed on one case: the median and its spread (``timing``,
    None when refused), why it was refused (``refused``: (reason, message) pairs), and
    what the judgement was made from."""
    timing: dict[str, Any] | None
    refused: list[tuple[str, str]] = field(default_factory=list)
    calls: int = 0
    checked_calls: list[int] = field(default_factory=list)
    watched: dict[str, float] = field(default_factory=dict)
    overhead_ms: float | None = None        # per call, outside the timed interval (flush, rotation, host)
    output: str = ""

    @property
    def valid(self) -> bool:
        return not self.refused and self.timing is not None

    def summary(self) -> str:
        return "; ".join(f"{r}: {m}" for r, m in self.refused)


def activation_index(defn, inputs: Sequence[Any]) -> int | None:
    """The input the rotation rewrites before every call: the first activation (an input
    whose shape follows a var axis) that is a floating tensor of at least 16 bits."""
    import torch
    for i in input_groups(defn)["activations"]:
        t = inputs[i]
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.element_size() >= 2 and t.numel():
            return i
    return None


def rotation_sets(defn, case, *, seed: int, mode: str, device) -> list[list[Any]]:
    """:data:`ROTATION_SETS` input sets of one case, each drawn from a seed of its own."""
    return [generate_inputs(defn, case.axes, seed=seed + case.index + 7919 * j, mode=mode, device=device)
            for j in range(ROTATION_SETS)]


def _keep_bytes(device) -> int:
    import torch
    if getattr(device, "type", str(device)) == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        return int(min(8 << 30, free // 4))
    return 512 << 20


def time_impl(runner: Any, defn, case, *, seed: int, mode: str, device, reference: Callable,
              tolerance, rules: Mapping[str, Any], floor_ms: float | None = None,
              deadline: float | None = None) -> TimedRun:
    """Time ``runner`` (a :class:`fuseval.runner.Worker`, or a callable trusted to run in
    this process) on ``case`` and judge the run. ``rules``: the timer's (warm-up, reps,
    flush). The timed calls' inputs are rebuilt here for the checked ones."""
    import torch
    device = torch.device(device)
    sets = rotation_sets(defn, case, seed=seed, mode=mode, device=device)
    act = activation_index(defn, sets[0])
    run_seed = secrets.randbits(31)
    loop_rules = {**dict(rules), "watched": WATCHED_CALLS, "keep_bytes": _keep_bytes(device)}
    refused: list[tuple[str, str]] = []
    output = ""
    if isinstance(runner, Worker):
        res = runner.time(sets, act, run_seed, loop_rules, deadline=deadline)
        output = res.output
        refused += [(v, m) for v, m in zip(res.violations, res.messages)]
        raw = res.timing
        described = res.outputs
    else:
        fn = getattr(runner, "fn", runner)
        raw, kept = clock.run_timed(fn, sets, act, run_seed, device=device, **loop_rules)
        described = None
    if raw is None:
        return TimedRun(None, refused or [("raised", "the timed run returned no numbers")], output=output)
    n_kept = int(raw.get("kept") or 0)
    picks = sorted(secrets.SystemRandom().sample(range(n_kept), min(CHECKED_CALLS, n_kept)))
    if isinstance(runner, Worker):
        from ..validate import bind_axes, expected_outputs
        expected = expected_outputs(defn, bind_axes(defn, sets[0], check_values=False))
        got, res2 = runner.timed_outputs(picks, described or [], expected, deadline=deadline)
        refused += [(v, m) for v, m in zip(res2.violations, res2.messages)]
    else:
        got = [list(kept[i]) if isinstance(kept[i], (tuple, list)) else [kept[i]] for i in picks]
        del kept
    if got is not None:
        refused += _check_calls(defn, sets, act, run_seed, int(raw["first_call"]), picks, got, reference,
                                tolerance)
    run = judge(raw, floor_ms, host_clock=device.type != "cuda")
    run.refused = refused + run.refused
    run.checked_calls = picks
    run.output = output
    if run.refused:
        run.timing = None
    return run


def _check_calls(defn, sets, act, run_seed, first_call, picks, got, reference, tolerance) -> list[tuple[str, str]]:
    """The checked timed calls against the oracle on each call's own inputs."""
    import torch
    found = []
    for i, outs in zip(picks, got):
        k = first_call + i
        args = list(sets[k % len(sets)])
        if act is not None:
            fresh = torch.empty_like(args[act])
            clock.refresh(fresh, args[act], clock.scale_of(run_seed, k))
            args[act] = fresh
        with torch.no_grad():
            refs = reference(*args)
        refs = refs if isinstance(refs, (tuple, list)) else (refs,)
        if len(outs) != len(refs):
            found.append(("replayed_output", f"timed call {i + 1} returned {len(outs)} outputs, expected {len(refs)}"))
            continue
        for o, r, spec in zip(outs, refs, defn.outputs):
            if o is None or tuple(o.shape) != tuple(r.shape):
                found.append(("replayed_output", f"timed call {i + 1}: {spec.name} has the wrong shape"))
                break
            m = compare(o, r, tolerance, spec.name, "fuseval")
            if not m.passed:
                found.append(("replayed_output", f"timed call {i + 1} (of the loop's kept calls): {spec.name} is not "
                              f"the operator's on that call's inputs (max abs {m.max_abs:.3g}, matched "
                              f"{m.matched_ratio:.2%}): {REFUSALS['replayed_output']}"))
                break
    return found


def judge(raw: Mapping[str, Any], floor_ms: float | None, *, host_clock: bool = False) -> TimedRun:
    """The rules of the module docstring on a timed run's numbers. ``host_clock``: the
    readings are the host's (CPU timer), where a call preempted by another process reads
    long: the spread rule does not apply."""
    times = [float(t) for t in raw.get("times_ms") or []]
    if not times or any(not (t >= 0.0) for t in times):
        return TimedRun(None, [("timer", "the timed run returned no readings, or negative ones")])
    t = Timing.from_samples(times)
    run = TimedRun(t.__dict__.copy(), calls=len(times))
    refused = run.refused
    n, med = len(times), t.median_ms
    loop_ms = float(raw.get("loop_s") or 0.0) * 1e3
    run.overhead_ms = max(0.0, loop_ms / n - statistics.fmean(times)) if loop_ms else None
    if loop_ms and sum(times) > 1.02 * loop_ms + 0.05:
        refused.append(("timer", f"the calls' events add up to {sum(times):.3f} ms, more than the loop's "
                        f"{loop_ms:.3f} ms: {REFUSALS['timer']}"))
    # the mean without the slowest calls (a stall of the host or the driver, now and then)
    # against the median: work batched into every few calls raises the one, not the other
    trimmed = sorted(times)[:n - max(1, n // 50)]
    mean = statistics.fmean(trimmed) if trimmed else med
    if not host_clock and n >= 4 and mean > UNEVEN_FACTOR * med:
        refused.append(("uneven_calls", f"the {len(trimmed)} fastest of {n} calls average {mean:.4f} ms, "
                        f"{mean / med:.1f}x their median {med:.4f} ms: {REFUSALS['uneven_calls']}"))
    watched, empty = raw.get("watched") or [], raw.get("empty") or []
    if watched and empty:
        events = statistics.median(float(p[0]) for p in watched)
        span = statistics.median(float(p[1]) for p in watched)
        sync = statistics.median(float(p[1]) for p in empty)
        work = max(0.0, span - sync)
        # the host's time to return from a call: on the idle device of a watched call, the
        # device waits for the launches, which the span then holds (a launch-bound call);
        # the timed calls' launches overlap the flush before them. What the span holds
        # beyond them is the device's own work.
        host_watched = statistics.median(float(p[2]) for p in watched) if all(len(p) > 2 for p in watched) else 0.0
        launches = [float(t) for t in raw.get("launch_ms") or []]
        host_timed = statistics.median(launches) if launches else None
        device_work = max(0.0, work - host_watched)
        run.watched = {"events_ms": events, "span_ms": span, "sync_ms": sync, "host_ms": host_watched,
                       "host_timed_ms": host_timed}
        if work > 1.25 * events + UNWATCHED_SLACK_MS:
            refused.append(("unwatched_stream", f"watched calls: the events saw {events:.4f} ms, every stream "
                            f"was busy {work:.4f} ms: {REFUSALS['unwatched_stream']}"))
        elif host_timed is not None and host_watched > HOST_FACTOR * host_timed + HOST_SLACK_MS:
            refused.append(("unwatched_faster", f"watched calls took the host {host_watched:.4f} ms to return, "
                            f"timed calls {host_timed:.4f} ms: {REFUSALS['unwatched_faster']}"))
        elif device_work > UNWATCHED_SLACK_MS and med < 0.5 * device_work:
            refused.append(("unwatched_faster", f"timed median {med:.4f} ms, watched calls {work:.4f} ms of which "
                            f"{device_work:.4f} ms after the host returned: {REFUSALS['unwatched_faster']}"))
    if floor_ms is not None and floor_ms > 0 and med < (1.0 - FLOOR_MARGIN) * floor_ms:
        refused.append(("below_floor", f"median {med:.4f} ms is {floor_ms / med:.2f}x faster than the floor "
                        f"{floor_ms:.4f} ms: {REFUSALS['below_floor']}; the likely cause is work that was "
                        "not timed (another stream, a thread, a cache) or a timer that was changed"))
    return run
