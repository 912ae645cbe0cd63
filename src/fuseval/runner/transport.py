"""Tensors between fuseval's process and a worker: inputs it cannot change, buffers it fills.

**CPU.** Each input tensor's storage is copied into a memfd that is then *sealed*
(``F_SEAL_WRITE``, ``F_SEAL_SHRINK``, ``F_SEAL_GROW``, ``F_SEAL_SEAL``): no process,
fuseval's included, can ever write it again, and no writable shared mapping of it can be
made. The worker maps it private (copy-on-write): the implementation can scribble on its
copy, but the bytes fuseval compares with never change, and every page it wrote shows in
the worker's memory map as a private copy (:func:`fuseval.runner.procs.written_pages`), so a
write is seen whether or not it was restored before the call returned. Output buffers are
memfds mapped shared, written by the worker, and copied out by fuseval as soon as the worker
says they are filled. The file descriptors travel over the worker's socket (SCM_RIGHTS).

**CUDA.** CUDA IPC has no read-only mapping, and a CUDA IPC handle opens the whole segment
of the caching allocator that holds a tensor. So every tensor the worker is given, inputs
and output buffers alike, is a copy allocated in a memory pool of its own
(``torch.cuda.MemPool``): the worker's handles reach only memory meant for it, never the
oracle's outputs or fuseval's copies of the inputs. After each call the worker's copy of
every input is compared bitwise with fuseval's (a write is seen unless it was restored
before the call returned, which changes nothing fuseval reads); outputs are copied out of
the pool as soon as they are filled.
"""
from __future__ import annotations

import contextlib
import fcntl
import math
import mmap
import os
import socket
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["Shared", "Buffers", "share_inputs", "changed_inputs", "output_buffers", "collect", "open_inputs",
           "open_buffers", "send_fds", "recv_fds", "SEALS"]

SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL if hasattr(
    fcntl, "F_SEAL_WRITE") else 0
_MAX_FDS = 200          # per SCM_RIGHTS message (the kernel's limit is 253)


def _torch():
    import torch
    return torch


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _dtype(name: str):
    torch = _torch()
    d = getattr(torch, name, None)
    if not isinstance(d, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return d


def _storage_bytes(t):
    """The bytes of ``t``'s whole storage, as a uint8 tensor (any dtype, fp4/fp8 included)."""
    torch = _torch()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


# --------------------------------------------------------------------------- fuseval's side
@dataclass
class Shared:
    """One call's inputs as sent: the payload (pickled, fuseval -> worker), the file
    descriptors that go with it, and what fuseval verifies after the call."""
    payload: list[Any]
    fds: list[int] = field(default_factory=list)
    # (device, inode) of each sealed input file -> input index (CPU); the device too: an
    # inode number alone also names files of other filesystems the worker maps (its libraries)
    inodes: dict[tuple[int, int], int] = field(default_factory=dict)
    copies: list[tuple[int, Any, Any]] = field(default_factory=list)   # (index, fuseval's, the worker's) (CUDA)

    def close(self) -> None:
        """Release the worker's copies (the sealed files stay cached with their tensors)."""
        self.copies = []


# sealed memfds of tensors fuseval still holds, reused while the tensor is unchanged
_sealed: dict[tuple, tuple[int, tuple[int, int], weakref.ref]] = {}


def _sealed_fd(t) -> tuple[int, tuple[int, int]]:
    """(fd, (device, inode)) of a sealed memfd holding ``t``'s storage; the same file for the same,
    unchanged tensor (the weights of a case's later calls), closed when ``t`` is freed."""
    storage = t.untyped_storage()
    key = (id(t), storage.data_ptr(), storage.nbytes(), t._version)
    hit = _sealed.get(key)
    if hit is not None and hit[2]() is t:
        return hit[0], hit[1]
    nbytes = storage.nbytes()
    fd = os.memfd_create("fuseval-input", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        data = memoryview(_storage_bytes(t).numpy())
        done = 0
        while done < nbytes:
            done += os.pwrite(fd, data[done:], done)
        if SEALS:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except BaseException:
        os.close(fd)
        raise
    stat = os.fstat(fd)
    inode = (stat.st_dev, stat.st_ino)
    _sealed[key] = (fd, inode, weakref.ref(t))

    def forget(key=key, fd=fd):
        _sealed.pop(key, None)
        with contextlib.suppress(OSError):
            os.close(fd)
    weakref.finalize(t, forget)
    return fd, inode


def _pool(device):
    """The memory pool of the tensors shared with workers on ``device`` (None where torch has
    no MemPool: the copies then live in the default pool)."""
    torch = _torch()
    cls = getattr(torch.cuda, "MemPool", None)
    if cls is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    pools = _pool.__dict__.setdefault("pools", {})
    if index not in pools:
        with torch.cuda.device(index):
            pools[index] = cls()
    return pools[index]


# One thread at a time routes its allocations into the shared pool: torch routes a pool's
# allocations by thread and refuses a second thread while one is routing into it ("already
# recording to mempool_id"), which the gate's operator threads, sharing inputs with their
# workers at once, ran into.
_POOL_LOCK = threading.Lock()


@contextlib.contextmanager
def _in_pool(device):
    """The current thread's CUDA allocations on ``device`` go to the shared pool (keep the
    block to the allocations: other threads wait for it)."""
    torch = _torch()
    with _POOL_LOCK:
        pool = _pool(device)
        if pool is None:
            yield
            return
        with torch.cuda.device(device), torch.cuda.use_mem_pool(pool):
            yield


def share_inputs(inputs: Sequence[Any]) -> Shared:
    """The payload of one call's inputs: CPU tensors as sealed memfds, CUDA tensors as
    copies in the shared pool (sent by CUDA IPC), anything else as it is."""
    torch = _torch()
    shared = Shared([])
    for i, v in enumerate(inputs):
        if not isinstance(v, torch.Tensor):
            shared.payload.append(("value", v))
        elif v.device.type == "cpu":
            fd, inode = _sealed_fd(v)
            if v.untyped_storage().nbytes():
                shared.inodes[inode] = i
            shared.payload.append(("memfd", len(shared.fds), _dtype_name(v.dtype), tuple(v.shape), tuple(v.stride()),
                                   v.storage_offset(), v.untyped_storage().nbytes()))
            shared.fds.append(fd)
        elif v.device.type == "cuda":
            with _in_pool(v.device):
                copy = torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
            copy.copy_(v)
            shared.copies.append((i, v, copy))
            shared.payload.append(("tensor", copy))
        else:
            shared.payload.append(("tensor", v))
    return shared


def changed_inputs(shared: Shared) -> list[int]:
    """The CUDA inputs whose worker copy differs bitwise from fuseval's after the call."""
    u8 = _torch().uint8
    return [i for i, mine, theirs in shared.copies
            if not mine.contiguous().view(-1).view(u8).equal(theirs.contiguous().view(-1).view(u8))]


@dataclass
class Buffers:
    """Output buffers for one call: the payload, fds, and fuseval's views of them."""
    payload: list[Any]
    fds: list[int]
    tensors: list[Any]
    maps: list[Any]

    def close(self) -> None:
        self.tensors = []
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        for m in self.maps:
            with contextlib.suppress(BufferError, ValueError):
                m.close()
        self.maps = []


def output_buffers(specs: Sequence[tuple[tuple[int, ...], Any] | None], device: str) -> Buffers:
    """Buffers the worker fills, one per (shape, dtype) of ``specs`` (None: no buffer)."""
    torch = _torch()
    dev = torch.device(device)
    out = Buffers([], [], [], [])
    for spec in specs:
        if spec is None:
            out.payload.append(None)
            out.tensors.append(None)
            continue
        shape, dtype = spec
        if dev.type == "cuda":
            with _in_pool(dev):
                t = torch.empty(shape, dtype=dtype, device=dev)
            out.payload.append(("tensor", t))
            out.tensors.append(t)
            continue
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if nbytes == 0:
            out.payload.append(("empty", _dtype_name(dtype), tuple(shape)))
            out.tensors.append(torch.empty(shape, dtype=dtype))
            continue
        fd = os.memfd_create("fuseval-output", os.MFD_CLOEXEC)
        os.ftruncate(fd, nbytes)
        m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        t = torch.frombuffer(m, dtype=torch.uint8).view(dtype).view(shape)
        out.payload.append(("memfd", len(out.fds), _dtype_name(dtype), tuple(shape), nbytes))
        out.fds.append(fd)
        out.maps.append(m)
        out.tensors.append(t)
    return out


def collect(buffers: Buffers) -> list[Any]:
    """fuseval's own copies of the filled buffers (in its private memory), the buffers
    released: what the worker writes into them later is never read."""
    copies = [None if t is None else t.clone() for t in buffers.tensors]
    buffers.close()
    return copies


# --------------------------------------------------------------------------- file descriptors
def send_fds(conn, fds: Sequence[int]) -> None:
    """Send ``fds`` over the worker's connection (a UNIX socket) in SCM_RIGHTS messages."""
    from multiprocessing.reduction import sendfds
    with socket.socket(fileno=os.dup(conn.fileno())) as s:
        for k in range(0, len(fds), _MAX_FDS):
            sendfds(s, list(fds[k:k + _MAX_FDS]))


def recv_fds(conn, n: int) -> list[int]:
    from multiprocessing.reduction import recvfds
    got: list[int] = []
    with socket.socket(fileno=os.dup(conn.fileno())) as s:
        while len(got) < n:
            got += recvfds(s, min(_MAX_FDS, n - len(got)))
    return got


# --------------------------------------------------------------------------- the worker's side
def _map_private(fd: int, nbytes: int):
    torch = _torch()
    m = mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(m, dtype=torch.uint8)


def open_inputs(payload: Sequence[Any], fds: Sequence[int]) -> list[Any]:
    """The inputs of one call, in the worker: sealed memfds mapped copy-on-write."""
    torch = _torch()
    out = []
    for item in payload:
        kind = item[0]
        if kind == "value" or kind == "tensor":
            out.append(item[1])
            continue
        _, k, dtype, shape, stride, offset, nbytes = item
        dt = _dtype(dtype)
        if nbytes == 0:
            out.append(torch.empty_strided(shape, stride, dtype=dt))
            continue
        raw = _map_private(fds[k], nbytes)
        out.append(raw.view(dt).as_strided(shape, stride, offset))
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    return out


def open_buffers(payload: Sequence[Any], fds: Sequence[int]) -> list[Any]:
    """The output buffers of one call, in the worker: memfds mapped shared."""
    torch = _torch()
    out = []
    for item in payload:
        if item is None:
            out.append(None)
        elif item[0] == "tensor":
            out.append(item[1])
        elif item[0] == "empty":
            out.append(torch.empty(item[2], dtype=_dtype(item[1])))
        else:
            _, k, dtype, shape, nbytes = item
            m = mmap.mmap(fds[k], nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            out.append(torch.frombuffer(m, dtype=torch.uint8).view(_dtype(dtype)).view(shape))
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    return out
