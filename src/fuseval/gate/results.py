"""What a gate run found: one :class:`ComponentResult` per operator and component, and the
:class:`GateReport` over all of them with its verdict and exit code. Rendering (terminal,
JUnit XML, JSON, Markdown) is in :mod:`fuseval.gate.render`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..errors import EXIT_OK, gate_exit_code
from ..errors import OutputError, resource_message
from ..jsonio import dumps
from .render import junit_xml, markdown, print_summary, report_dict, save, text

# exit codes that mean "the gate's input is wrong": they outrank every verdict
STATUSES = ("pass", "warn", "fail", "error", "skipped")


@dataclass
class TestResult:
    """One JUnit test case."""
    __test__ = False            # not a pytest test class, despite its name
    name: str
    status: str                 # pass | fail | error | skipped
    seconds: float = 0.0
    message: str = ""           # one line: why it failed / was skipped
    details: str = ""           # the body: full messages, reproduction info
    output: str = ""            # system-out (warnings of a passing test)


@dataclass
class ComponentResult:
    """One component on one operator. ``skipped``: not run, ``summary`` says why (an
    operator without the implementation asked for, or without a budget file)."""
    op: str
    name: str                   # check | properties | budget
    status: str                 # pass | warn | fail | error | skipped
    summary: str
    seconds: float = 0.0        # wall time of the component
    exit_code: int = EXIT_OK
    messages: list[str] = field(default_factory=list)
    tests: list[TestResult] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)   # seconds by activity (check: inputs, oracle, ...)
    result: Any = field(default=None, repr=False)   # the component's own report object

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"component status: expected one of {', '.join(STATUSES)}, got {self.status!r}")

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "error")

    def test_results(self) -> list[TestResult]:
        """The component's test results (JUnit): its own, else one for the whole component."""
        if self.tests:
            return self.tests
        status = "pass" if self.status in ("pass", "warn") else self.status
        return [TestResult(self.name, status, self.seconds, self.summary, "\n".join(self.messages))]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "result"}


def not_run(op: str, name: str, reason: str) -> ComponentResult:
    """A component that was not run for ``op``, and why."""
    return ComponentResult(op, name, "skipped", f"not run: {reason}",
                           tests=[TestResult(name, "skipped", 0.0, reason)])


@dataclass
class GateReport:
    ops: list[str]
    impl: str
    profile: str
    device: str
    strict: bool
    components: list[ComponentResult]
    seconds: float
    started: str
    files: dict[str, str] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=list)     # the check's seeds (drawn at random unless given)
    seed_drawn: bool = False

    @property
    def passed(self) -> bool:
        return not any(c.failed for c in self.components)

    @property
    def exit_code(self) -> int:
        """The exit code of the most telling failure: a problem with the gate's own input
        (a bad file, an implementation that does not import) first, then the check's verdict
        on the implementation (raised, wrong outputs, NaN, hygiene, tolerance), then the
        other components' failures, and a component that crashed last."""
        return gate_exit_code([(c.name, c.status, c.exit_code) for c in self.components if c.failed])

    @property
    def warnings(self) -> list[ComponentResult]:
        return [c for c in self.components if c.status == "warn"]

    @property
    def not_run(self) -> list[ComponentResult]:
        return [c for c in self.components if c.status == "skipped"]

    # ---- renderings (fuseval.gate.render)
    def to_dict(self) -> dict[str, Any]:
        return report_dict(self)

    def to_json(self) -> str:
        return dumps(self.to_dict(), indent=1)

    def to_markdown(self) -> str:
        return markdown(self)

    def to_junit_xml(self) -> str:
        return junit_xml(self)

    def save(self, out: str) -> dict[str, str]:
        """Write junit.xml, gate.json and gate.md into the folder ``out``; an
        :class:`~fuseval.errors.OutputError` when that cannot be done (a machine limit stays
        an OSError, for the command's exit code of its own)."""
        try:
            return save(self, out)
        except OSError as exc:
            if resource_message(exc):
                raise
            raise OutputError(f"cannot write the gate's reports into {out!r}: {exc.strerror or exc}") from exc

    def text(self, max_findings: int = 12) -> str:
        """The summary as plain text (for pytest failures and logs)."""
        return text(self, max_findings)

    def print_summary(self, stream: TextIO | None = None, max_findings: int = 12) -> None:
        """One screen: a table of components, a timing line per component, then the first
        findings of each problem."""
        print_summary(self, stream, max_findings)
