"""The ``sluice`` command line: the layer above discovery (``enumerator_service``) and
reading (``spark_jobs``), driving both for the registered pipelines."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import warnings
from collections.abc import Sequence

import click

from enumerator_service import (
    ConfigError,
    CrossDayRebuildError,
    PartitionBusyError,
    SchemaError,
    ServerUnreachable,
)
from spark_jobs._outcomes import (
    BadInputFailure,
    DeterministicFailure,
    ExitCode,
    RunFailed,
    bad_input_line,
    is_bad_input,
)
from spark_jobs.cli._commands import cli
from spark_jobs.pipeline import DemoDataRefused, PipelineDefinitionError

__all__ = ["Terminated", "cli", "main"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt: a run's cleanup
    (its splits back to the pool, its staged output aborted) runs as for Ctrl-C, rather than
    the process vanishing with its splits leased until the lease ends."""


#: Set once Ctrl-C or SIGTERM arrived: what Py4J logs about the call it interrupted is noise.
_INTERRUPTED = threading.Event()


def _terminate(signum: int, _frame: object) -> None:
    _INTERRUPTED.set()
    raise Terminated(signum)


def _interrupt(signum: int, _frame: object) -> None:
    _INTERRUPTED.set()
    raise KeyboardInterrupt


class _InterruptedPy4J(logging.Filter):
    """Drops Py4J's "KeyboardInterrupt while sending command." (and "Exception while sending
    command.") once the user interrupted the run: a page of Py4J traceback about the call
    the interrupt cut short, before the one line that matters — and the errors of Py4J's own
    loggers then (a broken pipe while it shuts its connection down). Py4J logs the first
    through the root logger (``logging.exception``), hence a filter on each logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _INTERRUPTED.is_set():
            return True
        if record.name.startswith("py4j."):  # e.g. a broken pipe while shutting down
            return record.levelno < logging.ERROR
        return record.name != "root" or not str(record.msg).endswith("while sending command.")


def _silence_spark() -> None:
    """After an interrupt the process exits at once: Spark's JVM, stopped under a task that
    was still completing, would log an INTERNAL_ERROR_STORAGE stack trace after the one
    line (seen under load although the run waits for its tasks). Nothing it logs now
    concerns the user. Best effort: the gateway may already be gone."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return
    with contextlib.suppress(Exception):
        context.setLogLevel("OFF")


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: configuration and definition errors, and a ``--replace`` that
    cannot start (a day holding other days' rows, or being read), are one line on stderr
    and exit code 2; a run stopped by a deterministic error in the pipeline's code is one
    line and exit code 5. Exit codes: ``spark_jobs._outcomes``."""
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, _interrupt)
    quiet = _InterruptedPy4J()
    # A logger's filters see only the records logged on it (not its children's).
    for name in ("", "py4j.clientserver", "py4j.java_gateway"):
        logging.getLogger(name).addFilter(quiet)
    try:
        cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
    except DemoDataRefused as exc:
        click.echo(f"sluice: refused: {exc}", err=True)
        sys.exit(ExitCode.USAGE)
    except SchemaError as exc:  # says what to do; not a setting's mistake
        click.echo(f"sluice: {exc}", err=True)
        sys.exit(ExitCode.USAGE)
    except ServerUnreachable as exc:  # an outage: running again may succeed
        click.echo(f"sluice: unreachable: {exc}", err=True)
        sys.exit(ExitCode.FAILED)
    except ConfigError as exc:
        # A command's own argument (PIPELINE, --date, …) is a usage error; a setting is not.
        argument = exc.setting == "PIPELINE" or exc.setting.startswith("--")
        kind = "usage error" if argument else "configuration error"
        click.echo(f"sluice: {kind}: {exc}", err=True)
        sys.exit(ExitCode.USAGE)
    except PipelineDefinitionError as exc:
        click.echo(f"sluice: definition error: {exc}", err=True)
        sys.exit(ExitCode.USAGE)
    except (CrossDayRebuildError, PartitionBusyError) as exc:  # nothing was changed
        click.echo(f"sluice: cannot replace: {exc}", err=True)
        sys.exit(ExitCode.USAGE)
    except BadInputFailure as exc:  # the source's input: says what to do, no wrapper
        click.echo(f"sluice: {exc}", err=True)
        sys.exit(ExitCode.USAGE)
    except DeterministicFailure as exc:  # retrying cannot help: the one line, no traceback
        click.echo(f"sluice: run failed: {exc}", err=True)
        sys.exit(ExitCode.CODE_ERROR)
    except RunFailed as exc:  # Spark printed each attempt's traceback; this sums them up
        click.echo(f"sluice: run failed: {exc}", err=True)
        sys.exit(ExitCode.FAILED)
    except click.exceptions.Abort as exc:
        _silence_spark()
        if isinstance(exc.__cause__ or exc.__context__, Terminated):
            click.echo("Terminated.", err=True)
            sys.exit(ExitCode.TERMINATED)
        click.echo("Aborted.", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except click.UsageError as exc:  # one line like every other error, not click's block
        message = " ".join(exc.format_message().split())
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        click.echo(f"sluice: usage error: {message}{hint}", err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except Exception as exc:
        if not is_bad_input(exc):
            raise
        # A source's input met outside a run (a discovery's dropped slot): the one line.
        click.echo(f"sluice: {bad_input_line(exc)}", err=True)
        sys.exit(ExitCode.USAGE)
