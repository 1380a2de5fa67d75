"""The Kafka source end to end on real Spark against a real Kafka-protocol broker (Tansu,
started by the test): bounded "available now" runs exactly once over a 4-partition topic
with 2 subtasks (each subtask reads its own 2 partitions at once), the next run only what
was produced since, and the committed offsets back in the consumer group."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from confluent_kafka import TopicPartition
from conftest import TestSettings
from kafka_broker import KafkaBroker, kafka_broker, produce_clicks
from kafka_pipeline import assert_exactly_once, click_pipeline, output_rows

from enumerator_service import splits
from enumerator_service._operations import discover, open_platform
from spark_jobs.connectors.kafka._client import consumer, watermarks
from spark_jobs.connectors.parquet import output_path
from spark_jobs.jobs import run_pipeline
from spark_jobs.pipeline._paths import discovery_of

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    with kafka_broker() as running:
        yield running


def _split_rows(engine: sa.Engine, source: str) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.select(
                    splits.c.uri,
                    splits.c.start_offset,
                    splits.c.end_offset,
                    splits.c.status,
                    splits.c.subtask,
                    splits.c.committed_offset,
                )
                .where(splits.c.source == source)
                .order_by(splits.c.uri, splits.c.start_offset)
            ).all()
        )


def test_bounded_runs_read_each_message_once_and_commit_offsets_to_the_group(
    make_settings: Any, broker: KafkaBroker
) -> None:
    settings: TestSettings = make_settings(parallelism=2)
    platform = open_platform(settings)
    topic = f"clicks_{secrets.token_hex(3)}"
    name = f"kafka_{secrets.token_hex(3)}"
    broker.create_topic(topic, 4)
    try:
        oracle = produce_clicks(broker.bootstrap, topic, range(0, 2000))
        pipeline = click_pipeline(name, broker.bootstrap, topics=[topic])
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 4
        first = run_pipeline(settings, pipeline)
        assert (first.rows_out, first.dead_letters) == (2000, 0)
        rows = _split_rows(platform.engine, name)
        # 4 partitions, 2 subtasks: each read its own 2 (one consumer per subtask).
        assert sorted(r.subtask for r in rows) == [0, 0, 1, 1], rows
        assert {r.status for r in rows} == {"COMPLETED"}
        folder = output_path(pipeline, settings)
        assert_exactly_once(output_rows(folder), oracle)

        # More messages; the next bounded run reads exactly those.
        oracle |= produce_clicks(broker.bootstrap, topic, range(2000, 3000))
        discover(platform, discovery_of(pipeline, settings))
        second = run_pipeline(settings, pipeline)
        assert second.rows_out == 1000
        assert_exactly_once(output_rows(folder), oracle)
        # Nothing new: a third run reads nothing.
        discover(platform, discovery_of(pipeline, settings))
        assert run_pipeline(settings, pipeline).rows_out == 0

        # The group holds the committed offsets: each partition's end.
        options = pipeline.plan.source.options
        client = consumer(options)
        try:
            ends = watermarks(client, options, [(topic, p) for p in range(4)])
            group = client.committed([TopicPartition(topic, p) for p in range(4)], timeout=10)
        finally:
            client.close()
        assert options.group_id == f"sluice-{name}"
        assert {tp.partition: tp.offset for tp in group} == {
            p: ends[(topic, p)][1] for p in range(4)
        }
        assert sum(end for _, end in ends.values()) == 3000
    finally:
        broker.delete_topic(topic)
        platform.close()
