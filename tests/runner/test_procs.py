"""Direct tests of fuseval.runner.procs.written_pages: the pages a process wrote in its
private mappings of given files, told apart by device and inode.

The CI gate once failed honest fast paths with "input 'k_proj_weight' was written by the
implementation": the input's sealed memfd had the same inode number as a shared library
the worker maps from another filesystem, whose relocated pages are private copies."""
from __future__ import annotations

import mmap
import os

from fuseval.runner import procs


def test_written_pages_count_a_private_copy_of_the_file_and_only_of_that_file(tmp_path):
    path = tmp_path / "mapped.bin"
    path.write_bytes(b"\0" * (4 * mmap.PAGESIZE))
    fd = os.open(path, os.O_RDWR)
    try:
        m = mmap.mmap(fd, 4 * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        m[0] = 1                                    # one page copied on write
        st = os.fstat(fd)
        mine = (st.st_dev, st.st_ino)
        assert procs.written_pages(os.getpid(), {mine})[mine] > 0
        # the same inode number on another device is another file: not reported
        other = (os.makedev(os.major(st.st_dev) + 7, os.minor(st.st_dev)), st.st_ino)
        assert procs.written_pages(os.getpid(), {other}) == {}
        m.close()
    finally:
        os.close(fd)


def test_a_mapping_only_read_counts_nothing(tmp_path):
    path = tmp_path / "read.bin"
    path.write_bytes(b"\1" * mmap.PAGESIZE)
    fd = os.open(path, os.O_RDONLY)
    try:
        m = mmap.mmap(fd, mmap.PAGESIZE, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        assert m[0] == 1
        st = os.fstat(fd)
        assert procs.written_pages(os.getpid(), {(st.st_dev, st.st_ino)}) == {(st.st_dev, st.st_ino): 0}
        m.close()
    finally:
        os.close(fd)


def test_a_worker_ends_when_fuseval_is_killed_in_the_middle_of_a_call(tmp_path):
    """A worker has a session of its own, so killing fuseval's process (SIGKILL, a sweep's
    time budget, the out-of-memory killer) reaches it only through the worker's watch on
    its parent: without it, a worker busy in a call lives on, holding memory and the GPU."""
    import signal
    import subprocess
    import sys
    import time
    (tmp_path / "sleeper.py").write_text("import time\n\ndef run(*inputs):\n    time.sleep(120)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    check = subprocess.Popen([sys.executable, "-m", "fuseval.cli", "check", "--op", "nvfp4_qkv_rope",
                              "--config", "tiny", "--impl", "sleeper:run", "--cases", "0", "--timeout", "200"],
                             cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and check.poll() is None:
        workers = [p for p in procs.descendants(check.pid) if p.session == p.pid]   # a worker's own session
        if workers:
            break
        time.sleep(0.2)
    assert workers, "the check started no worker"
    time.sleep(5)      # the worker is in the sleeper's call
    assert all(procs.alive(w.pid) for w in workers)
    check.send_signal(signal.SIGKILL)
    check.wait()
    deadline = time.monotonic() + 5
    alive = [w.pid for w in workers]
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if procs.alive(pid)]
        time.sleep(0.1)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived fuseval's process"
