"""The column-wise decoder of a block of pgoutput change messages.

A block's change messages (Insert, Update, Delete payloads in stream order, with their
transactions' commit LSN and time) become one batch of records and the block's dead letters.
The result is *defined* by the per-message reference path (:meth:`BlockDecoder.reference`:
:func:`decode`, :meth:`ChangeRows.rows`, :meth:`RecordConverter.from_values`); the fast path
only takes what it can prove gives the same records:

1. framing (:class:`Frame`, vectorised NumPy over the joined payloads, no Python per message or
   value): the tuple of each insert and update without an old tuple (its new row) and of
   each delete (its old row: the key columns, or the whole row), grouped by relation, one
   record each. Any other message — an update with an old tuple (a key change, ``REPLICA
   IDENTITY FULL``), an unchanged TOASTed value, a change of a table the source does not
   read or of an unknown relation, anything malformed — is a *slow message*: its records
   come from the reference path, one message at a time.
2. columns: each declared column's texts are converted at once with Arrow where the pair
   (Postgres type, declared type) has an exact Arrow form (integers, double floats, bools,
   text, binary); other pairs convert value by value with the reference functions. A record
   the fast form cannot prove (a null required field, an integer outside a narrower type, a
   non-finite float, a value the declared type refuses) is a *slow record*: the reference
   path converts it, so its dead-letter reason is the exact one. A delete's ``_before``
   (JSON of its old values) is formatted column-wise when only an integer key is set, else
   per record with the reference's functions.
3. A value the reference's text parsing rejects (a run-failing :class:`CdcError`), invalid
   UTF-8, an LSN beyond int64: the whole block goes through the reference path, which fails
   (or dead-letters) exactly as it always did.

The records keep their stream order (fast and slow ones are merged by position).

Threading: owned by the stream reader's fetcher thread (like its :class:`ChangeRows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.connectors.postgres_cdc._changes import CdcError, ChangeRows, json_default
from spark_jobs.connectors.postgres_cdc._frame import Frame
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


class _Fallback(Exception):
    """The whole block goes through the reference path."""


class _Group:
    """The fast records of one relation: their messages and raw column values."""

    __slots__ = ("columns", "delete", "layout", "rows")

    def __init__(
        self,
        layout: tuple[Relation, tuple[int, ...]],
        rows: pa.Array,
        columns: list[pa.Array],
        delete: bool,
    ) -> None:
        self.layout = layout
        self.delete = delete  # columns: the old tuple (else the new one)
        self.rows = rows  # message indices (int64)
        self.columns = columns


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

    def _frame(self, payloads: Sequence[bytes]) -> tuple[list[_Group], list[int], pa.Array]:
        """Step 1: fast messages grouped by relation (their column values); the indices of
        the others."""
        frame = Frame(payloads)
        if frame.too_big:
            raise _Fallback
        groups: list[_Group] = []
        for kinds, delete in ((frame.candidates, False), (frame.deletes, True)):
            for relid in pc.unique(pc.filter(frame.relids, kinds)).to_pylist():
                layout = self._changes.layout_of(relid)
                if layout is None:  # not a source table, or unknown: the reference path says
                    continue
                rows = pc.indices_nonzero(pc.and_(kinds, pc.equal(frame.relids, relid)))
                ok, columns = frame.tuples(rows, len(layout[0].columns))
                if not pc.all(ok).as_py():
                    rows, columns = rows.filter(ok), [c.filter(ok) for c in columns]
                if len(rows):
                    groups.append(_Group(layout, pc.cast(rows, pa.int64()), columns, delete))
        # The other messages, by index (no Python per fast message).
        slow = np.ones(len(payloads), np.bool_)
        for group in groups:
            slow[group.rows.to_numpy()] = False
        return groups, np.flatnonzero(slow).tolist(), frame.inserts

    def _fast(self, payloads: Sequence[bytes], runs: Runs) -> Piece:
        groups, slow_messages, frame_inserts = self._frame(payloads)
        # Each message's transaction (index into runs); record positions: 2 x message index
        # (+ 1 for a key change's second record).
        ends = np.fromiter((end for end, _, _ in runs), np.int64, len(runs))
        run_of = np.repeat(np.arange(len(runs)), np.diff(ends, prepend=0))
        slow: list[tuple[int, list[Any]]] = []
        for i in slow_messages:
            _, lsn, committed = runs[run_of[i]]
            for sub, values in enumerate(self._message_rows(payloads[i], lsn, committed)):
                slow.append((2 * i + sub, values))
        if runs[-1][1] > _MAX_LSN:
            raise _Fallback
        run_index = pa.array(run_of)
        parts: list[tuple[pa.Array, pa.RecordBatch]] = []
        for group in groups:
            inserts = pc.take(frame_inserts, group.rows)
            batch, bad = self._columns(group, pc.take(run_index, group.rows), runs, inserts)
            positions = pc.multiply(group.rows, 2)
            if bad:
                for i in sorted(bad):
                    message = group.rows[i].as_py()
                    _, lsn, committed = runs[run_of[message]]
                    (values,) = self._message_rows(payloads[message], lsn, committed)
                    slow.append((2 * message, values))
                keep = pa.array([i for i in range(len(group.rows)) if i not in bad], pa.int64())
                positions, batch = pc.take(positions, keep), batch.take(keep)
            parts.append((positions, batch))
        dead: list[DeadLetter] = []
        if slow:
            slow.sort(key=lambda entry: entry[0])
            batch, dead, kept = self._convert_rows([values for _, values in slow])
            parts.append((pa.array([slow[i][0] for i in kept], pa.int64()), batch))
        return _merge(parts, self._converter), dead

    # -- columns ---------------------------------------------------------------------------

    def _columns(
        self, group: _Group, runs_of: pa.Array, runs: Runs, inserts: pa.Array
    ) -> tuple[pa.RecordBatch, set[int]]:
        """Step 2: the group's batch (every record) and the records it cannot prove."""
        relation, positions = group.layout
        count = len(group.rows)
        declared = set(positions)
        for index, column in enumerate(relation.columns):
            if index not in declared:  # the reference parses these too (and may fail)
                self._check_undeclared(column.type_oid, group.columns[index])
        bad: set[int] = set()
        arrays = [
            self._column(j, relation.columns[index].type_oid, group.columns[index], bad)
            for j, index in enumerate(positions)
        ]
        if "_before" in self._required:
            bad.update(range(count))
        lsns = pc.take(pa.array([lsn for _, lsn, _ in runs], pa.int64()), runs_of)
        if group.delete:
            ops, before = pa.repeat(pa.scalar("d", pa.string()), count), self._before(group)
        else:
            ops, before = pc.if_else(inserts, "c", "u"), pa.nulls(count, pa.string())
        arrays += [
            ops,
            lsns,
            pc.take(self._times(runs), runs_of),
            before,
            pa.repeat(pa.scalar(relation.qualified, pa.string()), count),
            lsns,
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=self._batch_schema), bad

    def _before(self, group: _Group) -> pa.Array:
        """``_before`` of deletes: the old tuple's values as JSON (the reference's
        ``_before_json``). A tuple of only an integer key, the common case, is formatted
        column-wise (Postgres prints integers the way ``int`` then JSON does)."""
        relation, columns = group.layout[0], group.columns
        names = [c.name for c in relation.columns]
        key = names.index(self._changes.key)
        simple = pc.is_valid(columns[key])
        for index, column in enumerate(columns):
            if index != key:
                simple = pc.and_(simple, pc.is_null(column))
        if relation.columns[key].type_oid not in _INT_OIDS:
            simple = pc.and_(simple, False)
        prefix = b"{" + orjson.dumps(names[key]) + b":"
        text = pc.binary_join_element_wise(
            pa.scalar(prefix, pa.binary()), columns[key], pa.scalar(b"}", pa.binary()), b""
        )
        if pc.all(simple).as_py():
            return text.cast(pa.string())
        rows = zip(*(c.to_pylist() for c in columns), strict=True)
        out = [
            None if is_simple else _json_of(relation, values)
            for is_simple, values in zip(simple.to_pylist(), rows, strict=True)
        ]
        return pc.if_else(simple, text.cast(pa.string()), pa.array(out, pa.string()))

    def _times(self, runs: Runs) -> pa.Array:
        """The reference's conversion of each transaction's commit time."""
        at = self._declared + 2
        convert = self._convert[at]
        return pa.array([convert(when) for _, _, when in runs], self._fields[at].type)

    @staticmethod
    def _check_undeclared(oid: int, raw: pa.Array) -> None:
        try:
            raw.cast(pa.string())
        except pa.ArrowInvalid:
            raise _Fallback from None
        if oid in _RISKY_OIDS:
            for text in raw.to_pylist():
                if text is not None:
                    try:
                        from_text(oid, text.decode())
                    except ValueError:
                        raise _Fallback from None

    def _column(self, j: int, oid: int, raw: pa.Array, bad: set[int]) -> pa.Array:
        field = self._fields[j]
        kind = field.type
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
        for i, value in enumerate(raw.to_pylist()):
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


def _json_of(relation: Relation, texts: Sequence[bytes | None]) -> str:
    """The reference's ``_before`` of an old tuple's raw values."""
    old = {}
    for column, text in zip(relation.columns, texts, strict=True):
        if text is not None:
            try:
                old[column.name] = from_text(column.type_oid, text.decode())
            except ValueError:
                raise _Fallback from None
    return orjson.dumps(old, default=json_default).decode()


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
    parts: list[tuple[pa.Array, pa.RecordBatch]], converter: RecordConverter
) -> pa.RecordBatch:
    """The parts' records in position order."""
    parts = [(positions, batch) for positions, batch in parts if len(positions)]
    if not parts:
        return converter.empty()
    if len(parts) == 1:
        return parts[0][1]
    batch = pa.concat_batches([b for _, b in parts])
    order = pc.sort_indices(pa.concat_arrays([positions for positions, _ in parts]))
    return batch.take(order)
