"""The shape of the tree: operators are plug-ins, the harness never names one, and modules
import downward only (the layers of docs/architecture.md). Each test names the offending
place, so a failure says what to move."""
from __future__ import annotations

import ast
import io
import pathlib
import tokenize

import pytest

from fuseval import operators

SRC = pathlib.Path(__file__).resolve().parents[2] / "src" / "fuseval"
HARNESS = [p for p in sorted(SRC.rglob("*.py")) if "operators" not in p.relative_to(SRC).parts]


def _code_without_docs(path: pathlib.Path) -> str:
    """The file's code with comments and docstrings blanked (examples in docs may name operators)."""
    text = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                docstrings.add((body[0].lineno, body[0].col_offset))
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT or (tok.type == tokenize.STRING and tok.start in docstrings):
            continue
        out.append(tok.string)
    return " ".join(out)


@pytest.mark.parametrize("path", HARNESS, ids=lambda p: str(p.relative_to(SRC)))
def test_the_harness_never_names_an_operator(path):
    code = _code_without_docs(path)
    named = [name for name in operators.names() if name in code]
    assert not named, f"{path.relative_to(SRC)} names operator(s) {named} in its code: operator facts belong " \
                      f"in fuseval/operators/<name>/ and are read through fuseval.operators.spec(name)"


def test_the_scan_sees_an_operator_name_in_code(tmp_path):
    # the check above would pass vacuously if blanking removed code too
    f = tmp_path / "m.py"
    name = operators.names()[0]
    f.write_text(f'"""docs may say {name}"""\n# so may comments: {name}\nOP = "{name}"\n')
    code = _code_without_docs(f)
    assert code.count(name) == 1


def test_every_operator_is_a_package_with_its_data():
    for name in operators.names():
        spec = operators.spec(name)
        if spec.definition_json is None:
            assert spec.read_text(spec.definition), name
        assert spec.name == name


# --------------------------------------------------------------------------- layers
# The layers of docs/architecture.md, lowest first: a module may import its own layer and the
# ones below, never one above, and no set of modules may import each other in a cycle.
# Every ``import`` statement counts, those inside functions included. A module is placed by
# the longest prefix listed; operator packages (fuseval.operators.<name>) are plug-ins above
# the tools, found by the registry by name. The root package (``fuseval``, the Python API's lazy
# names) is an interface: a new module must be placed here explicitly.
LAYERS = [
    ("base", ["fuseval._version", "fuseval.errors", "fuseval.jsonio", "fuseval.memory", "fuseval.torch_flags",
              "fuseval.precision", "fuseval.fast", "fuseval.refimpl"]),
    ("data", ["fuseval.definitions", "fuseval.options"]),
    ("operator model", ["fuseval.operators", "fuseval.operators.implementations", "fuseval.operators.mutants",
                        "fuseval.inputs", "fuseval.validate", "fuseval.staged"]),
    ("comparison", ["fuseval.comparison", "fuseval.hygiene"]),
    ("runner", ["fuseval.runner"]),
    ("check", ["fuseval.terminal", "fuseval.oracles", "fuseval.diagnosis", "fuseval.check", "fuseval.stats",
               "fuseval.requests"]),
    ("tools", ["fuseval.budget", "fuseval.properties", "fuseval.bench", "fuseval.interop", "fuseval.baseline"]),
    ("gate", ["fuseval.gate"]),
    ("operator packages", ["fuseval.operators.*"]),
    ("interfaces", ["fuseval.cli", "fuseval.commands", "fuseval.pytest_plugin", "fuseval.properties.__main__",
                    "fuseval"]),
]


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def layer_of(module: str) -> int:
    best, where = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if prefix.endswith(".*"):       # a subpackage of the prefix, not the prefix itself
                base = prefix[:-2]
                hit = module.startswith(base + ".") and len(base) + 1 > best
                length = len(base) + 1
            else:
                # a prefix holds its submodules too, but the root package only itself
                hit = module == prefix or (prefix != "fuseval" and module.startswith(prefix + "."))
                length = len(prefix)
            if hit and length > best:
                best, where = length, index
    if where is None:
        raise AssertionError(f"{module} is in no layer of tests/repository/test_architecture.py's LAYERS: place it")
    return where


def package_of(module: str, path: pathlib.Path) -> str:
    """The package a relative import in ``path`` (module ``module``) is relative to."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def imported_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module of ``from ... import`` in ``package``."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts) + ("." + node.module if node.module else "")


def imports_of(module: str, path: pathlib.Path) -> dict[str, list[int]]:
    """{fuseval module imported: [line, ...]} of every import statement in the file (those
    inside functions too; ``if TYPE_CHECKING:`` blocks, which never run, left out). ``from
    X import name`` counts as importing the module X.name where that is a module, else X."""
    tree = ast.parse(path.read_text())
    package = package_of(module, path)
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    found: dict[str, list[int]] = {}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = imported_module(node, package)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != module:
                found.setdefault(target, []).append(node.lineno)
    return found


GRAPH = {m: imports_of(m, p) for m, p in MODULES.items()}


def test_every_module_has_a_layer():
    for module in MODULES:
        layer_of(module)


def packages_above(module: str) -> list[str]:
    """The packages whose ``__init__`` importing ``module`` runs first (the root's aside: it
    imports nothing of fuseval's, see below)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) in MODULES]


def test_modules_import_downward_only():
    # importing a module runs its packages' __init__ first: those count as imports too
    edges = {m: {**{p: ["its package"] for p in packages_above(m)}, **targets} for m, targets in GRAPH.items()}
    upward = [f"{m} (layer {LAYERS[layer_of(m)][0]}) imports {t} (layer {LAYERS[layer_of(t)][0]}) at line(s) {lines}"
              for m, targets in edges.items() for t, lines in targets.items() if layer_of(t) > layer_of(m)]
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


def cycles(graph: dict[str, dict[str, list[int]]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    found = cycles(GRAPH)
    detail = [" <-> ".join(c) + ": " + "; ".join(f"{a} -> {b} {GRAPH[a][b]}" for a in c for b in GRAPH[a] if b in c)
              for c in found]
    assert not found, "modules that import each other (counting imports inside functions):\n" + "\n".join(detail)


def test_the_root_package_imports_nothing_at_import():
    # every module's import runs fuseval/__init__.py first: it may import only the version
    top_level = [n for n in ast.parse(MODULES["fuseval"].read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    named = {ast.unparse(n) for n in top_level if "fuseval" in ast.unparse(n) or getattr(n, "level", 0)}
    assert named <= {"from ._version import __version__"}, named


def test_the_import_scan_sees_cycles_and_upward_imports(tmp_path):
    # the two rules above would pass vacuously if the scan missed imports inside functions
    graph = {"a": {"b": [3]}, "b": {"c": [1]}, "c": {"a": [9]}, "d": {"a": [1]}}
    assert cycles(graph) == [["a", "b", "c"]]
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from fuseval.gate import runner\n    import fuseval.check\n"
                 "if TYPE_CHECKING:\n    from fuseval import cli\n")
    found = imports_of("fuseval.errors", f)
    assert set(found) == {"fuseval.gate.runner", "fuseval.check"}
    assert layer_of("fuseval.gate.runner") > layer_of("fuseval.errors")
    assert layer_of("fuseval.operators.nvfp4_qkv_rope.fast") > layer_of("fuseval.gate") > layer_of("fuseval.operators")
    assert layer_of("fuseval.properties.__main__") == len(LAYERS) - 1
    assert packages_above("fuseval.operators.nvfp4_qkv_rope.fast") == ["fuseval.operators",
                                                                        "fuseval.operators.nvfp4_qkv_rope"]
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("fuseval.a_module_nobody_placed")


# --------------------------------------------------------------------------- imports at the top
# Imports stand at the top of each module. An import inside a function is allowed only
# - in the interfaces, which import the harness inside each command so that `fuseval --help`
#   and `fuseval list` start without torch or Hypothesis;
# - in the modules the confined worker runs before it confines itself (fuseval.runner, the
#   problem worker's fuseval.interop.problem_code): Landlock restricts only the thread that
#   asks, and importing torch may start threads;
# - of a third-party library a command may never need (OPTIONAL_LIBRARIES);
# - at the sites of DEFERRED, each with why.
DEFERRING_MODULES = ("fuseval.cli", "fuseval.commands", "fuseval.pytest_plugin", "fuseval.properties.__main__",
                     "fuseval.runner", "fuseval.interop.problem_code")
OPTIONAL_LIBRARIES = ("matplotlib", "pandas", "rich", "triton", "landlockpy", "seccomp", "pyseccomp", "safetensors",
                      "torch.utils.cpp_extension")
DEFERRED = {
    # importing fuseval.fast chooses Triton's interpreter on a machine without CUDA: only a
    # solution written in Triton may need that choice made
    ("fuseval.interop.solution", "fuseval.fast"),
    # the Gluon kernels need a Triton with Gluon and a Hopper GPU; they load where a launch uses them
    ("fuseval.operators.nvfp4_qkv_rope._launch", "fuseval.operators.nvfp4_qkv_rope._gluon"),
    ("fuseval.operators.qwen2vl_decoder_layer._launch", "fuseval.operators.qwen2vl_decoder_layer._gluon"),
}


def imports_in_functions(module: str, path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, what is imported) of every import statement inside a function of the file:
    ``from X import name`` gives X.name, but X for a name of a fuseval module X that is no module."""
    tree = ast.parse(path.read_text())
    package = package_of(module, path)
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                found += [(node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = imported_module(node, package)
                found += [(node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES
                           or not base.startswith("fuseval") else base) for a in node.names]
    return sorted(set(found))


def deferred_without_reason(module: str, path: pathlib.Path) -> list[str]:
    if module == "fuseval" or any(module == m or module.startswith(m + ".") for m in DEFERRING_MODULES):
        return []
    return [f"{module} line {line}: import {target}" for line, target in imports_in_functions(module, path)
            if not any(target == lib or target.startswith(lib + ".") for lib in OPTIONAL_LIBRARIES)
            and (module, target) not in DEFERRED]


def test_imports_stand_at_the_top_of_each_module():
    found = [line for m, p in MODULES.items() for line in deferred_without_reason(m, p)]
    assert not found, ("imports inside functions (move them to the top of the module, or give the reason in "
                       "DEFERRED):\n" + "\n".join(found))


def test_the_deferred_import_scan_sees_imports_inside_functions(tmp_path):
    # the rule above would pass vacuously if the scan missed one
    f = tmp_path / "m.py"
    f.write_text("import os\ndef f():\n    import secrets\n    from . import check\n"
                 "    class C:\n        def g(self):\n            from matplotlib import pyplot\n")
    assert imports_in_functions("fuseval.stats", f) == [(3, "secrets"), (4, "fuseval.check"), (7, "matplotlib.pyplot")]
    assert deferred_without_reason("fuseval.stats", f) == ["fuseval.stats line 3: import secrets",
                                                           "fuseval.stats line 4: import fuseval.check"]
    assert deferred_without_reason("fuseval.commands.check", f) == []


# --------------------------------------------------------------------------- one operator record
# The registry resolves an operator's name into its record (``fuseval.operators.OperatorRecord``)
# once, at the boundary, and attaches it to every Definition it loads (``defn.operator``); the
# layers below the operator packages read hooks, cost model, mutants and budget file off the
# definition or record they are given. A call of the registry's resolvers there (``spec``,
# ``record``, ``load``, ``implementations.get``) is a name looked up from below, allowed only in
# the functions listed here: the Python API's entry points, which take a name (or a Definition)
# and resolve it once, and the places where a name is all there is (a file's or a report's
# "op", a unit of work sent to another process). Each entry says why; a new lookup fails.
RESOLVERS = {"fuseval.operators": {"spec", "record", "load"}, "fuseval.operators.implementations": {"get"}}
NAME_BOUNDARIES = {
    # the registry's own public resolvers (fuseval.operators is the registry itself)
    "fuseval.operators.implementations": {"get"},
    "fuseval.operators.mutants": {"make", "_record"},      # catalogues name their operator; catalogue("op")
    # entry points of the Python API: they take a name or a Definition
    "fuseval.check": {"run_check"},
    "fuseval.budget.runner": {"run_request"},
    "fuseval.bench": {"run_request"},
    "fuseval.baseline": {"collect"},
    "fuseval.interop.crosscheck": {"crosscheck"},
    # the gate's context holds operator names: run_gate resolves them, and its parallel units and
    # warm-up processes are sent names, which each process resolves for itself
    "fuseval.gate.context": {"resolve_ops", "context"},
    "fuseval.gate.runner": {"_plan", "_prespawn_workers"},
    "fuseval.gate.components": {"_check_covers_budget_hygiene", "implementation_for"},
    "fuseval.gate.warmup": {"shapes", "_warm_one"},
    # data that names its operator: a budget file's "op", a check report's
    "fuseval.budget.budgetfile": {"parse_budget", "load_budget"},
    "fuseval.terminal": {"print_check_report"},
    # the property engine's public functions take a record, a Definition or (the Python
    # API's callers) a name, which resolves once, in definition_of; what they build carries
    # the record
    "fuseval.properties.hooks": {"definition_of"},
}


def name_lookups(module: str, path: pathlib.Path) -> list[tuple[str, int, str]]:
    """(function, line, call) of every call in the file of a registry resolver (RESOLVERS),
    bound by ``from ... import`` or through its module (``operators.spec``, ``_ops.get``)."""
    tree = ast.parse(path.read_text())
    package = package_of(module, path)

    functions: dict[str, str] = {}       # local name -> "resolver module:function"
    modules: dict[str, str] = {}         # local name -> resolver module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = imported_module(node, package)
            for a in node.names:
                if f"{base}.{a.name}" in RESOLVERS:
                    modules[a.asname or a.name] = f"{base}.{a.name}"
                elif a.name in RESOLVERS.get(base, ()):
                    functions[a.asname or a.name] = f"{base}:{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in RESOLVERS and a.asname:
                    modules[a.asname] = a.name
    found = []

    def visit(node: ast.AST, where: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, [*where, child.name])
                continue
            if isinstance(child, ast.Call):
                f = child.func
                target = None
                if isinstance(f, ast.Name) and f.id in functions:
                    target = functions[f.id]
                elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules \
                        and f.attr in RESOLVERS[modules[f.value.id]]:
                    target = f"{modules[f.value.id]}:{f.attr}"
                if target is not None:
                    found.append((".".join(where) or "<module>", child.lineno, target))
            visit(child, where)
    visit(tree, [])
    return found


# every module below the operator packages but the registry itself (fuseval.operators)
BELOW_OPERATOR_PACKAGES = [m for m in MODULES if m != "fuseval.operators"
                           and layer_of(m) < layer_of("fuseval.operators.some_operator")]


def test_lower_layers_receive_the_operator_record_not_a_name():
    # a boundary resolves a name into a definition or a record; the spec (the registry's raw
    # entry) is read through the record, never looked up here
    found = [f"{m}:{function} line {line} calls {target}" for m in BELOW_OPERATOR_PACKAGES
             for function, line, target in name_lookups(m, MODULES[m])
             if function not in NAME_BOUNDARIES.get(m, ()) or target.endswith(":spec")]
    assert not found, ("operators looked up by name below the interfaces (read defn.operator, or pass the "
                       "Definition down; a new boundary that takes a name goes in NAME_BOUNDARIES, with why):\n"
                       + "\n".join(found))


def test_every_listed_boundary_still_resolves_a_name():
    # the list is what remains to move to the boundary: an entry that no longer looks up goes
    used = {(m, function) for m in BELOW_OPERATOR_PACKAGES for function, _, _ in name_lookups(m, MODULES[m])}
    stale = [f"{m}:{function}" for m, functions in NAME_BOUNDARIES.items() for function in sorted(functions)
             if (m, function) not in used]
    assert not stale, "NAME_BOUNDARIES lists functions that look no operator up by name: " + ", ".join(stale)


def test_the_lookup_scan_sees_every_way_of_calling_the_registry(tmp_path):
    # the rule above would pass vacuously if the scan missed a spelling of the lookup
    f = tmp_path / "m.py"
    f.write_text("from .. import operators\nfrom ..operators import load as L, resolve\n"
                 "from ..operators import implementations as _ops\n"
                 "def draw(defn, mode):\n    return operators.spec(defn.name).input_hook(mode)\n"
                 "class Space:\n    def definition(self):\n        return L(self.op)\n"
                 "def run(op):\n    return _ops.get(op).definition, resolve('.x:y', 'p'), operators.names()\n"
                 "HOOKS = operators.record('x')\n")
    assert name_lookups("fuseval.budget.m", f) == [
        ("draw", 5, "fuseval.operators:spec"), ("Space.definition", 8, "fuseval.operators:load"),
        ("run", 10, "fuseval.operators.implementations:get"), ("<module>", 11, "fuseval.operators:record")]
    assert "fuseval.inputs" in BELOW_OPERATOR_PACKAGES and "fuseval.gate.context" in BELOW_OPERATOR_PACKAGES
    assert "fuseval.operators" not in BELOW_OPERATOR_PACKAGES
    assert not any(m.startswith("fuseval.operators.residual_rmsnorm") or m.startswith("fuseval.commands")
                   for m in BELOW_OPERATOR_PACKAGES)
