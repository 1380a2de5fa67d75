"""``bench/e2e.py``: the Kafka latency row — produce to visible in the committed Parquet.

On the invocation's broker, a fresh 4-partition topic and a fresh pipeline (the Kafka rows'
clickstream over a ``KafkaSource``, lookup, Parquet sink), run continuously
(``run_pipeline(continuous=True)`` in a thread, fed by discover + assign as the continuous
sensor does). Once all its splits are being read, a producer on this thread sends events at
``rate`` per second (a burst every ``TICK``) for ``seconds``: event ``lat-<n>``, its
``event_time`` the produce moment (wall clock, UTC), its produce moment also kept here by id.
This producer batches (librdkafka's defaults): a continuous run never stops at a high
watermark, so Tansu's batch quirk does not matter, and one record per batch could not keep up.
A poller thread (``_e2e_latency.Poller``) lists the committed Parquet files (outside the
staging folder) every ``POLL`` s and reads each new one's ``event_id``: a record's latency =
the first poll that saw it minus its produce moment (``time.time``; the poll period adds up
to ``POLL``). Every produced record must be seen exactly once. The run is then cancelled.

Threading: the run and the poller are daemon threads of this module; ``measure_kafka_latency``
joins both before it returns.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from _e2e_common import Context
from _e2e_kafka import PARTITIONS, KafkaTopic, kafka_source
from _e2e_latency import POLL, Latency, Poller
from _e2e_sluice import clickstream_pipeline, sluice_settings
from _harness import forget_source

from enumerator_service import SplitStore, splits
from enumerator_service._operations import Platform, discover

__all__ = ["measure_kafka_latency"]

TICK = 0.05
START_TIMEOUT = 180.0
CATCH_UP = 60.0


class _Files:
    """First-seen time of every ``event_id`` in the committed files under ``root`` (a
    ``Poller``'s look)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.seen: dict[str, float] = {}
        self.duplicates = 0
        self.files: set[Path] = set()

    def look(self, now: float) -> None:
        import pyarrow.parquet as pq

        for path in self.root.rglob("*.parquet"):
            if path in self.files or "_staging" in path.parts:
                continue
            self.files.add(path)
            for event_id in pq.read_table(path, columns=["event_id"]).column(0).to_pylist():
                self.duplicates += event_id in self.seen
                self.seen.setdefault(event_id, now)


def _produce(bootstrap: str, topic: str, rate: float, seconds: float, users: int) -> dict:
    """``event_id`` -> produce time (``time.time``) of each event sent."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    per = max(1, round(rate * TICK))
    sent: dict[str, float] = {}
    start = time.monotonic()
    n = 0
    for tick in range(int(seconds / TICK)):
        time.sleep(max(0.0, start + tick * TICK - time.monotonic()))
        for _ in range(per):
            now = time.time()
            event = {
                "event_id": f"lat-{n:09d}",
                "user_id": 1 + n % users,
                "event_time": datetime.fromtimestamp(now, UTC).replace(tzinfo=None).isoformat(),
                "event_type": "view",
                "amount": 1.0,
            }
            producer.produce(topic, orjson.dumps(event), partition=n % PARTITIONS)
            sent[event["event_id"]] = now
            n += 1
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("Kafka latency: messages left unsent")
    return sent


def _reading(engine: Any, source: str) -> int:
    import sqlalchemy as sa

    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.select(sa.func.count()).where(
                    splits.c.source == source, splits.c.status == "READING"
                )
            ).scalar_one()
        )


def measure_kafka_latency(ctx: Context, topic: KafkaTopic, rate: float, seconds: float) -> Latency:
    """Produce -> visible latency of a continuous Kafka run at ``rate`` events/s."""
    from spark_jobs.jobs import run_pipeline
    from spark_jobs.pipeline._paths import discovery_of

    engine = ctx.platform.engine
    name = f"bench_kafkalat_{uuid.uuid4().hex[:8]}"
    topic_name, run_id = name, f"{name}-c1"
    topic.broker.create_topic(topic_name, PARTITIONS)
    settings = sluice_settings(ctx, 0.0, name).model_copy(
        update={"continuous_poll_seconds": 0.2, "continuous_idle_seconds": 0}
    )
    pipeline = dataclasses.replace(
        clickstream_pipeline(ctx.landing, name, 0),
        source=kafka_source(topic_name, topic.bootstrap),
    )
    platform = Platform(settings, ctx.platform.url, engine)
    store = SplitStore(engine)
    outcome: dict[str, Any] = {}

    def reader() -> None:
        try:
            outcome["summary"] = run_pipeline(settings, pipeline, run_id=run_id, continuous=True)
        except BaseException as exc:  # the cancel at the end; shown if it came earlier
            outcome["error"] = exc

    run = threading.Thread(target=reader, name="kafka-latency-run", daemon=True)
    files = _Files(settings.warehouse_path)
    poller = Poller("kafka-latency-poller", files.look, time.time)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while _reading(engine, name) < PARTITIONS:  # what the continuous sensor does
            discover(platform, discovery_of(pipeline, settings))
            store.assign_to_run(run_id, name, lease_seconds=settings.lease_seconds)
            if not run.is_alive():
                assert "error" not in outcome, outcome
                run.start()
            assert time.monotonic() < deadline, "the Kafka splits were never read"
            time.sleep(0.5)
        poller.start()
        sent = _produce(topic.bootstrap, topic_name, rate, seconds, ctx.args.users)
        poller.catch_up(lambda: len(files.seen) >= len(sent), run, outcome, CATCH_UP)
        load = os.getloadavg()
        extra = files.seen.keys() - sent.keys()
        assert not extra and not files.duplicates, (len(extra), files.duplicates)
    finally:
        poller.stop.set()
        ctx.spark.sparkContext.cancelAllJobs()
        run.join(60)
        forget_source(engine, name)
        shutil.rmtree(settings.warehouse_path, ignore_errors=True)
        topic.broker.delete_topic(topic_name)
    return Latency(
        "Kafka latency: produce -> visible in the committed Parquet (continuous run)",
        [files.seen[k] - at for k, at in sent.items()],
        len(sent) / seconds,
        seconds,
        settings.checkpoint_interval_seconds,
        load,
        note=f"a burst every {TICK:g} s, committed files polled every {POLL:g} s",
    )
