"""Direct tests of fuseval.runner.integrity: a watched name rebound after the snapshot is reported
(and nothing else is), wherever the rebinding hides (a module attribute, a builtin, a class
attribute behind a patched ``__getattr__``, the timer's own names); a thread left running
is reported, one that finished is not."""
from __future__ import annotations

import builtins
import threading
import time

import torch

from fuseval.runner import integrity
from fuseval.runner import clock


def test_nothing_changed_nothing_reported():
    before = integrity.snapshot()
    assert len(before) > 100 and "torch.allclose" in before
    assert integrity.changed(before) == []


def test_each_kind_of_rebinding_is_named(monkeypatch):
    before = integrity.snapshot()
    monkeypatch.setattr(torch, "allclose", lambda *a, **k: True)
    monkeypatch.setattr(builtins, "abs", lambda x: 0)
    monkeypatch.setattr(torch.Tensor, "__eq__", lambda self, other: torch.ones_like(self, dtype=torch.bool))
    monkeypatch.setattr(clock, "_perf_counter", lambda: 0.0)
    assert sorted(integrity.changed(before)) == ["builtins.abs", "fuseval.runner.clock._perf_counter",
                                                  "torch.Tensor.__eq__", "torch.allclose"]
    monkeypatch.undo()
    assert integrity.changed(before) == []


def test_a_replacement_hidden_behind_getattr_is_still_seen(monkeypatch):
    """A name the module answers through its ``__getattr__`` is looked up that way too,
    and judged by identity: the same object is no change, another one is."""
    import fuseval.comparison as comparison
    before = integrity.snapshot()
    real = comparison.rms
    monkeypatch.delattr(comparison, "rms")
    monkeypatch.setattr(comparison, "__getattr__", lambda name: real if name == "rms" else None, raising=False)
    assert integrity.changed(before) == []                   # the same object, reached another way
    monkeypatch.setattr(comparison, "__getattr__", lambda name: (lambda *a: 0.0), raising=False)
    assert integrity.changed(before) == ["fuseval.comparison.rms"]


def test_a_thread_left_running_is_named_a_finished_one_is_not():
    before = integrity.threads()
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="writes-later", daemon=True)
    t.start()
    try:
        assert integrity.new_threads(before, grace=0.01) == ["writes-later"]
    finally:
        stop.set()
        t.join()
    assert integrity.new_threads(before, grace=0.01) == []
    # one that ends within the grace period is not reported either
    quick = threading.Thread(target=time.sleep, args=(0.02,), name="quick")
    quick.start()
    assert integrity.new_threads(before, grace=2.0) == []
    quick.join()


def test_fuseval_own_threads_are_not_the_implementations_but_their_name_buys_nothing():
    # SOL L1/003 in the sweep's in-process check: the benchmark's reference starts its
    # problem's confined worker on its first call, and the worker's output drain (a thread
    # of fuseval's process) read as "lingering_thread" on the next calls
    import os
    from fuseval.runner.worker import _Output
    before = integrity.threads()
    read_end, write_end = os.pipe()
    drain = _Output(read_end)
    stop = threading.Event()
    impostor = threading.Thread(target=stop.wait, name="fuseval-worker-output", daemon=True)
    impostor.start()
    try:
        assert integrity.new_threads(before, grace=0.01) == ["fuseval-worker-output"]   # the impostor only
    finally:
        stop.set()
        impostor.join()
        os.close(write_end)
        drain.thread.join(timeout=5)
    assert integrity.new_threads(before, grace=0.01) == []
