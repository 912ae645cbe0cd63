"""The pytest plugin (fuseval.pytest_plugin): gate items and the ``fuseval_check`` fixture,
exercised in a throwaway pytest session (pytester) the way a kernel repository uses them."""
from __future__ import annotations

import importlib.metadata
import pathlib
import sys
import xml.etree.ElementTree as ET

import pytest

pytest_plugins = ["pytester"]

ROOT = pathlib.Path(__file__).resolve().parents[2]
OP = "nvfp4_qkv_rope"

KERNELS = '''
import torch
from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager

def good(*a):
    return torch_eager(*a)

def nan(*a):
    q, k, v = torch_eager(*a)
    return q, k, torch.full_like(v, float("nan"))
'''


def _registered() -> bool:
    return any(ep.name == "fuseval" and ep.value == "fuseval.pytest_plugin"
               for ep in importlib.metadata.entry_points(group="pytest11"))


def _run(pytester, *args):
    # the entry point loads the plugin in an installed fuseval; name it only otherwise
    extra = [] if _registered() else ["-p", "fuseval.pytest_plugin"]
    return pytester.runpytest_inprocess(*extra, "-p", "no:cacheprovider", *args)


@pytest.fixture
def kernel_repo(pytester):
    pytester.makepyfile(my_kernels=KERNELS)
    pytester.syspathinsert()
    return pytester


def test_entry_point_is_declared():
    if sys.version_info >= (3, 11):
        import tomllib
        meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
        assert meta["project"]["entry-points"]["pytest11"]["fuseval"] == "fuseval.pytest_plugin"
    import fuseval.pytest_plugin as plugin
    assert hasattr(plugin, "fuseval_check") and hasattr(plugin, "pytest_addoption")


def test_fixture_passes_a_correct_kernel_and_fails_a_broken_one(kernel_repo):
    kernel_repo.makepyfile(test_kernels='''
        import my_kernels

        def test_good(fuseval_check):
            report = fuseval_check("nvfp4_qkv_rope", my_kernels.good, components=["check"], cases="0-1", seeds=2)
            assert report.passed

        def test_broken(fuseval_check):
            fuseval_check("nvfp4_qkv_rope", my_kernels.nan, components=["check"], cases="0", seeds=1)
    ''')
    result = _run(kernel_repo)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*fuseval gate FAILED (exit code 10)*", "*value_states: nonfinite*"])
    assert "run_gate" not in result.stdout.str()      # the failure is the gate's summary, not a traceback


def test_gate_items_from_the_command_line(kernel_repo, tmp_path):
    kernel_repo.makepyfile(test_plain="def test_plain():\n    assert True\n")
    out = tmp_path / "reports"
    result = _run(kernel_repo, "-v", f"--fuseval-gate={OP}=my_kernels:good", "--fuseval-components=check",
                  "--fuseval-cases=0-1", "--fuseval-seeds=2", f"--fuseval-out={out}")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"*fuseval[[]{OP}=my_kernels:good[]]::check PASSED*"])
    root = ET.parse(out / "junit.xml").getroot()
    assert root.get("failures") == "0" and int(root.get("tests")) >= 2


def test_gate_items_fail_a_broken_kernel_and_select_with_k(kernel_repo):
    result = _run(kernel_repo, f"--fuseval-gate={OP}=my_kernels:nan", "--fuseval-components=check,budget",
                  "--fuseval-cases=0", "--fuseval-seeds=1", "-k", "check")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*nvfp4_qkv_rope / check: fail (exit code 10)*"])


def test_gate_items_from_the_ini_file(kernel_repo):
    kernel_repo.makeini(f"""
        [pytest]
        fuseval_gate =
            {OP}=my_kernels:good
        fuseval_components = check
        fuseval_cases = 0
        fuseval_seeds = 1
    """)
    result = _run(kernel_repo, "--collect-only", "-q")
    result.stdout.fnmatch_lines([f"*fuseval[[]{OP}=my_kernels:good[]]::check*"])
    result = _run(kernel_repo)
    result.assert_outcomes(passed=1)


def test_warning_of_a_thin_margin_surfaces_as_a_pytest_warning(kernel_repo):
    # the float64 reference rounded to the outputs' dtypes, wrong in one element of every
    # 150 of query_states: 99.33% matched on every draw, a third of the 1% allowance left
    kernel_repo.makepyfile(thin='''
        from fuseval.operators import load
        from fuseval.operators.implementations import resolve_impl
        from fuseval.operators.nvfp4_qkv_rope.reference import torch_eager

        _exact = resolve_impl(load("nvfp4_qkv_rope"), "reference")

        def thin(*a):
            q, k, v = (r.to(e.dtype) for r, e in zip(_exact(*a), torch_eager(*a)))
            q = q.clone()
            q.view(-1)[::150] += 0.25
            return q, k, v
    ''')
    result = _run(kernel_repo, f"--fuseval-gate={OP}=thin:thin", "--fuseval-components=check",
                  "--fuseval-cases=0-1", "--fuseval-seeds=1")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*FusevalGateWarning*near the threshold*"])
    strict = _run(kernel_repo, f"--fuseval-gate={OP}=thin:thin", "--fuseval-components=check",
                  "--fuseval-cases=0-1", "--fuseval-seeds=1", "--fuseval-strict")
    strict.assert_outcomes(failed=1)


def test_bad_plugin_configuration_is_a_usage_error(kernel_repo):
    result = _run(kernel_repo, "--fuseval-gate=no_such_op=my_kernels:good")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown operator 'no_such_op'*"])
    result = _run(kernel_repo, "--fuseval-gate=just_a_name")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result = _run(kernel_repo, f"--fuseval-gate={OP}=my_kernels:good", "--fuseval-components=lint")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_plugin_is_inert_when_not_asked(kernel_repo):
    kernel_repo.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = _run(kernel_repo, "--collect-only", "-q")
    assert "fuseval[" not in result.stdout.str()
    result = _run(kernel_repo)
    result.assert_outcomes(passed=1)


def test_all_skips_an_operator_without_the_implementation(kernel_repo):
    # op B (and every operator but op A) has no 'torch_tf32': under all= their items are
    # skipped with the reason, op A's run
    from fuseval import operators
    from fuseval.operators import load
    lacking = [op for op in operators.names() if "torch_tf32" not in load(op).implementations]
    assert OP in lacking and "qwen2vl_decoder_layer" not in lacking
    result = _run(kernel_repo, "-rs", "--fuseval-gate=all=torch_tf32", "--fuseval-components=check",
                  "--fuseval-cases=0", "--fuseval-seeds=1")
    result.assert_outcomes(passed=1, skipped=len(lacking))
    result.stdout.fnmatch_lines([f"*SKIPPED*fuseval {OP} check: not run: no implementation 'torch_tf32'*"])
    named = _run(kernel_repo, f"--fuseval-gate={OP}=torch_tf32", "--fuseval-components=check",
                 "--fuseval-cases=0", "--fuseval-seeds=1")
    named.assert_outcomes(failed=1)
    named.stdout.fnmatch_lines(["*unknown implementation 'torch_tf32'*(exit code 4)*"])
