"""A CDC source's publication: the tables it lists, created when missing (never altered),
required once its stream has started.

Threading: functions on the caller's connection, any thread.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from enumerator_service import ConfigError, qualified_name, quote_identifier

__all__ = [
    "PublicationMissingError",
    "ensure_publication",
    "publication_tables",
    "require_publication",
    "shown_tables",
]


class PublicationMissingError(RuntimeError):
    """The publication of a CDC source whose stream has started does not exist any more:
    pgoutput decodes by the publication as of each change, so the changes made while it
    was gone are lost. Never recreated silently; like a dropped slot (one line, exit 2)."""

    sqlstate = "42704"
    bad_input = True


def publication_tables(conn: Connection, publication: str) -> set[tuple[str, str]] | None:
    """The tables ``publication`` lists (None: it does not exist)."""
    exists = conn.execute(
        sa.text("SELECT 1 FROM pg_publication WHERE pubname = :p"), {"p": publication}
    ).first()
    if exists is None:
        return None
    found = conn.execute(
        sa.text("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = :p"),
        {"p": publication},
    ).all()
    return {(str(s), str(t)) for s, t in found}


def shown_tables(tables: set[tuple[str, str]] | list[tuple[str, str]]) -> str:
    return ", ".join(sorted(f"{s}.{t}" for s, t in tables)) or "no table"


def _check_owned(
    publication: str, listed: set[tuple[str, str]], tables: list[tuple[str, str]]
) -> None:
    # Altering (or later dropping) a publication that lists other tables would change what
    # another pipeline receives: its changes made meanwhile would be lost.
    if listed != set(tables):
        raise ConfigError(
            "PostgresCdcSource(publication)",
            f"publication {publication!r} exists and lists {shown_tables(listed)}, not exactly"
            f" the pipeline's tables ({shown_tables(tables)}); it is left as it is (another"
            " pipeline's?): name a publication of the pipeline's own",
        )


#: SQLSTATE of "permission denied" (``insufficient_privilege``).
_INSUFFICIENT_PRIVILEGE = "42501"


def ensure_publication(conn: Connection, publication: str, tables: list[tuple[str, str]]) -> None:
    """Create ``publication`` for ``tables`` (in the caller's transaction); one that exists
    must list exactly ``tables`` (ConfigError naming ``PostgresCdcSource(publication)``) —
    never altered."""
    listed = publication_tables(conn, publication)
    if listed is not None:
        _check_owned(publication, listed, tables)
        return
    names = ", ".join(qualified_name(s, t) for s, t in tables)
    try:
        with conn.begin_nested():  # (the caller's transaction stays usable for the error)
            conn.execute(
                sa.text(f"CREATE PUBLICATION {quote_identifier(publication)} FOR TABLE {names}")
            )
    except sa.exc.ProgrammingError as exc:
        if getattr(exc.orig, "sqlstate", None) != _INSUFFICIENT_PRIVILEGE:
            raise
        detail = " ".join(str(exc.orig).split())
        raise ConfigError(
            "PostgresCdcSource(publication)",
            f"cannot create publication {publication!r}: {detail}; the user needs CREATE on"
            " the database and ownership of the tables — or create the publication (FOR"
            f" TABLE {names}) as another user and name it in PostgresCdcSource(publication)",
        ) from None


def require_publication(
    conn: Connection, source: str, publication: str, tables: list[tuple[str, str]]
) -> None:
    """A started stream's publication: it must exist (else PublicationMissingError, never
    recreated) and list exactly ``tables`` (else ConfigError)."""
    listed = publication_tables(conn, publication)
    if listed is None:
        raise PublicationMissingError(
            f"publication {publication!r} of {source} does not exist (dropped?): changes made"
            f" while it was missing are lost; run 'sluice cdc drop {source}' and discover"
            " again to take a new snapshot"
        )
    _check_owned(publication, listed, tables)
