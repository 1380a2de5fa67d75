"""What ``sluice status`` shows of a Kafka source: its message lag, asked of the broker.

A split counts in the status backlog until a run reads it, but an open partition split
(``[next, ∞)``) may hold nothing new: the number that says how far behind the pipeline is
is the *message lag* — per partition, the broker's end offset now minus Sluice's position
(its latest main-line split's committed offset, or that split's start when nothing of it
committed yet, else the enumerator cursor's next offset), summed; the figure consumer-lag
tools show, from the source of truth rather than the consumer group (which Sluice only
updates after each checkpoint). A partition no tick has seen yet is counted from where the
next ``discover`` will start it (``KafkaSource(start)``: with ``earliest``, all its
messages), and named apart. Day splits (a backfill's) are not the main line and do not
count.

An unreachable broker or a missing topic is not a failure of ``sluice status``: the result
says so in one line (``kafka_unknown``) and the rest of the status is shown.

Threading: blocks on Postgres and on the broker (bounded by ``KafkaSource(timeout)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import distinct_on

from enumerator_service import ConfigError, splits
from spark_jobs.connectors.kafka._client import (
    consumer,
    list_partitions,
    start_offsets,
    watermarks,
)
from spark_jobs.connectors.kafka._enumerator import KIND, KafkaEnumerator
from spark_jobs.connectors.kafka._options import KafkaOptions, partition_path, topic_of

__all__ = ["kafka_status", "main_line_offsets"]


def main_line_offsets(conn: sa.Connection, source: str, *, committed: bool) -> dict[str, int]:
    """Per partition path, from its latest main-line split (day splits left out):
    ``committed`` — the committed offset of the latest split with one (what the consumer
    group is told); else the offset the pipeline reads next (the latest split's committed
    offset, or its start when nothing of it committed yet)."""
    offset = (
        splits.c.committed_offset
        if committed
        else sa.func.coalesce(splits.c.committed_offset, splits.c.start_offset)
    )
    stmt = (
        sa.select(splits.c.uri, offset)
        .where(
            splits.c.source == source,
            splits.c.kind == KIND,
            sa.not_(splits.c.uri.contains("@")),  # the main line, not day splits
        )
        .order_by(splits.c.uri, splits.c.start_offset.desc())
        .ext(distinct_on(splits.c.uri))
    )
    if committed:
        stmt = stmt.where(splits.c.committed_offset.is_not(None))
    return {uri: int(value) for uri, value in conn.execute(stmt).all()}


def kafka_status(conn: sa.Connection, source: str, options: KafkaOptions) -> Mapping[str, Any]:
    """``kafka_lag_messages`` (total), ``kafka_lag`` (per partition),
    ``kafka_partitions`` (every partition the source reads now) and
    ``kafka_partitions_unseen`` (no tick has given them a position yet: counted from their
    start); or ``kafka_unknown``: why the broker could not say."""
    at = {
        **KafkaEnumerator(conn.engine, source, options).cursor()["next"],
        **main_line_offsets(conn, source, committed=False),
    }
    try:
        client = consumer(options)
        try:
            topics = list_partitions(client, options)
            found = [(t, p) for t, count in sorted(topics.items()) for p in range(count)]
            ends = watermarks(client, options, found)
            unseen = [tp for tp in found if partition_path(tp) not in at]
            starts = start_offsets(client, options, unseen) if unseen else {}
        finally:
            client.close()
    except ConfigError as exc:
        return {"kafka_unknown": str(exc)}
    at.update({partition_path(tp): offset for tp, offset in starts.items()})
    lag = {
        path: max(ends[topic_of(path)][1] - int(offset), 0)
        for path, offset in sorted(at.items())
        if topic_of(path) in ends
    }
    return {
        "kafka_lag_messages": sum(lag.values()),
        "kafka_lag": lag,
        "kafka_partitions": len(found),
        "kafka_partitions_unseen": len(unseen),
    }
