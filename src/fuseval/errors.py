"""Exit codes of the ``fuseval`` command, one per kind of failure, so a CI system can tell
a numerically wrong kernel from a kernel that crashed or a typo in the command line, and
the one error type that carries them.

A failure is raised where it is known, as a :class:`FusevalError` (or a subclass) with
its exit code; :mod:`fuseval.cli` is the only place that prints it and exits. Anything
else that escapes a command is a bug in fuseval: exit :data:`EXIT_INTERNAL` with a
traceback, never a usage error.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1          # a tolerance / all-zero / max-abs verdict failed
EXIT_USAGE = 2                 # bad command line or bad input to fuseval
EXIT_UNKNOWN_OPERATOR = 3
EXIT_IMPORT_ERROR = 4          # the implementation path does not import or is not callable
EXIT_BAD_FILE = 5              # malformed budget / baseline / report file
EXIT_NO_DEVICE = 6             # --device cuda without a GPU, or similar
EXIT_OUT_OF_MEMORY = 7         # out of memory (the implementation's, or fuseval's at this size)
EXIT_RESOURCE_LIMIT = 8        # a limit of the machine stops fuseval: open files, file size, disk space
EXIT_OUTPUT = 9                # a report could not be written where it was asked for
EXIT_NONFINITE = 10            # an output had NaN/Inf the oracle does not have
EXIT_BAD_OUTPUTS = 11          # wrong number, type, shape or dtype of outputs
EXIT_IMPL_RAISED = 12          # the implementation raised
EXIT_HYGIENE = 13              # mutated inputs, aliased outputs, cached or reused results
EXIT_REGRESSION = 14           # baseline compare found a regression
EXIT_TIMEOUT = 15              # the implementation did not return within the case's timeout
EXIT_IMPL_DIED = 16            # the implementation ended its process: sys.exit, os._exit, a crash, a signal
EXIT_TAMPERED = 17             # the implementation patched the functions a verdict relies on, or left threads running
EXIT_NO_FLOAT64_ORACLE = 18    # a float64 verdict was asked for, but the oracle was the reference in its own precision
EXIT_TIMING_REFUSED = 19       # bench: a timing was refused (below the floor, a replayed output, unwatched work...)
EXIT_INTERNAL = 70             # a bug in fuseval itself
EXIT_BROKEN_PIPE = 141         # stdout was closed by its reader (`fuseval list | head`); the shell's code for SIGPIPE

# violation name -> exit code; when several apply the highest-priority (first) wins
VIOLATION_EXIT = (
    ("tampered", EXIT_TAMPERED),
    ("lingering_thread", EXIT_TAMPERED),
    ("child_process", EXIT_TAMPERED),
    ("exited", EXIT_IMPL_DIED),
    ("crashed", EXIT_IMPL_DIED),
    ("timeout", EXIT_TIMEOUT),
    ("out_of_memory", EXIT_OUT_OF_MEMORY),
    ("raised", EXIT_IMPL_RAISED),
    ("bad_outputs", EXIT_BAD_OUTPUTS),
    ("wrong_device", EXIT_BAD_OUTPUTS),
    ("nonfinite", EXIT_NONFINITE),
    ("mutated_input", EXIT_HYGIENE),
    ("aliased_output", EXIT_HYGIENE),
    ("cached_result", EXIT_HYGIENE),
    ("output_reused", EXIT_HYGIENE),
    ("all_zero", EXIT_CHECK_FAILED),
    ("max_abs", EXIT_CHECK_FAILED),
    # fuseval's own bounds: the worst element's error, the error's RMS (comparison.py)
    ("worst_element", EXIT_CHECK_FAILED),
    ("error_rms", EXIT_CHECK_FAILED),
    ("tolerance", EXIT_CHECK_FAILED),
    # the tolerance of an output cannot see an error of 10% of its RMS: the check warns,
    # the gate fails, since a verdict of that check says nothing about that output
    ("blind_tolerance", EXIT_CHECK_FAILED),
)


def exit_code_for(violations) -> int:
    """The exit code for a set of violation names (0 when empty)."""
    found = set(violations)
    for name, code in VIOLATION_EXIT:
        if name in found:
            return code
    return EXIT_CHECK_FAILED if found else EXIT_OK


class FusevalError(Exception):
    """A failure fuseval reports to the user as one clear message with an exit code.

    ``FusevalError(message, exit_code)``; a subclass sets its default ``exit_code``."""
    exit_code: int = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            if isinstance(exit_code, bool) or not isinstance(exit_code, int):
                raise TypeError(f"exit_code: expected an int from fuseval.errors, got {exit_code!r}")
            self.exit_code = exit_code


class UsageError(FusevalError, ValueError):
    """Bad input from the user (an option, an argument of the Python API), found where it
    is validated. Also a ValueError, so callers of the Python API that catch bad input by
    that type keep working."""
    exit_code = EXIT_USAGE


class UnknownOperatorError(FusevalError, ValueError):
    """An operator name no registered operator has."""
    exit_code = EXIT_UNKNOWN_OPERATOR


class ImplementationError(FusevalError, ValueError):
    """An implementation could not be found, imported or called (a missing module or
    attribute, a name the operator's table does not have, an object that is not callable)."""
    exit_code = EXIT_IMPORT_ERROR


class BadFileError(FusevalError, ValueError):
    """A budget, baseline or report file that does not parse or does not apply."""
    exit_code = EXIT_BAD_FILE


class NoDeviceError(FusevalError, ValueError):
    """A CUDA device was asked for and torch sees none."""
    exit_code = EXIT_NO_DEVICE


class TimingRefused(FusevalError):
    """A time fuseval's timing rules refused (fuseval.runner.timing): never recorded."""
    exit_code = EXIT_TIMING_REFUSED


class ResourceLimitError(FusevalError):
    """A limit of the machine (open files, file size, disk space) stops fuseval itself."""
    exit_code = EXIT_RESOURCE_LIMIT


class OutputError(FusevalError):
    """A report file could not be written (its folder replaced by a file, no permission)."""
    exit_code = EXIT_OUTPUT


# errno -> what the limit is, for the limits of the machine that stop fuseval
RESOURCE_ERRNOS = {24: "too many open files (the open-file limit, ulimit -n)",
                   23: "too many open files on the machine",
                   27: "a file grew past the file-size limit (ulimit -f)",
                   28: "no space left on the device",
                   122: "the disk quota is exceeded"}


def resource_message(exc: OSError) -> str | None:
    """One line for an OSError that is a limit of the machine, else None."""
    what = RESOURCE_ERRNOS.get(getattr(exc, "errno", None))
    if what is None:
        return None
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return f"{what}{where}"


class OutOfMemory(FusevalError):
    """fuseval itself ran out of memory (the oracle, the inputs): the size that failed is
    in the message."""
    exit_code = EXIT_OUT_OF_MEMORY

    def __init__(self, message: str):
        super().__init__(message, EXIT_OUT_OF_MEMORY)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure (torch's CUDA OOM, a CPU allocator failure,
    MemoryError): not a bug in fuseval, but the size asked for being too large."""
    if isinstance(exc, MemoryError):
        return True
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


class user_input:
    """``with user_input("--config"):`` around a call that validates what the user gave:
    a ValueError raised inside is that input being wrong, and leaves as a
    :class:`FusevalError` (``exit_code``, default usage) whose message starts with
    ``what``. A FusevalError passes unchanged. Used only around validation, never around
    work, so that a ValueError from a bug in fuseval stays a bug (exit 70)."""

    def __init__(self, what: str | None = None, exit_code: int = EXIT_USAGE):
        self.what = what
        self.exit_code = exit_code

    def __enter__(self) -> "user_input":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or isinstance(exc, FusevalError) or not isinstance(exc, ValueError):
            return False
        message = str(exc) if not self.what or str(exc).startswith(self.what) else f"{self.what}: {exc}"
        kind = {EXIT_USAGE: UsageError, EXIT_BAD_FILE: BadFileError}.get(self.exit_code, FusevalError)
        raise kind(message, self.exit_code) from exc


# --------------------------------------------------------------------------- exit codes
# Every exit code a verdict or a failure gets is decided by one of the functions below; the
# commands, the gate and the CLI call them and decide none themselves.
def exit_code_of(exc: BaseException) -> int:
    """The exit code of an exception that ended a command or a gate component: its own for
    a :class:`FusevalError`, a machine limit (:func:`resource_message`), out of memory, a
    closed standard output; anything else is a bug in fuseval (70)."""
    if isinstance(exc, BrokenPipeError):
        return EXIT_BROKEN_PIPE
    if isinstance(exc, FusevalError):
        return exc.exit_code
    if isinstance(exc, OSError) and resource_message(exc) is not None:
        return EXIT_RESOURCE_LIMIT
    if is_out_of_memory(exc):
        return EXIT_OUT_OF_MEMORY
    return EXIT_INTERNAL


def check_exit_code(violations, *, failed: bool = False, float64_missing: bool = False) -> int:
    """A check's code: its worst violation's (:func:`exit_code_for`); with none, 1 when it
    failed all the same (``failed``: a gate's strict warning), else 18 when the float64
    verdict asked for could not be given (``float64_missing``), else 0."""
    if violations:
        return exit_code_for(violations)
    if failed:
        return EXIT_CHECK_FAILED
    return EXIT_NO_FLOAT64_ORACLE if float64_missing else EXIT_OK


def says_out_of_memory(message: str) -> bool:
    """Whether a case's message reports an implementation that ran out of memory."""
    return "raised" in message and ("can't allocate memory" in message or "out of memory" in message.lower())


def budget_exit_code(passed: bool, raised: list[list[str]]) -> int:
    """A budget report's code: 0 when it passed; the implementation raised (12) in some case,
    each listed by its messages in ``raised``, or ran out of memory in every such case (7);
    else the budget failed (1)."""
    if passed:
        return EXIT_OK
    if raised:
        return EXIT_OUT_OF_MEMORY if all(any(says_out_of_memory(m) for m in case) for case in raised) \
            else EXIT_IMPL_RAISED
    return EXIT_CHECK_FAILED


_INPUT_CODES = (EXIT_UNKNOWN_OPERATOR, EXIT_IMPORT_ERROR, EXIT_BAD_FILE, EXIT_NO_DEVICE)


def gate_exit_code(failures) -> int:
    """The gate's code from its failed components, in the plan's order, each as (component
    name, status "fail" or "error", its code or None): the most telling one's. A problem
    with the gate's own input (a bad file, an implementation that does not import) first,
    then the check's verdict on the implementation, then the other components' failures,
    and a component that crashed last."""
    if not failures:
        return EXIT_OK

    def rank(failure) -> int:
        name, status, code = failure
        if (code or EXIT_CHECK_FAILED) in _INPUT_CODES:
            return 0
        if name == "check" and status == "fail":
            return 1
        return 2 if status == "fail" else 3
    return min(failures, key=rank)[2] or EXIT_CHECK_FAILED   # min keeps the first of equals
