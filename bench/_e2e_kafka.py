"""``bench/e2e.py``: the Kafka rows — Sluice's ``KafkaSource`` against the no-platform ceiling.

Once per invocation (``kafka_topic``): a Tansu broker on 127.0.0.1 (the tests' fixture,
``tests/kafka_broker.py``, in memory) and a 4-partition topic holding the first
``--kafka-events`` lines of the bench's clickstream files (``ctx.files``, the main Sluice
row's input, malformed lines included), round-robin over the partitions. The producer sends
one record per batch, as the fixture's do: Tansu's high watermark is the base offset of a
partition's last *batch* + 1, and both a bounded run and the ceiling stop at the high
watermarks (so producing is slow, ~4k records/s here: hence the cap). The valid events
(an oracle computed here, independently: JSON objects with the required fields, a numeric
amount and an ISO timestamp) are counted while producing.

Then, in the rounds:

- **ceiling** (``kafka: ceiling``): ``kafka_lookup_job`` in ``CORES`` spawned processes
  (partitions split between them): consume to the end offsets with confluent-kafka, one
  ``= ANY`` lookup per batch, Parquet. Its rows must equal the valid events.
- **Sluice** (``kafka: Sluice``): the clickstream example with its source replaced by a
  ``KafkaSource`` over the topic (format json, the same schema, required fields and event
  time), the users lookup, the Parquet sink; a fresh pipeline name (fresh splits and consumer
  group) per round; discover + a bounded run to the end offsets. Rate = messages / wall s;
  rows out and the rows of the committed Parquet files must equal the valid events.

Threading: main thread only; ``KafkaBench.close`` shuts the ceiling's process pool.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import sys
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from _e2e_common import CORES, REQUIRED, Context, Result, console
from _e2e_kafka_ceiling import end_offsets, kafka_lookup_job
from _e2e_procs import timed_run
from _e2e_sluice import _run_pipeline, clickstream_pipeline, sluice_settings
from _harness import verdict_line

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # kafka_broker

__all__ = ["KafkaBench", "KafkaTopic", "kafka_source", "kafka_topic", "kafka_verdicts"]

PARTITIONS = 4
TARGET_KAFKA_VS_CEILING = 0.5  # Sluice's rate over the no-platform ceiling's, at least


@dataclasses.dataclass
class KafkaTopic:
    broker: Any  # tests/kafka_broker.KafkaBroker
    topic: str
    produced: int
    valid: int
    ends: dict[int, int]

    @property
    def bootstrap(self) -> str:
        return str(self.broker.bootstrap)


def valid_event(line: bytes) -> bool:
    """The oracle's view of a line: a JSON object with every required field, a numeric
    ``amount``, an integer ``user_id`` and an ISO-8601 ``event_time``."""
    try:
        event = orjson.loads(line)
        if not isinstance(event, dict) or any(event.get(f) is None for f in REQUIRED):
            return False
        datetime.fromisoformat(event["event_time"])
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return False
    return isinstance(event["user_id"], int) and isinstance(event["amount"], int | float)


def _lines(files: list[Path], limit: int) -> Iterator[bytes]:
    left = limit
    for path in files:
        with path.open("rb") as lines:
            for line in lines:
                if not left:
                    return
                if line := line.rstrip(b"\n"):
                    left -= 1
                    yield line


@contextmanager
def kafka_topic(ctx: Context, limit: int) -> Iterator[KafkaTopic]:
    """A broker and the topic of the bench's first ``limit`` lines; the broker stopped at
    the end (its process group killed)."""
    from kafka_broker import kafka_broker

    with kafka_broker() as broker:
        topic = "bench_clicks"
        broker.create_topic(topic, PARTITIONS)
        producer = broker.producer()
        produced = valid = 0
        with console.status(f"Kafka: producing {limit:,} events to {topic}…"):
            for n, line in enumerate(_lines(ctx.files, limit)):
                while True:
                    try:
                        producer.produce(topic, line, partition=n % PARTITIONS)
                        break
                    except BufferError:
                        producer.poll(0.05)
                produced += 1
                valid += valid_event(line)
            if producer.flush(120) != 0:
                raise RuntimeError("Kafka: messages left unsent")
        ends = end_offsets(broker.bootstrap, topic)
        assert sum(ends.values()) == produced, (ends, produced)
        console.print(
            f"Kafka: Tansu on {broker.bootstrap}, {produced:,} events ({valid:,} valid) in "
            f"{topic} ({PARTITIONS} partitions: {ends})"
        )
        yield KafkaTopic(broker, topic, produced, valid, ends)


def kafka_source(topic: str, bootstrap: str) -> Any:
    """The clickstream's source as a ``KafkaSource`` of ``topic`` (json, same schema)."""
    from examples.clickstream import clickstream
    from spark_jobs import KafkaSource

    files = clickstream.source
    return KafkaSource(
        topics=[topic],
        bootstrap=bootstrap,
        format="json",
        schema=dict(files.schema),
        required=list(files.required),
        event_time=files.event_time,
        start="earliest",
    )


class KafkaBench:
    """The ceiling and Sluice plans over one topic (see the module docstring)."""

    def __init__(self, ctx: Context, topic: KafkaTopic, dsn: str) -> None:
        self.ctx, self.topic, self.dsn = ctx, topic, dsn
        self._pool = ProcessPoolExecutor(CORES, mp_context=multiprocessing.get_context("spawn"))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def plans(self) -> list[tuple[str, Callable[[], Result]]]:
        return [
            ("kafka: ceiling, consume + = ANY + Parquet", self.ceiling),
            ("kafka: Sluice, KafkaSource -> lookup -> Parquet", self.sluice),
        ]

    def ceiling(self) -> Result:
        import shutil

        topic = self.topic
        out = self.ctx.out_root / f"kafka-ceiling-{uuid.uuid4().hex[:8]}"
        shares = [{p: end for p, end in topic.ends.items() if p % CORES == i} for i in range(CORES)]

        def job() -> list[tuple[int, int]]:
            futures = [
                self._pool.submit(
                    kafka_lookup_job, topic.bootstrap, topic.topic, share, str(out / str(i)),
                    self.dsn,
                )
                for i, share in enumerate(shares)
            ]  # fmt: skip
            return [f.result() for f in futures]

        try:
            wall, cpu, _memory, done = timed_run(job)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        rows, queries = sum(r for r, _ in done), sum(q for _, q in done)
        assert rows == topic.valid, f"Kafka ceiling wrote {rows:,} rows, {topic.valid:,} valid"
        return Result(
            None, "kafka-ceiling", f"Kafka ceiling: {CORES} processes, consume, = ANY, Parquet",
            topic.produced, wall, topic.produced / wall, cpu,
            note=f"{queries:,} queries; no Spark, no checkpoints",
        )  # fmt: skip

    def sluice(self) -> Result:
        topic = self.topic
        name = f"bench_kafka_{uuid.uuid4().hex[:10]}"
        settings = sluice_settings(self.ctx, 0.0, name)
        pipeline = dataclasses.replace(
            clickstream_pipeline(self.ctx.landing, name, 0),
            source=kafka_source(topic.topic, topic.bootstrap),
        )
        counted: dict[str, int] = {}

        def verify(settings: Any, summary: Any) -> None:
            counted["rows"] = committed_rows(settings.warehouse_path)
            assert summary.rows_out == topic.valid == counted["rows"], (
                f"Kafka: {summary.rows_out:,} rows out, {counted['rows']:,} in the committed "
                f"Parquet files, {topic.valid:,} valid events produced"
            )

        summary, wall, cpu, memory = _run_pipeline(self.ctx, settings, pipeline, verify)
        return Result(
            None, "kafka", "Kafka Sluice: KafkaSource -> lookup -> Parquet", topic.produced,
            wall, topic.produced / wall, cpu, memory.worker_mib, memory.driver_mib,
            f"{summary.checkpoints} ckpts (p50 {summary.checkpoint_p50_ms:.0f} ms), "
            f"{summary.lookup_queries:,} queries, {summary.dead_letters:,} dead letters; "
            "rows == valid events (checked)",
            postgres_cpu=memory.postgres_cpu, checkpoint_p50_ms=summary.checkpoint_p50_ms,
        )  # fmt: skip


def committed_rows(warehouse: Path) -> int:
    """Rows of the committed Parquet files under ``warehouse`` (not the staging folder)."""
    import pyarrow.parquet as pq

    return sum(
        pq.ParquetFile(path).metadata.num_rows
        for path in warehouse.rglob("*.parquet")
        if "_staging" not in path.parts
    )


def kafka_verdicts(results: list[Result]) -> list[str]:
    sluice = next((r for r in results if r.kind == "kafka"), None)
    ceiling = next((r for r in results if r.kind == "kafka-ceiling"), None)
    if sluice is None or ceiling is None:
        return [
            verdict_line(None, "Kafka source -> lookup -> Parquet vs its ceiling (not measured)")
        ]
    ratio = sluice.rate / ceiling.rate
    return [
        verdict_line(
            ratio >= TARGET_KAFKA_VS_CEILING,
            f"Kafka: {sluice.events:,} messages -> lookup -> Parquet at {sluice.rate:,.0f}/s = "
            f"{ratio:.2f}x the no-platform ceiling ({ceiling.rate:,.0f}/s, {CORES} processes; "
            f"target >= {TARGET_KAFKA_VS_CEILING:g}x; medians of this invocation)",
        )
    ]
