"""``bench/e2e.py``: the CDC ceiling — a bare reading of a replication slot.

The same client as Sluice's change-data-capture source (psycopg2's logical replication
connection, the ``pgoutput`` plugin with the same publication) reads the slot from its
confirmed position up to ``end_lsn`` and counts the change messages (Insert, Update, Delete),
nothing else: no decoding of the tuples, no checkpoint, no sink, and no feedback — the slot is
left where it was, so the Sluice row reads the same changes after it.

``read_slot`` runs in the calling thread and blocks until the end LSN is reached.
"""

from __future__ import annotations

import select
import struct
import time

__all__ = ["lsn_int", "read_slot"]

#: pgoutput message types (first byte) that carry a row change.
_CHANGES = frozenset(b"IUD")


def lsn_int(lsn: str) -> int:
    """``'16/B374D848'`` → its 64-bit integer."""
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def read_slot(dsn: str, slot: str, publication: str, end_lsn: int) -> tuple[int, float]:
    """(change messages, seconds) of reading ``slot`` until a message at or past ``end_lsn``.

    ``dsn``: a libpq connection string or URL of the database the slot belongs to.
    """
    import psycopg2
    import psycopg2.extras

    conn = psycopg2.connect(dsn, connection_factory=psycopg2.extras.LogicalReplicationConnection)
    try:
        cursor = conn.cursor()
        start = time.perf_counter()
        cursor.start_replication(
            slot_name=slot,
            decode=False,
            options={"proto_version": "1", "publication_names": publication},
        )
        changes = 0
        while True:
            message = cursor.read_message()
            if message is None:
                select.select([cursor], [], [], 1.0)
                continue
            if message.payload[0] in _CHANGES:
                changes += 1
            # Commit: flags (1 byte), commit LSN, end LSN of the transaction, time. The
            # transaction that ends at or past ``end_lsn`` closes the read.
            if message.payload[:1] == b"C":
                _, transaction_end = struct.unpack_from(">qq", message.payload, 2)
                if transaction_end >= end_lsn:
                    return changes, time.perf_counter() - start
    finally:
        conn.close()
