"""The Kafka reader's one-parse JSON blocks equal its message-by-message decoding: rows,
offsets, dead letters (Kafka reasons with the key, raw bytes), and every message accounted
for once; input the text cannot carry (line breaks, tombstones, whitespace, metadata fields)
is left to the exact path."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from spark_jobs.connectors.kafka._decode import MessageDecoder
from spark_jobs.connectors.kafka._json_block import JsonBlockDecoder
from spark_jobs.source._batch import OFFSET, RecordSchema

SCHEMA = RecordSchema(
    (
        pa.field("event_id", pa.string()),
        pa.field("user_id", pa.int64()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("amount", pa.float64()),
    ),
    frozenset({"event_id", "ts"}),
    "ts",
)


@dataclass
class _Message:
    """What the decoders use of a confluent-kafka ``Message``."""

    _value: bytes | None
    _offset: int
    _key: bytes | None = None

    def value(self) -> bytes | None:
        return self._value

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_777_000_000_000)


def _good(n: int) -> bytes:
    event = {"event_id": f"e-{n}", "user_id": n, "ts": "2026-05-01T10:00:00.5", "amount": n / 4}
    return orjson.dumps(event)


BAD = [
    b"{not json",
    b'{"event_id": "x", "user_id": 1}',  # a required field missing
    b'{"event_id": "x", "user_id": "seven", "ts": "2026-05-01T00:00:00"}',
    b'{"event_id": "x", "user_id": 1.5, "ts": "2026-05-01T00:00:00"}',
    b"[1, 2]",
    b'{"event_id": "\xff", "ts": "2026-05-01T00:00:00"}',
    b'{"event_id": "x", "ts": "yesterday"}',
    b'{"event_id": "x", "ts": "2026-05-01T00:00:00", "extra": NaN}',
]


def _decoders(max_bytes: int = 1 << 20) -> tuple[JsonBlockDecoder, MessageDecoder]:
    exact = MessageDecoder(SCHEMA, "json", (), max_bytes)
    return JsonBlockDecoder(SCHEMA, max_bytes, exact), exact


def _messages(values: list[bytes | None], first: int = 100) -> list[Any]:
    return [_Message(v, first + 3 * i, f"k{i}".encode()) for i, v in enumerate(values)]


def test_a_block_with_malformed_messages_equals_the_exact_decoding() -> None:
    rng = random.Random(7)
    values: list[bytes | None] = [_good(n) for n in range(2000)]
    for place in rng.sample(range(len(values)), 60):
        values[place] = rng.choice(BAD)
    messages = _messages(values)
    block, exact = _decoders()
    decoded = block.decode(messages)
    assert decoded is not None, "the fast path gave up on input it can carry"
    rows, dead = decoded
    want_rows, want_dead = exact.decode_each(messages, None)
    assert rows.equals(want_rows)
    assert dead == want_dead
    # An oracle of its own: every message once, as a row or a dead letter.
    seen = rows.column(OFFSET).to_pylist() + [offset for offset, _, _ in dead]
    assert sorted(seen) == [m.offset() for m in messages]
    assert len(dead) == sum(v in BAD for v in values) > 0
    assert all(reason.endswith("')") for _, _, reason in dead)  # the key is named


def test_input_the_joined_text_cannot_carry_goes_the_exact_way() -> None:
    block, _ = _decoders(max_bytes=200)
    for odd in (None, b"", b"   ", b'{"event_id": "a",\n"ts": "2026-05-01T00:00:00"}', b"{}\r"):
        assert block.decode(_messages([_good(1), odd, _good(2)])) is None, odd
    assert block.decode(_messages([_good(1), b"{" + b" " * 300 + b"}"])) is None
    with_metadata = RecordSchema((*SCHEMA.fields, pa.field("kafka_offset", pa.int64())))
    exact = MessageDecoder(with_metadata, "json", (), 1000)
    assert JsonBlockDecoder(with_metadata, 1000, exact).decode(_messages([_good(1)])) is None
