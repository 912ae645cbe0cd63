"""Direct tests of the worker's side of an isolated run (fuseval.runner.in_worker), in this
process: the worker object is driven through a real pipe the way fuseval's process drives
it (a load, then calls), and its replies are read as the JSON they are. Each test puts an
honest implementation beside a broken one written here and the replies must differ.
Also the description of an implementation's exception (one line, its own file:line)."""
from __future__ import annotations

import json
import multiprocessing
import sys
import threading
from types import SimpleNamespace

import pytest
import torch

from fuseval.runner import in_worker as W


@pytest.fixture
def worker():
    """A worker on one end of a pipe; ``ask(kind, *args)`` sends what fuseval would and
    returns the worker's replies (JSON)."""
    ours, theirs = multiprocessing.Pipe()
    w = W._Worker(theirs)

    def replies():
        out = []
        while ours.poll():
            out.append(json.loads(ours.recv_bytes()))
        return out
    yield w, ours, replies
    ours.close()
    theirs.close()


def _call(worker, fn, inputs):
    w, ours, replies = worker
    w.fn = fn
    ours.send(("no fill",))          # what fuseval sends after the reply: here, no copy back
    answer = w.call({"inputs": [("tensor", t) for t in inputs], "nfds": 0, "device": "cpu", "which": "fn"})
    (reply,) = replies() + ([] if answer is None else [answer])     # a failure is the call's answer
    return reply


def test_an_honest_call_is_described_and_nothing_is_reported(worker):
    x = torch.arange(6.0).view(2, 3)
    reply = _call(worker, lambda t: (t * 2,), [x])
    assert reply["status"] == "ok" and reply["shape"] == "sequence" and reply["type"] == "tuple"
    assert reply["outputs"] == [{"kind": "tensor", "shape": [2, 3], "dtype": "float32", "device": "cpu",
                                 "aliases": []}]
    assert reply["tampered"] == [] and reply["threads"] == []


def test_an_output_that_is_an_input_names_it(worker):
    x, y = torch.ones(4), torch.ones(4)
    assert _call(worker, lambda a, b: (b[1:],), [x, y])["outputs"][0]["aliases"] == [1]
    assert _call(worker, lambda a, b: (b.clone(),), [x, y])["outputs"][0]["aliases"] == []


def test_what_is_not_a_tensor_is_described_as_such(worker):
    class Sub(torch.Tensor):
        pass
    outputs = _call(worker, lambda a: (a.as_subclass(Sub), [1.0]), [torch.ones(2)])["outputs"]
    assert [o["kind"] for o in outputs] == ["tensor_subclass", "not_tensor"]
    assert outputs[1]["type"] == "builtins.list"


def test_a_call_that_patches_torch_is_reported(worker, monkeypatch):
    def patches(a):
        monkeypatch.setattr(torch, "allclose", lambda *args, **kw: True)
        return (a,)
    assert _call(worker, patches, [torch.ones(2)])["tampered"] == ["torch.allclose"]


def test_a_call_that_leaves_a_thread_running_is_reported(worker):
    stop = threading.Event()

    def lingers(a):
        threading.Thread(target=stop.wait, name="late-writer", daemon=True).start()
        return (a + 1,)
    try:
        assert _call(worker, lingers, [torch.ones(2)])["threads"] == ["late-writer"]
    finally:
        stop.set()


def test_a_raise_and_an_exit_are_verdicts_not_crashes(worker):
    def raises(a):
        raise ValueError("boom")         # the line the reply must name
    reply = _call(worker, raises, [torch.ones(2)])
    assert reply["status"] == "raised" and reply["error"] == "ValueError: boom" and not reply["oom"]
    assert reply["where"] == f"{__file__}:{raises.__code__.co_firstlineno + 1}"
    reply = _call(worker, lambda a: sys.exit(3), [torch.ones(2)])
    assert reply["status"] == "exited" and reply["code"] == 3
    assert _call(worker, lambda a: (_ for _ in ()).throw(MemoryError()), [torch.ones(2)])["oom"]


def test_load_reports_an_import_that_patches_and_a_module_that_is_missing(worker, tmp_path, monkeypatch):
    w, ours, replies = worker
    monkeypatch.setattr(sys, "path", list(sys.path))          # load rewrites the search path
    monkeypatch.setattr(torch, "isfinite", torch.isfinite)    # put back after the patching module
    (tmp_path / "w_honest.py").write_text("def run(x):\n    return (x,)\n")
    (tmp_path / "w_patching.py").write_text("import torch\ntorch.isfinite = lambda t: torch.ones_like(t, dtype=bool)\n"
                                            "def run(x):\n    return (x,)\n")
    loaded = []
    for impl in ("w_honest:run", "w_patching:run", "w_missing:run"):
        w.load(impl, SimpleNamespace(name="op", implementations={}), list(sys.path), str(tmp_path))
        loaded += replies()
    assert [r["status"] for r in loaded] == ["loaded", "loaded", "load_failed"]
    assert loaded[0]["tampered"] == [] and loaded[1]["tampered"] == ["torch.isfinite"]
    assert loaded[2]["cause"] == "raised" and "w_missing" in loaded[2]["error"]


# --------------------------------------------------------------------------- exceptions, notes
def _fuseval_raises():
    from fuseval.validate import bind_axes
    bind_axes(None, [])                                      # raises inside fuseval's code


def test_the_location_is_the_implementations_line_not_fuseval_s():
    try:
        _fuseval_raises()
    except Exception as exc:  # noqa: BLE001
        where = W.impl_error_location(exc)
    assert where == f"{__file__}:{_fuseval_raises.__code__.co_firstlineno + 2}"
    try:
        try:
            raise KeyError("original")
        except KeyError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as exc:
        line, where = W.describe_exception(exc)
    assert line == "RuntimeError: wrapped" and where.endswith(f":{sys._getframe().f_lineno - 5}")


def test_a_message_is_cut_and_an_unprintable_one_still_described():
    assert W.cut("x" * 10, 10) == "x" * 10
    assert W.cut("x" * 15, 10) == "x" * 10 + "... (5 more characters cut)"

    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("no")
    line, where = W.describe_exception(Unprintable())         # described, not raised
    assert "Unprintable" in line and where == ""


def test_a_note_is_json_or_says_why_not(monkeypatch):
    W.note(None)
    assert W._note_text() is None
    W.note({"rows": [1, 2]})
    assert json.loads(W._note_text()) == {"rows": [1, 2]}
    W.note({"tensor": torch.ones(1)})
    assert "not JSON" in json.loads(W._note_text())["error"]["message"]
    monkeypatch.setattr(W, "MAX_NOTE", 8)
    W.note("a long enough note")
    assert "more than 8" in json.loads(W._note_text())["error"]["message"]
    W.note(None)


def test_the_worker_module_imports_nothing_heavy_before_it_confines_itself():
    # a spawned worker imports this module, then confines itself (Landlock restricts only the
    # calling thread): torch, with the threads it may start, must come after
    import subprocess
    import sys
    code = ("import sys, fuseval.runner.in_worker; "
            "print(sorted(m for m in ('torch', 'numpy', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
