"""Column checks of the JSON Lines fast path: what Arrow's JSON reader may keep.

Arrow reads each declared field as a *wire* type; a row whose values cannot be proven equal
to what :class:`~spark_jobs.source._convert.RecordConverter` gives for that line is a
*suspect* and is decided line by line. Arrow itself fails a piece on a type mismatch (a
string for a number, ``1.0`` or ``1e2`` for an integer, a number for a bool, ``1.234`` for
``decimal(5,2)``, a number too big for an int64, ``1e400``), which then goes the exact way.

- ``string``: read as string (escapes decoded as orjson does; invalid UTF-8 and lone
  surrogates never get here).
- ``int8…int64``: read as int64 (integer literals only), then range-checked: rows outside the
  declared type are suspects.
- ``float32/float64``: read as float64 (both parsers round correctly). Suspects: not finite
  (Arrow reads ``NaN``; for float32 after the cast, which rounds as Python's does), and
  ``-0.0`` (Arrow reads the integer ``-0`` as ``-0.0``, orjson as the int 0).
- ``bool``: read as bool (only ``true``/``false``).
- ``decimal(p,s)``: read as decimal128(p,s) (exact; Arrow refuses more than ``s`` fractional
  digits). Suspects: ``|v| >= 10**min(p-s, 15-s)`` — beyond ``p-s`` integer digits (which
  Arrow lets through) or where reading a JSON number through a double, as the exact path
  does, may change it (up to 15 significant digits a double keeps a decimal exactly).
- ``timestamp``/``timestamp_naive``: read as string; rows not in a strict ISO-8601 form on
  which Arrow's cast and ``datetime.fromisoformat`` agree (years 1000-9899, so no offset can
  leave Python's range) are suspects; then cast (no offset means UTC).
- ``date``: read as string; rows not ``YYYY-MM-DD`` (years 0001-9999) are suspects; then cast
  (an impossible day fails the cast and the piece).
- ``binary``: read as string, cast to its UTF-8 bytes.
- ``required`` fields: null rows are suspects.

Threading: immutable; any thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.source._batch import RecordSchema

__all__ = ["ColumnChecks"]

_TIME = (
    r"^([1-8][0-9]{3}|9[0-8][0-9]{2})-[0-9]{2}-[0-9]{2}"
    r"[T ]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
    r"(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])?$"
)
_ZONED_TIME = _TIME.removesuffix(")?$") + ")$"  # the same, with the offset required
_OFFSET = r"(Z|[+-][0-9]{2}:[0-9]{2})$"
_DATE = (
    r"^(000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})"
    r"-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
)
_UTC = pa.timestamp("us", tz="UTC")
_INT_RANGES = {
    pa.int8(): (-(1 << 7), (1 << 7) - 1),
    pa.int16(): (-(1 << 15), (1 << 15) - 1),
    pa.int32(): (-(1 << 31), (1 << 31) - 1),
}

#: (suspect mask or None, a note for ``finish``) of a column.
_Suspects = Callable[[pa.Array], tuple[pa.Array | None, Any]]
#: The column (suspects removed) in the declared type; may raise ArrowInvalid.
_Finish = Callable[[pa.Array, Any], pa.Array]


def _none(column: pa.Array) -> tuple[pa.Array | None, Any]:
    return None, None


def _same(column: pa.Array, note: Any) -> pa.Array:
    return column


def _narrow_int(kind: pa.DataType) -> tuple[_Suspects, _Finish]:
    low, high = _INT_RANGES[kind]

    def suspects(column: pa.Array) -> tuple[pa.Array | None, Any]:
        bounds = pc.min_max(column)
        smallest, largest = bounds["min"].as_py(), bounds["max"].as_py()
        if smallest is None or (smallest >= low and largest <= high):
            return None, None
        return pc.or_(pc.less(column, low), pc.greater(column, high)), None

    return suspects, lambda column, note: column.cast(kind)


def _float(kind: pa.DataType) -> tuple[_Suspects, _Finish]:
    single = kind == pa.float32()

    def suspects(column: pa.Array) -> tuple[pa.Array | None, Any]:
        masks = []
        finite = pc.is_finite(column.cast(kind, safe=False) if single else column)
        if not pc.all(finite, min_count=0).as_py():
            masks.append(pc.invert(finite))
        inverse = pc.divide(1.0, column)  # -inf for -0.0
        if pc.min(inverse).as_py() == -math.inf:
            masks.append(pc.and_(pc.equal(column, 0), pc.less(inverse, 0)))
        if not masks:
            return None, None
        return masks[0] if len(masks) == 1 else pc.or_kleene(masks[0], masks[1]), None

    if not single:
        return suspects, _same
    return suspects, lambda column, note: column.cast(kind, safe=False)


def _decimal(kind: pa.DataType) -> _Suspects:
    exponent = min(kind.precision - kind.scale, 15 - kind.scale)
    bound = pa.scalar(Decimal(1).scaleb(exponent), pa.decimal128(38, kind.scale))

    def suspects(column: pa.Array) -> tuple[pa.Array | None, Any]:
        big = pc.greater_equal(pc.abs(column), bound)
        return (big if pc.any(big).as_py() else None), None

    return suspects


def _time_suspects(column: pa.Array) -> tuple[pa.Array | None, Any]:
    zoned = pc.match_substring_regex(column, _ZONED_TIME)
    if pc.all(zoned, min_count=0).as_py():  # the usual form
        return None, False
    # The other rows are few (a bad value, a time without offset): matched alone. When none
    # of them is a time without offset, the rows kept are all zoned: finish() casts them as
    # they are (no second pass over the whole column, no offset appended to every row).
    others = pc.invert(zoned)
    if not pc.any(pc.match_substring_regex(column.filter(others), _TIME)).as_py():
        return others, False
    return pc.invert(pc.match_substring_regex(column, _TIME)), True


def _timestamp(kind: pa.DataType) -> _Finish:
    def finish(column: pa.Array, naive: Any) -> pa.Array:
        if naive:  # no offset means UTC, as in the exact path; Arrow needs one to cast to UTC
            with_offset = pc.match_substring_regex(column, _OFFSET)
            column = pc.if_else(
                with_offset, column, pc.binary_join_element_wise(column, "+00:00", "")
            )
        times = column.cast(_UTC)
        return times if kind.tz is not None else times.cast(kind)

    return finish


def _date_suspects(column: pa.Array) -> tuple[pa.Array | None, Any]:
    ok = pc.match_substring_regex(column, _DATE)
    return (None if pc.all(ok, min_count=0).as_py() else pc.invert(ok)), None


def _plan(kind: pa.DataType) -> tuple[pa.DataType, _Suspects, _Finish]:
    """(wire type, suspects, finish) of a declared type."""
    if pa.types.is_string(kind) or kind in (pa.int64(), pa.bool_()):
        return kind, _none, _same
    if kind in _INT_RANGES:
        return (pa.int64(), *_narrow_int(kind))
    if pa.types.is_floating(kind):
        return (pa.float64(), *_float(kind))
    if pa.types.is_decimal128(kind):
        return kind, _decimal(kind), _same
    if pa.types.is_timestamp(kind):
        return pa.string(), _time_suspects, _timestamp(kind)
    if pa.types.is_date32(kind):
        return pa.string(), _date_suspects, lambda column, note: column.cast(kind)
    if pa.types.is_binary(kind):
        return pa.string(), _none, lambda column, note: column.cast(kind)
    raise ValueError(f"type {kind} is not supported by the sources")


class ColumnChecks:
    """The wire schema of a :class:`RecordSchema` and the checks of its columns."""

    def __init__(self, schema: RecordSchema) -> None:
        plans = [_plan(field.type) for field in schema.fields]
        wire = [plan[0] for plan in plans]
        self.wire = pa.schema(
            [pa.field(field.name, kind) for field, kind in zip(schema.fields, wire, strict=True)]
        )
        self._suspects = [suspects for _, suspects, _ in plans]
        self._finish = [finish for _, _, finish in plans]
        names = [field.name for field in schema.fields]
        self._required = [i for i, name in enumerate(names) if name in schema.required]

    def suspects(self, columns: list[pa.Array]) -> tuple[pa.Array | None, list[Any]]:
        """(mask of the suspect rows — None when there are none, notes for ``finish``).

        Each check is an aggregate first; a mask is built only when one fails.
        """
        masks = [pc.is_null(columns[i]) for i in self._required if columns[i].null_count]
        notes = []
        for suspects, column in zip(self._suspects, columns, strict=True):
            mask, note = suspects(column)
            notes.append(note)
            if mask is not None:
                masks.append(mask)
        if not masks:
            return None, notes
        bad = masks[0]
        for mask in masks[1:]:
            bad = pc.or_kleene(bad, mask)
        return pc.fill_null(bad, False), notes  # null: a null value, fine unless required

    def finish(self, columns: list[pa.Array], notes: list[Any]) -> list[pa.Array]:
        """The columns (suspects removed) in the declared types; ArrowInvalid when a value
        does not cast (the piece then goes the exact way)."""
        return [
            finish(column, note)
            for finish, column, note in zip(self._finish, columns, notes, strict=True)
        ]
