"""A decoder of ``pgoutput`` messages (logical replication protocol version 1).

What a walsender streams for a publication, one message per ``XLogData`` payload: ``B``
(Begin: the transaction's commit LSN, commit time, xid), ``R`` (Relation: a table's id,
name, replica identity and columns with their type OIDs — sent before the first change of
a table in a session and again after its definition changed), ``Y`` (Type), ``O``
(Origin), ``I`` (Insert: new tuple), ``U`` (Update: optional old tuple — ``K`` its key
columns, ``O`` the whole old row under ``REPLICA IDENTITY FULL`` — then the new tuple), ``D``
(Delete: ``K`` or ``O`` old tuple), ``T`` (Truncate), ``C`` (Commit), ``M`` (a logical
decoding message: the reader's position markers). Tuple values come as
text (``t``), null (``n``) or "unchanged TOASTed value" (``u``: an update that did not touch a
large column does not send it). Text values are converted to Python values by the column's
type OID (:func:`from_text`), the way a table row is read.

Threading: pure functions and immutable values; the stream reader calls them on its
fetcher thread.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = [
    "UNCHANGED",
    "Begin",
    "Change",
    "Column",
    "Commit",
    "DecodeError",
    "Marker",
    "Relation",
    "Truncate",
    "decode",
    "from_text",
    "postgres_time",
]

#: PostgreSQL's epoch (timestamps in the protocol are microseconds since it).
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


class DecodeError(ValueError):
    """A message that is not valid pgoutput (one line)."""


class _Unchanged:
    """An unchanged TOASTed value of an update (the walsender does not send it)."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED: Any = _Unchanged()


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    #: Part of the replica identity (the key an update's or delete's ``K`` tuple holds).
    key: bool


@dataclass(frozen=True, slots=True)
class Relation:
    relid: int
    schema: str
    table: str
    #: ``d`` default (primary key), ``n`` nothing, ``f`` full, ``i`` index.
    replica_identity: str
    columns: tuple[Column, ...]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True, slots=True)
class Begin:
    commit_lsn: int
    commit_time: datetime
    xid: int


@dataclass(frozen=True, slots=True)
class Commit:
    commit_lsn: int
    end_lsn: int
    commit_time: datetime


@dataclass(frozen=True, slots=True)
class Change:
    """An insert (``c``), update (``u``) or delete (``d``) of relation ``relid``: raw text
    values (None: null, :data:`UNCHANGED`: not sent). ``old``: the old tuple when the
    message carries one (``old_kind`` ``K``: key columns only, the others None; ``O``: the
    whole row)."""

    op: str
    relid: int
    new: tuple[str | None, ...] | None
    old: tuple[str | None, ...] | None
    old_kind: str | None


@dataclass(frozen=True, slots=True)
class Truncate:
    relids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Marker:
    """A logical decoding message (``pg_logical_emit_message``; with the ``messages``
    option). A non-transactional one is sent as soon as it is decoded, after every
    transaction that committed before its ``lsn``: a position the stream has passed."""

    lsn: int
    transactional: bool
    prefix: str
    content: bytes = b""


Message = Begin | Commit | Relation | Change | Truncate | Marker | None


def postgres_time(micros: int) -> datetime:
    """A protocol timestamp (µs since 2000-01-01 UTC) as an aware datetime."""
    return _PG_EPOCH + timedelta(microseconds=micros)


class _Buffer:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise DecodeError(f"pgoutput message ends early ({len(self.data)} bytes)")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        end = self.data.find(b"\x00", self.at)
        if end < 0:
            raise DecodeError("pgoutput string without its terminating NUL")
        text = self.data[self.at : end].decode("utf-8")
        self.at = end + 1
        return text

    def raw(self, size: int) -> bytes:
        if size < 0 or self.at + size > len(self.data):
            raise DecodeError("pgoutput value ends early")
        value = self.data[self.at : self.at + size]
        self.at += size
        return value


def _tuple(buf: _Buffer) -> tuple[str | None, ...]:
    values: list[str | None] = []
    for _ in range(buf.take(">h")):
        kind = buf.take(">c")
        if kind == b"n":
            values.append(None)
        elif kind == b"u":
            values.append(UNCHANGED)
        elif kind == b"t":
            values.append(buf.raw(buf.take(">i")).decode("utf-8"))
        else:
            raise DecodeError(f"pgoutput tuple value of kind {kind!r} (binary is not requested)")
    return tuple(values)


def _relation(buf: _Buffer) -> Relation:
    relid = buf.take(">I")
    schema, table = buf.string(), buf.string()
    identity = chr(buf.take(">B"))
    columns = []
    for _ in range(buf.take(">h")):
        flags = buf.take(">B")
        name = buf.string()
        type_oid = buf.take(">I")
        buf.take(">i")  # atttypmod
        columns.append(Column(name, type_oid, bool(flags & 1)))
    return Relation(relid, schema, table, identity, tuple(columns))


def _change(kind: bytes, buf: _Buffer) -> Change:
    relid = buf.take(">I")
    marker = buf.take(">c")
    if kind == b"I":
        if marker != b"N":
            raise DecodeError(f"pgoutput insert with tuple marker {marker!r}")
        return Change("c", relid, _tuple(buf), None, None)
    old: tuple[str | None, ...] | None = None
    old_kind: str | None = None
    if marker in (b"K", b"O"):
        old, old_kind = _tuple(buf), marker.decode()
        if kind == b"D":
            return Change("d", relid, None, old, old_kind)
        marker = buf.take(">c")
    if kind == b"U" and marker == b"N":
        return Change("u", relid, _tuple(buf), old, old_kind)
    raise DecodeError(f"pgoutput {kind.decode()} message with tuple marker {marker!r}")


def decode(payload: bytes) -> Message:
    """One message; None for the kinds a reader ignores (Type, Origin, logical messages)."""
    if not payload:
        raise DecodeError("empty pgoutput message")
    buf = _Buffer(bytes(payload))
    kind = buf.take(">c")
    if kind == b"B":
        lsn, micros, xid = buf.take(">Q"), buf.take(">q"), buf.take(">I")
        return Begin(lsn, postgres_time(micros), xid)
    if kind == b"C":
        buf.take(">B")  # flags (unused)
        lsn, end, micros = buf.take(">Q"), buf.take(">Q"), buf.take(">q")
        return Commit(lsn, end, postgres_time(micros))
    if kind == b"R":
        return _relation(buf)
    if kind in (b"I", b"U", b"D"):
        return _change(kind, buf)
    if kind == b"T":
        count = buf.take(">I")
        buf.take(">B")  # options (CASCADE, RESTART IDENTITY)
        return Truncate(tuple(buf.take(">I") for _ in range(count)))
    if kind == b"M":
        flags, lsn = buf.take(">B"), buf.take(">Q")
        prefix = buf.string()
        size = buf.take(">I")
        if buf.at + size > len(buf.data):
            raise DecodeError(f"pgoutput message ends early ({len(buf.data)} bytes)")
        return Marker(lsn, bool(flags & 1), prefix, buf.data[buf.at : buf.at + size])
    if kind in (b"Y", b"O"):
        return None
    raise DecodeError(f"unknown pgoutput message {kind!r}")


# -- text values ---------------------------------------------------------------------------

_INTS = {20, 21, 23, 26}  # int8, int2, int4, oid
_FLOATS = {700, 701}
_NUMERIC = 1700
_BOOL = 16
_BYTEA = 17
_DATE = 1082
_TIMESTAMP = 1114
_TIMESTAMPTZ = 1184


def _check_representable(kind: str, text: str) -> None:
    """ValueError, one line, for a ``date`` or timestamp value Postgres holds and Python
    cannot (nor the Arrow column it is written to, for ``infinity``): ``infinity`` and
    ``-infinity``, years BC (printed with a `` BC`` suffix), years after 9999."""
    if text in ("infinity", "-infinity"):
        why = f"Postgres {text} has no Arrow/Python equivalent"
    elif text.endswith(" BC"):
        why = "years BC are outside Python's date range"
    elif _PAST_9999.match(text):
        why = "years after 9999 are outside Python's date range"
    else:
        return
    raise ValueError(f"{kind} value {text!r} cannot be represented ({why})")


#: A date or timestamp text of a year with five digits or more.
_PAST_9999 = re.compile(r"\d{5,}-")


def _date(text: str) -> date:
    _check_representable("date", text)
    return date.fromisoformat(text)


def _timestamp(text: str, aware: bool) -> datetime:
    # The walsender prints ISO style ("2026-01-01 00:00:00+00"); Python 3.11 parses it.
    _check_representable("timestamp", text)
    value = datetime.fromisoformat(text)
    if aware and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def from_text(type_oid: int, text: str) -> Any:
    """A column's text value as the Python value a table read gives (int, float, bool,
    bytes, date, datetime; numeric and any other type as its text). ValueError when it does not
    parse, or is a date or timestamp Python cannot hold (``infinity``, years BC or after 9999:
    a one-line message saying so, to which the caller adds the table and column)."""
    if type_oid in _INTS:
        return int(text)
    if type_oid == _NUMERIC:
        # Its text: exact for a field declared string (an unconstrained numeric must be) and
        # parsed by a decimal field's converter to the same Decimal.
        try:
            Decimal(text)
        except InvalidOperation:
            raise ValueError(f"numeric {text!r} does not parse") from None
        return text
    if type_oid in _FLOATS:
        return float(text)
    if type_oid == _BOOL:
        return text == "t"
    if type_oid == _BYTEA:
        if not text.startswith("\\x"):
            raise ValueError("bytea not in hex format (bytea_output = hex is needed)")
        return bytes.fromhex(text[2:])
    if type_oid == _DATE:
        return _date(text)
    if type_oid in (_TIMESTAMP, _TIMESTAMPTZ):
        return _timestamp(text, type_oid == _TIMESTAMPTZ)
    return text
