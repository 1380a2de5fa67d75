"""The Kafka split reader: every partition a subtask holds, read at once by one consumer.

A split ``[start, end)`` of ``"<topic>/<partition>"`` is read from its resume offset; ``end``
None: for ever. The reader is a whole :class:`~spark_jobs.source.SplitReader` (the fetcher
hands it every split it pulls, not one at a time: an unbounded partition must not starve the
others), backed by one librdkafka ``Consumer`` that is ``assign``\\ ed every partition with
its offset — no group subscription, no rebalancing, no automatic commit. Each ``fetch`` takes
what librdkafka has queued (up to ``batch_messages``), or, when nothing is, waits at most
``poll_seconds`` for the first message, and returns one block per partition that had some
(records tagged by their split id; a record's offset is its Kafka offset, a block ``[first,
last + 1)``, so the split's state is the next offset to read) and the bounded splits it
finished (next offset ≥ ``end``, or the partition's end reached past it).
Two splits of one partition are read one after the other.

JSON messages of a block are decoded in one Arrow parse (``_json_block``), falling back to
message by message (``MessageDecoder``) where that cannot be proven equal.

A day split (``"<topic>/<partition>@D"``, a backfill's) keeps only the records of event day
D (the event-time field's day; a dead letter's: its Kafka timestamp's) — its offset range is
a little wider than the day. A main-line split has no landing day: its dead letters carry
their Kafka timestamp's day (``ParsedBlock.dead_days``), which they count on.

Backlog: each fetch also says which splits are *behind* (their partition's end offset
known from the last fetch response is past their next offset): the emitter never counts
such a split idle, so a partition whose fetches stall with unread messages keeps holding the
watermark (``RecordsWithSplitIds.behind``).

Restore: a split's ``pending`` ranges (in flight at the restored checkpoint) are re-read
first, one at a time, by a consumer of their own, as blocks marked ``replay``.

Errors: a partition that disappears (a deleted topic) fails the task with one line naming
it. An offset no longer in the partition (retention passed it): ``on_offset_out_of_range``
``"fail"`` fails the task naming partition and offset; ``"earliest"`` continues at the
earliest offset; the lost messages are logged, counted (``lost``, per split) and recorded as
one dead letter per gap (category ``lost``).

Threading: ``add_split``, ``has_splits``, ``fetch`` and ``close`` run on the one fetcher
thread; ``wake_up`` may be called from any thread (a ``fetch`` returns within
``poll_seconds``: librdkafka's poll cannot be interrupted).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import date
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from enumerator_service import SplitAssignment
from spark_jobs._dead_letters import LOST
from spark_jobs.connectors.kafka._client import READING, consume_ready, consumer, watermarks
from spark_jobs.connectors.kafka._decode import MessageDecoder
from spark_jobs.connectors.kafka._json_block import JsonBlockDecoder
from spark_jobs.connectors.kafka._options import KafkaOptions, day_of, topic_of
from spark_jobs.source._batch import DeadLetter, ParsedBlock, RecordSchema
from spark_jobs.source._convert import new_block
from spark_jobs.source._format_router import replay_reads
from spark_jobs.source._records import RecordsWithSplitIds, SplitRead

__all__ = ["KafkaSplitReader", "PartitionGoneError"]

_log = logging.getLogger(__name__)
_Key = tuple[str, int]


class PartitionGoneError(RuntimeError):
    """A partition being read no longer exists, or its next offset does not: every retry
    would fail the same way, so the run stops at once (one line)."""

    deterministic = True


@dataclass(slots=True)
class _Read:
    split_id: int
    topic: str
    partition: int
    next: int
    stop: int | None
    replay: bool = False
    entry: int = 0
    #: A day split's day: only records of that event day are kept.
    day: date | None = None

    @property
    def key(self) -> _Key:
        return (self.topic, self.partition)

    def done(self, eof: int | None) -> bool:
        """Bounded and at its end (or the partition's end is at or past it)."""
        if self.stop is None:
            return False
        return self.next >= self.stop or (eof is not None and eof >= self.stop)


class KafkaSplitReader:
    """Reads all its splits at once (see the module docstring)."""

    def __init__(
        self,
        schema: RecordSchema,
        options: KafkaOptions,
        *,
        max_bytes: int,
        batch_messages: int = 5000,
        poll_seconds: float = 0.2,
        check_seconds: float = 5.0,
    ) -> None:
        self._schema = schema
        self._options = options
        self._decoder = MessageDecoder(schema, options.format, options.columns, max_bytes)
        self._blocks = JsonBlockDecoder(schema, max_bytes, self._decoder)
        self._blocks.usable &= options.format == "json"
        self._batch = batch_messages
        self._poll = poll_seconds
        self._reads: dict[_Key, _Read] = {}  # assigned to the consumer
        self._waiting: deque[_Read] = deque()  # a later split of a partition being read
        self._replays: deque[_Read] = deque()
        self._finished: list[int] = []
        self._gaps: list[ParsedBlock] = []  # lost ranges (on_offset_out_of_range="earliest")
        self._consumer: Consumer | None = None
        self._replayer: Consumer | None = None
        self._woken = threading.Event()
        self._check = check_seconds
        self._next_check = time.monotonic() + check_seconds
        #: Messages skipped per split by ``on_offset_out_of_range="earliest"``.
        self.lost: dict[int, int] = {}

    # -- splits --------------------------------------------------------------------------

    def add_split(self, assignment: SplitAssignment) -> None:
        split = assignment.split
        topic, partition = topic_of(split.path)
        day = day_of(split.path)
        for replay in replay_reads(assignment):
            self._replays.append(_of(replay, topic, partition, day))
        read = _Read(assignment.split_id, topic, partition, assignment.resume_offset, split.end)
        read.day = day
        if read.done(None):
            self._finished.append(read.split_id)
        elif read.key in self._reads or any(w.key == read.key for w in self._waiting):
            self._waiting.append(read)
        else:
            self._assign(read)

    def has_splits(self) -> bool:
        return bool(self._reads or self._waiting or self._replays or self._finished)

    def _assign(self, read: _Read) -> None:
        self._reads[read.key] = read
        client = self._open()
        client.incremental_assign([TopicPartition(read.topic, read.partition, read.next)])

    def _release(self, read: _Read) -> None:
        del self._reads[read.key]
        self._open().incremental_unassign([TopicPartition(read.topic, read.partition)])
        for waiting in list(self._waiting):
            if waiting.key == read.key:
                self._waiting.remove(waiting)
                self._assign(waiting)
                break

    def _open(self) -> Consumer:
        if self._consumer is None:
            self._consumer = consumer(self._options, **READING)
        return self._consumer

    # -- fetching ------------------------------------------------------------------------

    def fetch(self) -> RecordsWithSplitIds:
        self._woken.clear()
        batch = RecordsWithSplitIds()
        if self._finished:
            batch.finished, self._finished = self._finished, []
            return batch
        if self._replays:
            return self._replay(batch)
        if not self._reads:
            return batch
        self._check_partitions(batch)
        messages, eofs = self._poll_messages(self._open(), self._reads)
        batch.blocks.extend(self._gaps)  # (before the blocks that follow them)
        self._gaps.clear()
        for key, read in list(self._reads.items()):
            block = self._block(read, messages.get(key, ()))
            if block is not None:
                batch.blocks.append(block)
            if read.done(eofs.get(key)):
                if read.stop is not None and read.next < read.stop:
                    # Nothing left below ``stop`` (compacted, or transaction markers).
                    batch.blocks.append(self._empty(read, read.stop))
                self._release(read)
                batch.finished.append(read.split_id)
        batch.behind = self._behind()
        return batch

    def _behind(self) -> frozenset[int]:
        """The splits with a known backlog: their partition's end offset as of the last fetch
        response (``get_watermark_offsets(cached=True)``: no request, unknown before the
        first response) is past their next offset. Told to the emitter, which never counts
        such a split idle however long its fetches stall (a partition with unread messages
        that went idle would let the watermark pass them; they would arrive late)."""
        client = self._open()
        ends: dict[_Key, int] = {}
        for read in self._reads.values():
            try:
                _, high = client.get_watermark_offsets(
                    TopicPartition(read.topic, read.partition), cached=True
                )
            except KafkaException:
                continue  # nothing known about it yet
            if high is not None and high >= 0:
                ends[read.key] = high
        reads = [*self._reads.values(), *self._waiting]
        return frozenset(
            r.split_id
            for r in reads
            if r.key in ends
            and r.next < (ends[r.key] if r.stop is None else min(ends[r.key], r.stop))
        )

    def _check_partitions(self, batch: RecordsWithSplitIds) -> None:
        """Every ``check_seconds``: is each partition being read still there? (A consumer
        assigned a deleted partition may just get nothing.) Gone: a named topic's, or a
        bounded split's, fails the task; a pattern's open split ends where it is (its topic
        was retired: a warning says so)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self._check
        client = self._open()
        for topic in sorted({read.topic for read in self._reads.values()}):
            try:
                found = client.list_topics(topic, timeout=self._options.timeout).topics.get(topic)
            except KafkaException:
                return  # unreachable for now: librdkafka keeps trying, the next check too
            if found is not None and found.error is not None:
                if found.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue  # e.g. no leader right now
                found = None
            for read in [r for r in self._reads.values() if r.topic == topic]:
                if found is not None and read.partition in found.partitions:
                    continue
                where = f"{read.topic}/{read.partition}"
                if self._options.pattern is None or read.stop is not None:
                    raise PartitionGoneError(
                        f"KafkaSource(topics): partition {where} no longer exists (deleted "
                        f"while it was read, at offset {read.next})"
                    )
                _log.warning(
                    "KafkaSource: topic of %s deleted; its open split ends at offset %d "
                    "(messages it had and were not read are lost)", where, read.next,
                )  # fmt: skip
                self._release(read)
                batch.finished.append(read.split_id)

    def _poll_messages(
        self, client: Consumer, reads: dict[_Key, _Read]
    ) -> tuple[dict[_Key, list[Message]], dict[_Key, int]]:
        messages: dict[_Key, list[Message]] = {}
        eofs: dict[_Key, int] = {}
        for message in consume_ready(client, self._batch, self._poll):
            error = message.error()
            # (An error of no partition — the client's own — has no topic: key ("", -1).)
            key = (message.topic() or "", _or(message.partition(), -1))
            if error is None:
                messages.setdefault(key, []).append(message)
            elif error.code() == KafkaError._PARTITION_EOF:
                eofs[key] = _or(message.offset(), -1)
            else:
                self._failed(client, reads, key, error)
        return messages, eofs

    def _failed(
        self, client: Consumer, reads: dict[_Key, _Read], key: _Key, error: KafkaError
    ) -> None:
        read = reads.get(key)
        where = f"{key[0]}/{key[1]}"
        code = error.code()
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
                    KafkaError._UNKNOWN_TOPIC):  # fmt: skip
            raise PartitionGoneError(
                f"KafkaSource(topics): partition {where} no longer exists (deleted while it "
                f"was read): {error.str()}"
            )
        if code == KafkaError._AUTO_OFFSET_RESET and read is not None:
            if self._options.on_offset_out_of_range == "fail":
                raise PartitionGoneError(
                    f"KafkaSource(on_offset_out_of_range): offset {read.next} of {where} is "
                    "no longer in the partition (retention passed it); policy 'fail' — "
                    "'earliest' would continue at the earliest offset and lose the messages"
                )
            low, _ = watermarks(client, self._options, [key])[key]
            lost = max(0, low - read.next)
            self.lost[read.split_id] = self.lost.get(read.split_id, 0) + lost
            _log.warning(
                "KafkaSource: offset %d of %s is out of range; continuing at the earliest "
                "offset %d (on_offset_out_of_range='earliest'): %d messages lost",
                read.next, where, low, lost,
            )  # fmt: skip
            if lost and not read.replay:
                # One dead letter per gap: the loss is in the platform's counts, not only
                # in a log (category ``lost``, at the first lost offset).
                reason = (
                    f"{LOST}: {lost} messages (offsets {read.next}-{low - 1} of {where}) "
                    "deleted by retention before they were read"
                )
                dead: list[DeadLetter] = [(read.next, b"", reason)]
                rows = self._decoder.converter.empty()
                self._gaps.append(
                    new_block(self._schema, read.split_id, read.next, low, rows, dead)
                )
            read.next = low
            client.incremental_unassign([TopicPartition(*key)])
            client.incremental_assign([TopicPartition(key[0], key[1], read.next)])
            return
        if error.fatal() or not error.retriable():
            raise PartitionGoneError(f"KafkaSource: reading {where} failed: {error.str()}")
        _log.info("KafkaSource: %s: %s (retried by librdkafka)", where, error.str())

    def _block(self, read: _Read, messages: Any) -> ParsedBlock | None:
        kept: list[Message] = []
        for message in messages:
            offset = message.offset()
            if offset < read.next:
                continue  # delivered again after a seek
            if read.stop is not None and offset >= read.stop:
                break
            kept.append(message)
        if not kept:
            return None
        start = read.next
        read.next = _or(kept[-1].offset(), read.next - 1) + 1
        # A day split filters message by message; anything else tries one Arrow parse.
        decoded = None if read.day is not None else self._blocks.decode(kept)
        batch, dead = decoded if decoded is not None else self._decoder.decode_each(kept, read.day)
        block = new_block(self._schema, read.split_id, start, read.next, batch, dead)
        if block.dead and read.day is None:
            # The main line has no landing day: its dead letters count on their timestamp's.
            by_offset = {message.offset(): message for message in kept}
            block.dead_days = [
                self._decoder.timestamp_day(by_offset[offset]) for offset, _, _ in block.dead
            ]
        if read.replay:
            block.replay, block.replay_entry = True, read.entry
        return block

    def _empty(self, read: _Read, end: int) -> ParsedBlock:
        start, read.next = read.next, end
        rows = self._decoder.converter.empty()
        return new_block(self._schema, read.split_id, start, end, rows, [])

    def _replay(self, batch: RecordsWithSplitIds) -> RecordsWithSplitIds:
        """One block of the first pending range, read by a consumer of its own."""
        read = self._replays[0]
        if self._replayer is None:
            self._replayer = consumer(self._options, **READING)
            self._replayer.incremental_assign(
                [TopicPartition(read.topic, read.partition, read.next)]
            )
        messages, eofs = self._poll_messages(self._replayer, {read.key: read})
        block = self._block(read, messages.get(read.key, ()))
        if block is not None:
            batch.blocks.append(block)
        if read.done(eofs.get(read.key)):
            self._replays.popleft()
            self._replayer.close()
            self._replayer = None
        return batch

    def wake_up(self) -> None:
        self._woken.set()

    def close(self) -> None:
        for client in (self._consumer, self._replayer):
            if client is not None:
                client.close()
        self._consumer = self._replayer = None
        self._reads.clear()
        self._waiting.clear()
        self._replays.clear()


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _of(read: SplitRead, topic: str, partition: int, day: date | None) -> _Read:
    return _Read(read.split_id, topic, partition, read.resume, read.stop, True, read.entry, day)
