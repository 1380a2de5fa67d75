"""A CDC source's replication slot: checks, creation, advance, retained WAL, drop (with its
publication: ``_publication``).

The slot keeps every WAL segment from its ``restart_lsn`` on the server's disk until it is
advanced, whether or not anybody reads it: a forgotten slot fills the disk. Sluice creates
the slot and the publication when a pipeline first discovers (``ensure_*``), advances the
slot only to offsets that completed checkpoints committed (the stream reader's feedback, or
:func:`advance_slot` between runs), shows the retained WAL (``sluice status``, a Dagster
check) and drops both with ``sluice cdc drop <pipeline>`` (:func:`drop_slot`).

LSNs are integers here (``pg_lsn - '0/0'``), as split offsets are.

Threading: functions on the caller's connection, any thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from enumerator_service import ConfigError, quote_identifier
from spark_jobs.connectors.postgres_cdc._publication import publication_tables, shown_tables

__all__ = [
    "SlotInfo",
    "SlotMissingError",
    "advance_slot",
    "check_slot_owner",
    "check_wal_level",
    "current_lsn",
    "drop_slot",
    "ensure_slot",
    "lsn_text",
    "recorded_cursor",
    "release_source",
    "slot_info",
    "slot_lock",
]


class SlotMissingError(RuntimeError):
    """The slot a CDC source reads from does not exist any more (dropped by an admin). Its
    SQLSTATE (undefined object, class 42) makes a run stop at once: retrying cannot bring
    the slot's WAL back (see ``deterministic_error``); ``bad_input``: the source's input,
    not a refused query — one line, exit code 2 (a run's and ``sluice discover``'s)."""

    sqlstate = "42704"
    bad_input = True


@dataclass(frozen=True, slots=True)
class SlotInfo:
    name: str
    database: str
    restart_lsn: int | None
    confirmed_flush: int | None
    active: bool
    #: Bytes of WAL the slot keeps (current WAL position - restart_lsn).
    retained_bytes: int


def lsn_text(lsn: int) -> str:
    """An integer LSN as ``pg_lsn`` text (``16/B374D848``)."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def check_wal_level(conn: Connection) -> None:
    """One ConfigError line naming ``wal_level`` unless the server has ``logical``."""
    level = conn.execute(sa.text("SELECT current_setting('wal_level')")).scalar_one()
    if level != "logical":
        raise ConfigError(
            "wal_level",
            f"is {level!r} on the source server; a CDC source needs wal_level = logical "
            "(set it in postgresql.conf or with ALTER SYSTEM, then restart the server)",
        )


def current_lsn(conn: Connection) -> int:
    return int(conn.execute(sa.text("SELECT pg_current_wal_lsn() - '0/0'")).scalar_one())


_SLOT = sa.text(
    "SELECT slot_name, database, restart_lsn - '0/0', confirmed_flush_lsn - '0/0', active,"
    " COALESCE(pg_current_wal_lsn() - restart_lsn, 0)"
    " FROM pg_replication_slots WHERE slot_name = :slot"
)


def slot_info(conn: Connection, slot: str) -> SlotInfo | None:
    row = conn.execute(_SLOT, {"slot": slot}).first()
    if row is None:
        return None
    name, database, restart, flushed, active, retained = row
    return SlotInfo(
        str(name),
        str(database),
        None if restart is None else int(restart),
        None if flushed is None else int(flushed),
        bool(active),
        int(retained),
    )


# The pipelines whose records name the slot: the discovery cursor (``slot``, recorded when
# the pipeline created or first adopted it) or a stream split (an older version recorded
# only those). The owner is the earliest of them (its first split); a cursor without splits
# yet (a discovery between its two writes) comes last.
_SLOT_OWNER = sa.text(
    "WITH users AS (SELECT source FROM sluice.enumerator_state WHERE cursor ->> 'slot' = :slot"
    " UNION SELECT source FROM sluice.splits WHERE kind = 'pgcdc' AND uri = :slot)"
    " SELECT u.source FROM users u LEFT JOIN sluice.splits s ON s.source = u.source"
    " AND s.kind IN ('pgcdc', 'pgcdc-chunk')"
    " GROUP BY u.source ORDER BY min(s.registered_at) NULLS LAST, u.source LIMIT 1"
)


def slot_owner(conn: Connection, slot: str) -> str | None:
    """The pipeline the platform's records say ``slot`` belongs to (None: none)."""
    owner = conn.execute(_SLOT_OWNER, {"slot": slot}).scalar()
    return None if owner is None else str(owner)


@contextmanager
def slot_lock(engine: Engine, slot: str) -> Iterator[None]:
    """Hold a session advisory lock on ``slot``'s name (blocks while another discovery
    holds it); on its own connection, outside any transaction."""
    key = {"k": f"sluice.cdc.slot:{slot}"}
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("SELECT pg_advisory_lock(hashtextextended(:k, 0))"), key)
        try:
            yield
        finally:
            conn.execute(sa.text("SELECT pg_advisory_unlock(hashtextextended(:k, 0))"), key)


def check_slot_owner(conn: Connection, source: str, slot: str) -> None:
    """One ConfigError line naming ``PostgresCdcSource(slot)`` and the owner when ``slot``
    belongs to another pipeline: a slot has one confirmed position, so a second reader
    advances it past changes the first never read (they are lost). A slot that exists
    but no pipeline recorded (made by hand) may be adopted by the first that names it."""
    owner = slot_owner(conn, slot)
    if owner is not None and owner != source:
        raise ConfigError(
            "PostgresCdcSource(slot)",
            f"replication slot {slot!r} belongs to pipeline {owner!r}: a second pipeline"
            " reading it would advance it past changes the other has not read (they would be"
            f" lost); name a slot of {source}'s own",
        )


def ensure_slot(engine: Engine, slot: str) -> tuple[int, bool]:
    """(the slot's start LSN, whether it was created now): its consistent point when
    created, else its ``confirmed_flush_lsn``. Created outside any transaction (Postgres
    refuses a slot in a transaction that wrote); waits for transactions running now."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        info = slot_info(conn, slot)
        if info is not None:
            if info.confirmed_flush is None:
                raise ConfigError(
                    "slot", f"replication slot {slot!r} exists but is not a logical slot"
                )
            return info.confirmed_flush, False
        created = conn.execute(
            sa.text("SELECT lsn - '0/0' FROM pg_create_logical_replication_slot(:s, 'pgoutput')"),
            {"s": slot},
        ).scalar_one()
        return int(created), True


#: How far restart_lsn may trail an idle slot's confirmed position before ``advance_slot``
#: moves it up (each move decodes that range again).
_RESTART_SLACK = 8 << 20
#: Seconds ``advance_slot`` waits for a just-ended run's walsender to release the slot.
_RELEASE_SECONDS = 5.0


def advance_slot(engine: Engine, slot: str, lsn: int) -> bool:
    """Move an inactive slot's ``confirmed_flush_lsn`` forward to ``lsn`` (an offset a
    completed checkpoint committed); False when it is active (its reader moves it) or
    already there. A missing slot: SlotMissingError."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        info = _inactive_info(conn, slot)
        if info.active:
            return False
        # An advance moves restart_lsn (what the server keeps) only to the first decoding
        # restart point past the *previous* confirmed position (Postgres takes one candidate
        # beyond confirmed_flush until it is confirmed), so after one advance over a whole
        # run's WAL the slot still kept all of it (133 of 133 MiB in a fault case). An
        # advance to the position already confirmed decodes the range again with every
        # restart point at or before confirmed_flush, and takes the last one. So: twice when
        # the slot is behind ``lsn``; once, to where it is, when its reader's status updates
        # confirmed ``lsn`` already but restart_lsn trails far behind (120 of 120 MiB kept
        # after a bounded run that streamed its whole range).
        confirmed = info.confirmed_flush
        if confirmed is None or confirmed < lsn:
            passes, target = 2, lsn
        elif info.restart_lsn is not None and confirmed - info.restart_lsn >= _RESTART_SLACK:
            passes, target = 1, confirmed
        else:
            return False
        for _ in range(passes):
            conn.execute(
                sa.text("SELECT pg_replication_slot_advance(:s, CAST(:lsn AS pg_lsn))"),
                {"s": slot, "lsn": lsn_text(target)},
            )
        return True


def _inactive_info(conn: Connection, slot: str) -> SlotInfo:
    """The slot, once no walsender holds it (waiting at most ``_RELEASE_SECONDS``): called
    when no run reads it, an active slot is a run that just ended — its walsender exits
    moments after the reader closed the stream (the slot would be left unadvanced, keeping
    the run's whole WAL). Still active after the wait: returned as it is."""
    deadline = time.monotonic() + _RELEASE_SECONDS
    while True:
        info = slot_info(conn, slot)
        if info is None:
            raise SlotMissingError(slot)
        if not info.active or time.monotonic() >= deadline:
            return info
        time.sleep(0.05)


def drop_slot(engine: Engine, slot: str, publication: str | None) -> tuple[bool, bool]:
    """Drop the slot (ending a session that reads it) and the publication (None: keep it);
    (slot dropped, publication dropped). Idempotent."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(
            sa.text(
                "SELECT pg_terminate_backend(active_pid, 5000) FROM pg_replication_slots"
                " WHERE slot_name = :s AND active_pid IS NOT NULL"
            ),
            {"s": slot},
        )
        dropped = False
        if slot_info(conn, slot) is not None:
            conn.execute(sa.text("SELECT pg_drop_replication_slot(:s)"), {"s": slot})
            dropped = True
        if publication is None or publication_tables(conn, publication) is None:
            return dropped, False
        conn.execute(sa.text(f"DROP PUBLICATION IF EXISTS {quote_identifier(publication)}"))
        return dropped, True


_FORGET_SPLITS = sa.text(
    "DELETE FROM sluice.splits WHERE source = :source AND kind IN ('pgcdc', 'pgcdc-chunk')"
)
_FORGET_CURSOR = sa.text("DELETE FROM sluice.enumerator_state WHERE source = :source")
_CURSOR = sa.text("SELECT cursor FROM sluice.enumerator_state WHERE source = :source")


def recorded_cursor(conn: Connection, source: str) -> dict[str, Any]:
    """What the source's discoveries recorded (``start_lsn``, ``chunks``, ``slot``; empty:
    nothing yet, or ``sluice cdc drop`` forgot it), read on the caller's connection."""
    cursor = conn.execute(_CURSOR, {"source": source}).scalar()
    return dict(cursor) if cursor else {}


def release_source(
    engine: Engine,
    source: str,
    slot: str,
    publication: str,
    tables: list[tuple[str, str]],
    *,
    source_db: Engine | None = None,
) -> list[str]:
    """``sluice cdc drop``: drop the slot and the publication — only when it lists exactly
    the source's ``tables``: one that lists others is another pipeline's, and dropping it
    would lose that pipeline's changes — then forget the source's splits (their dead
    letters go with them) and its discovery cursor, so that the next discovery creates
    them again and takes a new snapshot. Lines saying what was done. Another pipeline's
    slot: one ConfigError line naming its owner, and nothing is dropped nor forgotten.
    ``engine``: the platform database (the records); ``source_db``: the slot's and the
    publication's (default: the same)."""
    server = engine if source_db is None else source_db
    with engine.connect() as conn:
        owner = slot_owner(conn, slot)
        if owner is not None and owner != source:
            raise ConfigError(
                "PostgresCdcSource(slot)",
                f"replication slot {slot!r} belongs to pipeline {owner!r}: nothing dropped nor"
                f" forgotten (to retire that pipeline: 'sluice cdc drop {owner}')",
            )
        # The slot its snapshot was taken with, when ``slot=`` was changed since: dropped too.
        recorded = recorded_cursor(conn, source).get("slot")
        if recorded is not None and slot_owner(conn, recorded) != source:
            recorded = None  # (another pipeline's now: never dropped from here)
    with server.connect() as conn:
        listed = publication_tables(conn, publication)
    owned = listed is None or listed == set(tables)
    dropped_slot, dropped_publication = drop_slot(server, slot, publication if owned else None)
    earlier = []
    if recorded is not None and recorded != slot:
        gone = drop_slot(server, recorded, None)[0]
        earlier = [f"replication slot {recorded} (named before): {_dropped(gone)}"]
    with engine.begin() as conn:
        forgotten = conn.execute(_FORGET_SPLITS, {"source": source}).rowcount
        conn.execute(_FORGET_CURSOR, {"source": source})
    if listed is not None and not owned:
        shown = (
            f"not dropped: it lists {shown_tables(listed)}, not exactly the pipeline's tables"
            f" ({shown_tables(tables)}) — another pipeline's? (PostgresCdcSource(publication))"
        )
    else:
        shown = _dropped(dropped_publication)
    return [
        f"replication slot {slot}: {_dropped(dropped_slot)}",
        *earlier,
        f"publication {publication}: {shown}",
        f"{forgotten} split(s) of {source} forgotten: the next discovery takes a new snapshot"
        " (empty the sink table first: a row deleted meanwhile has no delete to replay)",
    ]


def _dropped(done: bool) -> str:
    return "dropped" if done else "did not exist"
