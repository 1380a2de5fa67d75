"""The receive thread of a CDC stream read: the replication connection's messages, read ahead.

The stream reader decodes a block of change messages at a time; while it does, nobody reads
the replication socket, so the walsender stops sending as soon as the socket's buffer is
full. A :class:`Receiver` reads the socket on its own thread instead, into a bounded buffer of
raw payloads (bytes, in stream order) that the reader takes from between its blocks, so the
server streams on while a block decodes.

Threading contract:

- ``start`` (the reader's fetcher thread) starts the receive thread; from then until ``stop``
  returns, the receive thread is the only one to touch the replication cursor (the reader
  never reads it, advances the slot or closes the connection in between).
- The receive thread blocks only (a) in ``select`` on the cursor and the wake pipe, (b)
  on the shared condition while the buffer holds ``capacity`` bytes or more (back-pressure:
  the reader is behind), (c) in a short sleep (``_GATHER_SECONDS``) after a hand-over
  that drained the connection: the walsender flushes every message on its own, so a
  receiver woken by each arrival would hand over a few messages per wake-up and spend its
  time (and the GIL the decoder needs) in ``select``, locking and notifying; after the
  sleep a read takes what arrived meanwhile (a millisecond holds hundreds of changes, far
  less than the socket buffers), and (d) briefly, sending a status update. It notifies the
  condition after each hand-over.
- ``take`` (fetcher thread) never blocks on the server: it returns what has arrived (possibly
  nothing) and notifies the condition, which wakes a receive thread waiting for room. Once the
  buffer is empty it raises the receive thread's error, if any (so an error comes after the
  messages received before it, and is never swallowed: the read fails with it).
- The fetcher waits for messages on the same condition (``StreamReader`` owns it, so its
  ``wake_up`` from any thread wakes the wait too); ``ready`` says whether ``take`` has
  something to return (messages or the error), to be checked under the condition.
- ``stop_lsn`` (a read with a stop): once the thread has read the position marker at or
  past it (a non-transactional logical decoding message, ``M``), it hands that message over
  and closes the replication connection itself, then ends. The reader's read ends at that
  marker at the latest, and the walsender would otherwise go on decoding the WAL after it —
  other tables' writes, a same-database sink's among them — for nobody, until the reader
  got there.
- ``confirm`` (fetcher thread) asks the receive thread to report a flushed position to the
  server (see below) and wakes its ``select`` through the wake pipe; it never blocks.
- ``stop`` (fetcher thread) sets the stop flag, writes to the wake pipe, notifies the
  condition and joins the thread: it returns promptly whether the thread was waiting for
  room, in ``select`` or reading. Messages not taken are dropped (the reader restarts the
  stream from its own position). Idempotent.

Confirming (the slot's advance while it streams): the receive thread is the only one to use
the connection, so it sends the standby status update itself, between two reads:
``send_feedback(flush_lsn=f)`` with ``f = min(requested, start of the last message read - 1)``.
psycopg2 forwards its flush position to a keepalive's WAL end when the last flush it was given
is at or past the start of the last message it read (``explicitly_flushed_lsn >=
last_msg_data_start``): the bound keeps ``f`` below that start, so psycopg2 never moves the
flush past what the reader asked for when a keepalive comes between two transactions. In the
middle of a transaction the bound does not hold (transactions interleave in the WAL: a change
of the transaction after ``f``'s may start before ``f``), so none may come there: the stream
runs with the largest ``wal_sender_timeout`` (``_replication``), with which the server sends
one mid-transaction only after half of it (12 days) without a status update, and this thread
sends one at least every ``HEARTBEAT_SECONDS`` once it has confirmed a position (the last
flush again; from its loop, and while it waits for room). Before that, psycopg2's
``explicitly_flushed_lsn`` is 0, below every message's start: a keepalive forwards nothing,
and the heartbeat would only send what a keepalive before the first message forwarded (the
reader's *floor*, ``_advance``). Nothing is sent before the first message (psycopg2's start
is 0 then).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections import deque
from typing import Any

__all__ = ["HEARTBEAT_SECONDS", "Receiver"]

#: Messages read per hand-over at most (one lock round per batch, not per message).
_BATCH = 1000
#: Seconds one ``select`` waits before the loop looks at the stop flag again (the wake pipe
#: normally ends the wait at once).
_SELECT_SECONDS = 1.0
#: Seconds the thread sleeps after a hand-over that drained the connection, so that the
#: next read gathers what arrived meanwhile (see the module docstring).
_GATHER_SECONDS = 0.001
#: Seconds at most between two status updates once a flush was confirmed (see the module
#: docstring: the server's keepalive bound is 12 days; this is far inside it).
HEARTBEAT_SECONDS = 60.0


class Receiver:
    """Reads one replication cursor on a thread into a bounded buffer (see the module
    docstring). ``cond`` is the reader's condition, shared with its waits and wake-ups."""

    def __init__(
        self,
        cursor: Any,
        cond: threading.Condition,
        capacity: int,
        stop_lsn: int | None = None,
    ) -> None:
        self._cursor = cursor
        self._stop_lsn = stop_lsn
        self._cond = cond
        self._capacity = capacity
        self._chunks: deque[list[bytes]] = deque()
        self._bytes = 0
        self._error: BaseException | None = None
        self._stopping = False
        # Ends the receive thread's ``select`` (stop, confirm); drained by that thread.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._requested = 0  # the flush the reader asked for (under the condition)
        self._confirmed = 0  # the flush last sent (receive thread only)
        self._last_start = 0  # WAL start of the last message read (receive thread only)
        self._sent_at = time.monotonic()  # when the last status update went (likewise)
        self._thread = threading.Thread(target=self._run, name="cdc-receiver", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- fetcher thread --------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether ``take`` has messages or an error to give (call under the condition)."""
        return bool(self._chunks) or self._error is not None

    def take(self) -> list[bytes]:
        """The messages received since the last take (possibly none); raises the receive
        thread's error once every message before it was taken."""
        with self._cond:
            if not self._chunks:
                if self._error is not None:
                    raise self._error
                return []
            chunks, self._chunks, self._bytes = self._chunks, deque(), 0
            self._cond.notify_all()  # room again for a receive thread waiting
        if len(chunks) == 1:
            return chunks[0]
        return [payload for chunk in chunks for payload in chunk]

    def confirm(self, flush: int) -> None:
        """Report ``flush`` (every transaction committed before it is done with) to the
        server, from the receive thread, soon (see the module docstring)."""
        with self._cond:
            if flush <= self._requested:
                return
            self._requested = flush
        self._wake()

    def confirmed(self) -> int:
        """The flush position last sent to the server (0: none yet)."""
        return self._confirmed

    def stop(self) -> None:
        """End the receive thread and wait for it (see the module docstring)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._wake()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_r = self._wake_w = -1

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # (a full pipe wakes the select all the same)
            os.write(self._wake_w, b"x")

    # -- receive thread --------------------------------------------------------------------

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            # What ``select`` waits on, looked up once: the connection's socket stays the
            # same while the stream lives.
            ready: list[int] = []
            while not self._stopping and error is None:
                chunk, size, error = self._read()
                if chunk and not self._put(chunk, size):
                    return
                if chunk and error is None and self._passed_stop(chunk[-1]):
                    self._cursor.connection.close()  # (see the module docstring)
                    return
                if error is None:
                    self._send_confirmed()
                if error is None and len(chunk) < _BATCH:  # the connection is drained
                    if chunk:
                        time.sleep(_GATHER_SECONDS)
                    else:
                        ready = ready or [self._cursor.fileno(), self._wake_r]
                        select.select(ready, [], [], _SELECT_SECONDS)
                        with contextlib.suppress(OSError):  # (empty: nothing to drain)
                            os.read(self._wake_r, 4096)
        except BaseException as exc:
            error = exc
        if error is not None:  # handed to the reader (after the messages before it)
            with self._cond:
                self._error = error
                self._cond.notify_all()

    def _read(self) -> tuple[list[bytes], int, BaseException | None]:
        """The messages the connection has ready now (up to ``_BATCH``), and the error that
        ended the reading, if one did (the messages before it are kept)."""
        chunk: list[bytes] = []
        size = 0
        read = self._cursor.read_message
        watch = self._stop_lsn is not None
        try:
            while len(chunk) < _BATCH:
                message = read()
                if message is None:
                    break
                payload = message.payload
                chunk.append(payload)
                size += len(payload)
                self._last_start = message.data_start
                if watch and payload[:1] == b"M" and self._passed_stop(payload):
                    break  # the last message this stream needs
        except BaseException as exc:
            return chunk, size, exc
        return chunk, size, None

    def _passed_stop(self, payload: bytes) -> bool:
        """Whether ``payload`` is a non-transactional position marker at or past
        ``stop_lsn`` (flags, then its LSN: ``_pgoutput.decode``'s ``Marker``)."""
        if self._stop_lsn is None or payload[:1] != b"M" or len(payload) < 10:
            return False
        transactional = payload[1] & 1
        return not transactional and int.from_bytes(payload[2:10], "big") >= self._stop_lsn

    def _send_confirmed(self) -> None:
        """Send the flush the reader asked for, bounded below the last message's start (see
        the module docstring), when that moves it; else the last one again when the
        heartbeat is due."""
        with self._cond:
            requested = self._requested
        flush = min(requested, self._last_start - 1)
        if flush > self._confirmed:
            self._send(flush)
        else:
            self._heartbeat()

    def _heartbeat(self) -> None:
        """The last flush again, once ``HEARTBEAT_SECONDS`` passed since the last status
        update (once a flush was confirmed: see the module docstring)."""
        if self._confirmed and time.monotonic() - self._sent_at >= HEARTBEAT_SECONDS:
            self._send(self._confirmed)

    def _send(self, flush: int) -> None:
        self._cursor.send_feedback(flush_lsn=flush, force=True)
        self._confirmed = flush
        self._sent_at = time.monotonic()

    def _put(self, chunk: list[bytes], size: int) -> bool:
        """Hand ``chunk`` over; waits while the buffer is full (sending the heartbeat while
        it waits long). False: stopping."""
        while True:
            with self._cond:
                if self._stopping:
                    return False
                if self._bytes < self._capacity:
                    self._chunks.append(chunk)
                    self._bytes += size
                    self._cond.notify_all()
                    return True
                self._cond.wait(HEARTBEAT_SECONDS)
            self._heartbeat()  # (outside the condition: a send may block briefly)
