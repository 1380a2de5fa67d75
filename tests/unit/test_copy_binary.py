"""Binary COPY built column-wise (``spark_jobs.sink._copy_binary``): byte for byte the rows a
plain-Python encoder of Postgres' binary COPY format gives (Hypothesis over batches of every
type it takes, NULLs anywhere, several batches, partitioned or not), in the column order it
returns. That Postgres reads them as ``write_row`` stages them is
``tests/integration/test_table_sink_copy.py``."""

from __future__ import annotations

import struct
from datetime import date
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_jobs.sink import _copy_binary
from spark_jobs.sink._copy_binary import BinaryRows, binary_columnar

_EPOCH_US = 946_684_800_000_000
_MICROS = st.integers(-62_135_596_800_000_000, 253_402_300_799_999_999)  # years 1 .. 9999
_DAYS = st.integers(-719_162, 2_932_896)  # years 1 .. 9999
_TYPES: dict[str, tuple[pa.DataType, st.SearchStrategy[Any], str]] = {
    "i8": (pa.int8(), st.integers(-128, 127), ">h"),
    "i16": (pa.int16(), st.integers(-(2**15), 2**15 - 1), ">h"),
    "i32": (pa.int32(), st.integers(-(2**31), 2**31 - 1), ">i"),
    "i64": (pa.int64(), st.integers(-(2**63), 2**63 - 1), ">q"),
    "f32": (pa.float32(), st.floats(width=32, allow_nan=False), ">f"),
    "f64": (pa.float64(), st.floats(allow_nan=False), ">d"),
    "ok": (pa.bool_(), st.booleans(), ">?"),
    "day": (pa.date32(), _DAYS, ">i"),
    "at": (pa.timestamp("us", "UTC"), _MICROS, ">q"),
    "naive": (pa.timestamp("us"), _MICROS, ">q"),
    "s": (pa.string(), st.text(), ""),
    "raw": (pa.binary(), st.binary(), ""),
}


def _field(name: str, value: Any) -> bytes:
    """One field as Postgres' binary COPY format has it (the oracle)."""
    if value is None:
        return struct.pack(">i", -1)
    fmt = _TYPES[name][2] if name in _TYPES else ">q"
    if name == "s":
        data = value.encode()
    elif name == "raw":
        data = value
    elif name == "day":
        data = struct.pack(fmt, value - 10_957)
    elif name in ("at", "naive"):
        data = struct.pack(fmt, value - _EPOCH_US)
    else:
        data = struct.pack(fmt, value)
    return struct.pack(">i", len(data)) + data


@st.composite
def _batches(draw: st.DrawFn) -> tuple[pa.Schema, list[tuple[str, list[dict[str, Any]]]]]:
    names = draw(st.lists(st.sampled_from(sorted(_TYPES)), min_size=1, max_size=6, unique=True))
    schema = pa.schema([(n, _TYPES[n][0]) for n in names])
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        day = draw(st.dates(date(1, 1, 1), date(9999, 12, 31))).isoformat()
        rows = draw(
            st.lists(
                st.fixed_dictionaries({n: st.none() | _TYPES[n][1] for n in names}), max_size=8
            )
        )
        batches.append((day, rows))
    return schema, batches


def _arrow(schema: pa.Schema, rows: list[dict[str, Any]]) -> pa.RecordBatch:
    arrays = []
    for f in schema:
        values = [r[f.name] for r in rows]
        if f.name == "day":
            arrays.append(pa.array(values, pa.int32()).cast(pa.date32()))
        elif f.name in ("at", "naive"):
            arrays.append(pa.array(values, pa.int64()).cast(f.type))
        else:
            arrays.append(pa.array(values, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


@settings(max_examples=200, deadline=None)
@given(_batches(), st.booleans(), st.integers(0, 10**9))
def test_rows_are_postgres_binary_copy_byte_for_byte(
    data: tuple[pa.Schema, list[tuple[str, list[dict[str, Any]]]]], partitioned: bool, seq: int
) -> None:
    schema, drawn = data
    assert binary_columnar(schema)
    names = ["seq", *schema.names, *(["dt"] if partitioned else [])]
    encoder = BinaryRows(schema, partitioned=partitioned, names=names)
    batches = [(day if partitioned else "", _arrow(schema, rows)) for day, rows in drawn]
    payload, last, order = encoder.encode(batches, seq)
    assert sorted(order) == sorted(names) and order[0] == "seq"
    # Columns without a NULL of a fixed width come first (one record per row), then the rest.
    fixed = {"seq", "dt"} | {n for n in schema.names if n not in ("s", "raw")}
    nulls = {n for _, rows in drawn for r in rows for n, v in r.items() if v is None}
    steady = [n for n in names if n in fixed and n not in nulls]
    assert order == steady + [n for n in names if n not in steady]
    expected = [b"PGCOPY\n\xff\r\n\x00" + bytes(8)]
    n = seq
    for day, rows in drawn:
        for row in rows:
            n += 1
            values = {"seq": n, **row}
            if partitioned:
                values["dt"] = (date.fromisoformat(day) - date(2000, 1, 1)).days + 10_957
            fields = [_field("day" if c == "dt" else c, values[c]) for c in order]
            expected.append(struct.pack(">h", len(order)) + b"".join(fields))
    expected.append(b"\xff\xff")
    assert last == n
    assert payload == b"".join(expected)


def test_a_decimal_keeps_the_columnar_path_off() -> None:
    schema = pa.schema([("id", pa.int64()), ("amount", pa.decimal128(12, 2))])
    assert not binary_columnar(schema)
    with pytest.raises(ValueError, match="not built for"):
        BinaryRows(schema, partitioned=False, names=["seq", "id", "amount"])


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        (pa.date32(), -(2**31)),
        (pa.timestamp("us"), -(2**63)),
        (pa.timestamp("us", "UTC"), -(2**63) + 5),
    ],
)
def test_a_value_past_postgres_range_fails_instead_of_wrapping(
    kind: pa.DataType, value: int
) -> None:
    storage = pa.int32() if kind == pa.date32() else pa.int64()
    batch = pa.RecordBatch.from_arrays([pa.array([0, value], storage).cast(kind)], names=["v"])
    encoder = BinaryRows(batch.schema, partitioned=False, names=["seq", "v"])
    with pytest.raises(ValueError, match="out of Postgres' range"):
        encoder.encode([("", batch)], 0)


def test_a_batch_goes_in_slices_with_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    batch = pa.RecordBatch.from_pydict(
        {"id": list(range(7)), "s": ["a", None, "", "é", "b", None, "c"]},
        schema=pa.schema([("id", pa.int64()), ("s", pa.string())]),
    )

    def encoded() -> tuple[bytes, int, list[str]]:
        encoder = BinaryRows(batch.schema, partitioned=False, names=["seq", "id", "s"])
        return encoder.encode([("", batch), ("", batch.slice(3))], 5)

    whole = encoded()
    monkeypatch.setattr(_copy_binary, "_SLICE", 2)
    assert encoded() == whole and whole[1] == 5 + 7 + 4
