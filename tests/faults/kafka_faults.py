"""Helpers of the Kafka fault case: a watcher checking that the offsets committed to the
consumer group never pass the offsets Sluice committed (the group is only a copy for lag
tools, written after each checkpoint completes).

It reads the group with its own consumer (``Consumer.committed``) and ``sluice.splits`` with
its own SQL, never the connector's code.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from cdc_oracle import libpq_url
from confluent_kafka import Consumer, TopicPartition

__all__ = ["GroupSample", "GroupWatch", "group_offsets", "sluice_offsets"]

_log = logging.getLogger("tests.kafka")


@dataclass(frozen=True)
class GroupSample:
    at: float
    #: partition → the group's committed offset (partitions without one left out)
    group: dict[int, int]
    #: partition → the greatest offset a completed checkpoint committed, read after ``group``
    sluice: dict[int, int]

    def past(self) -> dict[int, tuple[int, int]]:
        """Partitions whose group offset is past Sluice's: (group, Sluice)."""
        return {
            p: (offset, self.sluice.get(p, -1))
            for p, offset in self.group.items()
            if offset > self.sluice.get(p, -1)
        }


def group_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset of each partition that has one."""
    client = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "logger": _log,
        }
    )
    try:
        found = client.committed([TopicPartition(topic, p) for p in range(partitions)], 10)
    finally:
        client.close()
    return {tp.partition: tp.offset for tp in found if tp.offset >= 0}


def sluice_offsets(conn: psycopg.Connection[Any], source: str, topic: str) -> dict[int, int]:
    """Per partition: the greatest committed offset of its splits (a later split starts where
    the last one's committed output ended, so its start counts too)."""
    rows = conn.execute(
        "SELECT uri, max(GREATEST(start_offset, COALESCE(committed_offset, 0)))"
        " FROM sluice.splits WHERE source = %s GROUP BY uri",
        (source,),
    ).fetchall()
    prefix = f"{topic}/"
    return {int(uri.removeprefix(prefix)): int(n) for uri, n in rows if uri.startswith(prefix)}


class GroupWatch(threading.Thread):
    """Samples the group's and Sluice's offsets every ``every`` seconds until ``stop()``;
    ``violations``: samples where the group is past Sluice. Offsets only grow, so reading
    the group first and Sluice second never reports a violation that was not one. Samples
    while Postgres is down are skipped. Threading: its own thread; the lists are read by the
    test after ``stop()``."""

    def __init__(
        self, db_url: str, bootstrap: str, source: str, topic: str, partitions: int
    ) -> None:
        super().__init__(name=f"group-watch-{source}", daemon=True)
        self._args = (db_url, bootstrap, source, topic, partitions)
        self.every = 1.0
        self.samples: list[GroupSample] = []
        self.violations: list[GroupSample] = []
        self.down = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(60)

    def run(self) -> None:
        db_url, bootstrap, source, topic, partitions = self._args
        t0 = time.monotonic()
        while not self._halt.wait(self.every):
            try:
                group = group_offsets(bootstrap, f"sluice-{source}", topic, partitions)
                with psycopg.connect(libpq_url(db_url), autocommit=True, connect_timeout=3) as c:
                    ours = sluice_offsets(c, source, topic)
            except psycopg.OperationalError:
                self.down += 1
                continue
            except BaseException as exc:  # shown by the test
                self.error = exc
                return
            sample = GroupSample(time.monotonic() - t0, group, ours)
            self.samples.append(sample)
            if sample.past():
                self.violations.append(sample)
