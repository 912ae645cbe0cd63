"""The shape of the tree: operators are plug-ins, the harness never names one, files and
functions stay readable. Each test names the offending place, so a failure says what to move."""
from __future__ import annotations

import ast
import io
import pathlib
import tokenize

import pytest

from fuseval import operators

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "fuseval"
HARNESS = [p for p in sorted(SRC.rglob("*.py")) if "operators" not in p.relative_to(SRC).parts]
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 100


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


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_no_source_file_is_over_the_limit(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_FILE_LINES, f"{path.relative_to(SRC)} has {n} lines (limit {MAX_FILE_LINES}): split it"


def _is_kernel(node: ast.AST) -> bool:
    for d in getattr(node, "decorator_list", []):
        text = ast.unparse(d)
        if "jit" in text:          # @triton.jit, @gluon.jit
            return True
    return False


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_no_function_is_over_the_limit_outside_kernels(path):
    long = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_kernel(node):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                long.append(f"{node.name} ({n} lines, line {node.lineno})")
    assert not long, f"{path.relative_to(SRC)}: functions over {MAX_FUNCTION_LINES} lines: {', '.join(long)}"
