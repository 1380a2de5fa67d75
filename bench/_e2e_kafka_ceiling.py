"""``bench/e2e.py``: the Kafka ceiling — the Kafka row's work without the platform.

The same client (confluent-kafka / librdkafka) in ``CORES`` spawned processes, each assigned
every ``CORES``-th partition of the topic from offset 0 up to the end offsets taken before the
run (no consumer group, no commits), each batch of messages (``consume(BATCH)``) joined into
one block of lines, parsed by ``pyarrow.json`` against the event schema (a malformed message
dropped as the file ceiling drops a malformed line), looked up with one ``= ANY`` query per
batch's distinct user ids (asyncpg, one prepared statement per process) and written to one
Parquet file per process. No Spark, no checkpoints, no split store.

The worker function runs in the child processes; ``kafka_ceiling`` blocks until they are done.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
from _e2e_ceiling import _QUERY, _join, _read

__all__ = ["BATCH", "kafka_lookup_job"]

#: Seconds without any message before the job fails (a stalled broker), not hangs.
STALL_SECONDS = 60.0
#: Messages per ``consume`` call (librdkafka returns fewer when fewer are buffered).
BATCH = 10_000


async def _consume_lookup_write(
    bootstrap: str, topic: str, ends: dict[int, int], out: str, dsn: str
) -> tuple[int, int]:
    import asyncpg
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-ceiling",  # required by the client; never joined or committed
            "enable.auto.commit": False,
            "enable.partition.eof": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
    left = {p: end for p, end in ends.items() if end > 0}
    conn = await asyncpg.connect(dsn)
    writer: pq.ParquetWriter | None = None
    rows = queries = 0
    try:
        statement = await conn.prepare(_QUERY)
        quiet_since = time.monotonic()
        while left:
            messages = consumer.consume(BATCH, timeout=1.0)
            if messages:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > STALL_SECONDS:
                # (Tansu in memory has stalled mid-topic here: fail rather than hang the bench.)
                raise RuntimeError(
                    f"Kafka ceiling: no message for {STALL_SECONDS:g} s, partitions {left} "
                    f"not read to their end of {topic} (the broker stalled)"
                )
            values = []
            for message in messages:
                if message.error() is not None:
                    raise RuntimeError(str(message.error()))
                partition = message.partition()
                if partition in left and message.offset() < left[partition]:
                    values.append(message.value())
                    if message.offset() + 1 >= left[partition]:
                        del left[partition]
            if not values:
                continue
            table = _read(b"\n".join(values) + b"\n")
            if table is None:
                continue
            keys = pc.unique(table.column("user_id").drop_null()).to_pylist()
            arrays = await statement.fetchrow(keys)
            queries += 1
            table = _join(table, arrays)
            writer = writer or pq.ParquetWriter(str(Path(out) / f"{topic}.parquet"), table.schema)
            writer.write_table(table)
            rows += table.num_rows
        return rows, queries
    finally:
        if writer is not None:
            writer.close()
        consumer.close()
        await conn.close()


def kafka_lookup_job(
    bootstrap: str, topic: str, ends: dict[int, int], out: str, dsn: str
) -> tuple[int, int]:
    """Child process: consume ``ends``' partitions of ``topic`` from 0 to their end offsets,
    one ``= ANY`` lookup per batch, write Parquet into the folder ``out`` (created);
    (rows written, queries). Blocks."""
    Path(out).mkdir(parents=True, exist_ok=True)
    return asyncio.run(_consume_lookup_write(bootstrap, topic, ends, out, dsn))


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Each partition's end offset (high watermark) now."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ceiling"})
    try:
        metadata: Any = consumer.list_topics(topic, timeout=10)
        partitions = sorted(metadata.topics[topic].partitions)
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        }
    finally:
        consumer.close()
