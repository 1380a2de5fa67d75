"""The column-wise decoder of a block of pgoutput change messages.

A block's change messages (Insert, Update, Delete payloads in stream order, with their
transactions' commit LSN and time) become one batch of records and the block's dead letters.
The result is *defined* by the per-message reference path (:meth:`BlockDecoder.reference`:
:func:`decode`, :meth:`ChangeRows.rows`, :meth:`RecordConverter.from_values`); the fast path
only takes what it can prove gives the same records:

1. framing: one tight loop slices each new tuple's text values (an insert, or an update
   without an old tuple: one record each), grouped by relation. Any other message — a
   delete, an update with an old tuple, an unchanged TOASTed value, a change of a table the
   source does not read, anything malformed — is a *slow message*: its records come from the
   reference path, one message at a time.
2. columns: each declared column's texts are converted at once with Arrow where the pair
   (Postgres type, declared type) has an exact Arrow form (integers, double floats, bools,
   text, binary); other pairs convert value by value with the reference functions. A record
   the fast form cannot prove (a null required field, an integer outside a narrower type, a
   non-finite float, a value the declared type refuses) is a *slow record*: the reference
   path converts it, so its dead-letter reason is the exact one.
3. A value the reference's text parsing rejects (a run-failing :class:`CdcError`), invalid
   UTF-8, an LSN beyond int64: the whole block goes through the reference path, which fails
   (or dead-letters) exactly as it always did.

The records keep their stream order (fast and slow ones are merged by position).

Threading: owned by the stream reader's fetcher thread (like its :class:`ChangeRows`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.connectors.postgres_cdc._changes import CdcError, ChangeRows
from spark_jobs.connectors.postgres_cdc._pgoutput import Change, Relation, from_text
from spark_jobs.connectors.postgres_cdc._pgoutput import decode as decode_message
from spark_jobs.source._batch import DeadLetter
from spark_jobs.source._convert import RecordConverter, raw_json
from spark_jobs.source._fields import FieldError, value_converter

__all__ = ["BlockDecoder", "Piece", "Runs"]

#: A decoded part of a block: its good records (``batch_schema``) and its dead letters.
Piece = tuple[pa.RecordBatch, list[DeadLetter]]
#: The transactions of a block's messages: (index after its last message, commit LSN, time).
Runs = list[tuple[int, int, datetime]]

_INT_OIDS = frozenset({20, 21, 23, 26})
_FLOAT_OIDS = frozenset({700, 701})
_BOOL_OID = 16
#: Types whose text the reference parsing can refuse (bytea, date, timestamp[tz]); the text
#: of any other type always parses (ints, numeric, floats, bool, text-like).
_RISKY_OIDS = frozenset({17, 1082, 1114, 1184})
#: Types ``from_text`` converts; any other one's value is its text.
_TYPED_OIDS = _INT_OIDS | _FLOAT_OIDS | _RISKY_OIDS | {_BOOL_OID, 1700}
_INT_TYPES = {pa.int8(), pa.int16(), pa.int32(), pa.int64()}
_MAX_LSN = (1 << 63) - 1
_unpack_h = struct.Struct(">h").unpack_from
_unpack_i = struct.Struct(">i").unpack_from
_unpack_I = struct.Struct(">I").unpack_from


class _Fallback(Exception):
    """The whole block goes through the reference path."""


def new_tuple(p: bytes) -> tuple[int, list[bytes | None]] | None:
    """(relid, raw text values) of an insert or of an update without an old tuple; None for
    a slow message (another kind, an unchanged TOASTed value, anything malformed)."""
    kind = p[0]
    if (kind != 73 and kind != 85) or len(p) < 8 or p[5] != 78:  # 'I' / 'U', then 'N'
        return None
    at = 8
    values: list[bytes | None] = []
    append = values.append
    try:
        for _ in range(_unpack_h(p, 6)[0]):
            tag = p[at]
            if tag == 116:  # 't'
                size = _unpack_i(p, at + 1)[0]
                if size < 0:
                    return None
                at += 5
                append(p[at : at + size])
                at += size
            elif tag == 110:  # 'n'
                append(None)
                at += 1
            else:  # 'u' (unchanged TOAST: the reference path says what it means) or bad
                return None
    except (IndexError, struct.error):
        return None
    if at != len(p):
        return None
    return _unpack_I(p, 1)[0], values


class _Group:
    """The fast records of one relation: raw texts and their CDC fields."""

    __slots__ = ("layout", "lsns", "ops", "payloads", "positions", "times", "tuples")

    def __init__(self, layout: tuple[Relation, tuple[int, ...]]) -> None:
        self.layout = layout
        self.tuples: list[list[bytes | None]] = []
        self.positions: list[int] = []
        self.lsns: list[int] = []
        self.times: list[datetime] = []
        self.ops: list[str] = []
        self.payloads: list[bytes] = []


class BlockDecoder:
    """Decodes blocks of change messages of one stream read (see the module docstring).
    ``changes``: the read's relations (the reader decodes before it applies a Relation)."""

    def __init__(self, converter: RecordConverter, changes: ChangeRows) -> None:
        self._converter = converter
        self._changes = changes
        schema = converter.schema
        self._fields = schema.fields
        self._names = list(converter.names)
        self._required = schema.required
        self._declared = len(self._fields) - 5  # then _op, _lsn, _commit_time, _before, _table
        self._lsn_at = self._names.index("_lsn")
        self._convert = [value_converter(f, rows=True) for f in self._fields]
        self._batch_schema = schema.batch_schema

    # -- the reference ---------------------------------------------------------------------

    def _message_rows(self, p: bytes, lsn: int, committed: datetime) -> list[list[Any]]:
        change = decode_message(p)
        assert isinstance(change, Change), change
        return self._changes.rows(change, lsn, committed)

    def reference(self, payloads: Sequence[bytes], runs: Runs) -> Piece:
        """The per-message path (the definition of the result)."""
        found: list[list[Any]] = []
        start = 0
        for end, lsn, committed in runs:
            for p in payloads[start:end]:
                found.extend(self._message_rows(p, lsn, committed))
            start = end
        batch, dead, _ = self._convert_rows(found)
        return batch, dead

    def _convert_rows(
        self, found: list[list[Any]]
    ) -> tuple[pa.RecordBatch, list[DeadLetter], list[int]]:
        """The reference conversion; also the indices of the records kept."""
        kept: list[int] = []
        rows: list[tuple[Any, ...]] = []
        offsets: list[int] = []
        dead: list[DeadLetter] = []
        for index, values in enumerate(found):
            parsed = self._converter.from_values(values)
            if isinstance(parsed, str):
                record = dict(zip(self._names, values, strict=True))
                dead.append((values[self._lsn_at], raw_json(record), parsed))
            else:
                kept.append(index)
                rows.append(parsed)
                offsets.append(values[self._lsn_at])
        return self._converter.to_batch(rows, offsets), dead, kept

    # -- the fast path ---------------------------------------------------------------------

    def decode(self, payloads: Sequence[bytes], runs: Runs) -> Piece:
        """The records of ``payloads`` (``runs``: their transactions), in stream order."""
        if not payloads:
            return self._converter.empty(), []
        try:
            return self._fast(payloads, runs)
        except (_Fallback, CdcError, ValueError):
            # A run-failing error (or a value only the reference judges): the reference
            # path fails with the first bad message's exact error.
            return self.reference(payloads, runs)

    def _frame(
        self, payloads: Sequence[bytes], runs: Runs
    ) -> tuple[dict[int, _Group], list[tuple[int, list[Any]]]]:
        """Step 1: fast records grouped by relation; slow records with their positions."""
        groups: dict[int, _Group] = {}
        slow: list[tuple[int, list[Any]]] = []
        layout_of = self._changes.layout_of
        position = start = 0
        for end, lsn, committed in runs:
            if lsn > _MAX_LSN:
                raise _Fallback
            for p in payloads[start:end]:
                framed = new_tuple(p)
                group = None
                if framed is not None:
                    group = groups.get(framed[0])
                    if group is None:
                        layout = layout_of(framed[0])
                        if layout is not None:
                            group = groups[framed[0]] = _Group(layout)
                if (
                    framed is None
                    or group is None
                    or len(framed[1]) != len(group.layout[0].columns)
                ):
                    for values in self._message_rows(p, lsn, committed):
                        slow.append((position, values))
                        position += 1
                    continue
                group.tuples.append(framed[1])
                group.positions.append(position)
                group.lsns.append(lsn)
                group.times.append(committed)
                group.ops.append("c" if p[0] == 73 else "u")
                group.payloads.append(p)
                position += 1
            start = end
        return groups, slow

    def _fast(self, payloads: Sequence[bytes], runs: Runs) -> Piece:
        groups, slow = self._frame(payloads, runs)
        parts: list[tuple[list[int], pa.RecordBatch]] = []
        for group in groups.values():
            batch, bad = self._columns(group)
            keep = [i for i in range(len(group.positions)) if i not in bad] if bad else None
            for i in sorted(bad):
                (values,) = self._message_rows(group.payloads[i], group.lsns[i], group.times[i])
                slow.append((group.positions[i], values))
            if keep is None:
                parts.append((group.positions, batch))
            elif keep:
                parts.append(([group.positions[i] for i in keep], batch.take(keep)))
        dead: list[DeadLetter] = []
        if slow:
            slow.sort(key=lambda entry: entry[0])
            found = [values for _, values in slow]
            batch, dead, kept = self._convert_rows(found)
            parts.append(([slow[i][0] for i in kept], batch))
        return _merge(parts, self._converter), dead

    # -- columns ---------------------------------------------------------------------------

    def _columns(self, group: _Group) -> tuple[pa.RecordBatch, set[int]]:
        """Step 2: the group's batch (every record) and the records it cannot prove."""
        relation, positions = group.layout
        tuples, count = group.tuples, len(group.tuples)
        declared = set(positions)
        for index, column in enumerate(relation.columns):
            if index not in declared:  # the reference parses these too (and may fail)
                self._check_undeclared(column.type_oid, [t[index] for t in tuples])
        bad: set[int] = set()
        arrays = [
            self._column(j, relation.columns[index].type_oid, [t[index] for t in tuples], bad)
            for j, index in enumerate(positions)
        ]
        if "_before" in self._required:
            bad.update(range(count))
        lsns = pa.array(group.lsns, pa.int64())
        arrays += [
            pa.array(group.ops, pa.string()),
            lsns,
            self._times(group.times),
            pa.nulls(count, pa.string()),
            pa.array([relation.qualified] * count, pa.string()),
            lsns,
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self._batch_schema), bad

    def _times(self, times: list[datetime]) -> pa.Array:
        # The reference's conversion of each distinct commit time (one per transaction).
        at = self._declared + 2
        convert, seen = self._convert[at], {}
        for when in times:
            if when not in seen:
                seen[when] = convert(when)
        return pa.array([seen[when] for when in times], self._fields[at].type)

    @staticmethod
    def _check_undeclared(oid: int, texts: list[bytes | None]) -> None:
        raw = pa.array(texts, pa.binary())
        try:
            raw.cast(pa.string())
        except pa.ArrowInvalid:
            raise _Fallback from None
        if oid in _RISKY_OIDS:
            for text in texts:
                if text is not None:
                    try:
                        from_text(oid, text.decode())
                    except ValueError:
                        raise _Fallback from None

    def _column(self, j: int, oid: int, texts: list[bytes | None], bad: set[int]) -> pa.Array:
        field = self._fields[j]
        kind = field.type
        raw = pa.array(texts, pa.binary())
        try:
            text = raw.cast(pa.string())
        except pa.ArrowInvalid:
            raise _Fallback from None
        if field.name in self._required and text.null_count:
            bad.update(_where(text.is_null()))
        fast = _arrow_column(oid, kind, raw, text, bad)
        if fast is not None:
            return fast
        convert = self._convert[j]
        values: list[Any] = []
        for i, value in enumerate(texts):
            if value is None:
                values.append(None)
                continue
            try:
                parsed = from_text(oid, value.decode())
            except ValueError:
                raise _Fallback from None
            try:
                values.append(convert(parsed))
            except FieldError:
                bad.add(i)
                values.append(None)
        return pa.array(values, kind)


def _where(mask: pa.Array) -> list[int]:
    """Indices where ``mask`` is true (nulls: false)."""
    return pc.indices_nonzero(pc.fill_null(mask, False)).to_pylist()  # type: ignore[no-any-return]


def _arrow_column(
    oid: int, kind: pa.DataType, raw: pa.Array, text: pa.Array, bad: set[int]
) -> pa.Array | None:
    """The exact Arrow conversion of a (Postgres type, declared type) pair; None: none."""
    try:
        if oid in _INT_OIDS and kind in _INT_TYPES:
            ints = pc.cast(text, pa.int64())
            if kind != pa.int64():
                info = {8: 7, 16: 15, 32: 31}[kind.bit_width]
                low, high = -(1 << info), (1 << info) - 1
                out = pc.or_(pc.less(ints, low), pc.greater(ints, high))
                bad.update(_where(out))
                ints = pc.if_else(out, pa.scalar(None, pa.int64()), ints)
            return pc.cast(ints, kind)
        if oid in _FLOAT_OIDS and kind == pa.float64():
            floats = pc.cast(text, pa.float64())
            bad.update(_where(pc.invert(pc.is_finite(floats))))
            return floats
        if oid == _BOOL_OID and pa.types.is_boolean(kind):
            return pc.equal(text, "t")
        if oid not in _TYPED_OIDS and pa.types.is_string(kind):
            return text
        if oid not in _TYPED_OIDS and pa.types.is_binary(kind):
            return raw
    except pa.ArrowInvalid:
        return None
    return None


def _merge(
    parts: list[tuple[list[int], pa.RecordBatch]], converter: RecordConverter
) -> pa.RecordBatch:
    """The parts' records in position order."""
    parts = [(positions, batch) for positions, batch in parts if positions]
    if not parts:
        return converter.empty()
    if len(parts) == 1:
        return parts[0][1]
    batch = pa.concat_batches([b for _, b in parts])
    order = pc.sort_indices(pa.array([p for positions, _ in parts for p in positions]))
    return batch.take(order)
