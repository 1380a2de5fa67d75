"""Quoting SQL identifiers: the one place a schema, table or column name becomes SQL text.

Every name that reaches SQL is validated first (:func:`~enumerator_service.validate_identifier`
for schemas, tables and table columns: lower-case letters, digits and ``_``; record field
names may also hold upper-case letters) and then *quoted*, so that reserved words such as
``order``, ``user`` or ``group`` work as names. Quoting never escapes: a name outside the
grammar below (a ``"``, NUL, a space, a dot, non-ASCII, more than 63 bytes — Postgres'
``NAMEDATALEN``) is refused, so no crafted name can reach SQL even if a caller forgot to
validate it. A quoted name is case-sensitive: ``"Total"`` is not ``total`` (table and
column names from configuration are lower case, so both spellings agree for them).

SQLAlchemy Core statements (``sa.table``/``sa.column``) and psycopg's ``sql.Identifier``
quote on their own; this module is for SQL written as text (asyncpg, ``sa.text``).

Threading: pure functions, any thread.
"""

from __future__ import annotations

import re

__all__ = ["qualified_name", "quote_identifier"]

_QUOTABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def quote_identifier(name: str) -> str:
    """``name`` as a double-quoted SQL identifier; ValueError for a name that is not letters,
    digits and ``_`` (not starting with a digit, at most 63)."""
    if not isinstance(name, str) or not _QUOTABLE.fullmatch(name):
        raise ValueError(f"{name!r} is not a valid SQL name (letters, digits, _; max 63)")
    return f'"{name}"'


def qualified_name(schema: str, table: str) -> str:
    """``"schema"."table"``, both parts quoted by ``quote_identifier``."""
    return f"{quote_identifier(schema)}.{quote_identifier(table)}"
