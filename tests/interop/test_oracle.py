"""The lifted float64 oracle never falls back silently: a reference whose float64 run fails
is reported as such in the verdict (and the exit code, where a float64 verdict was asked
for), and running out of memory in the float64 run is out of memory, not "another path".

The problem folders are written by these tests."""
from fuseval import cli
from fuseval.errors import EXIT_NO_FLOAT64_ORACLE
from problem_folders import tensor, workload, write_problem


def _problem(tmp_path, name: str, body: str):
    return write_problem(
        tmp_path / name, name=f"test_{name}",
        axes={"n": {"type": "var"}, "h": {"type": "const", "value": 8}},
        inputs={"x": tensor(["n", "h"], "float32")}, outputs={"y": tensor(["n", "h"], "float32")},
        reference=f"""
            import torch


            @torch.no_grad()
            def run(x):
                y = x * 2
            {body}
                return y + 1
            """,
        workloads=[workload({"n": 3}), workload({"n": 4})])


def test_a_reference_that_fails_in_float64_is_reported_and_exits_8(tmp_path, register, capsys):
    folder = _problem(tmp_path, "float32_only", """
                if y.dtype != torch.float32:
                    raise TypeError("this reference computes in float32 only")""")
    code = cli.main(["check", "--problem", folder, "--impl", "sol_reference", "--in-process", "--no-hygiene"])
    out, err = capsys.readouterr()
    assert code == EXIT_NO_FLOAT64_ORACLE, out + err
    assert "oracle: the reference in its own precision on case(s) 0, 1, because the lifted run raised " \
           "TypeError: this reference computes in float32 only" in out
    assert "could not be given" in err
    # against the benchmark's reference no float64 verdict was asked for: the check passes
    # ("torch" names the same code as sol_reference: checking a name against itself is refused)
    assert cli.main(["check", "--problem", folder, "--impl", "torch", "--in-process", "--no-hygiene",
                     "--against", "sol_reference"]) == 0


def test_out_of_memory_in_the_float64_run_is_out_of_memory(tmp_path, register, capsys):
    folder = _problem(tmp_path, "float64_too_big", """
                if y.dtype == torch.float64:
                    raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                       "8000000000000 bytes")""")
    code = cli.main(["check", "--problem", folder, "--impl", "sol_reference", "--in-process", "--no-hygiene"])
    out, err = capsys.readouterr()
    assert code == 7, out + err
    assert "out of memory" in err and "another path" not in out + err
    assert "--config" not in err                      # a problem folder has no configurations to shrink


def test_the_gate_fails_a_check_without_a_float64_oracle(tmp_path, register, capsys):
    folder = _problem(tmp_path, "gate_float32_only", """
                if y.dtype != torch.float32:
                    raise TypeError("float32 only")""")
    code = cli.main(["gate", "--problem", folder, "--impl", "sol_reference", "--in-process", "--skip",
                     "properties,budget", "--seeds", "1", "--out", str(tmp_path / "gate"), "--quiet"])
    out = capsys.readouterr().out
    assert code == EXIT_NO_FLOAT64_ORACLE, out
    assert "no float64 oracle" in out


def test_a_worker_that_cannot_map_its_inputs_answers_out_of_memory():
    # SOL L2/064 on a shared H100: the problem's worker ran out of device memory while
    # torch's IPC mapped a CUDA input (inside conn.recv()), died with a traceback, and the
    # check said "its code ran confined and broke a rule: exited" (exit 16), not exit 7
    import pytest
    import torch

    from fuseval.runner.in_worker import next_request

    class Conn:
        def __init__(self, exc):
            self.exc = exc

        def recv(self):
            raise self.exc

    replies = []
    mapped = torch.AcceleratorError("CUDA error: out of memory") if hasattr(torch, "AcceleratorError") \
        else RuntimeError("CUDA error: out of memory")
    for exc in (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), mapped):
        assert next_request(Conn(exc), replies.append) is None
        assert replies[-1]["status"] == "raised" and replies[-1]["oom"] is True
        assert "out of memory receiving the inputs" in replies[-1]["error"]
    assert next_request(Conn(EOFError()), replies.append) is None and len(replies) == 2
    with pytest.raises(ValueError):                   # anything else still ends the worker loudly
        next_request(Conn(ValueError("bad pickle")), replies.append)


def test_a_problem_whose_inputs_are_all_scalars_runs_its_code_on_a_gpu_where_there_is_one(monkeypatch):
    """Such a reference makes its tensors on the device it names ('cuda' in the
    benchmark); a CPU worker, whose confinement leaves out the GPU's files, fails CUDA's
    start (error 304: L1/016 and L1/028 on an H100). Inputs on a GPU put the worker there,
    tensors all on the CPU keep it on the CPU, as does a machine without a GPU."""
    import torch
    from fuseval.interop.problem_code import worker_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert worker_device([10000.0]) == "cuda"
    assert worker_device([2, 128, 0]) == "cuda"
    assert worker_device([torch.zeros(2), 3]) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert worker_device([10000.0]) == "cpu"
