"""Run import, the benchmark reference's check and the gate over many problem folders
(``fuseval sweep DIR...``) and write one table.

Each DIR is a problem folder (definition.json) or a folder of them. Per problem, three
steps, each a ``fuseval`` command of its own in a process of its own, under the
problem's time budget (``--timeout``, seconds for all its steps together) and memory
limit (``--memory-gb``, the process's address space):

1. ``fuseval import DIR`` (reads the folder; runs none of its code);
2. ``fuseval check --problem DIR --impl sol_reference`` on the smallest workloads
   (``--smallest``): does the benchmark's own reference pass its tolerance against the
   lifted float64 oracle? Exit 1 there is a *finding* about the problem (its reference
   misses its own tolerance against exact arithmetic), not a failure of fuseval;
3. ``fuseval gate --problem DIR --impl sol_reference --profile PROFILE`` on the same
   workloads.

What is checked is the benchmark's own reference, the code fuseval's lifted oracle runs in
its own process anyway: it runs in fuseval's process (``--in-process``) unless
``--isolate`` asks for the confined worker (a worker per call costs seconds each).

Problems run ``--jobs`` at a time; on CUDA each job gets a GPU of its own
(``CUDA_VISIBLE_DEVICES``), round robin, and where several jobs share one GPU each gets an
equal share of its memory (``FUSEVAL_CUDA_MEMORY_SHARE``, to which torch's allocator holds
each of the problem's processes, fuseval's and its GPU workers, and which the property draws
take as their bound): a problem then runs out of memory in its own share rather than in its
neighbour's; the problems that ran out of memory in their share are then run again, one per
GPU, each with all of it (their rows say so). Stopping the sweep (SIGTERM, SIGINT) kills the
steps still running, writes the table so far and exits 128 + the signal. The table (problem, import, reference verdict,
the reference's tolerance use, gate, seconds) is written as Markdown, JSON and CSV under
``--out``, with each step's output beside it; progress goes to stderr, one line per
finished problem. The exit code is 0 when no step ended in exit 70 (a bug in fuseval),
else 70: a sweep is a survey, its findings are in the table.
"""
from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Any

from ..runner.procs import descendants, end_session
from . import parse_device, writable_folder

STEPS = ("import", "check", "gate")


def add_arguments(p) -> None:
    p.add_argument("directories", nargs="+", metavar="DIR",
                   help="problem folders, or folders of problem folders")
    p.add_argument("--out", required=True, metavar="DIR", help="where the table and each step's output go")
    p.add_argument("--profile", default="ci", help="the gate's profile (default: %(default)s)")
    p.add_argument("--device", default="cpu", type=parse_device, help="cpu or cuda (default: %(default)s)")
    p.add_argument("--smallest", type=int, default=1, metavar="N",
                   help="check and gate the N smallest workloads of each problem (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=600.0, metavar="S",
                   help="seconds per problem, all its steps together (default: %(default)s)")
    p.add_argument("--memory-gb", type=float, default=None, metavar="G",
                   help="address-space limit of each step's process, in GiB (default: none)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="problems at a time (default: %(default)s)")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="with --device cuda: GPUs to spread the jobs over (default: torch's device count)")
    p.add_argument("--skip", default="", help="steps to leave out, comma list of import, check, gate")
    p.add_argument("--isolate", action="store_true",
                   help="run the benchmark's reference in the confined worker too (default: in fuseval's process, "
                        "where the lifted oracle already runs the same code)")


@dataclass
class Row:
    """One problem's line of the table (exit codes; None: not run)."""
    folder: str
    name: str = ""
    subset: str = ""
    workloads: str = ""           # the case indices checked
    import_exit: int | None = None
    check_exit: int | None = None
    reference: str = ""           # pass | finding | fail (exit N) | timeout | not run
    matched: float | None = None  # the reference's lowest matched ratio over the checked cases
    allowance: float | None = None  # its worst element over its allowance (fuseval's bound)
    gate_exit: int | None = None
    gate: str = ""
    seconds: dict[str, float] = field(default_factory=dict)
    note: str = ""


def problem_folders(directories: list[str]) -> list[str]:
    """Each problem folder named or held (one level down), in order, no repeats."""
    found: list[str] = []
    for d in directories:
        d = os.path.abspath(d)
        if os.path.isfile(os.path.join(d, "definition.json")):
            candidates = [d]
        elif os.path.isdir(d):
            subs = sorted(os.listdir(d), key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s))
            candidates = [os.path.join(d, s) for s in subs if os.path.isfile(os.path.join(d, s, "definition.json"))]
        else:
            candidates = []
        if not candidates:
            from ..errors import UsageError
            raise UsageError(f"sweep: {d}: expected a problem folder (with definition.json) or a folder of them, "
                             "found neither")
        found += [c for c in candidates if c not in found]
    return found


def _limit(memory_gb: float | None):
    if memory_gb is None:
        return None
    limit = int(memory_gb * 2 ** 30)

    def apply() -> None:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


# each step runs in a session of its own (its workers with it), so a step is killed whole;
# the sweep kills the ones still running when it is stopped (SIGTERM, SIGINT), else they
# would go on holding the machine's memory and GPU after it
_live: set[subprocess.Popen] = set()
_live_lock = threading.Lock()
_stopping = threading.Event()


def _kill(proc: subprocess.Popen) -> None:
    """Kill a step whole: its session, and the sessions of its descendants that left it
    (fuseval's confined workers make sessions of their own), found before any dies."""
    tree = descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    for session in {p.session for p in tree} - {proc.pid}:
        end_session(session, wait=2.0)


def _stop_all() -> None:
    """No step starts from now on; every running step's session is killed."""
    with _live_lock:
        _stopping.set()
        running = list(_live)
    for proc in running:
        _kill(proc)


def _run(cmd: list[str], log: str, deadline: float, memory_gb: float | None, env: dict) -> tuple[int | None, float]:
    """Run ``cmd`` with its output to ``log``; (exit code or None on timeout or a stopped
    sweep, seconds)."""
    left = deadline - time.monotonic()
    t0 = time.monotonic()
    if left <= 0:
        return None, 0.0
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        with _live_lock:
            if _stopping.is_set():
                return None, 0.0
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, preexec_fn=_limit(memory_gb),
                                    start_new_session=True)
            _live.add(proc)
        try:
            code = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            _kill(proc)
            proc.wait()
            code = None
        finally:
            with _live_lock:
                _live.discard(proc)
        if code is not None and code < 0 and _stopping.is_set():
            code = None    # killed by the sweep's stop: no exit code of its own
    return code, time.monotonic() - t0


def _smallest_cases(folder: str, n: int) -> tuple[str, str, str]:
    """(name, subset, the case indices of the ``n`` smallest supported workloads)."""
    from ..interop.tolerance_use import select_workloads
    from ..interop.sol_problem import read_problem
    problem = read_problem(folder)
    chosen = {w.line for w in select_workloads(problem, smallest=n)}
    cases = [i for i, w in enumerate(problem.supported_workloads) if w.line in chosen]
    subset = ""
    meta = os.path.join(folder, "metadata.json")
    if os.path.isfile(meta):
        try:
            with open(meta) as f:
                m = json.load(f)
            subset = f"{m.get('subset', '')}/{int(m.get('collection_index', 0)):03d}"
        except (OSError, ValueError, TypeError):
            subset = ""
    return problem.name, subset, ",".join(map(str, cases))


def _tolerance_use(path: str) -> tuple[float | None, float | None]:
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError):
        return None, None
    outs = [o for c in report.get("cases", []) for o in c.get("outputs", [])]
    matched = [o["matched_ratio"] for o in outs if isinstance(o.get("matched_ratio"), (int, float))]
    ratios = [o["error_ratio"] for o in outs if isinstance(o.get("error_ratio"), (int, float))]
    return (min(matched) if matched else None), (max(ratios) if ratios else None)


def sweep_problem(folder: str, args, out: str, env: dict) -> Row:
    row = Row(folder)
    here = os.path.join(out, os.path.basename(folder.rstrip("/")))
    os.makedirs(here, exist_ok=True)
    deadline = time.monotonic() + args.timeout
    fuseval = [sys.executable, "-m", "fuseval.cli"]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if "import" not in skip:
        row.import_exit, row.seconds["import"] = _run([*fuseval, "import", folder], os.path.join(here, "import.txt"),
                                                      deadline, args.memory_gb, env)
    try:
        row.name, row.subset, row.workloads = _smallest_cases(folder, args.smallest)
    except Exception as exc:  # noqa: BLE001 - a folder that does not read is that row's note
        row.note = f"not read: {exc}"[:300]
        row.reference, row.gate = "not run", "not run"
        return row
    common = ["--problem", folder, "--impl", "sol_reference", "--cases", row.workloads, "--device", args.device,
              *([] if args.isolate else ["--in-process"])]
    if "check" not in skip:
        check_json = os.path.join(here, "check.json")
        row.check_exit, row.seconds["check"] = _run([*fuseval, "check", *common, "--seed", "0", "--json", check_json],
                                                    os.path.join(here, "check.txt"), deadline, args.memory_gb, env)
        row.reference = verdict(row.check_exit, finding=True)
        row.matched, row.allowance = _tolerance_use(check_json)
    else:
        row.reference = "not run"
    if "gate" not in skip:
        row.gate_exit, row.seconds["gate"] = _run([*fuseval, "gate", *common, "--profile", args.profile, "--seeds", "1",
                                                   "--budget-cases", row.workloads,
                                                   "--out", os.path.join(here, "gate")],
                                                  os.path.join(here, "gate.txt"), deadline, args.memory_gb, env)
        row.gate = verdict(row.gate_exit, finding=False)
    else:
        row.gate = "not run"
    if _stopping.is_set():
        # a step cut short, or never started, by the sweep's stop: no verdict of the problem
        row.reference = row.reference if row.check_exit is not None else "interrupted"
        row.gate = row.gate if row.gate_exit is not None else "interrupted"
        row.note = "interrupted: the sweep was stopped"
    for step, code in (("import", row.import_exit), ("check", row.check_exit), ("gate", row.gate_exit)):
        log = os.path.join(here, step + ".txt")
        if code not in (0, None) and not row.note:
            row.note = f"{step}: {_last_line(log)}"
        elif code is None and step in row.seconds and row.seconds[step] > 0 and not row.note:
            # out of time: where it was, by the last progress line it printed
            last = _last_line(log, said=False)
            row.note = f"{step}: out of time; " + (f"its last line: {last}" if last else "it printed nothing")
    return row


def _last_line(log: str, said: bool = True) -> str:
    """The last line a failed step printed that says why (fuseval prints one such line);
    ``said`` False: the last line it printed (a step cut short: where it was)."""
    try:
        with open(log, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip() and not ln.startswith("$ ")]
    except OSError:
        return ""
    why = [ln for ln in lines if "error" in ln.lower() or "GATE FAILED" in ln or "FAIL" in ln] if said else []
    return (why or lines or [""])[-1][:200]


def verdict(code: int | None, finding: bool) -> str:
    if code is None:
        return "timeout"
    if code == 0:
        return "pass"
    if code == 1 and finding:
        return "finding"       # the benchmark's reference misses its tolerance against exact arithmetic
    if code == 7:
        return "out of memory"
    return f"fail (exit {code})"


def _fmt(x: Any, spec: str = "") -> str:
    return "" if x is None else format(x, spec)


def write_table(rows: list[Row], out: str) -> dict[str, str]:
    cols = ["problem", "subset", "name", "cases", "import", "reference", "matched", "worst/allowance", "gate",
            "import s", "check s", "gate s", "note"]

    def cells(r: Row) -> list[str]:
        return [os.path.basename(r.folder), r.subset, r.name, r.workloads, _fmt(r.import_exit), r.reference,
                _fmt(r.matched, ".4%"), _fmt(r.allowance, ".3g"), r.gate,
                *(_fmt(r.seconds.get(s), ".1f") for s in STEPS), r.note]
    paths = {k: os.path.join(out, f"sweep.{k}") for k in ("md", "json", "csv")}
    with open(paths["csv"], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows(cells(r) for r in rows)
    with open(paths["json"], "w") as f:
        json.dump({"summary": summary(rows), "rows": [asdict(r) for r in rows]}, f, indent=1)
    with open(paths["md"], "w") as f:
        f.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
        for r in rows:
            f.write("| " + " | ".join(c.replace("|", "\\|") for c in cells(r)) + " |\n")
        f.write("\n" + "\n".join(f"- {k}: {v}" for k, v in summary(rows).items()) + "\n")
    return paths


def summary(rows: list[Row]) -> dict[str, Any]:
    codes = [c for r in rows for c in (r.import_exit, r.check_exit, r.gate_exit)]
    return {"problems": len(rows),
            "imported": sum(r.import_exit == 0 for r in rows),
            "reference pass": sum(r.reference == "pass" for r in rows),
            "reference finding": sum(r.reference == "finding" for r in rows),
            "reference fail": sum(r.reference.startswith("fail") for r in rows),
            "reference out of memory / timeout": sum(r.reference in ("out of memory", "timeout") for r in rows),
            "gate pass": sum(r.gate == "pass" for r in rows),
            # the gate fails the benchmark's reference where the check already found that it
            # misses its own tolerance against exact arithmetic: explained by the problem
            "gate fail, reference finding": sum(r.gate.startswith("fail") and r.reference == "finding" for r in rows),
            "gate out of memory / timeout": sum(r.gate in ("out of memory", "timeout") for r in rows),
            "exit 70": sum(c == 70 for c in codes)}


def gpu_share(jobs: int, gpus: int) -> float | None:
    """The share of a GPU's memory each job gets where ``jobs`` problems run at a time on
    ``gpus`` GPUs (None: a GPU per job, or no GPU); a share given in the environment
    (:data:`CUDA_SHARE_ENV`) is kept, validated."""
    from ..memory import cuda_share   # torch: imported by the commands that run, not by the parser
    given = cuda_share()
    if given is not None:
        return given
    per_gpu = -(-jobs // gpus) if gpus else 1
    return None if per_gpu <= 1 else 1.0 / per_gpu


# problems side by side on one GPU beyond which the sweep's own rows turn into out of memory
# and out of time (the whole-dataset sweep: 15 on one H100 caused most of those rows)
JOBS_PER_GPU = 4


def run(args) -> int:
    from ..errors import EXIT_INTERNAL, UsageError
    from ..options import check_at_least, check_one_of
    check_at_least(args.jobs, 1, "--jobs", int)
    if args.timeout <= 0:
        raise UsageError(f"--timeout: expected seconds > 0, got {args.timeout}")
    if args.memory_gb is not None and args.memory_gb <= 0:
        raise UsageError(f"--memory-gb: expected GiB > 0, got {args.memory_gb}")
    for step in args.skip.split(","):
        if step.strip():
            check_one_of(step.strip(), STEPS, "--skip")
    folders = problem_folders(args.directories)
    writable_folder(args.out, "--out")
    os.makedirs(args.out, exist_ok=True)
    gpus = 0
    if args.device.startswith("cuda"):
        import torch
        gpus = args.gpus or torch.cuda.device_count()
        if gpus and args.jobs > JOBS_PER_GPU * gpus:
            print(f"fuseval sweep: warning: --jobs {args.jobs} on {gpus} GPU(s): each problem gets a small share of "
                  f"its GPU's memory and time, so problems that fit alone run out of both "
                  f"(at most {JOBS_PER_GPU * gpus} advised, with --timeout 300 or more)", file=sys.stderr)
    lock = threading.Lock()
    rows: list[Row | None] = [None] * len(folders)

    from ..memory import CUDA_SHARE_ENV
    share = gpu_share(args.jobs, gpus)
    if share is not None:
        print(f"fuseval sweep: {args.jobs} jobs on {gpus} GPU(s): each problem gets {share:.0%} of its GPU's memory",
              file=sys.stderr)

    def one(index: int, alone: bool, counter: list[int], total: int) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")    # a step cut short keeps what it printed
        env.pop(CUDA_SHARE_ENV, None)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = str(index % gpus)
        if share is not None and not alone:
            env[CUDA_SHARE_ENV] = f"{share:.6g}"
        row = sweep_problem(folders[index], args, args.out, env)
        if alone:
            row.note = (f"rerun alone, after running out of memory in a {share:.0%} share of the GPU"
                        + (f"; {row.note}" if row.note else ""))
        with lock:
            rows[index] = row
            counter[0] += 1
            spent = sum(row.seconds.values())
            print(f"[{'alone ' if alone else ''}{counter[0]}/{total}] {os.path.basename(folders[index])} {row.subset} "
                  f"{row.name}: import {_fmt(row.import_exit) or '-'}, reference {row.reference}, gate {row.gate} "
                  f"({spent:.0f}s)", file=sys.stderr, flush=True)
            write_table([r for r in rows if r is not None], args.out)

    def drive(indices: list[int], jobs: int, alone: bool) -> None:
        pool = ThreadPoolExecutor(max_workers=jobs)
        counter = [0]
        try:
            pending = {pool.submit(one, i, alone, counter, len(indices)) for i in indices}
            while pending:
                # a signal may reach any thread, and the main thread runs its handler only
                # between waits: wait in short slices, never on a whole problem
                done_now, pending = wait(pending, timeout=0.2)
                for future in done_now:
                    future.result()
        except KeyboardInterrupt:
            # stop the running steps first: the threads waiting on them then finish their rows
            _stop_all()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    stopped = None
    with _stop_signals() as signalled:
        try:
            drive(list(range(len(folders))), args.jobs, alone=False)
            # a problem out of memory in its share of a GPU may fit the whole GPU: run those
            # again one per GPU, each with all of its GPU
            again = [] if share is None else [i for i, r in enumerate(rows)
                                              if r is not None and "out of memory" in (r.reference, r.gate)]
            if again:
                print(f"fuseval sweep: {len(again)} problem(s) ran out of memory in a {share:.0%} share: "
                      f"again, one per GPU", file=sys.stderr)
                drive(again, max(1, gpus), alone=True)
        except KeyboardInterrupt:
            stopped = signalled[0] if signalled else signal.SIGINT   # a KeyboardInterrupt of its own
        # still under the handlers: a signal repeated while the table is written is noted
        final = [r for r in rows if r is not None]
        paths = write_table(final, args.out)
        for k, v in summary(final).items():
            print(f"{k}: {v}")
        print(f"table: {paths['md']} (also {paths['json']}, {paths['csv']})")
        if stopped is not None:
            print(f"fuseval sweep: stopped by {signal.Signals(stopped).name} after {len(final)} of {len(folders)} "
                  "problems; the steps still running were killed", file=sys.stderr)
            return 128 + int(stopped)
        return EXIT_INTERNAL if summary(final)["exit 70"] else 0


@contextlib.contextmanager
def _stop_signals():
    """While the sweep runs, SIGTERM and SIGINT raise KeyboardInterrupt in the main thread
    once, so ``timeout``, a job scheduler or Ctrl-C stopping it ends its steps too; a
    signal repeated while it stops them is noted, not raised into the cleanup. Yields the
    list the signals received are appended to."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def interrupt(signum, frame):
        received.append(signum)
        if len(received) == 1:
            raise KeyboardInterrupt
    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _stopping.clear()
