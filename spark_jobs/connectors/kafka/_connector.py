"""The Kafka source connector: topic-partitions as stream splits (:class:`KafkaEnumerator`,
:class:`KafkaSplitReader`), offsets committed with the checkpoints, then to the group."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import date, timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from confluent_kafka import Consumer, KafkaException, TopicPartition
from sqlalchemy.engine import Engine

from enumerator_service import EnumeratorDiscovery, Settings, SplitEnumerator
from spark_jobs.connectors._interface import (
    CompletionHook,
    ReaderContext,
    SourceConnector,
    SourceDetails,
)
from spark_jobs.connectors.kafka._client import consumer, list_partitions
from spark_jobs.connectors.kafka._enumerator import KIND, KafkaEnumerator
from spark_jobs.connectors.kafka._options import (
    KafkaOptions,
    check_options,
    partition_path,
    topic_of,
)
from spark_jobs.connectors.kafka._reader import KafkaSplitReader
from spark_jobs.connectors.kafka._status import kafka_status, main_line_offsets

if TYPE_CHECKING:
    from spark_jobs.pipeline._checks import Context
    from spark_jobs.pipeline._definition import Pipeline
    from spark_jobs.pipeline._plan import Plan, SourcePlan
    from spark_jobs.source._batch import RecordSchema
    from spark_jobs.source._format_router import SplitReader
    from spark_jobs.source._records import BlockReader

__all__ = ["KafkaConnector", "KafkaOffsetCommitter"]

_log = logging.getLogger(__name__)


def _options(pipeline: Pipeline) -> KafkaOptions:
    options: KafkaOptions = pipeline.plan.source.options
    return options


class KafkaConnector(SourceConnector):
    name = "kafka"
    split_kinds = (KIND,)
    concurrent_splits = True
    own_day_splits = True

    def validate(self, spec: Any, ctx: Context) -> SourceDetails:
        options = ctx.check(check_options, spec, ctx.pipeline)
        start = spec.start_date
        if isinstance(start, str):
            start = ctx.check(date.fromisoformat, start)
        if start is not None and not isinstance(start, date):
            raise ctx.fail(f"start_date must be a date, got {start!r}")
        return SourceDetails(options, partitioned=spec.event_time is not None, start_date=start)

    def describe(self, plan: SourcePlan, pipeline: str, where: str | None = None) -> str:
        options: KafkaOptions = plan.options
        return f"Kafka {options.where} on {options.bootstrap} ({options.format})"

    def location(self, pipeline: Pipeline, settings: Settings) -> str | None:
        options = _options(pipeline)
        topics = options.pattern if options.pattern is not None else ",".join(options.topics)
        return f"kafka://{options.bootstrap}/{topics}"

    def discovery(self, pipeline: Pipeline, settings: Settings) -> EnumeratorDiscovery:
        options, source = _options(pipeline), pipeline.name
        margin = timedelta(seconds=pipeline.plan.source.out_of_orderness)

        def make(
            engine: Engine, settings: Settings, dates: Sequence[date] | None
        ) -> SplitEnumerator:
            return KafkaEnumerator(
                engine,
                source,
                options,
                lease_seconds=settings.lease_seconds,
                dates=dates,
                margin=margin,
            )

        return EnumeratorDiscovery(source, make)

    def check_catalog(self, conn: sa.Connection, plan: Plan) -> None:
        """When a run opens: the brokers answer and the named topics exist (one line)."""
        options: KafkaOptions = plan.source.options
        client = consumer(options)
        try:
            list_partitions(client, options)
        finally:
            client.close()

    def before_assignment(
        self,
        engine: Engine,
        pipeline: Pipeline,
        settings: Settings,
        *,
        continuous: bool,
        dates: Sequence[date] | None = None,
    ) -> None:
        # A bounded run of all new input reads up to the end offsets as it starts (a run of
        # some days reads their day splits only: the main line is left as it is).
        if not continuous and dates is None:
            KafkaEnumerator(engine, pipeline.name, _options(pipeline)).close_open()

    def completion_hook(
        self, engine: Engine, pipeline: Pipeline, settings: Settings
    ) -> CompletionHook | None:
        return KafkaOffsetCommitter(engine, pipeline.name, _options(pipeline))

    def split_reader(self, schema: RecordSchema, context: ReaderContext) -> BlockReader:
        raise TypeError("Kafka splits are read all at once: use concurrent_reader")

    def concurrent_reader(self, schema: RecordSchema, context: ReaderContext) -> SplitReader:
        if not isinstance(context.options, KafkaOptions):
            raise TypeError("the Kafka split reader needs its options")
        return KafkaSplitReader(schema, context.options, max_bytes=context.max_line_bytes)

    def content_errors(self) -> Sequence[tuple[type[BaseException], str]]:
        return ()

    def source_status(self, conn: sa.Connection, plan: Plan) -> Mapping[str, Any]:
        """The message lag, asked of the broker (``_status``)."""
        return kafka_status(conn, plan.name, plan.source.options)


class KafkaOffsetCommitter(CompletionHook):
    """Commits each partition's committed offset (the latest split's state in Postgres, the
    source of truth) to the consumer group after a checkpoint completed, for lag tools
    (Flink's ``commit.offsets.on.checkpoint``). The commit is asynchronous: a synchronous one
    held the coordinator (the next checkpoint's trigger and completion) for a broker round
    trip per checkpoint (~0.4 s with Tansu). A failure is logged when librdkafka reports it
    (served at the next completion and at ``close``) and its partitions are committed again
    at the next completion. ``close`` waits for the commits in flight.

    Threading: the coordinator's thread; librdkafka's commit callback runs inside this
    thread's ``poll`` / ``close`` calls."""

    def __init__(self, engine: Engine, source: str, options: KafkaOptions) -> None:
        self._engine = engine
        self._source = source
        self._options = options
        self._consumer: Consumer | None = None
        self._sent: dict[str, int] = {}

    def _committed(self, error: KafkaException | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's report of an asynchronous commit."""
        failed = [tp for tp in partitions if error is not None or tp.error is not None]
        for tp in failed:
            self._sent.pop(partition_path((tp.topic, tp.partition)), None)  # sent again next time
        if failed:
            _log.warning(
                "offsets not committed to consumer group %s (lag tools only; retried at the "
                "next checkpoint): %s", self._options.group_id, error or failed[0].error,
            )  # fmt: skip

    def offsets(self) -> dict[str, int]:
        """Per partition path, the committed offset of its latest split."""
        with self._engine.connect() as conn:
            return main_line_offsets(conn, self._source, committed=True)

    def completed(self, checkpoint_id: int) -> None:
        try:
            changed = {p: o for p, o in self.offsets().items() if self._sent.get(p) != o}
            if not changed:
                return
            if self._consumer is None:
                self._consumer = consumer(self._options, on_commit=self._committed)
            self._consumer.poll(0)  # the reports of earlier commits (no partition assigned)
            offsets = [TopicPartition(*topic_of(p), o) for p, o in sorted(changed.items())]
            self._sent.update(changed)
            self._consumer.commit(offsets=offsets, asynchronous=True)
        except (KafkaException, sa.exc.SQLAlchemyError, RuntimeError) as exc:
            _log.warning(
                "checkpoint %d: offsets not committed to consumer group %s (lag tools only; "
                "retried at the next checkpoint): %s",
                checkpoint_id, self._options.group_id, exc,
            )  # fmt: skip

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()  # waits for the commits in flight (reported meanwhile)
            self._consumer = None
