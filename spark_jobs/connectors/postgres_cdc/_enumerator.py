"""The CDC source's enumerator: the slot first, then snapshot chunks, then the stream split.

Why the snapshot and the stream merge correctly (the order of the steps is the argument):

1. The slot exists before any chunk is read; its start ``L0`` (its consistent point when
   created now, else its ``confirmed_flush_lsn``) is where the stream will begin, and it
   keeps every change committed after ``L0``.
2. Chunks (``pgcdc-chunk`` ranges of the integer key) are read later, each in a short
   ``REPEATABLE READ`` transaction without a lock, so each sees every change committed
   before it started — maybe some after ``L0``. Their rows carry ``_lsn = L0``.
3. The stream split is registered only when every chunk split is COMPLETED (read *and*
   committed by a checkpoint): no snapshot row can reach a sink after a change of its key.
4. The stream replays every change committed from ``L0`` on, in commit order, each with its
   commit LSN. Changes already visible to a chunk are applied again — harmless, since the
   upsert sinks keep the greatest ``_lsn`` per key and apply a delete only to a stored row
   whose ``_lsn`` is not greater: the last change of a key wins. A change committed after
   ``L0`` but not visible to a chunk (the race Flink CDC's low/high watermarks resolve) is
   applied all the same. During the catch-up a sink may briefly show an older version of a
   row; once the stream has passed the chunks' reads, the sink equals the table.

Stream splits are ``[start, None)``: a continuous run follows one; a bounded run reads it up
to the WAL position when its reader opened it and finishes it there. The next discovery then
registers the next one from the committed offset where the last ended (never two at once: a
slot has one reader) and moves the idle slot to that committed offset.

The cursor (``enumerator_state``) holds ``start_lsn`` (``L0``), whether the chunks are
registered, and ``slot``: the slot the pipeline created or first adopted, which makes it the
slot's owner (another pipeline naming it is refused, see ``check_slot_owner``). Bounded.

Threading: one thread (a sensor tick, a command); blocks on Postgres.
"""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import (
    ConfigError,
    DiscoveryResult,
    SplitEnumerator,
    SplitStatus,
    StreamSplit,
    TableRangeSplit,
    qualified_name,
    quote_identifier,
    splits,
)
from spark_jobs.connectors.postgres_cdc._publication import (
    ensure_publication,
    require_publication,
)
from spark_jobs.connectors.postgres_cdc._slot import (
    SlotMissingError,
    advance_slot,
    check_slot_owner,
    check_wal_level,
    ensure_slot,
    lsn_text,
    recorded_cursor,
    slot_info,
    slot_lock,
)

__all__ = ["CHUNK_KIND", "STREAM_KIND", "CdcEnumerator", "require_own_slot", "stream_state"]

CHUNK_KIND = "pgcdc-chunk"
STREAM_KIND = "pgcdc"


def stream_state(engine: Engine, source: str) -> tuple[int, int, int | None]:
    """(chunks not completed, stream splits not completed, the committed offset the
    completed stream splits reached — None: none completed)."""
    s = splits.c
    done = s.status == SplitStatus.COMPLETED
    query = sa.select(
        sa.func.count().filter(s.kind == CHUNK_KIND, ~done),
        sa.func.count().filter(s.kind == STREAM_KIND, ~done),
        sa.func.max(s.committed_offset).filter(s.kind == STREAM_KIND, done),
    ).where(s.source == source)
    with engine.connect() as conn:
        chunks, streams, reached = conn.execute(query).one()
    return int(chunks), int(streams), None if reached is None else int(reached)


_COMMITTED = sa.text(
    "SELECT max(COALESCE(committed_offset, start_offset)) FROM sluice.splits"
    " WHERE source = :source AND kind = 'pgcdc'"
)


def recorded_start(conn: sa.Connection, source: str) -> int | None:
    """The LSN the pipeline's slot was created at, as discovery recorded it (None: no slot
    was created for it yet, or ``sluice cdc drop`` forgot it)."""
    return _start_of(recorded_cursor(conn, source))


def _start_of(cursor: dict[str, Any]) -> int | None:
    start = cursor.get("start_lsn")
    return None if start is None else int(start)


def _check_same_slot(cursor: dict[str, Any], source: str, slot: str) -> None:
    """ConfigError naming ``PostgresCdcSource(slot)`` when the pipeline's snapshot was taken
    with another slot (``cursor``: its recorded one): the new one starts elsewhere in the WAL
    (changes between would be lost or applied twice), and the old one would fill the disk."""
    recorded = cursor.get("slot")
    if recorded is not None and recorded != slot:
        raise ConfigError(
            "PostgresCdcSource(slot)",
            f"{source} reads replication slot {recorded!r} (its snapshot was taken with it),"
            f" not {slot!r}: name {recorded!r} again, or run 'sluice cdc drop {source}' (it"
            " drops the old slot), empty the sink and discover again",
        )


def require_own_slot(engine: Engine, source_db: Engine, source: str, slot: str) -> None:
    """At discovery and at a run's start: ``slot`` is not another pipeline's (ConfigError
    naming ``PostgresCdcSource(slot)``), and once the pipeline's slot was created (its
    start recorded) it still exists — else SlotMissingError naming the last committed
    position (a run would otherwise find nothing to read and end as if all were read).
    ``engine``: the platform database (the records); ``source_db``: the slot's."""
    with engine.connect() as conn:
        check_slot_owner(conn, source, slot)
        cursor = recorded_cursor(conn, source)
        _check_same_slot(cursor, source, slot)
        start = _start_of(cursor)
        if start is None:
            return
        with source_db.connect() as server:
            if slot_info(server, slot) is not None:
                return
        committed = conn.execute(_COMMITTED, {"source": source}).scalar()
    position = start if committed is None else int(committed)
    raise SlotMissingError(
        f"replication slot {slot!r} of {source} does not exist (dropped?): changes after its"
        f" last committed position (LSN {lsn_text(position)}) may be lost; run 'sluice cdc"
        f" drop {source}', empty the sink and discover again to take a new snapshot"
    )


class CdcEnumerator(SplitEnumerator):
    """One discovery tick of a CDC source (see the module docstring for the steps).

    ``engine`` is the platform database (splits, cursor, the slot's owner and lock),
    ``source_db`` the tables' (publication, slot, chunk bounds): the same engine unless
    the source names ``url_env``."""

    def __init__(
        self,
        engine: Engine,
        source_db: Engine,
        source: str,
        *,
        tables: tuple[tuple[str, str], ...],
        key: str,
        publication: str,
        slot: str,
        rows_per_chunk: int,
        lease_seconds: float = 60.0,
    ) -> None:
        super().__init__(engine, source, lease_seconds=lease_seconds)
        self._source_db = source_db
        self._tables = tables
        self._key = key
        self._publication = publication
        self._slot = slot
        self._rows = rows_per_chunk

    def cursor(self) -> dict[str, Any]:
        return self._load_cursor({"start_lsn": None, "chunks": False})

    def discover(self) -> DiscoveryResult:
        # Steps 0-2 under the slot's lock, held until the cursor records the slot: two
        # pipelines naming one new slot at once cannot both pass the owner check.
        with slot_lock(self._engine, self._slot):
            cursor = self._claim_slot()
        # Step 3: the snapshot chunks, once.
        if not cursor["chunks"]:
            chunks = [c for table in self._tables for c in self._chunks(*table)]
            added = self._store.register(chunks)
            cursor = {**cursor, "chunks": True}
            self._save_cursor(cursor)
            return DiscoveryResult(len(chunks), added, cursor, seen_unit="chunks")
        # Step 4: the stream split once every chunk committed and no stream split is open.
        pending_chunks, open_streams, reached = stream_state(self._engine, self._source)
        if pending_chunks or open_streams:  # (the open stream split reads the changes)
            return DiscoveryResult(open_streams, 0, cursor, seen_unit="streams")
        start = int(cursor["start_lsn"]) if reached is None else reached
        if reached is not None:
            advance_slot(self._source_db, self._slot, reached)  # committed: WAL before it can go
        split = StreamSplit(self._source, STREAM_KIND, self._slot, start, None)
        added = self._store.register([split])
        return DiscoveryResult(1, added, cursor, seen_unit="streams")

    def _claim_slot(self) -> dict[str, Any]:
        """Steps 0-2 of a discovery (under the slot's lock): the cursor, recording the slot."""
        # Step 0: the slot is the pipeline's own (not another's), and still there once created.
        require_own_slot(self._engine, self._source_db, self._source, self._slot)
        cursor = self.cursor()
        # Step 1: the server can decode; the publication lists exactly the tables (one that
        # lists others is another pipeline's: never altered). Created only before the stream
        # starts: once it has, a missing publication means lost changes, never recreated.
        with self._source_db.begin() as conn:
            check_wal_level(conn)
            if cursor["start_lsn"] is None:
                ensure_publication(conn, self._publication, list(self._tables))
            else:
                require_publication(conn, self._source, self._publication, list(self._tables))
        # Step 2: the slot before any chunk (its start is L0), unless it exists already.
        if cursor["start_lsn"] is None:
            start, _ = ensure_slot(self._source_db, self._slot)
            cursor = {"start_lsn": start, "chunks": False, "slot": self._slot}
            self._save_cursor(cursor)
        elif cursor.get("slot") is None:  # an older version's cursor: record the owner now
            cursor = {**cursor, "slot": self._slot}
            self._save_cursor(cursor)
        return cursor

    def _chunks(self, schema: str, table: str) -> list[TableRangeSplit]:
        key = quote_identifier(self._key)
        with self._source_db.connect() as conn:
            low, high, rows = conn.execute(
                sa.text(
                    f"SELECT min({key}), max({key}), count(*) FROM {qualified_name(schema, table)}"
                )
            ).one()
        if not rows:
            return []
        width = max(1, math.ceil((high - low + 1) * self._rows / rows))
        return [
            TableRangeSplit(
                self._source,
                f"{schema}.{table}",
                self._key,
                start,
                min(start + width, high + 1),
                kind=CHUNK_KIND,
            )
            for start in range(low, high + 1, width)
        ]
