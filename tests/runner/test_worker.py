"""Direct tests of fuseval.runner.worker.Worker: the exchange of one call with the worker."""
from __future__ import annotations

import time

import pytest

from fuseval.inputs import generate_inputs
from fuseval.operators import load
from fuseval.runner import transport
from fuseval.runner.worker import Worker

OP = "residual_rmsnorm"


@pytest.fixture
def worker():
    defn = load(OP, "tiny")
    w = Worker("torch", defn, "cpu")
    w.start()
    yield w, defn
    w.close()


def test_a_call_fuseval_breaks_off_leaves_no_worker_mid_exchange(worker, monkeypatch):
    """fuseval's side fails between the worker's answer and the output buffers it waits for
    (as a CUDA pool refusal did in the gate's threads): the next call still gets its own
    answer, from a fresh worker, instead of a worker reading it as the last call's buffers."""
    w, defn = worker
    inputs = generate_inputs(defn, defn.cases([0])[0].axes, seed=1)
    first = w.call(inputs, deadline=time.monotonic() + 60)
    assert first.status == "ok" and first.outputs is not None
    real = transport.output_buffers
    failures = iter([RuntimeError("planted: no memory for the output buffers")])

    def once(*args, **kwargs):
        for exc in failures:
            raise exc
        return real(*args, **kwargs)
    monkeypatch.setattr(transport, "output_buffers", once)
    with pytest.raises(RuntimeError, match="planted"):
        w.call(inputs, deadline=time.monotonic() + 60)
    again = w.call(inputs, deadline=time.monotonic() + 60)
    assert again.status == "ok" and not again.violations, (again.status, again.violations)
    assert [o.equal(f) for o, f in zip(again.outputs, first.outputs)] == [True] * len(first.outputs)
