"""What fuseval's process reads of a worker from outside, through ``/proc``.

The verdict rests on these, not on anything the worker says about itself:

* :func:`session_processes` / :func:`end_session`: the processes of the worker's session
  (the worker made its own session; its seccomp filter keeps its children in it), and
  ending every one but the worker;
* :func:`descendants`: a process's children, theirs and so on (a worker among them in a
  session of its own), to end a whole tree that did not stay in one session;
* :func:`cpu_seconds`: the CPU time of the worker's whole thread group, to see work still
  running after a call returned;
* :func:`written_pages`: the private (copied-on-write) pages in the worker's mappings of
  fuseval's sealed input files, i.e. the inputs it wrote into, restored or not.

Everything here is Linux's ``/proc`` format; elsewhere the functions return what they can
(empty lists, None) and the callers say that the check was not made.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

__all__ = ["Proc", "session_processes", "end_session", "descendants", "alive", "cpu_seconds", "written_pages", "CLOCK_TICKS"]

try:
    CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
except (ValueError, OSError, AttributeError):
    CLOCK_TICKS = 100


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    session: int
    state: str
    name: str

    def describe(self) -> str:
        return f"pid {self.pid} ({self.name})"


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, with the name first (it is in
    parentheses and may hold spaces and parentheses of its own)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    left, right = raw.find("("), raw.rfind(")")
    if left < 0 or right < 0:
        return None
    return [raw[left + 1:right]] + raw[right + 2:].split()


# the states of /proc/PID/stat of a process that has ended (zombie, dead)
_ENDED = ("Z", "X")


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has)."""
    fields = _stat(pid)
    return fields is not None and fields[1] not in _ENDED


def _live_processes() -> list[Proc]:
    """Every live (not zombie) process /proc shows."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat(entry)
        # after the name: state, ppid, pgrp, session, ...
        if fields is None or len(fields) < 5:
            continue
        state, ppid, sid = fields[1], int(fields[2]), int(fields[4])
        if state not in _ENDED:
            found.append(Proc(int(entry), ppid, sid, state, fields[0]))
    return found


def session_processes(session: int) -> list[Proc]:
    """The live (not zombie) processes whose session id is ``session``."""
    return [p for p in _live_processes() if p.session == session]


def descendants(pid: int) -> list[Proc]:
    """The live processes below ``pid`` in the process tree (children first). Taken while
    their parents live: a process whose parent has died is reparented and no longer shows
    here."""
    children: dict[int, list[Proc]] = {}
    for p in _live_processes():
        children.setdefault(p.ppid, []).append(p)
    found: list[Proc] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            found.append(child)
            todo.append(child.pid)
    return found


def end_session(session: int, keep: int | None = None, wait: float = 5.0) -> list[Proc]:
    """Kill (SIGKILL) every process of ``session`` but ``keep``, until none is left or
    ``wait`` seconds have passed; returns the processes found on the first look (what the
    worker had left running). A process that forks while it is being killed is found on
    the next look."""
    first: list[Proc] | None = None
    deadline = time.monotonic() + wait
    while True:
        others = [p for p in session_processes(session) if p.pid != keep]
        if first is None:
            first = others
        if not others or time.monotonic() > deadline:
            return first
        for p in others:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.002)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid``'s whole thread group (None if unreadable)."""
    fields = _stat(pid)
    if fields is None or len(fields) < 15:
        return None
    # the name, then fields 3.. of proc(5): utime and stime are fields 14 and 15
    return (int(fields[12]) + int(fields[13])) / CLOCK_TICKS


def busy_reading(pid: int) -> tuple[float, float] | None:
    """(seconds ``pid``'s live threads spent on a CPU or runnable waiting for one, the
    thread group's CPU seconds), None if unreadable. The first is
    ``/proc/PID/task/*/schedstat`` (run time plus run-queue wait): a thread that spins is
    busy the whole time however loaded the machine, a sleeping one adds nothing; the second
    keeps the time of threads that ended. :func:`busy_between` compares two readings."""
    cpu = cpu_seconds(pid)
    if cpu is None:
        return None
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                    run_ns, wait_ns = f.read().split()[:2]
                total += int(run_ns) + int(wait_ns)
            except FileNotFoundError:
                continue              # a thread that ended between the listing and the read
    except (OSError, ValueError):
        return (cpu, cpu)             # no schedstat: CPU time alone
    return (total / 1e9, cpu)


def busy_between(before: tuple[float, float], after: tuple[float, float]) -> float:
    """Seconds the process was busy between two :func:`busy_reading`: on a CPU or waiting
    for one (live threads), and never less than the CPU time it used (ended threads too)."""
    return max(after[0] - before[0], after[1] - before[1])


def written_pages(pid: int, files: set[tuple[int, int]]) -> dict[tuple[int, int], int] | None:
    """For each file of ``files`` ((device, inode) pairs, as ``os.stat`` gives them) mapped
    by ``pid``, the kB of its mappings that are private copies (``Anonymous`` in
    /proc/PID/smaps): pages the process wrote. The device is compared too: the same inode
    number names files of other filesystems (a shared library's relocated pages are
    private copies). None when the map cannot be read (the process is gone, or hid its map)."""
    if not files:
        return {}
    written: dict[tuple[int, int], int] = {}
    current: tuple[int, int] | None = None
    try:
        with open(f"/proc/{pid}/smaps", "rb") as f:
            for raw in f:
                line = raw.decode("utf-8", "replace")
                head = line.split(None, 5)
                if len(head) >= 5 and "-" in head[0] and head[4].isdigit() and not head[0].endswith(":"):
                    major, _, minor = head[3].partition(":")
                    key = (os.makedev(int(major, 16), int(minor, 16)), int(head[4]))
                    current = key if key in files else None
                    if current is not None:
                        written.setdefault(current, 0)
                elif current is not None and line.startswith("Anonymous:"):
                    written[current] += int(line.split()[1])
    except (OSError, ValueError):
        return None
    return written
