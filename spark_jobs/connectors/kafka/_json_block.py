"""JSON messages of one partition decoded as one block by Arrow (the fetcher thread).

Per-message Python (``orjson.loads`` + :meth:`RecordConverter.from_json` per record) was most
of a Kafka reader's CPU. The values of a fetch are joined into JSON Lines and handed to the
file sources' :class:`~spark_jobs.source._blocks.JsonLinesParser`, whose fast path is proven
equal to the exact per-line conversion (or falls back to it piece by piece). The parser's
offsets are byte offsets in the joined text; each row's is mapped back to its message's
Kafka offset. A dead letter is decided again by the exact per-message decoder
(:class:`~spark_jobs.connectors.kafka._decode.MessageDecoder`), so its reason and raw bytes
are the Kafka ones (``… (key 'k')``, the value's first 4 KiB).

Only what the text can equal goes this way — otherwise :meth:`JsonBlockDecoder.decode`
returns None and the caller decodes message by message:

- the schema declares no metadata field (``kafka_offset`` …: not in the value);
- every message has a non-empty value of at most ``max_bytes`` without a line break (``\\n``
  would split one message into two lines, ``\\r`` is read as a line end too);
- the parser's output accounts for every message exactly once (a row or a dead letter: a
  whitespace-only value is a blank line to the parser, not a record).

Threading: used by one fetcher thread; the parser's only state is a hint.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Message

from spark_jobs.connectors.kafka._decode import MessageDecoder
from spark_jobs.connectors.kafka._spec import METADATA_FIELDS
from spark_jobs.source._batch import OFFSET, DeadLetter, RecordSchema
from spark_jobs.source._blocks import JsonLinesParser

__all__ = ["JsonBlockDecoder"]


class JsonBlockDecoder:
    """Decodes a run of JSON messages in one Arrow parse (see the module docstring)."""

    def __init__(self, schema: RecordSchema, max_bytes: int, exact: MessageDecoder) -> None:
        self._parser = JsonLinesParser(schema, max_bytes)
        self._max = max_bytes
        self._exact = exact
        self.usable = not any(field.name in METADATA_FIELDS for field in schema.fields)

    def decode(self, messages: Sequence[Message]) -> tuple[pa.RecordBatch, list[DeadLetter]] | None:
        """(rows with their Kafka offsets, dead letters in offset order), or None: decode
        these messages one by one."""
        if not self.usable or not messages:
            return None
        values = [message.value() for message in messages]
        if None in values or b"" in values or max(map(len, values)) > self._max:  # type: ignore[arg-type]
            return None
        data = b"\n".join(values)  # type: ignore[arg-type]
        if data.count(b"\n") != len(values) - 1 or b"\r" in data:
            return None
        rows, parsed_dead = self._parser.parse(data, 0)
        if rows.num_rows + len(parsed_dead) != len(messages):
            return None
        starts = pa.array(accumulate((len(v) + 1 for v in values[:-1]), initial=0), pa.int64())  # type: ignore[arg-type]
        offsets = pa.array([message.offset() for message in messages], pa.int64())
        # Step 1: each row's byte offset -> its message's index -> its Kafka offset.
        at = rows.schema.get_field_index(OFFSET)
        index = pc.index_in(rows.column(at), value_set=starts)
        if index.null_count:
            return None
        rows = rows.set_column(at, rows.schema.field(at), offsets.take(index))
        # Step 2: dead letters again by the exact decoder (Kafka reasons, raw bytes, key).
        place = {start: i for i, start in enumerate(starts.to_pylist())} if parsed_dead else {}
        dead: list[DeadLetter] = []
        for start, _raw, _reason in parsed_dead:
            message = messages[place[start]]
            reason = self._exact.decode(message)
            if not isinstance(reason, str):
                return None  # the two paths disagree: the exact one decides the block
            dead.append((message.offset(), self._exact.raw(message), reason))  # type: ignore[arg-type]
        return rows, dead
