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
