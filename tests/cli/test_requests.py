"""Validate once: every option of check, gate, budget and bench is checked by one helper of
fuseval.options, where the entry point's request is built, and the command line builds
the same request as the Python API. Each helper refuses a bad value with a UsageError that
names the input, what was expected and what was given; the command line and the Python API
say the same of the same bad option (each naming it in its own spelling); and no helper's
message is written a second time anywhere in the source."""
from __future__ import annotations

import math
import pathlib
import pickle
import re

import pytest

from fuseval import cli
from fuseval.bench.request import BenchRequest
from fuseval.budget.request import BudgetRequest
from fuseval.errors import EXIT_USAGE, UsageError
from fuseval.gate.request import GateRequest
from fuseval.requests import CheckRequest
from fuseval import options as v

OP = "nvfp4_qkv_rope"
SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "fuseval"


# ----------------------------------------------------------------- one test per helper
BAD = [
    # (helper, args after the value, bad value, what the message says was expected)
    (v.check_device, (), "tpu", "expected cpu, cuda or cuda:N"),
    (v.check_device, (), "cuda:x", "expected cpu, cuda or cuda:N"),
    (v.check_device, (), 3, "expected cpu, cuda or cuda:N"),
    (v.check_seed, (), -1, "expected an integer in [0, 2**63)"),
    (v.check_seed, (), 2 ** 63, "expected an integer in [0, 2**63)"),
    (v.check_seed, (), 1.5, "expected an integer in [0, 2**63)"),
    (v.check_seed, (), True, "expected an integer in [0, 2**63)"),
    (v.check_seeds, (), 0, "expected a number of seeds >= 1 or a non-empty list of seeds"),
    (v.check_seeds, (), [], "expected a number of seeds >= 1 or a non-empty list of seeds"),
    (v.check_seeds, (), [0, 1.5], "expected a number of seeds >= 1 or a non-empty list of seeds"),
    (v.check_seeds, (), [0, -2], "expected an integer in [0, 2**63)"),
    (v.check_timeout, (), -1, "expected a finite number of seconds >= 0 (0: none)"),
    (v.check_timeout, (), math.inf, "expected a finite number of seconds >= 0 (0: none)"),
    (v.check_timeout, (), math.nan, "expected a finite number of seconds >= 0 (0: none)"),
    (v.check_timeout, (), "5", "expected a finite number of seconds >= 0 (0: none)"),
    (v.check_jobs, (), 0, "expected a number of processes >= 1 or 'auto'"),
    (v.check_jobs, (), "two", "expected a number of processes >= 1 or 'auto'"),
    (v.check_jobs, (), 1.5, "expected a number of processes >= 1 or 'auto'"),
    (v.check_jobs, (), True, "expected a number of processes >= 1 or 'auto'"),
    (v.check_fraction, (), 2.0, "expected a fraction in [0, 1]"),
    (v.check_fraction, (), -0.1, "expected a fraction in [0, 1]"),
    (v.check_at_least, (0,), -1.0, "expected a number >= 0"),
    (v.check_at_least, (0,), math.nan, "expected a number >= 0"),
    (v.check_at_least, (1, "x", int), 0, "expected an integer >= 1"),
    (v.check_at_least, (1, "x", int), 2.5, "expected an integer >= 1"),
    (v.check_one_of, (("benchmark", "realistic"),), "weird", "expected one of benchmark, realistic"),
    (v.check_one_of, (("benchmark", "realistic"),), None, "expected one of benchmark, realistic"),
    (v.check_selection, (), "", "is empty; give indices such as '0,3,5-7' or 'all'"),
    (v.check_selection, (), " , ", "is empty; give indices such as '0,3,5-7' or 'all'"),
    (v.check_selection, (), [], "is empty; give indices such as '0,3,5-7' or 'all'"),
    (v.check_selection, (), "1,1", "selects case(s) [1] more than once"),
    (v.check_selection, (), "0-3,2", "selects case(s) [2] more than once"),
    (v.check_selection, (), [4, 4], "selects case(s) [4] more than once"),
    (v.check_selection, (), [1.5], "expected a case selection such as '0,3,5-7', 'all' or a list of indices"),
    (v.check_cases_in, (16,), "99", "out of range: there are 16 cases (0..15)"),
    (v.check_cases_in, (16,), "5-3", "is not a case index or an increasing range lo-hi"),
]


def _call(helper, value, args, what):
    # check_at_least and check_one_of take ``what`` after their own arguments
    if helper is v.check_at_least:
        low, *rest = args
        return helper(value, low, what, *rest[1:])
    if helper is v.check_one_of:
        return helper(value, args[0], what)
    if helper is v.check_cases_in:
        return helper(value, args[0], what)
    return helper(value, what)


@pytest.mark.parametrize("helper, args, bad, expected", BAD,
                         ids=[f"{h.__name__}-{b!r}" for h, _, b, _ in BAD])
def test_each_helper_refuses_a_bad_value_naming_the_input(helper, args, bad, expected):
    with pytest.raises(UsageError) as e:
        _call(helper, bad, args, "the_input")
    message = str(e.value)
    assert e.value.exit_code == EXIT_USAGE and isinstance(e.value, ValueError)
    assert message.startswith("the_input: "), message          # names the input
    assert expected in message, message                        # what was expected
    given = [repr(bad), str(bad)] + ([repr(bad[-1])] if isinstance(bad, list) and bad else [])
    assert any(g in message for g in given), message             # what was given


GOOD = [(v.check_device, (), "cuda:1"), (v.check_device, (), None), (v.check_seed, (), 0), (v.check_seed, (), None),
        (v.check_seeds, (), 3), (v.check_seeds, (), [0, 1000]), (v.check_timeout, (), 0), (v.check_timeout, (), 2.5),
        (v.check_jobs, (), "auto"), (v.check_jobs, (), 4), (v.check_fraction, (), 0.5),
        (v.check_at_least, (0,), 0.0), (v.check_one_of, (("benchmark", "realistic"),), "realistic"),
        (v.check_selection, (), "0,3,5-7"), (v.check_selection, (), "all"), (v.check_selection, (), [0, 2]),
        (v.check_cases_in, (16,), "0,3,5-7")]


@pytest.mark.parametrize("helper, args, good", GOOD, ids=[f"{h.__name__}-{g!r}" for h, _, g in GOOD])
def test_each_helper_takes_a_good_value(helper, args, good):
    _call(helper, good, args, "the_input")


# ----------------------------------------------------------------- the requests
REQUESTS = [
    (CheckRequest, "timeout", -1), (CheckRequest, "cases", "1,1"), (CheckRequest, "device", "tpu"),
    (CheckRequest, "mode", "weird"), (CheckRequest, "seed", -1), (CheckRequest, "hygiene_seed", 2 ** 63),
    (CheckRequest, "rules", "strict"), (CheckRequest, "diagnose", "everything"),
    (GateRequest, "jobs", 0), (GateRequest, "seeds", 0), (GateRequest, "seed", -1), (GateRequest, "warn_margin", 2.0),
    (GateRequest, "profile", "nightly"), (GateRequest, "components", []), (GateRequest, "components", ["lint"]),
    (GateRequest, "budget_cases", "0,0"), (GateRequest, "timeout", math.nan), (GateRequest, "device", "meta"),
    (BudgetRequest, "cpu_threads", 0), (BudgetRequest, "prefetch", -1), (BudgetRequest, "seed", -1),
    (BudgetRequest, "mode", "weird"), (BudgetRequest, "timeout", -5),
    (BenchRequest, "warmup_ms", -1.0), (BenchRequest, "rep_ms", math.nan), (BenchRequest, "min_reps", 0),
    (BenchRequest, "max_reps", 1.5), (BenchRequest, "sustained_s", -1.0), (BenchRequest, "impls", "fast"),
    (BenchRequest, "cases", ""),
]


def _request(kind, **fields):
    first = {BenchRequest: (OP,)}.get(kind, (OP, "torch"))
    return kind(*first, **fields)


@pytest.mark.parametrize("kind, field, bad", REQUESTS, ids=[f"{k.__name__}-{f}-{b!r}" for k, f, b in REQUESTS])
@pytest.mark.parametrize("cli_built", [False, True], ids=["python", "cli"])
def test_a_request_names_its_bad_option_as_its_caller_spells_it(kind, field, bad, cli_built):
    with pytest.raises(UsageError) as e:
        _request(kind, **{field: bad}, cli=cli_built).validated()
    name = v.option_name(field, cli_built)
    assert str(e.value).startswith(f"{name}: "), (name, str(e.value))
    assert cli_built == str(e.value).startswith("--")


def test_a_request_is_normalised_and_crosses_a_process_boundary():
    r = GateRequest(OP, "torch", components=["check"], seeds=[0, 1000], device=" cpu ").validated()
    assert r.components == ("check",) and r.seeds == [0, 1000] and r.device == "cpu" and r.seeds_given
    assert pickle.loads(pickle.dumps(r)) == r                   # what gate.parallel hands its pool
    with pytest.raises(UsageError, match="seed: give either a list of seeds"):
        GateRequest(OP, "torch", seeds=[0, 1000], seed=3).validated()
    with pytest.raises(UsageError, match="min_reps 20 is more than max_reps 10"):
        BenchRequest(OP, min_reps=20, max_reps=10).validated()
    with pytest.raises(UsageError, match="--min-reps 20 is more than --max-reps 10"):
        BenchRequest(OP, min_reps=20, max_reps=10, cli=True).validated()


# ----------------------------------------------------------------- the CLI and the Python API agree
def _api(call):
    import fuseval
    from fuseval.bench import run_bench
    from fuseval.budget import run_budget
    return {"check": lambda **kw: fuseval.check(OP, "torch", **kw), "gate": lambda **kw: fuseval.run_gate(OP, "torch", **kw),
            "budget": lambda **kw: run_budget(OP, "torch", **kw), "bench": lambda **kw: run_bench(OP, **kw)}[call]


def _spelled_as_python(message: str) -> str:
    """A CLI message with its options spelled as the Python API's keywords."""
    message = message.replace("--skip", "components")
    return re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), message)


SAME = [
    ("check", ["--impl", "torch", "--timeout", "-1"], dict(timeout=-1)),
    ("check", ["--impl", "torch", "--cases", "1,1"], dict(cases="1,1")),
    ("check", ["--impl", "torch", "--cases", ""], dict(cases="")),
    ("check", ["--impl", "torch", "--cases", "99"], dict(cases="99")),
    ("check", ["--impl", "torch", "--device", "tpu"], dict(device="tpu")),
    ("check", ["--impl", "torch", "--mode", "weird"], dict(mode="weird")),
    ("check", ["--impl", "torch", "--seed", "-3"], dict(seed=-3)),
    ("check", ["--impl", "torch", "--hygiene-seed", "-3"], dict(hygiene_seed=-3)),
    ("check", ["--impl", "torch", "--rules", "strict"], dict(rules="strict")),
    ("check", ["--impl", "torch", "--config", "bogus"], dict(config="bogus")),
    ("gate", ["--impl", "torch", "--jobs", "0"], dict(jobs=0)),
    ("gate", ["--impl", "torch", "--jobs", "many"], dict(jobs="many")),
    ("gate", ["--impl", "torch", "--seeds", "0"], dict(seeds=0)),
    ("gate", ["--impl", "torch", "--seed", "-1"], dict(seed=-1)),
    ("gate", ["--impl", "torch", "--timeout", "-1"], dict(timeout=-1)),
    ("gate", ["--impl", "torch", "--warn-margin", "2"], dict(warn_margin=2)),
    ("gate", ["--impl", "torch", "--profile", "nightly"], dict(profile="nightly")),
    ("gate", ["--impl", "torch", "--cases", "1,1"], dict(cases="1,1")),
    ("gate", ["--impl", "torch", "--skip", "check,properties,budget"], dict(components=[])),
    ("budget", ["--impl", "torch", "--timeout", "-1"], dict(timeout=-1)),
    ("budget", ["--impl", "torch", "--cases", "0-3,2"], dict(cases="0-3,2")),
    ("budget", ["--impl", "torch", "--device", "gpu"], dict(device="gpu")),
    ("bench", ["--min-reps", "20", "--max-reps", "10"], dict(min_reps=20, max_reps=10)),
    ("bench", ["--sustained-s", "-1"], dict(sustained_s=-1)),
    ("bench", ["--warmup-ms", "-2"], dict(warmup_ms=-2)),
    ("bench", ["--device", "tpu"], dict(device="tpu")),
]


@pytest.mark.parametrize("command, argv, kwargs", SAME, ids=[f"{c}{' '.join(a[2:] if c != 'bench' else a)}"
                                                              for c, a, _ in SAME])
def test_the_cli_and_the_python_api_give_the_same_error(capsys, tmp_path, command, argv, kwargs):
    out = ["--out", str(tmp_path / "out")] if command in ("gate",) else []
    rc = cli.main([command, "--op", OP, *argv, *out])
    _, err = capsys.readouterr()
    assert rc == EXIT_USAGE, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"fuseval {command}: error: "), err     # one line
    cli_message = lines[0].split(": error: ", 1)[1]
    with pytest.raises(UsageError) as e:
        _api(command)(**kwargs)
    assert _spelled_as_python(cli_message) == str(e.value)
    assert not (tmp_path / "out").exists()          # refused before any work, the report folder included


# ----------------------------------------------------------------- each message written once
# (a helper's call, the text of its message as the source writes it, as the message shows
# it): the text must come from the helper, and no other module of fuseval may write it
MESSAGES = [
    (lambda: v.check_device("tpu"), "expected cpu, cuda or cuda:N, got", None),
    (lambda: v.check_seed(-1), "expected an integer in [0, 2**63), got", None),
    (lambda: v.check_seeds(0), "expected a number of seeds >= 1 or a non-empty list of seeds, got", None),
    (lambda: v.check_timeout(-1), "expected a finite number of seconds >= 0 (0: none), got", None),
    (lambda: v.check_jobs(0), "expected a number of processes >= 1 or 'auto', got", None),
    (lambda: v.check_fraction(2.0, "warn_margin"), "expected a fraction in [0, 1], got", None),
    (lambda: v.check_selection(""), "is empty; give indices such as '0,3,5-7' or 'all'", None),
    (lambda: v.check_selection("1,1"), "selects case(s) {dup} more than once", "selects case(s) [1] more than once"),
    (lambda: v.check_selection([1.5]), "expected a case selection such as", None),
    (lambda: v.check_at_least(-1, 0, "x"), "else unit} >= {low:g}, got", "expected a number >= 0, got"),
    (lambda: v.check_one_of("weird", ("a", "b"), "mode"), "expected one of {', '.join(map(str, choices))}, got",
     "expected one of a, b, got"),
    (lambda: GateRequest(OP, "torch", components=[]).validated(), "the gate would run nothing", None),
    (lambda: BenchRequest(OP, min_reps=2, max_reps=1).validated(), "is more than", None),
]


def _sources() -> dict[str, str]:
    return {str(p.relative_to(SRC)): p.read_text() for p in sorted(SRC.rglob("*.py"))}


def _written_in(text: str) -> list[str]:
    return [name for name, code in _sources().items() if text in code]


@pytest.mark.parametrize("call, text, rendered", MESSAGES, ids=[t[:40] for _, t, _ in MESSAGES])
def test_no_validation_message_is_written_twice(call, text, rendered):
    with pytest.raises(UsageError) as e:
        call()
    assert (rendered or text) in str(e.value), (text, str(e.value))    # the table describes the helper
    found = _written_in(text)
    assert len(found) == 1, f"{text!r} is written in {found}: one rule, one message, in fuseval.options " \
                            "(or the request module that owns it)"
