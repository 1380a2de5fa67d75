"""The exact per-record path (RecordConverter): every declared type from JSON values, CSV
text and Parquet/table values, with the exact dead-letter reasons."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from source_schemas import EVENTS, ORDERS

from spark_jobs.source import OFFSET, RecordConverter, RecordSchema
from spark_jobs.source._convert import max_event_time, raw_json

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PLUS_ONE = timezone(timedelta(hours=1))


def one(kind: pa.DataType) -> RecordConverter:
    return RecordConverter(RecordSchema((pa.field("f", kind),)))


def json_value(kind: pa.DataType, value: Any) -> Any:
    out = one(kind).from_json({"f": value})
    return out if isinstance(out, str) else out[0]


def row_value(kind: pa.DataType, value: Any) -> Any:
    out = one(kind).from_values([value])
    return out if isinstance(out, str) else out[0]


def text_value(kind: pa.DataType, value: str) -> Any:
    out = one(kind).from_text([value])
    return out if isinstance(out, str) else out[0]


DEC = pa.decimal128(5, 2)
UTC_US = pa.timestamp("us", tz="UTC")
NAIVE = pa.timestamp("us")

JSON_CASES: list[tuple[pa.DataType, Any, Any]] = [
    (pa.string(), "x", "x"),
    (pa.string(), 5, "wrong type: f must be a string"),
    (pa.string(), None, None),
    (pa.int32(), 5, 5),
    (pa.int32(), -(2**31), -(2**31)),
    (pa.int32(), True, "wrong type: f must be an integer"),
    (pa.int32(), 1.0, "wrong type: f must be an integer"),
    (pa.int32(), "5", "wrong type: f must be an integer"),
    (pa.int32(), 2**31, "bad value: f 2147483648 is outside the int32 range"),
    (pa.int8(), 128, "bad value: f 128 is outside the int8 range"),
    (pa.int16(), -32769, "bad value: f -32769 is outside the int16 range"),
    (pa.int64(), 2**63, f"bad value: f {2**63} is outside the int64 range"),
    (pa.float64(), 3, 3.0),
    (pa.float64(), 2.5, 2.5),
    (pa.float64(), True, "wrong type: f must be a number"),
    (pa.float64(), "1", "wrong type: f must be a number"),
    (pa.float32(), 1e39, "bad value: f 1e+39 is outside the float32 range"),
    (pa.float32(), 3.4028235e38, 3.4028235e38),
    (pa.bool_(), True, True),
    (pa.bool_(), 1, "wrong type: f must be a boolean"),
    (pa.bool_(), "true", "wrong type: f must be a boolean"),
    (DEC, "1.25", Decimal("1.25")),
    (DEC, 1.25, Decimal("1.25")),
    (DEC, 0.1, Decimal("0.1")),
    (DEC, 100, Decimal(100)),
    (DEC, "999.99", Decimal("999.99")),
    (DEC, "1.2300", Decimal("1.2300")),
    (DEC, "-0", Decimal("-0")),
    (DEC, 1.234, "bad value: f 1.234 does not fit decimal(5,2)"),
    (DEC, 1e-7, "bad value: f 1e-07 does not fit decimal(5,2)"),
    (DEC, 1000, "bad value: f 1000 does not fit decimal(5,2)"),
    (DEC, "1000", "bad value: f '1000' does not fit decimal(5,2)"),
    (DEC, "NaN", "bad value: f 'NaN' is not finite"),
    (DEC, "abc", "bad value: f 'abc' is not a decimal number"),
    (DEC, True, "wrong type: f must be a decimal number or string"),
    (DEC, [1], "wrong type: f must be a decimal number or string"),
    (UTC_US, "2026-01-01T00:00:00", T0),
    (UTC_US, "2026-01-01T01:00:00+01:00", T0),
    (UTC_US, "2026-01-01 00:00:00Z", T0),
    (UTC_US, "yesterday", "bad value: f 'yesterday' is not ISO-8601"),
    (UTC_US, 5, "wrong type: f must be an ISO-8601 string"),
    (
        UTC_US,
        "0001-01-01T00:00:00+01:00",
        "bad value: f '0001-01-01T00:00:00+01:00' is out of range",
    ),
    (NAIVE, "2026-01-01T01:00:00+01:00", datetime(2026, 1, 1)),
    (NAIVE, "2026-01-01T01:00:00", datetime(2026, 1, 1, 1)),
    (pa.date32(), "2024-02-29", date(2024, 2, 29)),
    (pa.date32(), "2026-02-29", "bad value: f '2026-02-29' is not a YYYY-MM-DD date"),
    (pa.date32(), "20260101", "bad value: f '20260101' is not a YYYY-MM-DD date"),
    (pa.date32(), "0000-01-01", "bad value: f '0000-01-01' is not a YYYY-MM-DD date"),
    (pa.date32(), 5, "wrong type: f must be a YYYY-MM-DD string"),
    (pa.binary(), "ab", b"ab"),
    (pa.binary(), "é", "é".encode()),
    (pa.binary(), 5, "wrong type: f must be a string"),
]


@pytest.mark.parametrize(("kind", "value", "expected"), JSON_CASES)
def test_json_values(kind: pa.DataType, value: Any, expected: Any) -> None:
    got = json_value(kind, value)
    assert got == expected
    assert type(got) is type(expected)


ROW_CASES: list[tuple[pa.DataType, Any, Any]] = [
    (pa.string(), b"ok", "ok"),
    (pa.string(), b"\xff", "invalid UTF-8: f is not valid UTF-8 text"),
    (pa.float64(), Decimal("1.5"), 1.5),
    (pa.float64(), float("nan"), "bad value: f nan is not finite"),
    (pa.float64(), Decimal("Infinity"), "bad value: f inf is not finite"),
    (DEC, Decimal("12.5"), Decimal("12.5")),
    (DEC, Decimal("12.345"), "bad value: f 12.345 does not fit decimal(5,2)"),
    (UTC_US, datetime(2026, 1, 1), T0),
    (UTC_US, datetime(2026, 1, 1, 1, tzinfo=PLUS_ONE), T0),
    (UTC_US, date(2026, 1, 1), "wrong type: f must be a timestamp or ISO-8601 text"),
    (NAIVE, datetime(2026, 1, 1, 1, tzinfo=PLUS_ONE), datetime(2026, 1, 1)),
    (pa.date32(), date(2026, 1, 1), date(2026, 1, 1)),
    (pa.date32(), T0, "wrong type: f must be a date or YYYY-MM-DD text"),
    (pa.binary(), b"\x00\xff", b"\x00\xff"),
    (pa.binary(), memoryview(b"m"), b"m"),
    (pa.binary(), 5, "wrong type: f must be bytes or text"),
    (pa.int64(), 2**63, f"bad value: f {2**63} is outside the int64 range"),
]


@pytest.mark.parametrize(("kind", "value", "expected"), ROW_CASES)
def test_parquet_and_table_values(kind: pa.DataType, value: Any, expected: Any) -> None:
    got = row_value(kind, value)
    assert got == expected
    assert type(got) is type(expected)


TEXT_CASES: list[tuple[pa.DataType, str, Any]] = [
    (pa.int64(), " 42 ", 42),
    (pa.int64(), "+7", 7),
    (pa.int64(), "0" * 30 + "1", 1),
    (pa.int64(), "4.2", "wrong type: f must be an integer, got '4.2'"),
    (pa.int64(), "٣", "wrong type: f must be an integer, got '٣'"),
    (
        pa.int64(),
        "9223372036854775808",
        "bad value: f '9223372036854775808' is outside the int64 range",
    ),
    (pa.int32(), "1" + "0" * 5000, f"bad value: f {('1' + '0' * 39)!r} is outside the int32 range"),
    (pa.float64(), "1.5", 1.5),
    (pa.float64(), " 2 ", 2.0),
    (pa.float64(), "nan", "bad value: f 'nan' is not finite"),
    (pa.float64(), "a lot", "wrong type: f must be a number, got 'a lot'"),
    (pa.float32(), "1e39", "bad value: f '1e39' is outside the float32 range"),
    (pa.bool_(), "TRUE", True),
    (pa.bool_(), " 0", False),
    (pa.bool_(), "yes", "wrong type: f must be a boolean, got 'yes'"),
    (DEC, "1.5", Decimal("1.5")),
    (DEC, "x", "wrong type: f must be a decimal number, got 'x'"),
    (DEC, "1.234", "bad value: f '1.234' does not fit decimal(5,2)"),
    (UTC_US, "2026-01-01 01:00:00+01:00", T0),
    (UTC_US, "soon", "bad value: f 'soon' is not ISO-8601"),
    (pa.date32(), "2026-01-01", date(2026, 1, 1)),
    (pa.binary(), "é", "é".encode()),
    (pa.string(), " x ", " x "),
]


@pytest.mark.parametrize(("kind", "value", "expected"), TEXT_CASES)
def test_csv_text(kind: pa.DataType, value: str, expected: Any) -> None:
    got = text_value(kind, value)
    assert got == expected
    assert type(got) is type(expected)


def test_missing_required_fields_are_listed_in_declaration_order_before_any_type_error() -> None:
    converter = RecordConverter(ORDERS)
    assert converter.from_json({"order_no": "x", "placed_on": 5}) == (
        "missing field: region, placed_at, total"
    )
    assert converter.from_json({"region": "eu", "order_no": 1, "placed_at": None, "total": 1}) == (
        "missing field: placed_at"
    )


def test_the_first_bad_field_in_declaration_order_gives_the_reason() -> None:
    converter = RecordConverter(EVENTS)
    obj = {
        "event_id": "e",
        "user_id": "7",
        "event_time": "x",
        "event_type": "t",
        "amount": 1,
        "other": object(),
    }
    assert converter.from_json(obj) == "wrong type: user_id must be an integer"
    assert converter.from_json({**obj, "user_id": 7}) == "bad value: event_time 'x' is not ISO-8601"


def test_undeclared_fields_are_ignored_and_optional_ones_null() -> None:
    converter = RecordConverter(ORDERS)
    row = converter.from_json(
        {"region": "eu", "order_no": 3, "placed_at": "2026-01-01T00:00:00Z", "total": "9.5", "x": 1}
    )
    assert row == ("eu", 3, T0, None, Decimal("9.5"), None, None, None, None, None, None)


def test_rows_become_a_batch_of_the_declared_types_with_offsets() -> None:
    converter = RecordConverter(ORDERS)
    good = {
        "region": "eu",
        "order_no": 3,
        "placed_at": "2026-01-01T00:00:00Z",
        "placed_on": "2026-01-01",
        "total": 9.5,
        "paid": True,
        "weight": 0.1,
        "note": "n",
        "shipped": "2026-01-02T00:00:00",
        "tag": "t",
        "qty": -3,
    }
    rows = [converter.from_json(good), converter.from_json({**good, "note": None, "qty": None})]
    assert all(isinstance(row, tuple) for row in rows)
    batch = converter.to_batch(rows, [10, 20])  # type: ignore[arg-type]
    assert batch.schema == ORDERS.batch_schema
    assert batch.column(OFFSET).to_pylist() == [10, 20]
    first = batch.to_pylist()[0]
    assert first["total"] == Decimal("9.50")
    assert first["weight"] == pa.scalar(0.1, pa.float32()).as_py()
    assert first["shipped"] == datetime(2026, 1, 2)
    assert first["tag"] == b"t"
    assert batch.column("note").to_pylist() == ["n", None]
    assert converter.to_batch([], []).equals(converter.empty())
    assert converter.empty().schema == ORDERS.batch_schema


def test_max_event_time_is_utc_and_none_without_rows_or_field() -> None:
    naive = RecordSchema((pa.field("t", NAIVE),), event_time="t")
    converter = RecordConverter(naive)
    batch = converter.to_batch([(datetime(2026, 1, 2),), (datetime(2026, 1, 1),)], [0, 1])
    assert max_event_time(naive, batch) == datetime(2026, 1, 2, tzinfo=UTC)
    assert max_event_time(naive, converter.empty()) is None
    assert max_event_time(RecordSchema((pa.field("t", NAIVE),)), batch) is None


def test_raw_json_of_a_row() -> None:
    raw = raw_json({"a": Decimal("1.5"), "b": T0, "c": b"x\xff", "d": None})
    assert raw == b'{"a":"1.5","b":"2026-01-01T00:00:00+00:00","c":"x\\\\xff","d":null}'
    assert raw_json({"big": 2**70}) == repr({"big": 2**70}).encode()
    # A non-finite float keeps its text (orjson alone writes null: the trial's dead letter
    # showed "score":null for the -Infinity it was about).
    nan = float("nan")
    assert raw_json({"id": 1, "f": nan, "g": -float("inf"), "h": 0.5}) == (
        b'{"id":1,"f":"nan","g":"-inf","h":0.5}'
    )
