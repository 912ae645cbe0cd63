"""``fuseval.memory``: what a device has left for one drawn example, and the share of a GPU
a process was given (``FUSEVAL_CUDA_MEMORY_SHARE``, set by ``fuseval sweep`` where several
problems share one GPU).

Without a GPU the CUDA queries are replaced by a fake device whose numbers each test sets;
the share's enforcement by torch's allocator is tested on a real GPU (marked ``gpu``) in a
process of its own (the share is per process and cannot be taken back)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from fuseval import memory
from fuseval.errors import UsageError

GIB = 2 ** 30


@pytest.fixture
def fake_gpu(monkeypatch):
    """Two CUDA devices of 80 GiB, each with ``state['free']`` free and ``state['allocated']``
    of torch's ``state['reserved']`` in use by this process; records the fractions applied."""
    state = {"free": 70 * GIB, "total": 80 * GIB, "reserved": 6 * GIB, "allocated": 4 * GIB, "fractions": []}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state["free"], state["total"]))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: state["reserved"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: state["allocated"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, device=None: state["fractions"].append((fraction, device)))
    monkeypatch.setattr(memory, "_applied_share", None)
    monkeypatch.delenv(memory.CUDA_SHARE_ENV, raising=False)
    return state


def test_without_a_share_a_gpu_offers_its_free_memory_and_what_torch_caches_unused(fake_gpu):
    assert memory.available_bytes("cuda") == 70 * GIB + 2 * GIB
    assert fake_gpu["fractions"] == []


def test_a_share_caps_what_the_gpu_offers_and_is_applied_to_torchs_allocator(fake_gpu, monkeypatch):
    monkeypatch.setenv(memory.CUDA_SHARE_ENV, "0.25")
    # a quarter of 80 GiB is 20 GiB, of which this process already uses 4
    assert memory.available_bytes("cuda") == 16 * GIB
    assert fake_gpu["fractions"] == [(0.25, 0), (0.25, 1)], "applied to every GPU the process sees"
    assert memory.draw_budget("cuda") == int(16 * GIB * memory.DRAW_SHARE)
    memory.available_bytes("cuda:1")
    assert fake_gpu["fractions"] == [(0.25, 0), (0.25, 1)], "applied once"


def test_a_share_never_offers_more_than_the_gpu_has_free(fake_gpu, monkeypatch):
    monkeypatch.setenv(memory.CUDA_SHARE_ENV, "0.5")
    fake_gpu["free"] = 10 * GIB      # the neighbours hold the rest
    assert memory.available_bytes("cuda") == 12 * GIB
    fake_gpu["allocated"] = 50 * GIB  # already past its share
    assert memory.available_bytes("cuda") == 0


def test_a_share_leaves_the_cpu_alone(fake_gpu, monkeypatch):
    monkeypatch.setenv(memory.CUDA_SHARE_ENV, "0.5")
    monkeypatch.setattr(memory, "_CPU_SOURCES", (lambda: 3 * GIB,))
    assert memory.available_bytes("cpu") == 3 * GIB
    assert fake_gpu["fractions"] == []


@pytest.mark.parametrize("text", ["0", "1.5", "-0.2", "half", "nan"])
def test_a_share_outside_zero_to_one_is_a_usage_error_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv(memory.CUDA_SHARE_ENV, text)
    with pytest.raises(UsageError, match=rf"{memory.CUDA_SHARE_ENV}: expected a share of GPU memory in \(0, 1\], "
                                         rf"got '{text}'"):
        memory.cuda_share()


def test_a_share_outside_zero_to_one_ends_a_cuda_command_with_exit_2(monkeypatch, capsys):
    from fuseval import cli
    monkeypatch.setenv(memory.CUDA_SHARE_ENV, "2")
    assert cli.main(["check", "--op", "residual_rmsnorm", "--impl", "reference", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and memory.CUDA_SHARE_ENV in err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_share_is_enforced_by_torchs_allocator():
    """A process given 10% of the GPU cannot allocate 20% of it, and is told only that
    much room is left; a process without a share can."""
    script = textwrap.dedent("""
        import os, sys, torch
        from fuseval import memory
        total = torch.cuda.mem_get_info(0)[1]
        room = memory.available_bytes("cuda")
        try:
            x = torch.empty(int(0.2 * total), dtype=torch.uint8, device="cuda")
            print("allocated", room / total)
        except torch.OutOfMemoryError:
            print("refused", room / total)
    """)
    shared = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env={**os.environ, memory.CUDA_SHARE_ENV: "0.1"})
    alone = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != memory.CUDA_SHARE_ENV})
    verdict, room = shared.stdout.split()
    assert verdict == "refused" and float(room) <= 0.1, shared.stdout + shared.stderr
    assert alone.stdout.split()[0] == "allocated", alone.stdout + alone.stderr
