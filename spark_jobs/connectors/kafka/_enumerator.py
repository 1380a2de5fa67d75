"""The Kafka source's enumerator: one split per topic-partition, offsets as positions.

Cursor (``enumerator_state``, bounded: two entries per partition): ``next`` — per partition
``"<topic>/<partition>"``, the offset its next split starts at — and ``open``, the
partitions whose split is open (``end`` None).

- A **tick** (the sensor's, a command's, a run's "all new input") lists the topics (or the
  ones ``pattern`` matches: new topics and partitions are found by the next tick), gives a
  partition seen for the first time its start offset (``KafkaSource(start)``) and registers
  an open split ``[next, ∞)`` for every partition without one. A continuous run reads open
  splits for ever.
- A **bounded run** ("available now": a schedule, ``sluice run``) first closes the open
  splits no run holds at the partitions' end offsets taken then (:meth:`close_open`), so it
  reads what was there when it started and ends; the next tick opens ``[end, ∞)``. A split
  with nothing in it is dropped instead (it would take the next one's identity).
- A tick **bounded to days** (a backfill, a Dagster day partition) registers, per partition
  and day D, a *day split* ``"<topic>/<partition>@D"`` (partition key D) of the offsets
  from ``offsets_for_times(D 00:00 - margin)`` to ``offsets_for_times(D+1 00:00 + margin)``
  (the end offset when no message is that late; ``margin``: the source's
  ``out_of_orderness``). Its reader keeps only the records of event day D. The main line
  and its cursor are untouched: a day split is read by a run of that day (a rebuild of D
  when D has output: the day splits alone replace it). A partition whose day range resolves
  empty gets no day split; a rebuild of a day with committed rows is refused unless its day
  splits overlap the offsets those rows came from (``_rebuild_members``), never swapped
  for nothing.

Threading: like every enumerator, owned by one thread; methods block on the broker (bounded
by ``KafkaSource(timeout)``) and on Postgres.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import sqlalchemy as sa
from confluent_kafka import Consumer
from sqlalchemy.engine import Engine

from enumerator_service import (
    ConfigError,
    DiscoveryResult,
    SplitEnumerator,
    SplitStatus,
    SplitStore,
    StreamSplit,
    splits,
)
from spark_jobs.connectors.kafka._client import (
    consumer,
    list_partitions,
    start_offsets,
    timestamp_offsets,
    watermarks,
)
from spark_jobs.connectors.kafka._options import KafkaOptions, day_path, partition_path, topic_of

__all__ = ["KIND", "KafkaEnumerator"]

KIND = "kafka"
_log = logging.getLogger(__name__)


class KafkaEnumerator(SplitEnumerator):
    """Registers an open split per topic-partition of ``options`` (see the module)."""

    def __init__(
        self,
        engine: Engine,
        source: str,
        options: KafkaOptions,
        *,
        lease_seconds: float = 60.0,
        dates: Sequence[date] | None = None,
        margin: timedelta = timedelta(0),
    ) -> None:
        super().__init__(engine, source, lease_seconds=lease_seconds)
        self._options = options
        self._dates = None if dates is None else sorted(set(dates))
        self._margin = margin

    def cursor(self) -> dict[str, Any]:
        return self._load_cursor({"next": {}, "open": []})

    def discover(self) -> DiscoveryResult:
        client = consumer(self._options)
        try:
            topics = list_partitions(client, self._options)
            found = [(t, p) for t, count in sorted(topics.items()) for p in range(count)]
            if self._dates is not None:
                return self._discover_days(client, found)
            seen = self.cursor()["next"]
            new = [tp for tp in found if partition_path(tp) not in seen]
            starts = start_offsets(client, self._options, new) if new else {}
        finally:
            client.close()
        # The cursor is read again and written under the source's cursor lock, with the
        # splits: a bounded run closing open splits meanwhile is never undone by this tick.
        with self._engine.begin() as conn:
            _lock_cursor(conn, self._source)
            cursor = self.cursor()
            known: dict[str, int] = dict(cursor["next"])
            for tp, offset in starts.items():
                known.setdefault(partition_path(tp), offset)
            opened = set(cursor["open"])
            added = [
                StreamSplit(self._source, KIND, partition_path(tp), known[partition_path(tp)], None)
                for tp in found
                if partition_path(tp) not in opened
            ]
            registered = len(SplitStore.insert(conn, added))
            opened.update(s.path for s in added)
            state = {"next": known, "open": sorted(opened)}
            self.save_cursor(state, conn)
        return DiscoveryResult(len(found), registered, state, seen_unit="partitions")

    def _discover_days(self, client: Consumer, found: list[tuple[str, int]]) -> DiscoveryResult:
        """The day splits of ``dates`` (see the module docstring)."""
        assert self._dates is not None
        marks = watermarks(client, self._options, found)
        added, notes = [], []
        for day in self._dates:
            begin = datetime.combine(day, time(), UTC) - self._margin
            end = begin + timedelta(days=1) + 2 * self._margin
            low = timestamp_offsets(client, self._options, marks, _millis(begin))
            high = timestamp_offsets(client, self._options, marks, _millis(end))
            day_splits = [
                StreamSplit(self._source, KIND, day_path(*tp, day), low[tp], high[tp], day)
                for tp in found
                if high[tp] > low[tp]
            ]
            if len(day_splits) < len(found):
                # Why a user's backfill of D registered little or nothing: the broker's
                # time index (offsets_for_times) puts no message of D's range there.
                notes.append(
                    f"{day}: {len(found) - len(day_splits)} of {len(found)} partition(s) have "
                    f"no message with a timestamp in {begin:%Y-%m-%d %H:%M:%S} .. "
                    f"{end:%Y-%m-%d %H:%M:%S} UTC (the broker's offsets_for_times)"
                )
            added += day_splits
        registered = self._store.register(added)
        if registered < len(added):
            notes.append(
                f"{len(added) - registered} day split(s) were registered before (a run of "
                "that day reads them once; `sluice run --date D --replace` rebuilds the day)"
            )
        return DiscoveryResult(
            len(found), registered, self.cursor(), notes=tuple(notes), seen_unit="partitions"
        )

    def close_open(self) -> int:
        """Close the open splits no run holds at the partitions' end offsets now (a bounded
        run reads up to there); returns how many now have something to read."""
        with self._engine.begin() as conn:
            _lock_cursor(conn, self._source)  # (see discover)
            rows = conn.execute(
                sa.select(
                    splits.c.id, splits.c.uri, splits.c.start_offset, splits.c.committed_offset
                )
                .where(
                    splits.c.source == self._source,
                    splits.c.kind == KIND,
                    splits.c.end_offset.is_(None),
                    splits.c.status == SplitStatus.UNASSIGNED,
                )
                .with_for_update()
            ).all()
            if not rows:
                return 0
            client = consumer(self._options)
            try:
                # (A named topic that is gone fails here, a partition of it below; a pattern's
                # gone topic is retired.)
                topics = list_partitions(client, self._options)
                there = [
                    topic_of(r.uri)
                    for r in rows
                    if topic_of(r.uri)[1] < topics.get(topic_of(r.uri)[0], 0)
                ]
                marks = watermarks(client, self._options, there)
            finally:
                client.close()
            cursor = self.cursor()
            opened = set(cursor["open"])
            closed = 0
            for row in rows:
                resume = (
                    row.committed_offset if row.committed_offset is not None else row.start_offset
                )
                gone = topic_of(row.uri) not in marks
                if gone and self._options.pattern is None:
                    raise ConfigError(
                        "KafkaSource(topics)",
                        f"partition {row.uri} no longer exists (its topic was deleted or "
                        f"created again with fewer partitions) at offset {resume}",
                    )
                if gone:
                    _log.warning(
                        "%s: topic of %s deleted: its open split ends", self._source, row.uri
                    )
                end = resume if gone else max(marks[topic_of(row.uri)][1], resume)
                if end == row.start_offset:  # empty and never read: the next tick opens it again
                    conn.execute(sa.delete(splits).where(splits.c.id == row.id))
                else:
                    conn.execute(
                        sa.update(splits).where(splits.c.id == row.id).values(end_offset=end)
                    )
                    closed += end > resume
                if gone:  # a topic created again under its name starts by KafkaSource(start)
                    cursor["next"].pop(row.uri, None)
                else:
                    cursor["next"][row.uri] = end
                opened.discard(row.uri)
            cursor["open"] = sorted(opened)
            self.save_cursor(cursor, conn)  # with the splits it describes
        _log.info("%s: %d open Kafka splits closed for a bounded run", self._source, len(rows))
        return closed


def _lock_cursor(conn: sa.Connection, source: str) -> None:
    """The source's cursor lock, until ``conn``'s transaction ends (ticks and a bounded
    run's closing of open splits read and write the cursor one after the other)."""
    key = sa.func.hashtext(sa.literal(f"sluice-kafka-cursor:{source}"))
    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(key)))


def _millis(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)
