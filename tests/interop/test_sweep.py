"""``fuseval sweep``: import and the benchmark reference's check over several problem
folders, one table (Markdown, JSON, CSV), a reference that misses its own tolerance as a
finding about the problem, a folder that does not read as that row's note, the time
budget per problem. The gate step is left out here (its own tests cover it; a gate costs
tens of seconds per problem on the CPU).

The problem folders are written by these tests; what each row must say follows from how
each folder was written."""
import csv
import json
import os

import pytest

from fuseval import cli
from fuseval.runner import procs
from problem_folders import tensor, workload, write_problem


def _problem(root, name, reference_body, n=(3, 5)):
    return write_problem(
        root / name, name=f"test_sweep_{name}",
        axes={"n": {"type": "var"}, "h": {"type": "const", "value": 4}},
        inputs={"x": tensor(["n", "h"], "float32")}, outputs={"y": tensor(["n", "h"], "float32")},
        reference=f"""
            import time

            import torch


            def run(x):
            {reference_body}
            """,
        workloads=[workload({"n": v}, atol=1e-6, rtol=1e-6) for v in n])


def test_the_sweep_tables_each_problem(tmp_path, capsys):
    root = tmp_path / "problems"
    _problem(root, "good", "    return x * 2")
    # float16 rounding of x / 3: far outside rtol 1e-6 against exact arithmetic
    _problem(root, "loose", "    return (x.half() / 3).float()")
    _problem(root, "slow", "    return x if time.sleep(60) is None else x")
    os.makedirs(root / "broken")
    (root / "broken" / "definition.json").write_text("{not json")
    out = tmp_path / "sweep"
    code = cli.main(["sweep", str(root), "--out", str(out), "--skip", "gate", "--timeout", "30"])
    printed = capsys.readouterr()
    assert code == 0, printed.out + printed.err
    with open(out / "sweep.json") as f:
        table = json.load(f)
    rows = {os.path.basename(r["folder"]): r for r in table["rows"]}
    assert set(rows) == {"good", "loose", "slow", "broken"}
    assert rows["good"]["import_exit"] == 0 and rows["good"]["reference"] == "pass"
    assert rows["good"]["matched"] == 1.0
    assert rows["loose"]["reference"] == "finding" and rows["loose"]["matched"] < 0.99
    assert rows["slow"]["import_exit"] == 0 and rows["slow"]["reference"] == "timeout"
    assert rows["slow"]["note"] == "check: out of time; it printed nothing", rows["slow"]["note"]
    assert rows["broken"]["import_exit"] == 5 and rows["broken"]["reference"] == "not run"
    assert "not read" in rows["broken"]["note"]
    assert table["summary"]["imported"] == 3 and table["summary"]["exit 70"] == 0
    with open(out / "sweep.csv") as f:
        assert len(list(csv.reader(f))) == 5
    assert (out / "sweep.md").read_text().count("\n| ") >= 4
    assert "[4/4]" in printed.err


def test_a_path_that_holds_no_problem_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["sweep", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "expected a problem folder" in capsys.readouterr().err


def test_many_problems_on_one_gpu_are_warned_about(tmp_path, capsys, monkeypatch):
    # 15 problems side by side on one GPU turned most of the whole-dataset sweep's rows into
    # out of memory and out of time: the sweep says so before it starts
    from fuseval.commands import sweep
    root = tmp_path / "problems"
    _problem(root, "good", "    return x * 2")

    class Started(Exception):
        pass

    def not_run(*args):
        raise Started
    monkeypatch.setattr(sweep, "sweep_problem", not_run)
    for jobs, warned in ((sweep.JOBS_PER_GPU + 1, True), (sweep.JOBS_PER_GPU, False)):
        try:
            cli.main(["sweep", str(root), "--out", str(tmp_path / "o"), "--device", "cuda", "--gpus", "1",
                      "--jobs", str(jobs)])
        except Started:
            pass
        err = capsys.readouterr().err
        assert ("warning: --jobs" in err) == warned, err


def test_jobs_sharing_a_gpu_each_get_an_equal_share_of_its_memory(monkeypatch):
    from fuseval.commands.sweep import gpu_share
    from fuseval.memory import CUDA_SHARE_ENV
    monkeypatch.delenv(CUDA_SHARE_ENV, raising=False)
    assert gpu_share(2, 1) == 0.5
    assert gpu_share(3, 1) == 1 / 3
    assert gpu_share(4, 2) == 0.5       # two per GPU
    assert gpu_share(3, 2) == 0.5       # at most two per GPU
    assert gpu_share(2, 2) is None      # a GPU each: all of it
    assert gpu_share(1, 1) is None
    assert gpu_share(4, 0) is None      # no GPU
    monkeypatch.setenv(CUDA_SHARE_ENV, "0.2")
    assert gpu_share(2, 1) == 0.2       # the caller's share is kept


def test_the_sweep_says_the_share_it_gives_each_problem(tmp_path, capsys, monkeypatch):
    import torch
    from fuseval.memory import CUDA_SHARE_ENV
    monkeypatch.delenv(CUDA_SHARE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    _problem(tmp_path / "problems", "good", "    return x * 2")
    code = cli.main(["sweep", str(tmp_path / "problems"), "--out", str(tmp_path / "out"), "--device", "cuda",
                     "--jobs", "2", "--skip", "check,gate"])
    assert code == 0
    assert "2 jobs on 1 GPU(s): each problem gets 50% of its GPU's memory" in capsys.readouterr().err


_SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine, 234)


@pytest.mark.parametrize("delivery", ["to_a_thread", "twice"])
def test_a_stopped_sweep_kills_its_running_steps_and_keeps_its_table(tmp_path, delivery):
    """``timeout`` (SIGTERM) stopping a sweep ends the steps it started, which run in
    sessions of their own and would otherwise go on holding the machine (and its GPU)
    after it; the rows finished so far are kept and the cut one says it was interrupted.
    The signal may reach any of the sweep's threads (the kernel picks; ``to_a_thread``
    makes it one that runs a problem), or come again while the sweep stops (``twice``)."""
    import ctypes
    import signal
    import subprocess
    import sys
    import time
    root = tmp_path / "problems"
    _problem(root, "a_good", "    return x * 2")
    _problem(root, "b_stuck", "    return x if time.sleep(300) is None else x")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    sweep = subprocess.Popen([sys.executable, "-m", "fuseval.cli", "sweep", str(root), "--out", str(out),
                              "--skip", "gate", "--timeout", "250"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "b_stuck" / "check.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(8)   # the stuck check is past its start, in the reference's sleep
    steps = {p.pid for p in procs.descendants(sweep.pid)}
    assert steps, "the sweep runs no step"
    if delivery == "to_a_thread":
        threads = [int(t) for t in os.listdir(f"/proc/{sweep.pid}/task") if int(t) != sweep.pid]
        assert threads, "the sweep runs its problems on threads of their own"
        libc = ctypes.CDLL(None, use_errno=True)
        for tid in threads:
            assert libc.syscall(_SYS_TGKILL, sweep.pid, tid, signal.SIGTERM) == 0, ctypes.get_errno()
            break
    else:
        sweep.send_signal(signal.SIGTERM)
        time.sleep(0.01)
        sweep.send_signal(signal.SIGTERM)
    _, err = sweep.communicate(timeout=30)
    assert sweep.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM after 2 of 2 problems" in err
    time.sleep(0.5)
    left = [pid for pid in steps if procs.alive(pid)]
    assert not left, f"the stopped sweep left its steps' processes {left} running"
    with open(out / "sweep.json") as f:
        rows = {os.path.basename(r["folder"]): r for r in json.load(f)["rows"]}
    assert rows["a_good"]["reference"] == "pass"
    assert rows["b_stuck"]["reference"] == "interrupted" and "interrupted" in rows["b_stuck"]["note"]


def test_a_problem_out_of_memory_in_its_share_of_a_gpu_is_run_again_alone(tmp_path, capsys, monkeypatch):
    """Problems side by side on one GPU each get a share of its memory; one that runs out
    of memory in its share may fit the whole GPU, so the sweep runs it again alone, without
    the share, and says so in its row. (Here on the CPU: the problem's reference runs out
    of memory whenever it is given a share.)"""
    from fuseval.commands import sweep
    from fuseval.memory import CUDA_SHARE_ENV
    monkeypatch.delenv(CUDA_SHARE_ENV, raising=False)
    monkeypatch.setattr(sweep, "gpu_share", lambda jobs, gpus: 0.5)
    root = tmp_path / "problems"
    _problem(root, "good", "    return x * 2")
    _problem(root, "tight", f"    if __import__('os').environ.get({CUDA_SHARE_ENV!r}):\n"
                            "                    raise torch.OutOfMemoryError('no room in the share')\n"
                            "                return x * 2")
    out = tmp_path / "out"
    assert cli.main(["sweep", str(root), "--out", str(out), "--skip", "gate", "--jobs", "2", "--timeout", "60"]) == 0
    err = capsys.readouterr().err
    assert "1 problem(s) ran out of memory in a 50% share: again, one per GPU" in err
    with open(out / "sweep.json") as f:
        rows = {os.path.basename(r["folder"]): r for r in json.load(f)["rows"]}
    assert rows["tight"]["reference"] == "pass", rows["tight"]
    assert rows["tight"]["note"].startswith("rerun alone, after running out of memory in a 50% share")
    assert rows["good"]["reference"] == "pass" and not rows["good"]["note"]
