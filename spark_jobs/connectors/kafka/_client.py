"""librdkafka clients of the Kafka source: configuration, metadata, offsets, group commits.

Every call is bounded by the source's ``timeout`` (an unreachable broker is a one-line
:class:`~enumerator_service.ConfigError` naming ``KafkaSource(bootstrap)``, never a hang).
No consumer here joins a group: partitions are ``assign``\\ ed with explicit offsets and
``enable.auto.commit`` is off; the group only receives the offsets committed after a
checkpoint completed (for lag-monitoring tools).

Threading: a client belongs to the thread that made it (the enumerator's, the coordinator's
or a fetcher thread); the functions block on the network.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from enumerator_service import ConfigError, ServerUnreachable
from spark_jobs.connectors.kafka._options import KafkaOptions

__all__ = [
    "READING",
    "committed_offsets",
    "consume_ready",
    "consumer",
    "list_partitions",
    "start_offsets",
    "watermarks",
]

#: librdkafka's own log lines (connection refused, …) go to this logger, not to stderr.
_log = logging.getLogger("sluice.kafka")


class _DebugLog:
    """librdkafka's log lines, all at DEBUG on ``sluice.kafka``. An unreachable broker makes
    librdkafka log a FAIL line per reconnect (~100 within a metadata probe's timeout) at its
    own level ERROR; what matters reaches the caller as a KafkaException, said in one line
    (:func:`_unreachable`, a reader's error). Threading: called on the thread polling the
    client; stateless."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        _log.debug(msg, *args)


#: The split readers' consumers' settings. ``fetch.wait.max.ms``: how long the broker may
#: hold a fetch of a caught-up partition (librdkafka's default: 500 ms): a record produced
#: meanwhile waits for the answer (Tansu: ~140 ms at the median at 500, ~40 ms at 200; at 50,
#: ~15 ms, but draining a backlog was up to 2x slower in some runs).
READING = {"enable.partition.eof": True, "auto.offset.reset": "error", "fetch.wait.max.ms": 200}
#: Seconds a read waits for more messages once it has some: blocks big enough that their
#: per-block costs (a lookup query, Arrow, a mailbox hop) stay small, at a bounded latency.
LINGER_SECONDS = 0.05

_BOOTSTRAP = "KafkaSource(bootstrap)"
_TOPICS = "KafkaSource(topics)"


def consumer(options: KafkaOptions, **extra: Any) -> Consumer:
    """A consumer of the source's brokers that never commits by itself."""
    timeout_ms = int(options.timeout * 1000)
    config: dict[str, Any] = {
        "bootstrap.servers": options.bootstrap,
        "group.id": options.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "socket.timeout.ms": max(timeout_ms, 10),
        "isolation.level": "read_committed",
        "logger": _DebugLog(),
    }
    config.update(extra)
    return Consumer(config)


def consume_ready(client: Consumer, most: int, timeout: float) -> list[Message]:
    """Up to ``most`` messages (and events): what arrives within ``LINGER_SECONDS``; when
    nothing does, the first within ``timeout`` s and what follows it within the linger.
    (``consume`` of n waits out its whole timeout unless n arrive: with the poll timeout, a
    caught-up reader held each record back by up to that timeout.)"""
    messages = client.consume(most, timeout=min(LINGER_SECONDS, timeout))
    if not messages:
        messages = client.consume(1, timeout=timeout)
        if messages and most > 1:
            messages += client.consume(most - 1, timeout=min(LINGER_SECONDS, timeout))
    return messages


def _unreachable(options: KafkaOptions, exc: BaseException) -> ServerUnreachable:
    detail = exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError) else str(exc)
    return ServerUnreachable(
        _BOOTSTRAP,
        f"no answer from {options.bootstrap} within {options.timeout:g} s: {detail}",
    )


def list_partitions(client: Consumer, options: KafkaOptions) -> dict[str, int]:
    """The source's topics and their partition counts. A named topic that does not exist
    is a ConfigError naming ``KafkaSource(topics)`` (a pattern may match none yet)."""
    try:
        metadata = client.list_topics(timeout=options.timeout)
    except KafkaException as exc:
        raise _unreachable(options, exc) from None
    found: dict[str, int] = {}
    for name, topic in metadata.topics.items():
        if name.startswith("__") or not options.matches(name):
            continue
        if topic.error is not None or not topic.partitions:
            continue
        found[name] = len(topic.partitions)
    missing = [t for t in options.topics if t not in found]
    if missing:
        raise ConfigError(
            _TOPICS, f"topic {', '.join(missing)} does not exist on {options.bootstrap}"
        )
    return found


def watermarks(
    client: Consumer, options: KafkaOptions, partitions: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], tuple[int, int]]:
    """(earliest, end) offsets per partition, asked of the broker now."""
    out = {}
    for topic, partition in partitions:
        try:
            low, high = client.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=options.timeout, cached=False
            )
        except KafkaException as exc:
            raise _unreachable(options, exc) from None
        out[(topic, partition)] = (int(low), int(high))
    return out


def committed_offsets(
    client: Consumer, options: KafkaOptions, partitions: Iterable[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """The consumer group's committed offsets (partitions without one are left out)."""
    asked = [TopicPartition(t, p) for t, p in partitions]
    if not asked:
        return {}
    try:
        answered = client.committed(asked, timeout=options.timeout)
    except KafkaException as exc:
        raise _unreachable(options, exc) from None
    return {(tp.topic, tp.partition): tp.offset for tp in answered if tp.offset >= 0}


def start_offsets(
    client: Consumer, options: KafkaOptions, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """Where partitions seen for the first time start (``KafkaSource(start)``)."""
    marks = watermarks(client, options, partitions)
    start = options.start
    if start == "earliest":
        return {tp: low for tp, (low, _) in marks.items()}
    if start == "latest":
        return {tp: high for tp, (_, high) in marks.items()}
    if start == "committed":
        group = committed_offsets(client, options, partitions)
        return {tp: max(group.get(tp, low), low) for tp, (low, _) in marks.items()}
    return timestamp_offsets(client, options, marks, int(start))


def timestamp_offsets(
    client: Consumer,
    options: KafkaOptions,
    marks: Mapping[tuple[str, int], tuple[int, int]],
    millis: int,
) -> dict[tuple[str, int], int]:
    """Per partition, the first offset whose timestamp is at or after ``millis`` (the end
    offset when none is)."""
    asked = [TopicPartition(t, p, millis) for t, p in marks]
    try:
        answered = client.offsets_for_times(asked, timeout=options.timeout)
    except KafkaException as exc:
        raise _unreachable(options, exc) from None
    out = {}
    for tp in answered:
        low, high = marks[(tp.topic, tp.partition)]
        out[(tp.topic, tp.partition)] = high if tp.offset < 0 else min(max(tp.offset, low), high)
    return out
