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
- The receive thread blocks only (a) in ``select`` on the cursor and the wake pipe, (b) on
  the shared condition while the buffer holds ``capacity`` bytes or more (back-pressure:
  the reader is behind), and (c) briefly, sending a status update. It notifies the
  condition after each hand-over.
- ``take`` (fetcher thread) never blocks on the server: it returns what has arrived (possibly
  nothing) and notifies the condition, which wakes a receive thread waiting for room. Once the
  buffer is empty it raises the receive thread's error, if any (so an error comes after the
  messages received before it, and is never swallowed: the read fails with it).
- The fetcher waits for messages on the same condition (``StreamReader`` owns it, so its
  ``wake_up`` from any thread wakes the wait too); ``ready`` says whether ``take`` has
  something to return (messages or the error), to be checked under the condition.
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
flush past what the reader asked for (the server sends keepalives between whole transactions
only, with ``wal_sender_timeout = 0``, and every later message starts past ``f``). Nothing is
sent before the first message (psycopg2's start is 0 then).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections import deque
from typing import Any

__all__ = ["Receiver"]

#: Messages read per hand-over at most (one lock round per batch, not per message).
_BATCH = 1000
#: Seconds one ``select`` waits before the loop looks at the stop flag again (the stop pipe
#: normally ends the wait at once).
_SELECT_SECONDS = 1.0


class Receiver:
    """Reads one replication cursor on a thread into a bounded buffer (see the module
    docstring). ``cond`` is the reader's condition, shared with its waits and wake-ups."""

    def __init__(self, cursor: Any, cond: threading.Condition, capacity: int) -> None:
        self._cursor = cursor
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
            while not self._stopping and error is None:
                chunk, size, error = self._read()
                if chunk and not self._put(chunk, size):
                    return
                if error is None:
                    self._send_confirmed()
                if not chunk and error is None:
                    select.select([self._cursor, self._wake_r], [], [], _SELECT_SECONDS)
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
        try:
            while len(chunk) < _BATCH:
                message = read()
                if message is None:
                    break
                payload = message.payload
                chunk.append(payload)
                size += len(payload)
                self._last_start = message.data_start
        except BaseException as exc:
            return chunk, size, exc
        return chunk, size, None

    def _send_confirmed(self) -> None:
        """Send the flush the reader asked for, bounded below the last message's start (see
        the module docstring), when that moves it."""
        with self._cond:
            requested = self._requested
        flush = min(requested, self._last_start - 1)
        if flush > self._confirmed:
            self._cursor.send_feedback(flush_lsn=flush, force=True)
            self._confirmed = flush

    def _put(self, chunk: list[bytes], size: int) -> bool:
        """Hand ``chunk`` over; waits while the buffer is full. False: stopping."""
        with self._cond:
            while self._bytes >= self._capacity and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return False
            self._chunks.append(chunk)
            self._bytes += size
            self._cond.notify_all()
        return True
