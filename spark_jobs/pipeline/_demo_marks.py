"""Sample data goes only into what sample data created (``sluice demo-data``, issue 13).

A generator fills random rows and files; pointed at a production database or landing folder
it must not touch anything there. So:

- **tables**: a generator creates its tables through ``claim_demo_table``, which creates a
  missing table and marks it with a ``COMMENT ON TABLE`` starting with ``DEMO_COMMENT``.
  A table that exists without that mark (a real table, or one of the same name sample data did
  not create) is refused — before the generator has written anything, as long as it claims
  its tables first and in one transaction with its writes (the examples do).
- **landing folders**: ``check_landing`` (run by the CLI before the generator) accepts a
  missing folder, one without files, or one holding only files listed in its marker file
  ``LANDING_MARKER`` (hidden from discovery: it starts with ``_``), and no symlink;
  ``record_landing`` (after the generator, also when it failed half-way) lists every file
  then there in the marker.

Anything else raises ``DemoDataRefused``, one line saying why (the CLI exits with 2).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from enumerator_service import ConfigError, qualified_name, quote_identifier

__all__ = [
    "DEMO_COMMENT",
    "LANDING_MARKER",
    "DemoDataRefused",
    "check_landing",
    "claim_demo_table",
    "record_landing",
]

#: The start of the comment on every table sample data created.
DEMO_COMMENT = "sluice demo data"
#: The file in a landing folder listing the files sample data wrote there.
LANDING_MARKER = "_sluice_demo.json"
_MARKER_TMP = f".{LANDING_MARKER}.tmp"
_SHOWN = 3


class DemoDataRefused(ConfigError):
    """Sample data would go into a table or folder it did not create."""

    def __init__(self, target: str, problem: str) -> None:
        super().__init__(f"demo-data {target}", problem)


def _quoted(schema: str, table: str) -> str:
    return qualified_name(schema, table)


async def claim_demo_table(conn: Any, schema: str, table: str, columns_sql: str) -> bool:
    """Make ``schema.table`` a demo table on the asyncpg connection ``conn``: create it
    (``CREATE TABLE schema.table (columns_sql)``) and mark it when missing (True), accept it
    when it carries the mark (False), else raise ``DemoDataRefused``.

    Call it inside the transaction that then writes the table, so a refusal of a later
    table rolls back the creation of an earlier one. ``columns_sql`` is the generator's own
    constant text (never outside input); ``schema`` and ``table`` are quoted.
    """
    name = _quoted(schema, table)
    await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_identifier(schema)}")
    oid = await conn.fetchval("SELECT to_regclass($1)::oid", name)
    if oid is None:
        await conn.execute(f"CREATE TABLE {name} ({columns_sql})")
        # COMMENT takes no parameters; the text is this module's constant.
        await conn.execute(
            f"COMMENT ON TABLE {name} IS '{DEMO_COMMENT}: created by sluice demo-data, "
            "which refills it; drop it to start over'"
        )
        return True
    comment = await conn.fetchval("SELECT obj_description($1::oid, 'pg_class')", oid)
    if comment is None or not comment.startswith(DEMO_COMMENT):
        rows = await conn.fetchval(f"SELECT count(*) FROM {name}")
        raise DemoDataRefused(
            f"{schema}.{table}",
            f"the table exists ({rows:,} rows) and was not created by sluice demo-data; "
            "sample data is only written into tables it created (use another database)",
        )
    return False


def _files(landing: Path) -> list[str]:
    """Every file under ``landing`` (relative, ``/``-separated), the marker excluded; a
    symlinked folder counts as an entry of its own (it is not walked into)."""
    found = []
    for folder, dirs, files in os.walk(landing):
        linked = [name for name in dirs if Path(folder, name).is_symlink()]
        for name in [*files, *linked]:
            rel = Path(folder, name).relative_to(landing).as_posix()
            if rel not in (LANDING_MARKER, _MARKER_TMP):
                found.append(rel)
    return sorted(found)


def _recorded(landing: Path) -> set[str]:
    marker = landing / LANDING_MARKER
    if not marker.is_file():
        return set()
    try:
        listed = json.loads(marker.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        raise DemoDataRefused(
            str(landing), f"{LANDING_MARKER} is not a sluice demo-data marker"
        ) from None
    return {str(name) for name in listed}


def check_landing(landing: Path) -> None:
    """Raise ``DemoDataRefused`` unless ``landing`` is missing, holds no file, or holds
    only files its marker lists (sample data written there before)."""
    if not landing.exists() and not landing.is_symlink():
        return
    if not landing.is_dir():
        raise DemoDataRefused(str(landing), "the landing path exists and is not a folder")
    # A symlink inside is never sample data's own (it writes none): the generator would
    # write through it into a folder anywhere on the machine.
    recorded = _recorded(landing)
    foreign = [
        rel for rel in _files(landing) if rel not in recorded or (landing / rel).is_symlink()
    ]
    if foreign:
        shown = ", ".join(foreign[:_SHOWN]) + (" …" if len(foreign) > _SHOWN else "")
        raise DemoDataRefused(
            str(landing),
            f"the landing folder holds {len(foreign)} file(s) sluice demo-data did not write "
            f"({shown}); sample data goes only into an empty folder or one holding only "
            "its own files",
        )


def record_landing(landing: Path) -> None:
    """List every file now under ``landing`` in its marker (written atomically). Nothing
    happens to a missing folder or one without files."""
    if not landing.is_dir():
        return
    files = _files(landing)
    if not files and not (landing / LANDING_MARKER).exists():
        return
    tmp = landing / _MARKER_TMP
    tmp.write_text(json.dumps({"written_by": "sluice demo-data", "files": files}, indent=0))
    os.replace(tmp, landing / LANDING_MARKER)
