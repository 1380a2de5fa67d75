"""Deterministic errors in a pipeline's own code, told apart from transient ones.

A ``Map`` whose result has a string where the step declared a double, a result without a
declared field, a per-batch ``AsyncMap`` returning the wrong number of rows: reading the
same records again gives the same error, so restarting the stage from the last checkpoint
(what a transient error — a lost connection, a timeout — deserves) only repeats it, four
times, and buries the one useful line under Spark's and Py4J's tracebacks. Such an error is
a :class:`UserCodeError`: the operator chain names the step, the field and the record (its
split, file and offset); the subtask tells the driver, which stops the job at once and fails
the run with that one line (``_fatal``).

Deterministic too: Postgres refusing a lookup's query for what it *is* (SQLSTATE class 42:
a column or table dropped after the run resolved the plan, a permission taken away); a
retry reads the same catalog. Everything else — connection errors, timeouts, a user's async
function raising — stays transient and restarts from the last completed checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from spark_jobs._outcomes import bad_input_line, is_bad_input
from spark_jobs.source._batch import OFFSET, Batch

__all__ = ["UserCodeError", "deterministic_error", "first_bad_value"]

#: Characters of an offending value shown in the error line.
_VALUE_CHARS = 60


class UserCodeError(RuntimeError):
    """A deterministic error of step ``where`` (``step 2 (Map score)``); ``str()`` is one
    line naming the pipeline (once known), the step, the field and the record."""

    def __init__(
        self, where: str, problem: str, *, field: str | None = None, row: int | None = None
    ) -> None:
        self.where = where
        self.problem = " ".join(problem.split())  # one line, whatever Arrow printed
        self.field = field
        self.row = row
        self.pipeline: str | None = None
        self.split_id: int | None = None
        self.offset: int | None = None
        self.uri: str | None = None
        super().__init__(self.line())

    def at(self, batch: Batch) -> UserCodeError:
        """Name the record: row ``self.row`` (else the first) of ``batch``, the batch the step
        was given (it still has its offset column). Only the first naming counts."""
        if self.split_id is None:
            rows = batch.rows
            offset = batch.span[0]
            if OFFSET in rows.schema.names and rows.num_rows:
                index = min(self.row or 0, rows.num_rows - 1)
                offset = int(rows.column(OFFSET)[index].as_py())
            self.at_record(batch.split_id, offset)
        return self

    def at_record(self, split_id: int, offset: int) -> UserCodeError:
        """Name the record by its split and offset."""
        if self.split_id is None:
            self.split_id, self.offset = split_id, offset
            self.args = (self.line(),)
        return self

    def named(self, pipeline: str, uri: str | None) -> UserCodeError:
        """Add the pipeline and the split's file (or table range)."""
        self.pipeline, self.uri = pipeline, uri
        self.args = (self.line(),)
        return self

    def line(self) -> str:
        parts = []
        if self.pipeline is not None:
            parts.append(f"pipeline {self.pipeline}")
        parts.append(self.where)
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        text = ": ".join(parts) + f": {self.problem}"
        if self.split_id is not None:
            record = f"split {self.split_id}"
            if self.uri is not None:
                record += f" ({self.uri})"
            if self.offset is not None:
                record += f" offset {self.offset}"
            text += f" (record: {record})"
        return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled across the Python worker (the message is what matters there).
        return (_restore, (self.line(),))


def _restore(line: str) -> UserCodeError:
    return UserCodeError("", line)


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def deterministic_error(error: BaseException) -> str | None:
    """The one line of ``error`` if it (or an error it was raised from) is deterministic —
    a :class:`UserCodeError`, Postgres's SQLSTATE class 42, or an error whose class says
    ``deterministic = True`` (a connector's: a deleted Kafka topic) — else None (transient).
    An error whose class says ``bad_input = True`` (a CDC source's truncated table, dropped
    slot) is the source's input, not a refused query: its line begins with ``BAD_INPUT``."""
    for cause in _chain(error):
        if isinstance(cause, UserCodeError):
            return cause.line()
        if is_bad_input(cause):  # not a refused query
            return bad_input_line(cause)
        if getattr(type(cause), "deterministic", False) is True:
            return " ".join(str(cause).split()) or type(cause).__name__
        state = getattr(cause, "sqlstate", None)
        if isinstance(state, str) and state.startswith("42"):
            first = " ".join(str(cause).split()) or type(cause).__name__
            return f"the database refused a query ({type(cause).__name__}: {first})"
    return None


def first_bad_value(column: pa.Array, target: pa.DataType) -> tuple[int, str] | None:
    """Index and text of the first value of ``column`` that does not cast to ``target`` (on
    the error path only: one cast per value)."""
    for index in range(len(column)):
        try:
            column.slice(index, 1).cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            text = repr(column[index].as_py())
            if len(text) > _VALUE_CHARS:
                text = text[: _VALUE_CHARS - 1] + "…"
            return index, text
    return None
