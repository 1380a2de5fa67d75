"""The one error a pipeline definition raises, and the rules for names in definitions."""

from __future__ import annotations

import re

from enumerator_service import quote_identifier

__all__ = [
    "RESERVED_PREFIX",
    "MissingTableError",
    "PipelineDefinitionError",
    "check_field_name",
    "check_identifier",
    "check_table",
    "quote",
]

_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: Columns the platform adds to batches (source offsets) start with this; fields may not.
RESERVED_PREFIX = "__sluice"


class PipelineDefinitionError(ValueError):
    """A pipeline definition is wrong. ``str(error)`` is one line naming the pipeline, the
    step (``step 2 (Lookup ref.fx_rates)``) or part, and the field when there is one."""

    def __init__(self, pipeline: str, where: str, problem: str) -> None:
        # One line, whatever the problem's text (Arrow's messages print whole schemas).
        problem = "; ".join(line.strip() for line in problem.splitlines() if line.strip())
        # The step's label is the user's text (a table name): control characters in it are
        # shown escaped, never written raw into a log line.
        problem, where, pipeline = _printable(problem), _printable(where), _printable(pipeline)
        place = f"{where}: " if where else ""
        super().__init__(f"pipeline {pipeline}: {place}{problem}")
        self.pipeline = pipeline
        self.where = where
        self.problem = problem


class MissingTableError(PipelineDefinitionError):
    """A table the pipeline reads does not exist (yet): ``sluice pipelines`` shows it as a
    note (sample data or the user creates it later), not as an error."""


def _printable(text: object) -> str:
    """``text`` with every non-printable character (newline, NUL, …) escaped as in a repr."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def check_field_name(name: object, what: str) -> str:
    """A record field name: letters, digits and ``_``, at most 63 characters (it becomes a
    quoted SQL identifier and a Parquet column)."""
    if not isinstance(name, str) or not _FIELD.fullmatch(name):
        raise ValueError(f"{what} {name!r} is not a valid name (letters, digits, _; max 63)")
    if name.startswith(RESERVED_PREFIX):
        raise ValueError(f"{what} {name!r}: names starting with {RESERVED_PREFIX} are reserved")
    return name


def check_identifier(name: object, what: str) -> str:
    """A table, schema, column or pipeline name: lower-case letters, digits and ``_``."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
        raise ValueError(
            f"{what} {name!r} is not a valid identifier (lower-case letters, digits, _; max 63)"
        )
    return name


def check_table(name: object, what: str) -> tuple[str, str]:
    """``schema.table`` (or ``table``: schema ``public``) as its two validated parts."""
    if not isinstance(name, str):
        raise ValueError(f"{what} must be 'schema.table', got {name!r}")
    schema, dot, table = name.rpartition(".")
    # Only a name without a dot means ``public``: ``".t"`` is an empty schema, not a default.
    schema = schema if dot else "public"
    return check_identifier(schema, f"{what} schema"), check_identifier(table, what)


def quote(name: str) -> str:
    """A validated name as a quoted SQL identifier (reserved words such as ``order`` work);
    see ``enumerator_service.quote_identifier``."""
    return quote_identifier(name)
