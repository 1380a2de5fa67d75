"""The spec of the Kafka source: what a user writes in a pipeline definition."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Literal

from spark_jobs.pipeline._sources import LatePolicy
from spark_jobs.pipeline._types import Duration, TypeSpec

__all__ = ["KAFKA_TIMESTAMP", "METADATA_FIELDS", "KafkaSource"]

#: The field a message's Kafka timestamp fills (``event_time="kafka_timestamp"``).
KAFKA_TIMESTAMP = "kafka_timestamp"
#: Fields filled from a message's metadata, not from its value, when the schema declares them.
METADATA_FIELDS = ("kafka_topic", "kafka_partition", "kafka_offset", KAFKA_TIMESTAMP, "kafka_key")


@dataclass(frozen=True)
class KafkaSource:
    """Messages of Kafka topics, read with librdkafka (`confluent-kafka`), exactly once.

    Each topic-partition is a split; its state is the offset of the next message to read,
    committed with every checkpoint in the platform database (the source of truth) and
    then, for lag-monitoring tools only, to the consumer group `group_id`. A scheduled or
    CLI run reads what the partitions hold when it starts ("available now") and ends; the
    next run continues where it stopped. A continuous run reads for ever and picks up new
    partitions and topics (`pattern`) as discovery finds them.

    ```python
    from spark_jobs import KafkaSource

    source = KafkaSource(
        topics=["clicks"],
        bootstrap="broker-1:9092,broker-2:9092",
        schema={"event_id": "string", "user_id": "int64", "ts": "timestamp"},
        required=["event_id", "ts"],
        event_time="ts",
    )
    ```

    The fields `kafka_topic`, `kafka_partition`, `kafka_offset` (int64), `kafka_timestamp`
    (timestamp) and `kafka_key` (string or binary) are filled from each message's metadata
    when the schema declares them; `event_time="kafka_timestamp"` declares
    `kafka_timestamp` itself when the schema does not.

    Args:
        topics: A topic name or a list of them (one of `topics` and `pattern`).
        pattern: A regular expression a whole topic name must match; topics created later
            are found by later discoveries.
        bootstrap: `host:port[,host:port…]` of the brokers.
        format: `"json"` (a JSON object per message), `"csv"` (one CSV row per message,
            fields in the order of `columns`) or `"raw"` (the value in field `value`,
            string or binary).
        schema: Field name → type, as for `FileSource`.
        required: As for `FileSource`.
        event_time: A timestamp field, or `"kafka_timestamp"` (the message timestamp); the
            output is then partitioned by event day. `None`: unpartitioned output.
        start: Where a partition seen for the first time starts: `"earliest"`,
            `"latest"`, `"committed"` (the consumer group's committed offset; earliest
            without one) or a timestamp (a `datetime` or ISO-8601 text: the first message
            at or after it).
        group_id: The consumer group offsets are committed to after each checkpoint.
            Default: `sluice-<pipeline>`.
        columns: `format="csv"`: the names of a row's fields in order (default: the schema's
            fields, in order, without the metadata fields).
        on_offset_out_of_range: A split whose next offset is no longer in the partition
            (retention deleted it): `"fail"` (the run fails, naming the partition) or
            `"earliest"` (continue at the earliest offset; the lost messages are counted
            and logged).
        timeout: Seconds a metadata request may take before the broker counts as
            unreachable.
        start_date: First Dagster partition (default: today).
        out_of_orderness: As for `FileSource`.
        idle_timeout: A partition without a message for this long stops holding the
            watermark back (so days complete while a partition is quiet).
        late_records: As for `FileSource`.
    """

    topics: Sequence[str] | str | None = None
    pattern: str | None = None
    bootstrap: str = ""
    format: Literal["json", "csv", "raw"] = "json"
    schema: Mapping[str, TypeSpec] = field(default_factory=dict)
    required: Sequence[str] = ()
    event_time: str | None = None
    start: str | datetime = "earliest"
    group_id: str | None = None
    columns: Sequence[str] | None = None
    on_offset_out_of_range: Literal["fail", "earliest"] = "fail"
    timeout: float = 10.0
    start_date: date | str | None = None
    out_of_orderness: Duration = "5s"
    idle_timeout: Duration = "60s"
    late_records: LatePolicy = "reopen"

    def __post_init__(self) -> None:
        # event_time="kafka_timestamp" needs no declaration of its own.
        schema = self.schema
        implied = self.event_time == KAFKA_TIMESTAMP and isinstance(schema, Mapping)
        if implied and KAFKA_TIMESTAMP not in schema:
            object.__setattr__(self, "schema", {**schema, KAFKA_TIMESTAMP: "timestamp"})
