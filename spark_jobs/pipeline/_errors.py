"""The one error a pipeline definition raises, and the rules for names in definitions."""

from __future__ import annotations

import re

__all__ = [
    "RESERVED_PREFIX",
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
        place = f"{where}: " if where else ""
        super().__init__(f"pipeline {pipeline}: {place}{problem}")
        self.pipeline = pipeline
        self.where = where
        self.problem = problem


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
    schema, _, table = name.rpartition(".")
    return check_identifier(schema or "public", f"{what} schema"), check_identifier(table, what)


def quote(name: str) -> str:
    """A validated name as a quoted SQL identifier (reserved words such as ``order`` work)."""
    if '"' in name or "\x00" in name:
        raise ValueError(f"{name!r} cannot be quoted")
    return f'"{name}"'
