"""The Kafka split reader and enumerator against a real Kafka-protocol broker (Tansu), without
Spark: formats, dead letters (topic, partition, offset, key), resuming and replaying, and bad
input — an unreachable broker, a topic that does not exist, a topic deleted mid-read, offsets
out of range, bad settings."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from confluent_kafka import KafkaError
from kafka_broker import KafkaBroker, kafka_broker, produce_clicks, producer
from kafka_pipeline import click_pipeline

from enumerator_service import ConfigError, ServerUnreachable, SplitAssignment, StreamSplit, splits
from enumerator_service._operations import discover, open_platform
from spark_jobs import KafkaSource, ParquetSink, Pipeline, PipelineDefinitionError
from spark_jobs.connectors.kafka import (
    KafkaConnector,
    KafkaEnumerator,
    KafkaSplitReader,
    PartitionGoneError,
)
from spark_jobs.jobs import run_pipeline
from spark_jobs.jobs._source_reader import record_schema
from spark_jobs.pipeline._paths import discovery_of
from spark_jobs.source import (
    OFFSET,
    HandoffQueue,
    InputStatus,
    RecordEmitter,
    RecordsWithSplitIds,
    SourceReaderBase,
)


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaBroker]:
    with kafka_broker() as running:
        yield running


def _topic(broker: KafkaBroker, partitions: int = 1) -> str:
    name = f"t_{secrets.token_hex(4)}"
    broker.create_topic(name, partitions)
    return name


def _send(
    broker: KafkaBroker, topic: str, messages: list[tuple[bytes | None, bytes | None]]
) -> None:
    sender = producer(broker.bootstrap)
    for key, value in messages:
        sender.produce(topic, value, key=key, partition=0, timestamp=1_777_000_000_000)
    assert sender.flush(10) == 0


def _reader(pipeline: Pipeline, **kwargs: Any) -> KafkaSplitReader:
    source = pipeline.plan.source
    return KafkaSplitReader(record_schema(source), source.options, max_bytes=1 << 20, **kwargs)


def _split(topic: str, start: int, end: int | None, resume: int | None = None, **kw: Any) -> Any:
    split = StreamSplit("s", "kafka", f"{topic}/0", start, end)
    return SplitAssignment(1, split, 1, start if resume is None else resume, **kw)


def _drain(reader: KafkaSplitReader, seconds: float = 10.0) -> tuple[list[Any], list[Any], Any]:
    """(blocks, dead letters, finished split ids) until the reader holds no split."""
    blocks: list[Any] = []
    finished: list[int] = []
    deadline = time.monotonic() + seconds
    while reader.has_splits():
        assert time.monotonic() < deadline, "the reader did not finish its splits"
        batch = reader.fetch()
        blocks.extend(batch.blocks)
        finished.extend(batch.finished)
    dead = [d for b in blocks for d in b.dead]
    return blocks, dead, finished


def test_malformed_messages_are_dead_letters_naming_offset_and_key(broker: KafkaBroker) -> None:
    topic = _topic(broker)
    good = {"event_id": "e-1", "user_id": 7, "event_type": "view", "ts": "2026-05-01T10:00:00"}
    _send(
        broker,
        topic,
        [
            (b"u1", orjson.dumps(good)),  # 0
            (b"u2", b"{not json"),  # 1
            (b"u3", b"\xff\xfe{}"),  # 2: not UTF-8
            (b"u4", b"[1, 2]"),  # 3
            (b"u5", None),  # 4: a tombstone
            (b"u6", orjson.dumps({"user_id": 1, "ts": "2026-05-01T10:00:00"})),  # 5
            (None, orjson.dumps({**good, "event_id": "e-7", "user_id": "x"})),  # 6
            (b"u8", orjson.dumps({**good, "event_id": "e-8"})),  # 7
        ],
    )
    reader = _reader(click_pipeline("p", broker.bootstrap, topics=[topic]))
    reader.add_split(_split(topic, 0, 8))
    blocks, dead, finished = _drain(reader)
    reader.close()
    assert finished == [1] and blocks[-1].end == 8
    rows = [r for b in blocks for r in b.rows.to_pylist()]
    assert [(r["event_id"], r["kafka_partition"], r[OFFSET]) for r in rows] == [
        ("e-1", 0, 0),
        ("e-8", 0, 7),
    ]
    reasons = {offset: reason for offset, _, reason in dead}
    assert sorted(reasons) == [1, 2, 3, 4, 5, 6]
    assert reasons[1].startswith("invalid JSON: ") and reasons[1].endswith("(key 'u2')")
    assert reasons[2] == "invalid UTF-8: the message is not valid UTF-8 text (key 'u3')"
    assert reasons[3] == "wrong type: expected a JSON object, got list (key 'u4')"
    assert reasons[4] == "bad value: the message has no value (a tombstone) (key 'u5')"
    assert reasons[5] == "missing field: event_id (key 'u6')"
    assert reasons[6] == "wrong type: user_id must be an integer"  # no key
    assert {offset: raw for offset, raw, _ in dead}[2] == b"\xff\xfe{}"


def test_csv_and_raw_messages_and_the_kafka_timestamp(broker: KafkaBroker) -> None:
    topic = _topic(broker)
    _send(broker, topic, [(b"k", b"e-1,5\n"), (b"k", b"e-2,x"), (None, b"e-3,6,extra")])
    csv = Pipeline(
        name="csv_p",
        source=KafkaSource(
            topics=topic,
            bootstrap=broker.bootstrap,
            format="csv",
            schema={"event_id": "string", "n": "int32", "kafka_key": "string"},
            event_time="kafka_timestamp",
        ),
        sink=ParquetSink("csv_p"),
    )
    reader = _reader(csv)
    reader.add_split(_split(topic, 0, 3))
    blocks, dead, _ = _drain(reader)
    reader.close()
    rows = [r for b in blocks for r in b.rows.to_pylist()]
    moment = datetime.fromtimestamp(1_777_000_000, tz=UTC)
    assert [(r["event_id"], r["n"], r["kafka_key"], r["kafka_timestamp"]) for r in rows] == [
        ("e-1", 5, "k", moment)
    ]
    assert blocks[0].max_event_time == moment
    assert [(o, r) for o, _, r in dead] == [
        (1, "wrong type: n must be an integer, got 'x' (key 'k')"),
        (2, "bad value: expected 2 fields, got 3"),
    ]
    raw = Pipeline(
        name="raw_p",
        source=KafkaSource(
            topics=topic, bootstrap=broker.bootstrap, format="raw", schema={"value": "binary"}
        ),
        sink=ParquetSink("raw_p"),
    )
    reader = _reader(raw)
    reader.add_split(_split(topic, 0, 3))
    blocks, dead, _ = _drain(reader)
    reader.close()
    assert [r["value"] for b in blocks for r in b.rows.to_pylist()] == [
        b"e-1,5\n",
        b"e-2,x",
        b"e-3,6,extra",
    ]


def test_a_resumed_split_reads_exactly_the_rest_and_replays_its_pending_ranges(
    broker: KafkaBroker,
) -> None:
    topic = _topic(broker)
    produce_clicks(broker.bootstrap, topic, range(50))
    pipeline = click_pipeline("p", broker.bootstrap, topics=[topic])
    reader = _reader(pipeline)
    pending = ({"span": [3, 7]},)
    reader.add_split(_split(topic, 0, 50, resume=20, pending=pending))
    blocks, _, finished = _drain(reader)
    reader.close()
    replayed = [b for b in blocks if b.replay]
    assert [o for b in replayed for o in b.rows.column(OFFSET).to_pylist()] == [3, 4, 5, 6]
    normal = [o for b in blocks if not b.replay for o in b.rows.column(OFFSET).to_pylist()]
    assert normal == list(range(20, 50)) and finished == [1]


class _Metadata:
    def __init__(self, topics: dict[str, Any]) -> None:
        self.topics = topics


def test_a_deleted_topic_fails_a_named_topic_and_ends_a_patterns_open_split(
    broker: KafkaBroker,
) -> None:
    # With Tansu, deleting a topic a librdkafka consumer is assigned crashes the process
    # (SIGSEGV in librdkafka 2.16.1): the deletion is what the reader's metadata check sees,
    # a topic missing from the metadata, with the consumer's calls faked.
    for named in (True, False):
        topic = _topic(broker)
        produce_clicks(broker.bootstrap, topic, range(10))
        where = {"topics": [topic]} if named else {"pattern": f"{topic}.*"}
        reader = _reader(click_pipeline("p", broker.bootstrap, **where), check_seconds=0.0)
        reader.add_split(_split(topic, 0, None))
        rows = 0
        while rows < 10:
            rows += sum(b.rows.num_rows for b in reader.fetch().blocks)
        real = reader._open()
        fake = _Client()
        fake.list_topics = lambda *_, **__: _Metadata({})  # type: ignore[attr-defined]
        reader._consumer = fake  # type: ignore[assignment]
        batch = RecordsWithSplitIds()
        if named:
            message = (
                rf"KafkaSource\(topics\): partition {topic}/0 no longer exists .* at offset 10"
            )
            with pytest.raises(PartitionGoneError, match=message):
                reader._check_partitions(batch)
        else:
            reader._check_partitions(batch)
            assert batch.finished == [1] and not reader.has_splits()  # ended where it was
        reader._consumer = real
        reader.close()


class _Client:
    """A consumer whose partition starts at offset 100 (retention deleted 0-99)."""

    def __init__(self) -> None:
        self.assigned: list[Any] = []

    def get_watermark_offsets(self, *_: Any, **__: Any) -> tuple[int, int]:
        return (100, 150)

    def incremental_unassign(self, _: Any) -> None:
        pass

    def incremental_assign(self, partitions: list[Any]) -> None:
        self.assigned.extend((p.topic, p.partition, p.offset) for p in partitions)


def test_an_offset_out_of_range_fails_or_continues_at_the_earliest_by_policy() -> None:
    # Tansu never answers OFFSET_OUT_OF_RANGE: the reader's handling of librdkafka's
    # _AUTO_OFFSET_RESET error (auto.offset.reset=error) is driven directly.
    error = KafkaError(KafkaError._AUTO_OFFSET_RESET, "offset reset")
    for policy in ("fail", "earliest"):
        pipeline = click_pipeline(
            "p", "127.0.0.1:9", topics=["orders"], on_offset_out_of_range=policy
        )
        reader = _reader(pipeline)
        read = reader._reads  # assigned without a broker: the read is set up by hand
        from spark_jobs.connectors.kafka._reader import _Read

        read[("orders", 3)] = _Read(9, "orders", 3, 40, None)
        client = _Client()
        if policy == "fail":
            with pytest.raises(PartitionGoneError, match=r"offset 40 of orders/3 is no longer"):
                reader._failed(client, read, ("orders", 3), error)  # type: ignore[arg-type]
        else:
            reader._failed(client, read, ("orders", 3), error)  # type: ignore[arg-type]
            assert reader.lost == {9: 60} and client.assigned == [("orders", 3, 100)]
            assert read[("orders", 3)].next == 100
            # Recorded too: a block over the gap with one dead letter (category "lost").
            (gap,) = reader._gaps
            assert (gap.split_id, gap.start, gap.end, gap.rows.num_rows) == (9, 40, 100, 0)
            assert gap.dead == [
                (
                    40,
                    b"",
                    "lost: 60 messages (offsets 40-99 of orders/3) deleted by retention "
                    "before they were read",
                )
            ]


class _Stalled:
    """A consumer whose fetches bring nothing while its partition's end offset, known from the
    last fetch response, is ``end``."""

    def __init__(self, end: int) -> None:
        self.end = end

    def consume(self, *_: Any, **__: Any) -> list[Any]:
        return []

    def get_watermark_offsets(self, _: Any, *, cached: bool = False, **__: Any) -> tuple[int, int]:
        assert cached, "the fetch path never asks the broker for the end offsets"
        return (0, self.end)

    def incremental_assign(self, _: Any) -> None:
        pass

    def incremental_unassign(self, _: Any) -> None:
        pass

    def close(self) -> None:
        pass


class _Output:
    def split_added(self, *_: Any) -> None: ...
    def collect_block(self, *_: Any) -> None: ...
    def dead_letter(self, *_: Any) -> None: ...
    def split_finished(self, *_: Any) -> None: ...
    def split_failed(self, *_: Any) -> None: ...


class _NoThread:
    def start(self) -> None: ...
    def shutdown(self) -> None: ...


def test_a_partition_with_a_backlog_is_never_idle_while_its_fetches_stall() -> None:
    # An open split at offset 40 of a partition whose end is 100: 60 messages wait, and
    # every fetch brings nothing (a slow broker). Idle after 5 s, it would stop holding the
    # watermark back: its 60 messages could then arrive late and reopen their day.
    reader = _reader(click_pipeline("p", "127.0.0.1:9", topics=["orders"]), check_seconds=3600)
    client = _Stalled(end=100)
    reader._consumer = client  # type: ignore[assignment]
    now = [0.0]
    emitter = RecordEmitter(idle_timeout=5.0, clock=lambda: now[0])
    handoff = HandoffQueue(4)
    source = SourceReaderBase(_NoThread(), handoff, emitter)  # type: ignore[arg-type]
    assignment = SplitAssignment(7, StreamSplit("s", "kafka", "orders/0", 0, None), 1, 40)
    reader.add_split(assignment)
    handoff.put(RecordsWithSplitIds(added=[assignment]))

    def fetch_and_emit() -> None:
        handoff.put(reader.fetch())
        while source.poll_next(_Output()) is not InputStatus.NOTHING_AVAILABLE:  # type: ignore[arg-type]
            pass

    for _ in range(4):  # 40 s of fetches that bring nothing
        fetch_and_emit()
        now[0] += 10.0
        assert (source.is_idle(), source.idle_splits()) == (False, []), now
        assert source.watermark() is None  # it still holds the task watermark back
    # Caught up (its backlog went: the end is its next offset): idle 5 s after it was last
    # known behind, as a split that read its last record then.
    client.end = 40
    fetch_and_emit()
    assert not source.is_idle()
    now[0] += 5.0
    assert (source.is_idle(), source.idle_splits()) == (True, [7])
    reader.close()


def test_a_split_is_behind_until_it_has_read_to_its_partitions_end(broker: KafkaBroker) -> None:
    # The real consumer: the end offset known from the last fetch response says whether a
    # split has messages still waiting (no broker request per fetch).
    topic = _topic(broker)
    _send(
        broker,
        topic,
        [
            (b"k", orjson.dumps({"event_id": f"e{i}", "ts": "2026-05-01T00:00:00Z"}))
            for i in range(50)
        ],
    )
    reader = _reader(click_pipeline("p", broker.bootstrap, topics=[topic]), batch_messages=10)
    reader.add_split(_split(topic, 0, None))
    seen: list[tuple[int, bool]] = []
    deadline = time.monotonic() + 20
    read = 0
    while read < 50 or seen[-1][1]:
        assert time.monotonic() < deadline, seen
        batch = reader.fetch()
        read += sum(b.rows.num_rows for b in batch.blocks)
        assert batch.behind is not None
        seen.append((read, 1 in batch.behind))
    # Behind after some but not all messages were read; not behind once all 50 were.
    assert any(behind for n, behind in seen if 0 < n < 50), seen
    assert seen[-1] == (50, False), seen
    reader.close()


def test_bad_settings_and_unreachable_or_missing_input_fail_in_one_line(
    make_settings: Any, broker: KafkaBroker
) -> None:
    def refused(match: str, **source: Any) -> None:
        with pytest.raises(PipelineDefinitionError, match=match):
            _ = click_pipeline("bad", **source).plan

    refused(r"KafkaSource\(bootstrap\)", bootstrap="nowhere", topics=["a"])
    refused(r"KafkaSource\(topics\): give either", bootstrap=broker.bootstrap)
    refused(r"KafkaSource\(topics\): 'a b'", bootstrap=broker.bootstrap, topics=["a b"])
    refused(r"KafkaSource\(pattern\)", bootstrap=broker.bootstrap, pattern="(")
    refused(r"KafkaSource\(start\)", bootstrap=broker.bootstrap, topics="a", start="soon")
    refused(
        r"KafkaSource\(on_offset_out_of_range\)",
        bootstrap=broker.bootstrap,
        topics="a",
        on_offset_out_of_range="skip",
    )
    settings = make_settings()
    platform = open_platform(settings)
    try:
        # Nothing listens on port 9: one line within the timeout, not a hang.
        gone = click_pipeline("p", "127.0.0.1:9", topics=["a"], timeout=1)
        started = time.monotonic()
        with pytest.raises(
            ConfigError, match=r"^KafkaSource\(bootstrap\): no answer from 127.0.0.1:9 within 1 s"
        ):
            discover(platform, discovery_of(gone, settings))
        with pytest.raises(ConfigError, match=r"^KafkaSource\(bootstrap\)"):
            run_pipeline(settings, gone)  # before any Spark task starts
        assert time.monotonic() - started < 10
        # A named topic deleted after discovery: the run stops when it opens, in one line.
        topic = _topic(broker, 2)
        deleted = click_pipeline(f"p_{secrets.token_hex(3)}", broker.bootstrap, topics=[topic])
        assert discover(platform, discovery_of(deleted, settings)).splits_registered == 2
        broker.delete_topic(topic)
        with pytest.raises(ConfigError, match=rf"^KafkaSource\(topics\): topic {topic} does not"):
            run_pipeline(settings, deleted)
        missing = click_pipeline("p", broker.bootstrap, topics=["no_such_topic"])
        with pytest.raises(
            ConfigError, match=r"^KafkaSource\(topics\): topic no_such_topic does not exist"
        ):
            discover(platform, discovery_of(missing, settings))
    finally:
        platform.close()


def test_an_unreachable_broker_is_one_line_without_librdkafka_noise(
    make_settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # librdkafka logs a FAIL line per reconnect at its level ERROR (the CLI printed ~100 of
    # them before its one line): they go at DEBUG, the one ConfigError line says it all.
    settings = make_settings()
    platform = open_platform(settings)
    caplog.set_level(logging.DEBUG)
    try:
        gone = click_pipeline("p", "127.0.0.1:9", topics=["a"], timeout=1)
        with pytest.raises(ConfigError, match=r"^KafkaSource\(bootstrap\): no answer") as e:
            discover(platform, discovery_of(gone, settings))
        assert "\n" not in str(e.value)
        # An outage, not the setting's mistake: the CLI exits 1 (a retry may pass), not 2.
        assert isinstance(e.value, ServerUnreachable)
        noise = [
            r for r in caplog.records if r.name == "sluice.kafka" and r.levelno > logging.DEBUG
        ]
        assert noise == [], [r.getMessage() for r in noise[:3]]
    finally:
        platform.close()


def test_a_bounded_run_closes_open_splits_at_the_end_and_retires_a_deleted_pattern_topic(
    make_settings: Any, broker: KafkaBroker
) -> None:
    settings = make_settings()
    platform = open_platform(settings)
    prefix = f"pt_{secrets.token_hex(3)}"
    kept, retired = f"{prefix}_a", f"{prefix}_b"
    broker.create_topic(kept, 2)
    broker.create_topic(retired, 1)
    produce_clicks(broker.bootstrap, kept, range(40))
    name = f"p_{secrets.token_hex(3)}"
    pipeline = click_pipeline(name, broker.bootstrap, pattern=f"{prefix}_.*")
    try:
        assert discover(platform, discovery_of(pipeline, settings)).splits_registered == 3
        broker.delete_topic(retired)  # (no consumer assigned: Tansu and librdkafka survive)
        connector = KafkaConnector()
        connector.before_assignment(platform.engine, pipeline, settings, continuous=False)
        with platform.engine.connect() as conn:
            rows = conn.execute(
                sa.select(splits.c.uri, splits.c.start_offset, splits.c.end_offset)
                .where(splits.c.source == name)
                .order_by(splits.c.uri)
            ).all()
        # The kept topic's splits end at its partitions' ends (40 messages in all); the
        # deleted topic's empty open split is gone, and its cursor entry with it.
        assert [r.uri for r in rows] == [f"{kept}/0", f"{kept}/1"]
        assert sum(r.end_offset for r in rows) == 40 and all(r.start_offset == 0 for r in rows)
        cursor = KafkaEnumerator(platform.engine, name, pipeline.plan.source.options).cursor()
        assert cursor == {"next": {r.uri: r.end_offset for r in rows}, "open": []}
        # A run of some days, or a continuous run, leaves open splits open.
        discover(platform, discovery_of(pipeline, settings))
        connector.before_assignment(platform.engine, pipeline, settings, continuous=True)
        connector.before_assignment(
            platform.engine,
            pipeline,
            settings,
            continuous=False,
            dates=[datetime(2026, 5, 1).date()],
        )
        with platform.engine.connect() as conn:
            open_splits = conn.execute(
                sa.select(sa.func.count()).where(
                    splits.c.source == name, splits.c.end_offset.is_(None)
                )
            ).scalar()
        assert open_splits == 2
    finally:
        broker.delete_topic(kept)
        platform.close()
