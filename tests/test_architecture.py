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

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "fuseval"
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
    ("data", ["fuseval.definitions", "fuseval.validation"]),
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
        raise AssertionError(f"{module} is in no layer of tests/test_architecture.py's LAYERS: place it")
    return where


def imports_of(module: str, path: pathlib.Path) -> dict[str, list[int]]:
    """{fuseval module imported: [line, ...]} of every import statement in the file (those
    inside functions too; ``if TYPE_CHECKING:`` blocks, which never run, left out). ``from
    X import name`` counts as importing the module X.name where that is a module, else X."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
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
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts) + ("." + node.module if node.module else "")
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
