"""Field types and durations as pipelines spell them, and their Arrow and Postgres forms.

A field type is a string (``"int64"``, ``"decimal(12,2)"``, ``"timestamp"``) or the
``pyarrow.DataType`` itself. Only the types every reader, lookup and sink can carry exactly
are accepted; anything else fails the definition with a message naming the field.

Threading: pure functions, any thread.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, TypeAlias

import pyarrow as pa

__all__ = [
    "AMBIGUOUS",
    "Duration",
    "TypeSpec",
    "arrow_type",
    "catalog_arrow_type",
    "is_supported",
    "postgres_type",
    "seconds",
    "type_family",
    "type_name",
]

TypeSpec: TypeAlias = str | pa.DataType
Duration: TypeAlias = str | float | int | timedelta

UTC_MICROS = pa.timestamp("us", tz="UTC")

_NAMED: dict[str, pa.DataType] = {
    "string": pa.string(),
    "str": pa.string(),
    "text": pa.string(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "int": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "double": pa.float64(),
    "bool": pa.bool_(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "timestamp": UTC_MICROS,
    "timestamp_naive": pa.timestamp("us"),
    "binary": pa.binary(),
}
#: Names that mean different things in Python and in Arrow/Spark, refused with the reason.
AMBIGUOUS: dict[str, str] = {
    "float": (
        "'float' is ambiguous (64-bit in Python, 32-bit in Arrow and Spark): "
        "write 'float64' (or 'double') or 'float32'"
    ),
}
_DECIMAL = re.compile(r"^decimal\(\s*(\d{1,2})\s*,\s*(\d{1,2})\s*\)$")


def is_supported(kind: pa.DataType) -> bool:
    """True for the Arrow types Sluice carries end to end."""
    if kind in _NAMED.values():
        return True
    return bool(pa.types.is_decimal128(kind)) and 1 <= kind.precision <= 38


def arrow_type(spec: Any, where: str) -> pa.DataType:
    """The Arrow type of ``spec``; ValueError naming ``where`` when it is not supported."""
    if isinstance(spec, pa.DataType):
        kind = spec
    elif isinstance(spec, str):
        text = spec.strip().lower()
        match = _DECIMAL.fullmatch(text)
        if match:
            precision, scale = int(match.group(1)), int(match.group(2))
            if not 1 <= precision <= 38 or scale > precision:
                raise ValueError(
                    f"{where}: {spec!r} needs 1 <= precision <= 38, scale <= precision"
                )
            return pa.decimal128(precision, scale)
        if text in AMBIGUOUS:
            raise ValueError(f"{where}: {AMBIGUOUS[text]}")
        if text not in _NAMED:
            raise ValueError(
                f"{where}: unknown type {spec!r} (use one of {', '.join(sorted(_NAMED))} "
                "or decimal(p,s))"
            )
        return _NAMED[text]
    else:
        raise ValueError(f"{where}: a type is a string or a pyarrow.DataType, got {spec!r}")
    if pa.types.is_timestamp(kind) and kind.unit == "us" and kind.tz in ("UTC", "+00:00"):
        return UTC_MICROS
    if not is_supported(kind):
        raise ValueError(f"{where}: type {type_name(kind)} is not supported")
    return kind


def type_name(kind: pa.DataType | None) -> str:
    """How a type is shown (the spelling ``arrow_type`` reads back)."""
    if kind is None:
        return "?"
    if pa.types.is_decimal(kind):
        return f"decimal({kind.precision},{kind.scale})"
    if kind == UTC_MICROS:
        return "timestamp"
    if pa.types.is_timestamp(kind):
        return "timestamp_naive"
    for name, known in _NAMED.items():
        if known == kind:
            return name
    return str(kind)


def type_family(kind: pa.DataType) -> str:
    """The comparable family of a type: lookup keys must match their column's family."""
    if pa.types.is_integer(kind):
        return "integer"
    if pa.types.is_floating(kind):
        return "float"
    if pa.types.is_decimal(kind):
        return "decimal"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "string"
    if pa.types.is_boolean(kind):
        return "bool"
    if pa.types.is_date(kind):
        return "date"
    if pa.types.is_timestamp(kind):
        return "timestamp"
    if pa.types.is_binary(kind):
        return "binary"
    return str(kind)


def postgres_type(kind: pa.DataType) -> str:
    """The Postgres column type that holds ``kind`` exactly (sink tables)."""
    if pa.types.is_string(kind):
        return "text"
    if pa.types.is_int8(kind) or pa.types.is_int16(kind):
        return "smallint"
    if pa.types.is_int32(kind):
        return "integer"
    if pa.types.is_int64(kind):
        return "bigint"
    if pa.types.is_float32(kind):
        return "real"
    if pa.types.is_float64(kind):
        return "double precision"
    if pa.types.is_boolean(kind):
        return "boolean"
    if pa.types.is_decimal(kind):
        return f"numeric({kind.precision},{kind.scale})"
    if pa.types.is_date(kind):
        return "date"
    if pa.types.is_timestamp(kind):
        return "timestamptz" if kind.tz else "timestamp"
    if pa.types.is_binary(kind):
        return "bytea"
    raise ValueError(f"no Postgres type for {kind}")


_CATALOG_EXACT: dict[str, pa.DataType] = {
    "bigint": pa.int64(),
    "integer": pa.int32(),
    "smallint": pa.int16(),
    "double precision": pa.float64(),
    "real": pa.float32(),
    "boolean": pa.bool_(),
    "date": pa.date32(),
    "timestamp with time zone": UTC_MICROS,
    "timestamp without time zone": pa.timestamp("us"),
    "text": pa.string(),
    "bytea": pa.binary(),
}
_CATALOG_NUMERIC = re.compile(r"^numeric\((\d+),(\d+)\)$")


def catalog_arrow_type(sql_type: str) -> tuple[pa.DataType, bool]:
    """(Arrow type, read as text) of a column whose ``format_type`` is ``sql_type``.

    Character types, ``uuid``, ``json``, unconstrained ``numeric`` and any other type are
    read as text (``::text``); ``numeric(p,s)`` with p <= 38 as ``decimal(p,s)``.
    """
    if sql_type in _CATALOG_EXACT:
        return _CATALOG_EXACT[sql_type], False
    match = _CATALOG_NUMERIC.fullmatch(sql_type.replace(" ", ""))
    if match and int(match.group(1)) <= 38:
        return pa.decimal128(int(match.group(1)), int(match.group(2))), False
    if sql_type.startswith(("character varying", "character(", "character")):
        return pa.string(), False
    return pa.string(), True


def seconds(value: Duration, where: str) -> float:
    """A duration in seconds: a number, a timedelta, or text like ``500ms``, ``10s``, ``5m``,
    ``2h``; ValueError naming ``where`` otherwise (or when negative)."""
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        result = float(value)
    elif isinstance(value, str):
        match = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*", value)
        if not match:
            raise ValueError(f"{where}: {value!r} is not a duration (e.g. 500ms, 10s, 5m, 2h)")
        unit = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600, "d": 86400}[match.group(2)]
        result = float(match.group(1)) * unit
    else:
        raise ValueError(f"{where}: {value!r} is not a duration")
    if result < 0:
        raise ValueError(f"{where}: a duration must not be negative, got {value!r}")
    return result
