"""How a run ended, as one exit code: the one table the CLI and the Dagster op both use.

- 0: the run completed (or nothing was new) and every split in its scope is committed.
- 1: the run failed (an error that stayed after the retries, an outage, a bug).
- 2: usage, configuration or definition error; nothing was run.
- 3: the run completed, but input in its scope is quarantined: poison splits, and files
  refused because they changed after discovery (``sluice status`` lists them with their
  reasons, ``sluice retry`` puts them back).
- 4: the run completed, but input was left unread: splits held by another live run.
- 5: the run stopped at a deterministic error in the pipeline's code (one line names
  pipeline, step, field and record); nothing was committed past it, its splits are back in
  the pool.
- 130: interrupted (Ctrl-C).

3 wins over 4 when both apply: quarantined input needs someone to act, held input is read by
the run holding it.
"""

from __future__ import annotations

import enum

__all__ = ["DeterministicFailure", "ExitCode", "run_exit_code"]


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    QUARANTINED = 3
    HELD = 4
    CODE_ERROR = 5
    INTERRUPTED = 130


class DeterministicFailure(RuntimeError):
    """The run stopped at a deterministic error in the pipeline's code (or in what a step
    queries): ``str()`` is one line naming pipeline, step, field and record. Nothing was
    committed past it; the run's splits went back to the pool. Exit code 5."""


def run_exit_code(*, quarantined: int, held: int) -> ExitCode:
    """The exit code of a run that completed: 3 with quarantined splits in its scope, else 4
    with splits held by another run, else 0."""
    if quarantined:
        return ExitCode.QUARANTINED
    if held:
        return ExitCode.HELD
    return ExitCode.OK
