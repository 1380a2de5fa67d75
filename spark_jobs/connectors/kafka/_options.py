"""The Kafka source's validated options, and the checks that make them (pure, any thread)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any

from spark_jobs.connectors.kafka._spec import METADATA_FIELDS

__all__ = [
    "FORMATS",
    "KafkaOptions",
    "check_options",
    "day_of",
    "day_path",
    "partition_path",
    "topic_of",
]

FORMATS = ("json", "csv", "raw")
_START_WORDS = ("earliest", "latest", "committed")
#: Kafka's legal topic names.
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_BOOTSTRAP = re.compile(r"[^\s,/:@]+:[0-9]{1,5}")


@dataclass(frozen=True, slots=True)
class KafkaOptions:
    """What the reader and the enumerator need: topics (or a compiled pattern's text), the
    brokers, the format, where new partitions start, the group, CSV columns, the policy for
    offsets out of range and the metadata timeout. ``start``: a word or epoch milliseconds."""

    topics: tuple[str, ...]
    pattern: str | None
    bootstrap: str
    format: str
    start: str | int
    group_id: str
    columns: tuple[str, ...]
    on_offset_out_of_range: str
    timeout: float

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one of the source's topics."""
        if self.pattern is not None:
            return re.fullmatch(self.pattern, topic) is not None
        return topic in self.topics

    @property
    def where(self) -> str:
        """The topics as people read them."""
        if self.pattern is not None:
            return f"topics matching {self.pattern!r}"
        return "topic " + ", ".join(self.topics)


def topic_of(path: str) -> tuple[str, int]:
    """``"<topic>/<partition>"`` (a split's path; a day split's ends ``@YYYY-MM-DD``) as
    (topic, partition)."""
    topic, _, partition = path.partition("@")[0].rpartition("/")
    return topic, int(partition)


def partition_path(tp: tuple[str, int]) -> str:
    """The path of a main-line split of (topic, partition): ``"<topic>/<partition>"``
    (:func:`topic_of`'s inverse)."""
    return f"{tp[0]}/{tp[1]}"


def day_of(path: str) -> date | None:
    """The day of a day split's path (``"<topic>/<partition>@YYYY-MM-DD"``), else None."""
    _, at, day = path.partition("@")
    return date.fromisoformat(day) if at else None


def day_path(topic: str, partition: int, day: date) -> str:
    """The path of the split of ``day``'s messages of a partition."""
    return f"{topic}/{partition}@{day.isoformat()}"


def _topics(spec: Any) -> tuple[tuple[str, ...], str | None]:
    topics, pattern = spec.topics, spec.pattern
    if (topics is None) == (pattern is None):
        raise ValueError("KafkaSource(topics): give either topics or pattern")
    if pattern is not None:
        if not isinstance(pattern, str) or not pattern:
            raise ValueError("KafkaSource(pattern): must be a non-empty regular expression")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"KafkaSource(pattern): not a regular expression: {exc}") from None
        return (), pattern
    names = (topics,) if isinstance(topics, str) else tuple(topics)
    if not names:
        raise ValueError("KafkaSource(topics): name at least one topic")
    for name in names:
        if not isinstance(name, str) or not _TOPIC.fullmatch(name) or name in (".", ".."):
            raise ValueError(f"KafkaSource(topics): {name!r} is not a Kafka topic name")
    return names, None


def _start(value: object) -> str | int:
    if isinstance(value, str) and value in _START_WORDS:
        return value
    moment = value
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            moment = None
    if not isinstance(moment, datetime):
        words = ", ".join(repr(w) for w in _START_WORDS)
        raise ValueError(f"KafkaSource(start): must be {words} or a timestamp, got {value!r}")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def check_options(spec: Any, pipeline: str) -> KafkaOptions:
    """The options of ``spec``; ValueError (one line naming the setting) when one is wrong."""
    topics, pattern = _topics(spec)
    bootstrap = spec.bootstrap
    if not isinstance(bootstrap, str) or not all(
        _BOOTSTRAP.fullmatch(part.strip()) for part in bootstrap.split(",")
    ):
        raise ValueError(
            f"KafkaSource(bootstrap): must be host:port[,host:port…], got {bootstrap!r}"
        )
    if spec.format not in FORMATS:
        raise ValueError(f"KafkaSource(format): must be one of {FORMATS}, got {spec.format!r}")
    schema: Mapping[str, Any] = spec.schema if isinstance(spec.schema, Mapping) else {}
    value_fields = [name for name in schema if name not in METADATA_FIELDS]
    if spec.format == "raw" and value_fields != ["value"]:
        raise ValueError(
            "KafkaSource(schema): format 'raw' reads the message into field 'value' (and "
            f"metadata fields {', '.join(METADATA_FIELDS)}), got {value_fields}"
        )
    columns = tuple(spec.columns) if spec.columns is not None else tuple(value_fields)
    if spec.columns is not None and spec.format != "csv":
        raise ValueError("KafkaSource(columns): only for format 'csv'")
    if spec.on_offset_out_of_range not in ("fail", "earliest"):
        raise ValueError(
            "KafkaSource(on_offset_out_of_range): must be 'fail' or 'earliest', "
            f"got {spec.on_offset_out_of_range!r}"
        )
    timeout = spec.timeout
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"KafkaSource(timeout): must be a positive number, got {timeout!r}")
    group = spec.group_id if spec.group_id is not None else f"sluice-{pipeline}"
    if not isinstance(group, str) or not group.strip():
        raise ValueError("KafkaSource(group_id): must be a non-empty string")
    return KafkaOptions(
        topics,
        pattern,
        ",".join(part.strip() for part in bootstrap.split(",")),
        spec.format,
        _start(spec.start),
        group,
        _names(columns),
        spec.on_offset_out_of_range,
        float(timeout),
    )


def _names(columns: Sequence[object]) -> tuple[str, ...]:
    if not all(isinstance(c, str) and c for c in columns):
        raise ValueError("KafkaSource(columns): must be field names")
    return tuple(str(c) for c in columns)
