"""How a run ended, as one exit code: the one table the CLI and the Dagster op both use.

- 0: the run completed (or nothing was new) and every split in its scope is committed.
- 1: the run failed (an error that stayed after the retries, an outage, a bug).
- 2: usage, configuration or definition error; nothing was run. Also a run (or discovery)
  stopped by a source's input that cannot be read as it is (a CDC source's truncated table,
  dropped replication slot or column): one line saying what to do.
- 3: the run completed, but input in its scope is quarantined: poison splits, and files
  refused because they changed after discovery (``sluice status`` lists them with their
  reasons, ``sluice retry`` puts them back).
- 4: the run completed, but input was left unread: splits held by another live run or a
  pending rebuild, or back in the pool after a failed attempt.
- 5: the run stopped at a deterministic error in the pipeline's code (one line names
  pipeline, step, field and record); nothing was committed past it, its splits are back in
  the pool.
- 130: interrupted (Ctrl-C); 143: terminated (SIGTERM). Either way what the run did not
  commit goes back to the pool at once.

3 wins over 4 when both apply: quarantined input needs someone to act, held input is read by
the run holding it.
"""

from __future__ import annotations

import enum
import re

__all__ = [
    "BAD_INPUT",
    "PRECEDENCE",
    "BadInputFailure",
    "DeterministicFailure",
    "ExitCode",
    "RunFailed",
    "bad_input_line",
    "is_bad_input",
    "job_failure",
    "run_exit_code",
    "stopped_by",
]


class ExitCode(enum.IntEnum):
    """How a run or command ended: the exit code of ``sluice`` (and of a Dagster run's op).

    Each member's meaning is ``description``; ``PRECEDENCE`` says which wins when
    several apply. The documentation's exit-code reference is generated from them.
    """

    OK = 0
    FAILED = 1
    USAGE = 2
    QUARANTINED = 3
    HELD = 4
    CODE_ERROR = 5
    INTERRUPTED = 130
    TERMINATED = 143

    @property
    def description(self) -> str:
        """What this exit code means, and what to do about it."""
        return _MEANINGS[self]


#: Which code a run ends with when several apply.
PRECEDENCE = (
    "3 wins over 4 when both apply: quarantined input needs someone to act, held input is "
    "read by the run holding it."
)

_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "The run completed (or nothing was new) and every split in its scope is "
    "committed.",
    ExitCode.FAILED: "The run failed: an error that stayed after the retries, an outage (a "
    "database, broker or object store that does not answer: `sluice: unreachable: <setting>: "
    "…` when the run starts, or when the platform database stops answering during it; a CDC "
    "source's server lost during the run is waited for 30 s, then named in the run's last "
    "line), a bug. Spark prints each attempt's traceback; the last "
    "line sums them up. Run it again once the cause is fixed: committed output is kept, the "
    "rest is read again.",
    ExitCode.USAGE: "Usage, configuration or definition error (or a `--replace` that cannot "
    "start, a refused `demo-data`, a schema that needs `sluice db upgrade`); one line on "
    "stderr, nothing was run. Also bad input of a source that no retry can read (a CDC "
    "source's truncated table, dropped replication slot, dropped or renamed column): one "
    "line saying what to do (e.g. `sluice cdc drop` and a new snapshot); nothing was "
    "committed past it.",
    ExitCode.QUARANTINED: "The run completed, but input in its scope is quarantined: poison "
    "splits, and files refused because they changed after discovery (`sluice status` lists "
    "them with their reasons, `sluice retry` puts them back).",
    ExitCode.HELD: "The run completed, but input was left unread: splits held by another live "
    "run or a pending rebuild, or back in the pool after a failed attempt or unread when the "
    "run's readers ended. A later run reads them.",
    ExitCode.CODE_ERROR: "The run stopped at a deterministic error in the pipeline's code (one "
    "line names pipeline, step, field and record); nothing was committed past it, its splits "
    "are back in the pool. Fix the code and run again.",
    ExitCode.INTERRUPTED: "Interrupted (Ctrl-C). What the run did not commit went back to the "
    "pool: the next run reads it.",
    ExitCode.TERMINATED: "Terminated (SIGTERM, e.g. `kill` or a container stop). As for "
    "Ctrl-C, what the run did not commit went back to the pool: the next run reads it. (A "
    "SIGKILL cannot be caught: its splits wait for their lease, `SLUICE_LEASE_SECONDS`, "
    "before another run takes them.)",
}


class DeterministicFailure(RuntimeError):
    """The run stopped at a deterministic error in the pipeline's code (or in what a step
    queries): ``str()`` is one line naming pipeline, step, field and record. Nothing was
    committed past it; the run's splits went back to the pool. Exit code 5."""


#: How the one line of a run stopped by bad source input begins, after ``pipeline NAME: ``.
BAD_INPUT = "bad input: "


def is_bad_input(exc: BaseException) -> bool:
    """Whether ``exc``'s class says it is a source's input that cannot be read as it is
    (``bad_input = True``: a CDC source's truncated table, dropped slot), not a refused query."""
    return getattr(type(exc), "bad_input", False) is True


def bad_input_line(exc: BaseException) -> str:
    """``exc`` as the part of a one-line error after ``pipeline NAME: ``: ``BAD_INPUT`` and
    its message on one line (its class's name when it has none)."""
    return BAD_INPUT + (" ".join(str(exc).split()) or type(exc).__name__)


class BadInputFailure(DeterministicFailure):
    """The run (or discovery) stopped at a source's input that cannot be read as it is — a
    CDC source's truncated table, dropped slot or column — not at the pipeline's code nor a
    refused query: ``str()`` is one line saying what to do. Exit code 2."""


def stopped_by(line: str) -> DeterministicFailure:
    """The failure of a run a subtask stopped with the deterministic error ``line``."""
    _, _, rest = line.partition(": ")
    if line.startswith("pipeline ") and rest.startswith(BAD_INPUT):
        return BadInputFailure(line)
    return DeterministicFailure(line)


class RunFailed(RuntimeError):
    """A run whose Spark job failed after its stage attempts (a transient error that stayed):
    one line naming the pipeline and the Python error that ended the last attempt. Exit 1."""


def job_failure(exc: BaseException, pipeline: str) -> RunFailed | None:
    """The one line of a failed Spark job: the last Python error of the subtask traceback in
    its message (Spark prints each attempt's traceback above; this line sums them up), or
    None when ``exc`` carries none."""
    text = str(exc)
    if "Traceback (most recent call last)" not in text:
        return None
    python_part = text.rsplit("Traceback (most recent call last)", 1)[1]
    lines = [line.strip() for line in python_part.split("\n\tat ", 1)[0].splitlines()]
    errors = [
        line
        for line in lines
        if line and not line.startswith(("File ", "^", "~")) and _ERROR_LINE.match(line)
    ]
    if not errors:
        return None
    attempts = _ATTEMPTS.search(text)
    after = f" after {attempts.group(1)} stage attempts" if attempts else ""
    return RunFailed(f"pipeline {pipeline}: the Spark job failed{after}: {errors[-1][:500]}")


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Failed|Failure|Interrupt)\b.*")
_ATTEMPTS = re.compile(r"failed the maximum allowable number of times: (\d+)")


def run_exit_code(*, quarantined: int, held: int) -> ExitCode:
    """The exit code of a run that completed: 3 with quarantined splits in its scope, else 4
    with splits held by another run, else 0."""
    if quarantined:
        return ExitCode.QUARANTINED
    if held:
        return ExitCode.HELD
    return ExitCode.OK
