"""fuseval.runner.transport: inputs shared with a worker from several threads at once (the
gate runs one thread per operator, each with its own worker)."""
from __future__ import annotations

import contextlib
import threading
import time
import types

import pytest
import torch

from fuseval.runner import transport


class _RoutingTorch:
    """Stands in for torch.cuda's pool routing: like torch, a second thread that routes into
    a pool while another thread is routing into it is refused."""

    def __init__(self):
        self.routing: set[int] = set()
        self.refused: list[str] = []
        self.entered = 0
        self.cuda = types.SimpleNamespace(device=lambda d: contextlib.nullcontext(), use_mem_pool=self.use_mem_pool)

    @contextlib.contextmanager
    def use_mem_pool(self, pool):
        if self.routing - {threading.get_ident()}:
            self.refused.append("beginAllocateToPool: already recording to mempool_id")
            raise RuntimeError(self.refused[-1])
        self.routing.add(threading.get_ident())
        self.entered += 1
        try:
            time.sleep(0.01)              # an allocation's time, so that the threads overlap
            yield
        finally:
            self.routing.discard(threading.get_ident())


def test_threads_route_into_the_shared_pool_one_at_a_time(monkeypatch):
    fake = _RoutingTorch()
    monkeypatch.setattr(transport, "_torch", lambda: fake)
    monkeypatch.setattr(transport, "_pool", lambda device: object())
    errors = []

    def share():
        try:
            for _ in range(5):
                with transport._in_pool("cuda:0"):
                    pass
        except RuntimeError as exc:
            errors.append(str(exc))
    threads = [threading.Thread(target=share) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and fake.refused == [] and fake.entered == 20


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_threads_share_cuda_inputs_at_once():
    """Four threads share CUDA inputs with (would-be) workers at once: every copy is made,
    equal to its input, in the shared pool."""
    errors, copies = [], []

    def share(k):
        try:
            for i in range(20):
                x = torch.full((256, 256), float(k * 100 + i), device="cuda")
                shared = transport.share_inputs([x, 3])
                torch.cuda.synchronize()
                copies.append(bool(shared.copies[0][2].equal(x)))
        except RuntimeError as exc:
            errors.append(str(exc))
    threads = [threading.Thread(target=share, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(copies) == 80 and all(copies)
