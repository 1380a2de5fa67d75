"""A CDC stream reader's markers are heartbeats: a caught-up read on a quiet table advances its
event time to the source server's clock, which every later commit is at or past.

Real server (``wal_level=logical``), the stream reader alone (no Spark): a continuous read
writes a marker after ``_MARKER_SECONDS`` without a message; a bounded read writes one when it
opens and ends at it. The block that passes a marker carries its time as ``max_event_time``
when the event time is the commit time — and only then (another event-time field says nothing
about the rows still to come).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from test_cdc_confirm import _until, source, stream_reader

from enumerator_service import StreamSplit
from spark_jobs.connectors.postgres_cdc import _stream
from spark_jobs.connectors.postgres_cdc._advance import CommittedOffsets
from spark_jobs.connectors.postgres_cdc._stream import StreamReader
from spark_jobs.source._batch import ParsedBlock
from spark_jobs.source._records import SplitRead

__all__ = ["source"]  # the fixture, shared with test_cdc_confirm

Source = tuple[Engine, str, str, str, int]


def _server_now(engine: Engine) -> datetime:
    with engine.connect() as conn:
        now: datetime = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
    return now


def _insert(engine: Engine, table: str, key: int) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f"INSERT INTO {table} VALUES ({key}, 'x')"))


def _fetching(reader: StreamReader, blocks: list[ParsedBlock]) -> Callable[[], None]:
    def step() -> None:
        block, _ = reader.fetch()
        if block is not None:
            blocks.append(block)

    return step


@pytest.fixture
def quick_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_stream, "_MARKER_SECONDS", 0.2)
    monkeypatch.setattr(CommittedOffsets, "of", lambda _self, _split: None)  # no confirms


@pytest.mark.usefixtures("quick_markers")
def test_a_caught_up_continuous_read_advances_its_event_time_to_the_servers_clock(
    source: Source, db_url: str
) -> None:
    engine, table, _, slot, start = source
    reader = stream_reader(db_url, table, event_time="_commit_time", continuous=True)
    blocks: list[ParsedBlock] = []
    step = _fetching(reader, blocks)
    reader.open(SplitRead(1, StreamSplit("src", "pgcdc", slot, start, None), start))
    try:
        _insert(engine, table, 1)
        _until(lambda: (step(), any(b.rows.num_rows for b in blocks))[1], "insert not read")
        (first,) = [b for b in blocks if b.rows.num_rows]
        commit = first.max_event_time
        assert commit is not None
        quiet = _server_now(engine)  # after the commit: a heartbeat past it is the marker's
        blocks.clear()

        def beat_after_quiet() -> bool:
            step()
            return any(b.max_event_time is not None and b.max_event_time > quiet for b in blocks)

        _until(beat_after_quiet, "no heartbeat past the quiet moment")
        beats = [b for b in blocks if b.max_event_time is not None]
        assert all(b.rows.num_rows == 0 for b in beats)
        heartbeat = max(b.max_event_time for b in beats if b.max_event_time is not None)
        assert commit < quiet < heartbeat <= _server_now(engine)
        # Every commit after the heartbeat is at or past it: the watermark lost nothing.
        _insert(engine, table, 2)
        blocks.clear()
        _until(lambda: (step(), any(b.rows.num_rows for b in blocks))[1], "2nd insert not read")
        later = next(b for b in blocks if b.rows.num_rows).max_event_time
        assert later is not None and later >= heartbeat
    finally:
        reader.close()


@pytest.mark.usefixtures("quick_markers")
def test_markers_are_no_heartbeat_when_the_event_time_is_a_column(
    source: Source, db_url: str
) -> None:
    engine, table, _, slot, start = source
    reader = stream_reader(db_url, table, event_time=None, continuous=True)
    blocks: list[ParsedBlock] = []
    step = _fetching(reader, blocks)
    reader.open(SplitRead(1, StreamSplit("src", "pgcdc", slot, start, None), start))
    try:
        _insert(engine, table, 1)
        marks = []

        def passed_markers() -> bool:
            step()
            marks.append(reader._position)
            return len(set(marks)) >= 4  # the insert, then markers moving the offset on

        _until(passed_markers, "the offset did not move with the markers")
        assert [b.max_event_time for b in blocks] == [None] * len(blocks)
    finally:
        reader.close()


def test_a_bounded_read_ends_at_its_marker_with_the_markers_time(
    source: Source, db_url: str
) -> None:
    engine, table, _, slot, start = source
    _insert(engine, table, 1)
    before = _server_now(engine)
    reader = stream_reader(db_url, table, event_time="_commit_time", continuous=False)
    blocks: list[Any] = []
    reader.open(SplitRead(1, StreamSplit("src", "pgcdc", slot, start, None), start))
    try:
        done = False

        def finished() -> bool:
            nonlocal done
            block, done = reader.fetch()
            if block is not None:
                blocks.append(block)
            return done

        _until(finished, "the bounded read did not end")
    finally:
        reader.close()
    assert sum(b.rows.num_rows for b in blocks) == 1
    last = blocks[-1].max_event_time
    assert last is not None and before < last <= _server_now(engine)
