"""Contracts in code, figures in docs (issue 33, item 5): what the tree may hold.

* ``src/`` states what functions guarantee; measurements and dates (the rationale of a
  choice) live in ``docs/design/`` and the results index, where they are kept in one place
  instead of drifting between docstrings. At most :data:`MAX_FIGURE_LINES` lines of
  ``src/**/*.py`` may carry a date or a measured figure.
* ``benchmarks/results/`` holds the results index and the latest official run per operator;
  older runs are in git history. At most :data:`MAX_RESULT_FILES` tracked files.

Each failure prints the offending lines or files. The counter is checked on synthetic text
first (:func:`test_the_figure_counter_sees_figures_and_dates_and_not_constants`), so a
regex that matches nothing cannot make the tree test pass vacuously.
"""
from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
RESULTS = "benchmarks/results"
MAX_FIGURE_LINES = 5
MAX_RESULT_FILES = 15

_MONTH = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
          r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)")
_NUM = r"(?<![\w.:])\d+(?:\.\d+)?"
DATE = re.compile(
    r"\b\d{4}-\d{2}-\d{2}\b"                                            # 2026-12-01
    rf"|\b{_MONTH}\.? \d{{1,2}}(?:st|nd|rd|th)?,? \d{{4}}\b"            # Dec 1, 2026
    rf"|\b\d{{1,2}} {_MONTH}\.? \d{{4}}\b"                              # 1 December 2026
    rf"|\b{_MONTH} \d{{4}}\b")                                          # December 2026
FIGURE = re.compile(
    # a number with a unit of time, throughput, bandwidth, power, clock or energy
    rf"{_NUM}\s?(?:ms|us|µs|μs|ns|TFLOP/s|TFLOPS|GFLOP/s|GB/s|GiB/s|TB/s|TiB/s|W|MHz|GHz|pJ/FLOP)(?![\w/])"
    # seconds: "12.3 s", "52 s warm"
    rf"|{_NUM} s\b(?!')"
    # a speed-up or a share: "11% slower", "1.3x faster", "about 30% of"
    rf"|{_NUM}\s?(?:%|x|×)\s+(?:faster|slower|less|more|speed-?up)\b"
    rf"|\babout {_NUM}\s?%")
MEASURED = re.compile(
    # "measured 11% slower", "Measured: torch (bf16) 0.0024-0.0047", "0.41 ms measured"
    rf"\bmeasured\b[\s:,(]+(?:[\w()]+[\s:,()]+){{0,3}}?(?:{_NUM}\s?%|(?<![\w.])\d+\.\d+)"
    rf"|(?:(?<![\w.])\d+\.\d+|{_NUM}\s?%)\W+(?:[\w()]+\W+){{0,3}}?measured\b", re.IGNORECASE)


def figure_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line of ``text`` that carries a date or a measured figure."""
    return [(i, line) for i, line in enumerate(text.splitlines(), 1)
            if DATE.search(line) or FIGURE.search(line) or MEASURED.search(line)]


def test_the_figure_counter_sees_figures_and_dates_and_not_constants():
    """The counter's own mutant check: each kind of figure is seen, contracts and constants are not."""
    seen = ("# tile table measured on an H200 (2026-12-02)\n"
            "    suite mean 0.40 ms against 0.50 ms\n"
            "the burst rate: 795 TFLOP/s, copy 4.1 GB/s\n"
            "at its 700 W cap the SM clock falls to 1440 MHz\n"
            "the gate took 66 s wall, 57.8 s this way\n"
            "a store per tile measured 11% slower\n"
            "1.3x faster than the B operand\n"
            "Measured: torch (bf16) 0.0024-0.0047\n"
            "run on December 1, 2026\n")
    assert [i for i, _ in figure_lines(seen)] == list(range(1, 10))
    assert len(figure_lines("a date 2026-12-01\nand 0.40 ms\nBLOCK_M = 128\n")) == 2
    unseen = ("BLOCK_M = 128\n"
              "NUM_WARPS = 8  # two warpgroups\n"
              "TIMEOUT_S = 60.0\n"
              "an error of 10% of its RMS is seen by the tolerance\n"
              "matched {m.matched_ratio:.4%}, time {t:.2f}s\n"
              "the rate is measured here and now (bf16, fp16, tf32, fp32)\n"
              "measured = getattr(e2e, kind)\n"
              "op A's 16 cases, nvfp4 weights, W4A16, sm_90, 2^-10\n"
              "the case's allowance; over 100%: fails\n")
    assert figure_lines(unseen) == [], figure_lines(unseen)


def test_src_carries_at_most_a_few_figures_or_dates():
    hits = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
            for path in sorted(SRC.rglob("*.py")) for i, line in figure_lines(path.read_text())]
    assert len(hits) <= MAX_FIGURE_LINES, (
        f"{len(hits)} lines of src/ carry a date or a measured figure (at most {MAX_FIGURE_LINES}); "
        "move the rationale to docs/design/ and leave the contract with a pointer:\n" + "\n".join(hits))


def _tracked(folder: str) -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "ls-files", "--", folder], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"git ls-files failed: {r.stderr.strip()}")
    return r.stdout.splitlines()


def results_problems(files: list[str]) -> list[str]:
    """What is wrong with this list of tracked files under benchmarks/results (empty: nothing)."""
    problems = []
    if f"{RESULTS}/README.md" not in files:
        problems.append("the results index (README.md) is missing")
    if len(files) > MAX_RESULT_FILES:
        problems.append(f"{len(files)} tracked files under {RESULTS}/ (at most {MAX_RESULT_FILES}): keep "
                        "the index and the latest official run per operator, older runs are in git "
                        "history:\n" + "\n".join(files))
    return problems


def test_the_results_rule_fails_on_too_many_files_or_no_index():
    index = f"{RESULTS}/README.md"
    assert results_problems([index] + [f"{RESULTS}/run/{i}.txt" for i in range(MAX_RESULT_FILES - 1)]) == []
    assert len(results_problems([index] + [f"{RESULTS}/run/{i}.txt" for i in range(MAX_RESULT_FILES)])) == 1
    assert len(results_problems([f"{RESULTS}/run/bench.txt"])) == 1


def test_benchmark_results_keep_the_index_and_the_latest_runs_only():
    problems = results_problems(_tracked(RESULTS))
    assert not problems, "\n".join(problems)


def test_test_files_have_names_of_their_own():
    """tests/ has no __init__.py files, so pytest imports each test file by its base name
    alone: two files of one name in two areas make the second fail to collect."""
    seen: dict[str, pathlib.Path] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(ROOT)} and {path.relative_to(ROOT)}")
        seen.setdefault(path.name, path)
    assert not clashes, "test files of the same name: " + "; ".join(clashes)
