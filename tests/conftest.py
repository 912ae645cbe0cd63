"""Shared test setup. Kept minimal: others add to it.

Without a CUDA device, Triton kernels run through the interpreter, which must be chosen
before triton is first imported."""
import contextlib
import os
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The tests are grouped by area (tests/<area>/, mirroring fuseval's packages); the modules
# they share (bounds, op_invariants, problem_folders, the hookless operator, ...) are in
# tests/helpers/, imported by their plain names whatever the import mode.
_HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers")
if _HELPERS not in sys.path:
    sys.path.insert(0, _HELPERS)


# Hypothesis profiles of the property suite (fuseval.properties.profiles): ``ci``, ``dev``,
# ``thorough``, ``gpu``. The one named by HYPOTHESIS_PROFILE is loaded (default: ``ci``
# when CI is set, else ``dev``); ``ci`` has no example database and is derandomized, so
# CI runs are repeatable. FUSEVAL_PROPERTY_SEED=N makes the draws random but seeded.
from fuseval.properties.profiles import load_profile as _load_property_profile  # noqa: E402

_load_property_profile()


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The suite's tensors are tiny and CI has 2 cores: extra intra-op threads only contend
    (measured 10-20x slower check runs with the default thread count under load)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(autouse=True, scope="session")
def _rules_tested_in_process():
    """The tests of fuseval's rules call their (trusted) test implementations in this
    process: a worker process per implementation would cost seconds each. The default,
    isolated path (fuseval.runner.isolation) is exercised by the tests under tests/runner/, which
    turn it back on (``isolation_default(True)``), and by every test that runs a command in a
    subprocess."""
    from fuseval.runner import isolation
    with isolation.default_isolation(False):
        yield


@pytest.fixture
def isolation_default():
    """``isolation_default(flag)`` sets, for the rest of the test, whether calls not told
    whether to isolate do (the product's default is True; this suite's, above, False)."""
    from fuseval.runner import isolation
    with contextlib.ExitStack() as stack:
        yield lambda flag: stack.enter_context(isolation.default_isolation(flag))


@pytest.fixture(autouse=True, scope="session")
def _fixed_seeds():
    """The suite's checks draw the same inputs every run: a check or gate given no seed
    draws seed 0 here instead of a random one (the product's default: the commands that
    tests/runner/test_confinement.py runs in a subprocess draw theirs), and the hygiene rules' later
    calls a fixed seed of their own. Commands run in a subprocess draw at random."""
    import sys as _sys
    from fuseval import hygiene
    import fuseval.check  # noqa: F401 - the module (fuseval.check is the function)
    check = _sys.modules["fuseval.check"]
    fixed = {check.draw_seed: lambda: 0, hygiene.draw_hygiene_seed: lambda: 7_919_993}
    # every module that imported them holds them under the same name: replace them there too
    # (a module imported later takes the replacement from where it is defined)
    replaced = [(module, name, value) for module in list(_sys.modules.values())
                if getattr(module, "__name__", "").startswith("fuseval")
                for name, value in vars(module).items() if any(value is f for f in fixed)]
    for module, name, value in replaced:
        setattr(module, name, next(new for f, new in fixed.items() if f is value))
    yield
    for module, name, value in replaced:
        setattr(module, name, value)


@pytest.fixture
def register(monkeypatch, tmp_path):
    """Register problem folders as operators for one test, and forget them afterwards."""
    from fuseval import operators
    from fuseval.operators import _CACHE
    from fuseval.interop.sol_problem import PROBLEM_PATH_VARIABLE
    # set (to nothing) rather than deleted, so that monkeypatch restores it after the test
    monkeypatch.setenv(PROBLEM_PATH_VARIABLE, "")
    monkeypatch.setenv("FUSEVAL_SOLUTION_CACHE", str(tmp_path / "solutions"))
    added = []
    # problems a command registers itself (cli.main with --problem or import) are forgotten too
    before = set(operators.registry())

    def _register(directory):
        spec = operators.register_problem(directory)
        added.append(spec.name)
        return spec
    yield _register
    for name in set(added) | (set(operators.registry()) - before):
        operators.registry().pop(name, None)
        _CACHE.pop(name, None)
