"""The column-wise CDC block decoder against the per-message reference path.

Hypothesis writes streams of pgoutput messages — transactions of inserts, updates (without an
old tuple, with a key tuple ``K`` that changes the key, with a whole old row ``O``) and
deletes (``K``, ``O``) over a table of eleven column types (one not declared), with nulls,
unchanged TOASTed values, values the declared types refuse (dead letters) or the text
parsing refuses (the run fails), changes of another table and Relation messages in the
middle of a transaction that add a column or drop a declared one. Each stream is read by a
:class:`StreamReader` (no server: a scripted cursor) twice — with the block decoder, and with
its ``decode`` replaced by the reference path — and both must give the same block (rows,
their order, offsets, dead letters with their reasons) or fail with the same error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enumerator_service import StreamSplit
from spark_jobs.connectors.postgres_cdc import _block
from spark_jobs.connectors.postgres_cdc._receiver import Receiver
from spark_jobs.connectors.postgres_cdc._stream import StreamReader
from spark_jobs.source._batch import ParsedBlock, RecordSchema
from spark_jobs.source._records import SplitRead

U = object()  # an unchanged TOASTed value in a generated tuple

# name, type OID, declared Arrow type (None: not declared)
COLUMNS: list[tuple[str, int, pa.DataType | None]] = [
    ("id", 20, pa.int64()),
    ("small", 20, pa.int16()),
    ("f", 701, pa.float64()),
    ("n", 1700, pa.decimal128(6, 2)),
    ("b", 16, pa.bool_()),
    ("s", 25, pa.string()),
    ("by", 17, pa.binary()),
    ("d", 1082, pa.date32()),
    ("ts", 1184, pa.timestamp("us", tz="UTC")),
    ("j", 3802, pa.string()),
    ("hidden", 1114, None),
]
DECLARED = [c for c in COLUMNS if c[2] is not None]
CDC = [
    ("_op", pa.string()),
    ("_lsn", pa.int64()),
    ("_commit_time", pa.timestamp("us", tz="UTC")),
    ("_before", pa.string()),
    ("_table", pa.string()),
]
FIELDS = tuple(pa.field(n, t) for n, _, t in DECLARED) + tuple(pa.field(n, t) for n, t in CDC)
#: With a required field (a key-only delete is then a dead letter), and without.
SCHEMAS = [
    RecordSchema(FIELDS, frozenset({"s"}), "_commit_time"),
    RecordSchema(FIELDS, frozenset(), "_commit_time"),
]
RELID, OTHER = 16401, 16409


# -- encoding ------------------------------------------------------------------------------


def _tuple(values: list[Any]) -> bytes:
    out = struct.pack(">h", len(values))
    for value in values:
        if value is None:
            out += b"n"
        elif value is U:
            out += b"u"
        else:
            raw = value if isinstance(value, bytes) else value.encode()
            out += b"t" + struct.pack(">i", len(raw)) + raw
    return out


def relation(relid: int, table: str, columns: list[tuple[str, int]], identity: str) -> bytes:
    out = b"R" + struct.pack(">I", relid) + b"public\0" + table.encode() + b"\0"
    out += identity.encode() + struct.pack(">h", len(columns))
    for name, oid in columns:
        out += bytes([name == "id"]) + name.encode() + b"\0" + struct.pack(">Ii", oid, -1)
    return out


def begin(lsn: int) -> bytes:
    return b"B" + struct.pack(">QqI", lsn, 820_000_000_000_000 + lsn, 7)


def commit(lsn: int) -> bytes:
    return b"C" + struct.pack(">BQQq", 0, lsn, lsn + 8, 820_000_000_000_000 + lsn)


def marker(lsn: int) -> bytes:
    return b"M" + struct.pack(">BQ", 0, lsn) + b"sluice-cdc\0" + struct.pack(">I", 0)


# -- generated values ----------------------------------------------------------------------

_pg_float = st.floats().map(
    lambda x: (
        "NaN" if x != x else {float("inf"): "Infinity", float("-inf"): "-Infinity"}.get(x, repr(x))
    )
)
TEXTS: dict[int, st.SearchStrategy[Any]] = {
    20: st.integers(-(2**63), 2**63 - 1).map(str) | st.integers(-40_000, 40_000).map(str),
    701: _pg_float,
    1700: st.decimals(
        allow_nan=False, allow_infinity=False, places=3, min_value=-99999, max_value=99999
    ).map(str)
    | st.just("NaN"),
    16: st.sampled_from(["t", "f"]),
    25: st.text(max_size=12) | st.just(b"\xff\xfe"),
    17: st.binary(max_size=6).map(lambda b: "\\x" + b.hex()) | st.just("\\000"),
    1082: st.dates().map(lambda d: d.isoformat()) | st.just("infinity"),
    1184: st.datetimes(timezones=st.just(UTC)).map(lambda t: t.isoformat(sep=" "))
    | st.just("infinity"),
    3802: st.text(max_size=8).map(lambda t: f'{{"k": {len(t)}}}'),
    1114: st.datetimes().map(lambda t: t.isoformat(sep=" ")),
    23: st.integers(-(2**31), 2**31 - 1).map(str),
}


def value(oid: int, toast: bool) -> st.SearchStrategy[Any]:
    choices = [st.none(), TEXTS[oid], TEXTS[oid], TEXTS[oid]]
    if toast:
        choices.append(st.just(U))
    return st.one_of(*choices)


def row(columns: list[tuple[str, int]], toast: bool = False) -> st.SearchStrategy[list[Any]]:
    ids = st.integers(1, 50).map(str)
    rest = [value(oid, toast) for _, oid in columns[1:]]
    return st.tuples(ids, *rest).map(list)


@st.composite
def stream(draw: st.DrawFn) -> list[bytes]:
    """Messages of a read: a relation, then transactions (maybe a Relation mid-way)."""
    columns = [(n, o) for n, o, _ in COLUMNS]
    identity = draw(st.sampled_from(["d", "f"]))
    out = [relation(RELID, "t", columns, identity), relation(OTHER, "x", [("id", 20)], "d")]
    lsn = 1000
    for _ in range(draw(st.integers(1, 4))):
        lsn += 100
        out.append(begin(lsn))
        for _ in range(draw(st.integers(0, 12))):
            kind = draw(st.sampled_from("IIIIUUUKODX" + "R" * draw(st.integers(0, 1))))
            new = draw(row(columns))
            if kind == "I":
                out.append(b"I" + struct.pack(">I", RELID) + b"N" + _tuple(new))
            elif kind == "U":
                upd = draw(row(columns, toast=True))
                out.append(b"U" + struct.pack(">I", RELID) + b"N" + _tuple(upd))
            elif kind in "KO":  # an update with its old tuple
                old = draw(row(columns))
                if kind == "K":
                    old = [old[0]] + [None] * (len(columns) - 1)
                upd = draw(row(columns, toast=True))
                msg = b"U" + struct.pack(">I", RELID) + kind.encode() + _tuple(old)
                out.append(msg + b"N" + _tuple(upd))
            elif kind == "D":
                old = new if identity == "f" else [new[0]] + [None] * (len(columns) - 1)
                marker_kind = b"O" if identity == "f" else b"K"
                out.append(b"D" + struct.pack(">I", RELID) + marker_kind + _tuple(old))
            elif kind == "X":  # another table of the publication
                out.append(b"I" + struct.pack(">I", OTHER) + b"N" + _tuple(["1"]))
            else:  # a new definition: a column added, or (rarely) a declared one dropped
                if draw(st.integers(0, 5)) == 0:
                    columns = [c for c in columns if c[0] != "j"]
                else:
                    columns = [*columns, (f"add{len(columns)}", 23)]
                out.append(relation(RELID, "t", columns, identity))
        out.append(commit(lsn))
    out.append(marker(lsn + 50))
    return out


# -- reading -------------------------------------------------------------------------------


@dataclass
class _Message:
    payload: bytes
    data_start: int = 0  # (0: the receiver confirms nothing)


class _Cursor:
    def __init__(self, messages: list[bytes]) -> None:
        self._messages = iter(messages)

    def read_message(self) -> _Message | None:
        return _Message(next(self._messages))


def read(messages: list[bytes], schema: RecordSchema) -> ParsedBlock | None:
    reader = StreamReader(
        schema,
        "postgresql:///unused",
        publication="p",
        tables=("public.t",),
        declared=tuple(n for n, _, _ in DECLARED),
        key="id",
        continuous=False,
    )
    split = StreamSplit("src", "pgcdc", "slot", 0, None)
    reader._read = SplitRead(1, split, 0)
    reader._stop = messages_end(messages)
    reader._cursor = _Cursor(messages)
    reader._receiver = Receiver(reader._cursor, reader._cond, 1 << 20)
    reader._receiver.start()  # (it fails with StopIteration past the last message: unread)
    try:
        block, done = reader.fetch()
    finally:
        reader.close()
    assert done
    return block


def messages_end(messages: list[bytes]) -> int:
    last = messages[-1]
    return int(struct.unpack_from(">Q", last, 2)[0])


def outcome(messages: list[bytes], schema: RecordSchema = SCHEMAS[0]) -> tuple[Any, ...]:
    try:
        block = read(messages, schema)
    except Exception as exc:  # the same error, both ways
        return ("error", type(exc).__name__, str(exc))
    assert block is not None
    return ("block", block.start, block.end, block.rows, block.dead, block.max_event_time)


def reference_outcome(messages: list[bytes], schema: RecordSchema = SCHEMAS[0]) -> tuple[Any, ...]:
    fast = _block.BlockDecoder.decode
    _block.BlockDecoder.decode = _block.BlockDecoder.reference  # type: ignore[method-assign]
    try:
        return outcome(messages, schema)
    finally:
        _block.BlockDecoder.decode = fast  # type: ignore[method-assign]


def same(fast: tuple[Any, ...], reference: tuple[Any, ...]) -> None:
    assert fast[0] == reference[0], (fast, reference)
    if fast[0] == "error":
        assert fast == reference
        return
    assert fast[1:3] == reference[1:3]
    assert fast[3].schema == reference[3].schema
    assert fast[3].to_pylist() == reference[3].to_pylist()
    assert fast[4] == reference[4]
    assert fast[5] == reference[5]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=stream(), schema=st.sampled_from(SCHEMAS))
def test_the_block_decoder_gives_what_the_reference_gives(
    messages: list[bytes], schema: RecordSchema
) -> None:
    same(outcome(messages, schema), reference_outcome(messages, schema))


@pytest.mark.extended
@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=stream(), schema=st.sampled_from(SCHEMAS))
def test_the_block_decoder_gives_what_the_reference_gives_exhaustively(
    messages: list[bytes], schema: RecordSchema
) -> None:
    same(outcome(messages, schema), reference_outcome(messages, schema))


def test_a_plain_stream_is_decoded_fast_and_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inserts, updates and key deletes of good values: every record on the fast path (the
    reference is never asked), the same records as the reference."""
    columns = [(n, o) for n, o, _ in COLUMNS]
    good = ["7", "12", "1.5", "3.25", "t", "hé", "\\x01ff", "2026-01-02",
            "2026-01-02 03:04:05.123456+00", '{"a": 1}', "2026-01-02 03:04:05"]  # fmt: skip
    messages = [relation(RELID, "t", columns, "d"), begin(2000)]
    for i in range(1, 40):
        values = [str(i), *good[1:]]
        messages.append(b"I" + struct.pack(">I", RELID) + b"N" + _tuple(values))
        messages.append(
            b"U" + struct.pack(">I", RELID) + b"N" + _tuple([*values[:6], None, *values[7:]])
        )
        key_only = [str(i)] + [None] * (len(columns) - 1)
        messages.append(b"D" + struct.pack(">I", RELID) + b"K" + _tuple(key_only))
    messages += [commit(2000), marker(2100)]
    reference = reference_outcome(messages)
    calls: list[int] = []
    original = _block.BlockDecoder._message_rows

    def counted(self: Any, *args: Any) -> Any:
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(_block.BlockDecoder, "_message_rows", counted)
    fast = outcome(messages)
    same(fast, reference)
    # The required s is null in a key-only delete: a dead letter (the reference's reason).
    assert fast[3].num_rows == 39 * 2 and len(fast[4]) == 39
    assert {reason for _, _, reason in fast[4]} == {"missing field: s"}
    assert len(calls) == 39  # only the dead deletes went the per-message way
    assert fast[3].column("_op").to_pylist()[:3] == ["c", "u", "c"]
    assert fast[3].column("by").to_pylist()[:2] == [b"\x01\xff", None]
    # Without the required field, the deletes are fast records too: _before is the key.
    monkeypatch.setattr(_block.BlockDecoder, "_message_rows", original)
    free = outcome(messages, SCHEMAS[1])
    same(free, reference_outcome(messages, SCHEMAS[1]))
    assert free[3].num_rows == 39 * 3 and not free[4]
    assert free[3].column("_op").to_pylist()[:3] == ["c", "u", "d"]
    assert free[3].column("_before").to_pylist()[:3] == [None, None, '{"id":1}']
