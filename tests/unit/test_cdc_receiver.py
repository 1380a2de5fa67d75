"""The CDC stream reader's receive thread (``postgres_cdc/_receiver.py``): messages in order,
an error on the thread fails the read (never swallowed), ``stop`` returns while the thread is
blocked (waiting for room, or in ``select``), ``wake_up`` ends a waiting ``fetch``, the
stream is closed as soon as the marker of a read's stop is received, and ``confirm`` sends a
flush position bounded below the last message's start, promptly."""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from enumerator_service import StreamSplit
from spark_jobs.connectors.postgres_cdc import _receiver
from spark_jobs.connectors.postgres_cdc._changes import CdcError
from spark_jobs.connectors.postgres_cdc._pgoutput import DecodeError
from spark_jobs.connectors.postgres_cdc._receiver import Receiver
from spark_jobs.connectors.postgres_cdc._stream import StreamReader
from spark_jobs.source._records import SplitRead
from tests.unit.test_cdc_block import (
    COLUMNS,
    DECLARED,
    RELID,
    SCHEMAS,
    _tuple,
    begin,
    commit,
    marker,
    relation,
)

_COLUMNS = [(name, oid) for name, oid, _ in COLUMNS]


def _one_insert(lsn: int, key: int) -> list[bytes]:
    """A transaction inserting one row (its other columns null) of table ``public.t``."""
    values: list[str | None] = [str(key)] + [None] * (len(_COLUMNS) - 1)
    return [
        begin(lsn),
        relation(RELID, "t", _COLUMNS, "d"),
        b"I" + struct.pack(">I", RELID) + b"N" + _tuple(values),
        commit(lsn),
    ]


@dataclass
class _Message:
    payload: bytes
    data_start: int = 0  # (0: the receiver confirms nothing)


class _Broken(Exception):
    pass


class _Connection:
    closed = False

    def close(self) -> None:
        self.closed = True


class _Cursor:
    """Gives ``messages`` (None: nothing ready now), then raises ``error`` (or has nothing
    more). ``fileno`` is a pipe nobody writes to, so a ``select`` on it waits. Message ``i``
    starts at WAL position ``starts[i]`` (default 0); ``feedback`` lists the flush positions
    sent."""

    def __init__(
        self,
        messages: list[bytes | None],
        error: BaseException | None = None,
        starts: list[int] | None = None,
    ) -> None:
        self._messages: Iterator[bytes | None] = iter(messages)
        self._starts = iter(starts or [])
        self._error = error
        self._r, self._w = os.pipe()
        self.connection = _Connection()
        self.reads = 0  # read_message calls that gave a message
        self.feedback: list[int] = []

    def send_feedback(self, *, flush_lsn: int, force: bool) -> None:
        assert force  # sent now: psycopg2 sends no periodic status updates on this stream
        self.feedback.append(flush_lsn)

    def fileno(self) -> int:
        return self._r

    def read_message(self) -> _Message | None:
        payload = next(self._messages, None)
        if payload is not None:
            self.reads += 1
            return _Message(payload, next(self._starts, 0))
        if self._error is not None:
            raise self._error
        return None

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


def test_messages_come_in_order_then_the_error_once_they_are_taken() -> None:
    cond = threading.Condition()
    payloads = [f"m{i}".encode() for i in range(2500)]  # more than one hand-over
    cursor = _Cursor([*payloads], _Broken("connection lost"))
    receiver = Receiver(cursor, cond, 1 << 20)
    receiver.start()
    try:
        got: list[bytes] = []

        def take_until_the_error() -> None:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                got.extend(receiver.take())

        with pytest.raises(_Broken, match="connection lost"):
            take_until_the_error()
        assert got == payloads  # every message before the error, in order, once
    finally:
        receiver.stop()
        cursor.close()


def _reader(cursor: _Cursor, stop_lsn: int | None = None) -> StreamReader:
    reader = StreamReader(
        SCHEMAS[1],
        "postgresql:///unused",
        publication="p",
        tables=("public.t",),
        declared=tuple(n for n, _, _ in DECLARED),
        key="id",
        continuous=False,
    )
    reader._read = SplitRead(1, StreamSplit("src", "pgcdc", "slot", 0, None), 0)
    reader._stop = 10_000
    reader._cursor = cursor
    reader._receiver = Receiver(cursor, reader._cond, 1 << 20, stop_lsn)
    reader._receiver.start()
    return reader


def test_an_error_on_the_receive_thread_fails_the_read() -> None:
    cursor = _Cursor([*_one_insert(100, 1)], _Broken("server closed"))
    reader = _reader(cursor)
    try:

        def fetch_20() -> None:
            for _ in range(20):  # it must not turn into empty fetches
                reader.fetch()

        with pytest.raises(_Broken, match="server closed"):
            fetch_20()
    finally:
        reader.close()
        cursor.close()


def test_the_read_ends_at_its_stop_with_the_rows_before_it() -> None:
    messages = [*_one_insert(100, 1), marker(10_000)]
    cursor = _Cursor([*messages], _Broken("read past the stop: not reached"))
    reader = _reader(cursor)
    try:
        block, done = reader.fetch()
        assert done and block is not None and block.rows.column("id").to_pylist() == [1]
    finally:
        reader.close()
        cursor.close()


def test_the_stream_closes_once_the_marker_of_the_stop_is_received() -> None:
    # A transactional marker and an earlier one do not end it; the first non-transactional
    # one at or past the stop does: nothing after it is read, the connection is closed (the
    # walsender stops decoding WAL nobody will read) and the reader still ends its read.
    transactional = b"M" + struct.pack(">BQ", 1, 20_000) + b"sluice-cdc\0" + struct.pack(">I", 0)
    messages = [marker(50), *_one_insert(100, 1), transactional, marker(10_000)]
    after = [*_one_insert(20_000, 2), None, *_one_insert(30_000, 3)]
    cursor = _Cursor([*messages, *after], _Broken("read past the stop"))
    reader = _reader(cursor, stop_lsn=10_000)
    try:
        deadline = time.monotonic() + 5
        while not cursor.connection.closed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cursor.connection.closed
        block, done = reader.fetch()
        assert done and block is not None and block.rows.column("id").to_pylist() == [1]
        assert cursor.reads == len(messages)
    finally:
        reader.close()
        cursor.close()


def test_stop_returns_while_the_thread_waits_for_room() -> None:
    cond = threading.Condition()
    cursor = _Cursor([b"x" * 100] * 100_000)
    receiver = Receiver(cursor, cond, 1000)  # full after one hand-over: it waits for room
    receiver.start()
    time.sleep(0.2)
    with cond:
        assert receiver.ready()
    start = time.monotonic()
    receiver.stop()
    assert time.monotonic() - start < 0.5
    cursor.close()


def test_stop_returns_while_the_thread_waits_in_select() -> None:
    cond = threading.Condition()
    cursor = _Cursor([])  # nothing ever arrives
    receiver = Receiver(cursor, cond, 1 << 20)
    receiver.start()
    time.sleep(0.2)
    start = time.monotonic()
    receiver.stop()  # the stop pipe ends the select (its own timeout is 1 s)
    assert time.monotonic() - start < 0.5
    receiver.stop()  # idempotent
    cursor.close()


def test_wake_up_ends_a_waiting_fetch_early() -> None:
    cursor = _Cursor([])
    reader = _reader(cursor)
    try:
        threading.Timer(0.05, reader.wake_up).start()
        start = time.monotonic()
        block, done = reader.fetch()  # would wait out its 0.5 s otherwise
        assert time.monotonic() - start < 0.4
        assert block is None and not done
    finally:
        reader.close()
        cursor.close()


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_confirm_sends_nothing_before_the_first_message() -> None:
    cond = threading.Condition()
    cursor = _Cursor([])  # psycopg2 forwards any flush to a keepalive's WAL end now
    receiver = Receiver(cursor, cond, 1 << 20)
    receiver.start()
    try:
        receiver.confirm(50)
        time.sleep(0.2)
        assert cursor.feedback == [] and receiver.confirmed() == 0
    finally:
        receiver.stop()
        cursor.close()


def test_confirm_sends_a_flush_below_the_last_message_start_promptly() -> None:
    cond = threading.Condition()
    cursor = _Cursor([b"a", b"b"], starts=[1_000, 2_000])
    receiver = Receiver(cursor, cond, 1 << 20)
    receiver.start()
    try:
        assert _wait_for(receiver.ready, 0.5)
        time.sleep(0.05)  # (in its select now, which waits 1 s unless woken)
        receiver.confirm(400)
        assert _wait_for(lambda: cursor.feedback == [400], 0.5)
        receiver.confirm(300)  # lower than sent: ignored
        # Past b's start: bounded below it (psycopg2 forwards a flush at or past the last
        # message's start to the next keepalive's WAL end).
        receiver.confirm(5_000)
        assert _wait_for(lambda: len(cursor.feedback) == 2, 0.5)
        receiver.confirm(6_000)  # still bounded to 1,999: nothing more to send
        time.sleep(0.1)
        assert cursor.feedback == [400, 1_999] and receiver.confirmed() == 1_999
    finally:
        receiver.stop()
        cursor.close()


def test_a_heartbeat_repeats_the_last_flush_once_one_was_confirmed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The stream's server sends a keepalive mid-transaction only after half its
    # wal_sender_timeout without a status update: the receiver never stays that quiet.
    monkeypatch.setattr(_receiver, "HEARTBEAT_SECONDS", 0.05)
    cond = threading.Condition()
    cursor = _Cursor([b"a"], starts=[1_000])
    receiver = Receiver(cursor, cond, 1 << 20)
    receiver.start()
    try:
        assert _wait_for(receiver.ready, 0.5)
        time.sleep(1.5)  # (more than one select round)
        assert cursor.feedback == []  # nothing confirmed yet: no heartbeat either
        receiver.confirm(400)
        assert _wait_for(lambda: cursor.feedback[-2:] == [400, 400], 3.0)
        assert receiver.confirmed() == 400
    finally:
        receiver.stop()
        cursor.close()


def test_no_heartbeat_before_the_first_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_receiver, "HEARTBEAT_SECONDS", 0.01)
    cond = threading.Condition()
    cursor = _Cursor([])
    receiver = Receiver(cursor, cond, 1 << 20)
    receiver.start()
    try:
        time.sleep(1.5)  # (more than one select round)
        assert cursor.feedback == []
    finally:
        receiver.stop()
        cursor.close()


def test_the_heartbeat_goes_while_the_receiver_waits_for_room(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_receiver, "HEARTBEAT_SECONDS", 0.05)
    cond = threading.Condition()
    messages = [b"x" * 10 for _ in range(2_500)]  # more than two hand-overs
    cursor = _Cursor([*messages], starts=list(range(1_000, 3_500)))
    receiver = Receiver(cursor, cond, 100)  # full after one hand-over; nobody takes
    receiver.confirm(500)  # (sent after the first hand-over)
    receiver.start()
    try:
        assert _wait_for(lambda: len(cursor.feedback) >= 3, 3.0)
        assert set(cursor.feedback) == {500}
        assert cursor.reads < len(messages)  # (still waiting for room)
        assert [p for chunk in [receiver.take()] for p in chunk]  # room: it goes on
    finally:
        receiver.stop()
        cursor.close()


def _fetch_20(reader: StreamReader) -> None:
    for _ in range(20):  # (an error must not turn into empty fetches)
        reader.fetch()


_FIRST, _SECOND = _one_insert(100, 1), _one_insert(200, 2)


@pytest.mark.parametrize(
    ("messages", "error", "match"),
    [
        ([_FIRST[2]], CdcError, "change outside a transaction"),
        # (the changes between two other messages are kept as one run: an empty payload
        # among them still reaches the decoder, in its place, after the ones before it)
        ([*_FIRST, *_SECOND[:3], b"", _SECOND[3]], DecodeError, "empty pgoutput message"),
    ],
    ids=["change outside a transaction", "empty message"],
)
def test_a_message_out_of_place_fails_the_read(
    messages: list[bytes], error: type[Exception], match: str
) -> None:
    cursor = _Cursor([*messages])
    reader = _reader(cursor)
    try:
        with pytest.raises(error, match=match):
            _fetch_20(reader)
    finally:
        reader.close()
        cursor.close()


def test_many_transactions_in_one_hand_over_keep_every_change_in_order() -> None:
    messages = [m for key in range(1, 301) for m in _one_insert(100 + key, key)]
    cursor = _Cursor([*messages, marker(10_000)])
    reader = _reader(cursor)
    try:
        ids: list[int] = []
        done = False
        while not done:
            block, done = reader.fetch()
            if block is not None:
                ids += block.rows.column("id").to_pylist()
        assert ids == list(range(1, 301))
    finally:
        reader.close()
        cursor.close()
