"""A continuous CDC read advances its slot while it streams, never past the committed offset.

The stream reader confirms the committed offset on its open replication connection (a
standby status update): the walsender goes on (same process, no restart), and the slot's
``confirmed_flush_lsn`` follows. psycopg2 forwards its flush position to a keepalive's WAL
end when no message has arrived yet: a keepalive before the stream's first transaction (the
walsender waited past other tables' WAL) would make any later confirm report that end, past
the committed offset — the reader confirms nothing before its first whole transaction.
(``committed_offset`` is scripted here: no pipeline commits checkpoints.)
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import StreamSplit, connect_engine
from spark_jobs.connectors.postgres_cdc import _stream, drop_slot, slot_info
from spark_jobs.connectors.postgres_cdc._advance import CommittedOffsets
from spark_jobs.connectors.postgres_cdc._markers import MARKER_PREFIX
from spark_jobs.connectors.postgres_cdc._publication import ensure_publication
from spark_jobs.connectors.postgres_cdc._slot import ensure_slot
from spark_jobs.connectors.postgres_cdc._stream import StreamReader
from spark_jobs.source._batch import RecordSchema
from spark_jobs.source._records import SplitRead

_FIELDS = (
    pa.field("id", pa.int64()),
    pa.field("s", pa.string()),
    pa.field("_op", pa.string()),
    pa.field("_lsn", pa.int64()),
    pa.field("_commit_time", pa.timestamp("us", tz="UTC")),
    pa.field("_before", pa.string()),
    pa.field("_table", pa.string()),
)


def stream_reader(
    db_url: str, table: str, *, event_time: str | None, continuous: bool
) -> StreamReader:
    """A stream reader of ``table`` (``id``, ``s``) with the fixture's publication."""
    return StreamReader(
        RecordSchema(_FIELDS, frozenset(), event_time),
        db_url.replace("postgresql+psycopg://", "postgresql://", 1),
        publication=table.removeprefix("public."),
        tables=(table,),
        declared=("id", "s"),
        key="id",
        continuous=continuous,
    )


def _until(condition: Callable[[], bool], what: str, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _scalar(engine: Engine, query: str) -> Any:
    with engine.connect() as conn:
        value = conn.execute(sa.text(query)).scalar_one()
        conn.commit()
    return value


@pytest.fixture
def source(db_url: str) -> Iterator[tuple[Engine, str, str, str, int]]:
    """(engine, table, other table, slot, slot start): a slot whose publication lists
    ``table`` only."""
    engine = connect_engine(db_url)
    name = f"conf_{secrets.token_hex(3)}"
    table, other, slot = f"public.{name}", f"public.{name}_other", f"sluice_{name}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, s text)"))
        conn.execute(sa.text(f"CREATE TABLE {other} (id bigint PRIMARY KEY, s text)"))
        ensure_publication(conn, name, [("public", name)])
    start, _ = ensure_slot(engine, slot)
    try:
        yield engine, table, other, slot, start
    finally:
        drop_slot(engine, slot, name)
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE {table}, {other}"))
        engine.dispose()


def test_a_continuous_read_confirms_its_slot_while_it_streams(
    source: tuple[Engine, str, str, str, int], db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine, table, other, slot, start = source
    committed = {"offset": start}
    monkeypatch.setattr(CommittedOffsets, "of", lambda _self, _split: committed["offset"])
    monkeypatch.setattr(_stream, "_CONFIRM_SECONDS", (0.0, 0.0))  # a look per fetch
    reader = stream_reader(db_url, table, event_time="_commit_time", continuous=True)

    def confirmed() -> int:
        with engine.connect() as conn:
            info = slot_info(conn, slot)
        assert info is not None and info.confirmed_flush is not None
        return info.confirmed_flush

    def walsender() -> int:
        query = f"SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{slot}'"
        return int(_scalar(engine, query))

    rows: list[int] = []

    def fetch_until(condition: Callable[[], bool], what: str) -> None:
        def step() -> bool:
            block, _ = reader.fetch()
            if block is not None:
                rows.extend(block.rows.column("id").to_pylist())
            return condition()

        _until(step, what)

    reader.open(SplitRead(1, StreamSplit("src", "pgcdc", slot, start, None), start))
    try:
        pid = walsender()
        cursor = reader._cursor
        # Other tables' WAL only: the walsender waits past it and sends a keepalive first.
        with engine.begin() as conn:
            conn.execute(
                sa.text(f"INSERT INTO {other} SELECT g, 'x' FROM generate_series(1, 100) g")
            )
        ahead = int(_scalar(engine, "SELECT pg_current_wal_insert_lsn() - '0/0'"))
        fetch_until(lambda: cursor.wal_end >= ahead, "no keepalive past the other table's WAL")
        with engine.begin() as conn:
            conn.execute(sa.text(f"INSERT INTO {table} VALUES (1, 'a')"))
        fetch_until(lambda: rows == [1], "the insert was not read")
        # The committed offset is still the start (each fetch looked at it): nothing moves
        # the slot past it — not the keepalive's WAL end either.
        time.sleep(0.3)
        assert confirmed() <= committed["offset"]

        # A marker the reader passed, committed: confirmed on the open stream.
        mark = int(
            _scalar(engine, f"SELECT pg_logical_emit_message(false, '{MARKER_PREFIX}', '') - '0/0'")
        )
        fetch_until(lambda: reader._position >= mark, "the marker was not read")
        committed["offset"] = mark
        fetch_until(lambda: confirmed() > start, "the slot was not advanced")
        assert start < confirmed() <= mark
        assert walsender() == pid  # the same stream: not stopped and started again
    finally:
        reader.close()
