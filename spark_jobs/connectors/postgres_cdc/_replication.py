"""Opening a CDC stream reader's replication connection on its slot.

A slot has one reader at a time. When a run takes the stream split over from one that was
cancelled or died, the old reader's walsender can hold the slot for a few seconds more (a
cancelled Spark task's Python worker is stopped after a delay; a dead one's connection is
closed by the server when it notices): ``START_REPLICATION`` then fails with "replication
slot ... is active". The split's new hand-out fenced the old reader (its commits fail on the
epoch), so waiting for its walsender to go is safe: the open is retried for at most
``TAKEOVER_SECONDS``, then fails (a transient error: the task is retried).

Threading: called on the stream reader's fetcher thread; blocks on the server.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import psycopg2
import psycopg2.errors
import psycopg2.extras

from spark_jobs.connectors.postgres_cdc._source_db import (
    PLATFORM,
    connect_patiently,
    session_options,
)

__all__ = ["TAKEOVER_SECONDS", "WAL_SENDER_TIMEOUT_MS", "open_replication"]

#: Seconds an open waits for another walsender to release the slot.
TAKEOVER_SECONDS = 30.0
#: The stream's ``wal_sender_timeout``: the largest the server takes (about 24.8 days). The
#: walsender then sends a keepalive only after half of it without a word from the reader,
#: and the receive thread speaks at least every ``_receiver.HEARTBEAT_SECONDS``: no
#: keepalive ever comes in the middle of a transaction (see ``_advance``). (0 would do that
#: too, but makes the walsender look for replies after every message it sends: about 15 %
#: more of its CPU per change, measured.)
WAL_SENDER_TIMEOUT_MS = 2**31 - 1

_log = logging.getLogger(__name__)


def open_replication(
    dsn: str,
    slot: str,
    position: int,
    publication: str,
    wait: float = TAKEOVER_SECONDS,
    where: tuple[str, str] = PLATFORM,
) -> tuple[Any, Any]:
    """(connection, cursor) streaming ``slot`` from ``position`` (pgoutput, ``publication``,
    raw payloads, no status updates: see ``_stream``). A missing slot raises
    ``psycopg2.errors.UndefinedObject`` (the caller names what is lost); a server that does
    not answer is waited for (``connect_patiently``; ``where``: what its error names)."""
    deadline = time.monotonic() + wait
    waited = False
    while True:
        connection = connect_patiently(
            lambda: psycopg2.connect(
                dsn,
                connection_factory=psycopg2.extras.LogicalReplicationConnection,
                options=session_options(dsn, f"-c wal_sender_timeout={WAL_SENDER_TIMEOUT_MS}"),
                application_name="sluice-cdc-stream",
            ),
            dsn,
            where,
        )
        cursor = connection.cursor()
        options = {"proto_version": "1", "publication_names": publication, "messages": "true"}
        try:
            cursor.start_replication(
                slot_name=slot,
                decode=False,
                start_lsn=position,
                options=options,
                status_interval=10**7,  # no status updates (see ``_stream``)
            )
            return connection, cursor
        except psycopg2.errors.ObjectInUse:
            with contextlib.suppress(Exception):
                connection.close()
            if time.monotonic() >= deadline:
                raise
            if not waited:  # once: why a taken-over stream is silent for a while
                _log.warning(
                    "replication slot %s is still held by a previous reader; waiting up to"
                    " %.0fs for its server process to release it",
                    slot,
                    wait,
                )
                waited = True
            time.sleep(0.2)
        except BaseException:
            with contextlib.suppress(Exception):
                connection.close()
            raise
