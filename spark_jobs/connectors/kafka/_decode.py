"""Kafka messages → rows of the source's schema, or dead letters (the fetcher thread).

Every format ends in the exact per-record conversion of ``spark_jobs.source._convert``:

- ``json``: the value is one JSON object (orjson); fields by name (JSON rules).
- ``csv``: the value is one CSV row without a header, fields in ``columns`` order (CSV
  rules, exactly as a CSV file's line: ``CsvLinesParser.parse_line``).
- ``raw``: the value (bytes) is field ``value`` (a ``string`` field decodes it as UTF-8).

Metadata fields the schema declares (``kafka_topic``, ``kafka_partition``, ``kafka_offset``,
``kafka_timestamp``, ``kafka_key``) are filled from the message, overriding a field of that
name in the value. A message without a value (a tombstone) is a dead letter. A dead letter
keeps the value's first 4 KiB as its raw bytes; its split names the topic and partition, its
offset is the message's, and its reason ends with the message key (``… (key 'k')``).

Threading: immutable after construction; used by one fetcher thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime
from typing import Any

import orjson
import pyarrow as pa
from confluent_kafka import Message

from spark_jobs._dead_letters import BAD_VALUE, INVALID_JSON, INVALID_UTF8, WRONG_TYPE
from spark_jobs.connectors.kafka._spec import METADATA_FIELDS
from spark_jobs.source._batch import DeadLetter, RecordSchema
from spark_jobs.source._convert import RecordConverter
from spark_jobs.source._csv import CsvLinesParser

__all__ = ["MessageDecoder"]

_RAW_BYTES = 4096


class MessageDecoder:
    """Decodes messages of one format to rows (tuples) of ``schema`` or reasons."""

    def __init__(
        self, schema: RecordSchema, format: str, columns: tuple[str, ...], max_bytes: int
    ) -> None:
        self.converter = RecordConverter(schema)
        self._names = self.converter.names
        self._format = format
        self._meta = [(i, n) for i, n in enumerate(self._names) if n in METADATA_FIELDS]
        self._max = max_bytes
        self._event = self._names.index(schema.event_time) if schema.event_time else None
        self._csv: CsvLinesParser | None = None
        if format == "csv":
            # The value's fields by CSV rules; the metadata fields (no CSV columns) as a
            # row's values; the row assembled by position.
            values = [f for f in schema.fields if f.name not in METADATA_FIELDS]
            meta = [f for f in schema.fields if f.name in METADATA_FIELDS]
            self._csv = CsvLinesParser(_part(schema, values), list(columns), max_bytes)
            self._csv_meta = _part(schema, meta)
            self._csv_places = [self._names.index(f.name) for f in (*values, *meta)]

    def decode(self, message: Message) -> tuple[Any, ...] | str:
        """The row of ``message``, or the dead-letter reason (with its key)."""
        value = message.value()
        if value is None:
            return self._with_key(f"{BAD_VALUE}: the message has no value (a tombstone)", message)
        if self._format == "json":
            parsed = self._json(value, message)
        elif self._format == "csv":
            parsed = self._csv_row(value, message)
        else:
            values: list[Any] = [value if n == "value" else None for n in self._names]
            for i, name in self._meta:
                values[i] = _metadata(message, name, text=False)
            parsed = self.converter.from_values(values)
        return self._with_key(parsed, message) if isinstance(parsed, str) else parsed

    def decode_each(
        self, messages: Sequence[Message], day: date | None
    ) -> tuple[pa.RecordBatch, list[DeadLetter]]:
        """Messages one by one: (their rows, in order, dead letters); ``day``: only the
        records of that event day (a day split's)."""
        rows: list[tuple[Any, ...]] = []
        offsets: list[int] = []
        dead: list[DeadLetter] = []
        for message in messages:
            offset = message.offset()
            assert offset is not None  # a consumed message's
            parsed = self.decode(message)
            if day is not None and not self.of_day(parsed, message, day):
                continue  # a day split: another day's record (the main line has it)
            if isinstance(parsed, str):
                dead.append((offset, self.raw(message), parsed))
            else:
                rows.append(parsed)
                offsets.append(offset)
        return self.converter.to_batch(rows, offsets), dead

    def of_day(self, parsed: tuple[Any, ...] | str, message: Message, day: date) -> bool:
        """Whether a decoded record is of event ``day`` (a dead letter, or a source without
        an event-time field: by the message's Kafka timestamp)."""
        moment: Any = None
        if isinstance(parsed, tuple) and self._event is not None:
            moment = parsed[self._event]
        elif not isinstance(parsed, tuple) or self._event is None:
            moment = _metadata(message, "kafka_timestamp", text=False)
        if not isinstance(moment, datetime):
            return False
        aware = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
        return aware.date() == day

    @staticmethod
    def timestamp_day(message: Message) -> date | None:
        """The UTC day of the message's Kafka timestamp (None: it has none): the day a dead
        letter of the main line counts on, as a day split keeps a dead letter by it."""
        moment = _metadata(message, "kafka_timestamp", text=False)
        return moment.date() if isinstance(moment, datetime) else None

    def raw(self, message: Message) -> bytes:
        """What a dead letter keeps of the message: its value's first 4 KiB."""
        value = message.value()
        return b"" if value is None else bytes(value[:_RAW_BYTES])

    def _json(self, value: bytes, message: Message) -> tuple[Any, ...] | str:
        if len(value) > self._max:
            return f"{BAD_VALUE}: the message is over {self._max} bytes"
        try:
            obj = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                return f"{INVALID_UTF8}: the message is not valid UTF-8 text"
            return f"{INVALID_JSON}: {exc}"
        if not isinstance(obj, dict):
            return f"{WRONG_TYPE}: expected a JSON object, got {type(obj).__name__}"
        for _, name in self._meta:
            obj[name] = _metadata(message, name, text=True)
        return self.converter.from_json(obj)

    def _csv_row(self, value: bytes, message: Message) -> tuple[Any, ...] | str:
        assert self._csv is not None
        line = value.rstrip(b"\r\n")
        parsed = self._csv.parse_line(line, len(line) > self._max)
        if parsed is None:
            return f"{BAD_VALUE}: the message is a blank line"
        if isinstance(parsed, str) or not self._meta:
            return parsed
        names = self._csv_meta.names
        meta = self._csv_meta.from_values([_metadata(message, n, text=False) for n in names])
        if isinstance(meta, str):
            return meta
        row: list[Any] = [None] * len(self._names)
        for place, value in zip(self._csv_places, (*parsed, *meta), strict=True):
            row[place] = value
        return tuple(row)

    @staticmethod
    def _with_key(reason: str, message: Message) -> str:
        key = message.key()
        if key is None:
            return reason
        shown = key[:40].decode("utf-8", "backslashreplace")
        return f"{reason} (key {shown!r})"


def _part(schema: RecordSchema, fields: list[pa.Field]) -> RecordConverter:
    names = {f.name for f in fields}
    return RecordConverter(RecordSchema(tuple(fields), schema.required & names))


def _metadata(message: Message, name: str, *, text: bool) -> Any:
    """A metadata field's value: as JSON gives it (``text``: timestamps as ISO-8601 text,
    keys as text) or as a row gives it (datetimes, bytes)."""
    if name == "kafka_topic":
        return message.topic()
    if name == "kafka_partition":
        return message.partition()
    if name == "kafka_offset":
        return message.offset()
    if name == "kafka_key":
        key = message.key()
        if key is None or not text:
            return key
        return key.decode("utf-8", "backslashreplace")
    _kind, millis = message.timestamp()
    if millis is None or millis < 0:
        return None
    moment = datetime.fromtimestamp(millis / 1000, tz=UTC)
    return moment.isoformat() if text else moment
