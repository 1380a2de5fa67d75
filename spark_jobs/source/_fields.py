"""Field converters: the per-field rules of the exact per-record path (see ``_convert``).

A converter takes a decoded value that is not None and returns it in its Arrow type's Python
form, or raises :class:`FieldError` with the dead-letter reason.

Threading: pure functions; any thread.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa

from spark_jobs._dead_letters import BAD_VALUE, INVALID_UTF8, WRONG_TYPE

__all__ = ["Convert", "FieldError", "text_converter", "value_converter"]

Convert = Callable[[Any], Any]
_INT_RANGES = {
    pa.int8(): (-(1 << 7), (1 << 7) - 1),
    pa.int16(): (-(1 << 15), (1 << 15) - 1),
    pa.int32(): (-(1 << 31), (1 << 31) - 1),
    pa.int64(): (-(1 << 63), (1 << 63) - 1),
}
_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_DATE_TEXT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_TRUE, _FALSE = frozenset({"true", "1"}), frozenset({"false", "0"})
_BYTES = (bytes, bytearray, memoryview)


class FieldError(Exception):
    """A field that does not convert; ``args[0]`` is the dead-letter reason."""


def _text(value: str) -> str:
    return repr(value[:40])


def _number(value: object) -> str:
    try:
        return str(value)[:40]
    except ValueError:  # an int beyond Python's str() digit limit
        return "(a very long number)"


def _show(value: object) -> str:
    return _text(value) if isinstance(value, str) else _number(value)


# -- JSON values and Parquet / table values ------------------------------------------------


def _string(name: str) -> Convert:
    def convert(value: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, _BYTES):
            try:
                return bytes(value).decode()
            except UnicodeDecodeError:
                raise FieldError(f"{INVALID_UTF8}: {name} is not valid UTF-8 text") from None
        raise FieldError(f"{WRONG_TYPE}: {name} must be a string")

    return convert


def _integer(name: str, kind: pa.DataType) -> Convert:
    low, high = _INT_RANGES[kind]

    def convert(value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise FieldError(f"{WRONG_TYPE}: {name} must be an integer")
        if not low <= value <= high:
            raise FieldError(f"{BAD_VALUE}: {name} {_number(value)} is outside the {kind} range")
        return value

    return convert


def _finite(name: str, number: float, single: bool, shown: str) -> float:
    if not math.isfinite(number):
        raise FieldError(f"{BAD_VALUE}: {name} {shown} is not finite")
    if single:
        try:
            struct.pack("<f", number)  # OverflowError iff it rounds to infinity
        except OverflowError:
            raise FieldError(f"{BAD_VALUE}: {name} {shown} is outside the float32 range") from None
    return number


def _float(name: str, kind: pa.DataType) -> Convert:
    single = kind == pa.float32()

    def convert(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
            raise FieldError(f"{WRONG_TYPE}: {name} must be a number")
        try:
            number = float(value)
        except (OverflowError, ValueError):  # an int beyond a double, a signaling NaN
            raise FieldError(f"{BAD_VALUE}: {name} {_number(value)} is not finite") from None
        return _finite(name, number, single, _number(number))

    return convert


def _bool(name: str) -> Convert:
    def convert(value: Any) -> bool:
        if not isinstance(value, bool):
            raise FieldError(f"{WRONG_TYPE}: {name} must be a boolean")
        return value

    return convert


def _fit(name: str, number: Decimal, kind: pa.DataType, shown: str) -> Decimal:
    """``number`` when it fits ``kind`` (a decimal128) without rounding."""
    if not number.is_finite():
        raise FieldError(f"{BAD_VALUE}: {name} {shown} is not finite")
    _, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    significant = len(digits)
    while significant and digits[significant - 1] == 0:  # trailing zeros change nothing
        significant -= 1
        exponent += 1
    if significant:
        fraction = max(0, -exponent)
        integer = significant + exponent  # digits left of the point (may be <= 0)
        if fraction > kind.scale or integer > kind.precision - kind.scale:
            raise FieldError(
                f"{BAD_VALUE}: {name} {shown} does not fit decimal({kind.precision},{kind.scale})"
            )
    return number


def _decimal(name: str, kind: pa.DataType) -> Convert:
    def convert(value: Any) -> Decimal:
        if isinstance(value, Decimal):
            number = value
        elif isinstance(value, bool):
            raise FieldError(f"{WRONG_TYPE}: {name} must be a decimal number or string")
        elif isinstance(value, int):
            number = Decimal(value)
        elif isinstance(value, float):
            number = Decimal(repr(value))
        elif isinstance(value, str):
            try:
                number = Decimal(value)
            except InvalidOperation:
                raise FieldError(
                    f"{BAD_VALUE}: {name} {_text(value)} is not a decimal number"
                ) from None
        else:
            raise FieldError(f"{WRONG_TYPE}: {name} must be a decimal number or string")
        return _fit(name, number, kind, _show(value))

    return convert


def _in_time_zone(name: str, when: datetime, aware: bool, shown: str) -> datetime:
    if when.tzinfo is None:
        return when.replace(tzinfo=UTC) if aware else when
    try:
        utc = when.astimezone(UTC)
    except OverflowError:
        raise FieldError(f"{BAD_VALUE}: {name} {shown} is out of range") from None
    return utc if aware else utc.replace(tzinfo=None)


def _timestamp(name: str, kind: pa.DataType, rows: bool) -> Convert:
    aware = kind.tz is not None
    expected = "a timestamp or ISO-8601 text" if rows else "an ISO-8601 string"

    def convert(value: Any) -> datetime:
        if isinstance(value, str):
            try:
                when = datetime.fromisoformat(value)
            except ValueError:
                raise FieldError(f"{BAD_VALUE}: {name} {_text(value)} is not ISO-8601") from None
            return _in_time_zone(name, when, aware, _text(value))
        if isinstance(value, datetime):
            return _in_time_zone(name, value, aware, _number(value))
        raise FieldError(f"{WRONG_TYPE}: {name} must be {expected}")

    return convert


def _date(name: str, rows: bool) -> Convert:
    expected = "a date or YYYY-MM-DD text" if rows else "a YYYY-MM-DD string"

    def convert(value: Any) -> date:
        if isinstance(value, str):
            if _DATE_TEXT.fullmatch(value):
                try:
                    return date.fromisoformat(value)
                except ValueError:
                    pass
            raise FieldError(f"{BAD_VALUE}: {name} {_text(value)} is not a YYYY-MM-DD date")
        if isinstance(value, date) and not isinstance(value, datetime):
            return value
        raise FieldError(f"{WRONG_TYPE}: {name} must be {expected}")

    return convert


def _binary(name: str, rows: bool) -> Convert:
    expected = "bytes or text" if rows else "a string"

    def convert(value: Any) -> bytes:
        if isinstance(value, _BYTES):
            return bytes(value)
        if isinstance(value, str):
            try:
                return value.encode()
            except UnicodeEncodeError:  # lone surrogates
                raise FieldError(f"{INVALID_UTF8}: {name} is not valid UTF-8 text") from None
        raise FieldError(f"{WRONG_TYPE}: {name} must be {expected}")

    return convert


def value_converter(field: pa.Field, rows: bool) -> Convert:
    """The converter of a JSON value (``rows`` False) or a Parquet/table value (True)."""
    name, kind = field.name, field.type
    if pa.types.is_string(kind):
        return _string(name)
    if kind in _INT_RANGES:
        return _integer(name, kind)
    if pa.types.is_floating(kind):
        return _float(name, kind)
    if pa.types.is_boolean(kind):
        return _bool(name)
    if pa.types.is_decimal128(kind):
        return _decimal(name, kind)
    if pa.types.is_timestamp(kind):
        return _timestamp(name, kind, rows)
    if pa.types.is_date32(kind):
        return _date(name, rows)
    if pa.types.is_binary(kind):
        return _binary(name, rows)
    raise ValueError(f"field {name}: type {kind} is not supported by the sources")


# -- CSV text ---------------------------------------------------------------------------------


def _text_integer(name: str, kind: pa.DataType) -> Convert:
    low, high = _INT_RANGES[kind]

    def convert(value: str) -> int:
        text = value.strip()
        if not _INT_TEXT.fullmatch(text):
            raise FieldError(f"{WRONG_TYPE}: {name} must be an integer, got {_text(value)}")
        if len(text.lstrip("+-").lstrip("0")) > 20 or not low <= (number := int(text)) <= high:
            raise FieldError(f"{BAD_VALUE}: {name} {_text(value)} is outside the {kind} range")
        return number

    return convert


def _text_float(name: str, kind: pa.DataType) -> Convert:
    single = kind == pa.float32()

    def convert(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise FieldError(f"{WRONG_TYPE}: {name} must be a number, got {_text(value)}") from None
        return _finite(name, number, single, _text(value))

    return convert


def _text_bool(name: str) -> Convert:
    def convert(value: str) -> bool:
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise FieldError(f"{WRONG_TYPE}: {name} must be a boolean, got {_text(value)}")

    return convert


def _text_decimal(name: str, kind: pa.DataType) -> Convert:
    def convert(value: str) -> Decimal:
        try:
            number = Decimal(value)
        except InvalidOperation:
            raise FieldError(
                f"{WRONG_TYPE}: {name} must be a decimal number, got {_text(value)}"
            ) from None
        return _fit(name, number, kind, _text(value))

    return convert


def text_converter(field: pa.Field) -> Convert:
    """The converter of a CSV field's text (never empty: empty fields are null)."""
    name, kind = field.name, field.type
    if kind in _INT_RANGES:
        return _text_integer(name, kind)
    if pa.types.is_floating(kind):
        return _text_float(name, kind)
    if pa.types.is_boolean(kind):
        return _text_bool(name)
    if pa.types.is_decimal128(kind):
        return _text_decimal(name, kind)
    return value_converter(field, rows=False)  # string, timestamp, date, binary: as JSON text
