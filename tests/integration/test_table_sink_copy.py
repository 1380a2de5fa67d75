"""The table sink's COPY paths stage exactly the same rows: binary COPY row by row (psycopg's
``write_row``, the oracle), CSV rendered by Arrow, and binary COPY built column-wise.

Real Postgres: one batch of every supported type, with the awkward values each can hold,
staged by each path under its own run id; the batch tables must hold the same rows.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa

from enumerator_service import asyncpg_dsn
from enumerator_service._operations import Platform, open_platform
from spark_jobs.sink import PostgresTableSinkWriter, ensure_tables

_TS = [
    datetime(1, 1, 1),
    datetime(9999, 12, 31, 23, 59, 59, 999999),
    None,
    datetime(1969, 12, 31, 23, 59, 59, 500000),
    datetime(2026, 3, 29, 1, 30, 0, 1),
    datetime(1970, 1, 1),
    datetime(2000, 2, 29, 12),
    datetime(2024, 1, 1),
]
_VALUES: dict[str, tuple[pa.DataType, list[Any]]] = {
    "s": (pa.string(), ["", None, 'say "hi"', "a,b\nc\r\nd", "é😀中", "\\N", " lead", "NULL"]),
    "i8": (pa.int8(), [-128, 127, None, 0, 1, -1, 2, 3]),
    "i16": (pa.int16(), [-32768, 32767, None, 0, 1, -1, 2, 3]),
    "i32": (pa.int32(), [-(2**31), 2**31 - 1, None, 0, 1, -1, 2, 3]),
    "i64": (pa.int64(), [-(2**63), 2**63 - 1, None, 0, 1, -1, 2, 3]),
    "f32": (
        pa.float32(),
        [math.nan, math.inf, None, -0.0, 1.1, -math.inf, 3.4e38, 1e-45],
    ),
    "f64": (
        pa.float64(),
        [math.nan, -math.inf, None, -0.0, 0.1, math.inf, 1.7976931348623157e308, 5e-324],
    ),
    "ok": (pa.bool_(), [True, False, None, True, False, True, False, True]),
    "amount": (
        pa.decimal128(38, 10),
        [
            Decimal("1.20"),
            Decimal("-9999999999999999999999999999.9999999999"),
            None,
            Decimal("0"),
            Decimal("0.0000000001"),
            Decimal("9999999999999999999999999999.9999999999"),
            Decimal("-1"),
            Decimal("12345.6789"),
        ],
    ),
    "small": (pa.decimal128(3, 3), [Decimal("0.999"), None, None, Decimal("-0.5"), *[None] * 4]),
    "day": (
        pa.date32(),
        [date(1, 1, 1), date(9999, 12, 31), None, date(1969, 12, 31), *[date(2000, 2, 29)] * 4],
    ),
    "at": (pa.timestamp("us", tz="UTC"), [t and t.replace(tzinfo=UTC) for t in _TS]),
    "naive": (pa.timestamp("us"), _TS),
}
_RAW = (pa.binary(), [b'\x00\xff,"\n', b"", None, b"\\N", b"\r\n", b"x" * 300, b"\x80", b"NULL"])
SCHEMA = pa.schema([(name, kind) for name, (kind, _) in _VALUES.items()])
#: Every type binary COPY built column-wise takes (no decimal), and a binary field.
COLUMNAR = pa.schema(
    [f for f in SCHEMA if not pa.types.is_decimal(f.type)] + [pa.field("raw", _RAW[0])]
)
_ENCODER = {"rows": "NoneType", "csv": "CsvRows", "columns": "BinaryRows"}


def _batch(rows: int = len(_TS), schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
    values = {**_VALUES, "raw": _RAW}
    return pa.RecordBatch.from_arrays(
        [pa.array((values[f.name][1] * rows)[:rows], f.type) for f in schema], schema=schema
    )


@pytest.fixture
def platform(make_settings: Any) -> Iterator[Platform]:
    p = open_platform(make_settings())
    yield p
    p.close()


def _stage(
    platform: Platform,
    table: str,
    schema: pa.Schema,
    batches: list[tuple[str, pa.RecordBatch]],
    *,
    via: str,
    partitioned: bool,
    encoder: str | None = None,
) -> str:
    run_id = f"run-{secrets.token_hex(4)}"
    io = ThreadPoolExecutor(1)
    writer = PostgresTableSinkWriter(
        io,
        dsn=asyncpg_dsn(platform.url),
        schema_name="public",
        table=table,
        columns=schema,
        partitioned=partitioned,
        upsert_key=None,
        run_id=run_id,
        subtask=3,
        attempt='a\'1,"x"',
        via=via,
    )
    assert type(writer._encoder).__name__ == _ENCODER[encoder or via]
    for partition, batch in batches:
        writer.write_batch(partition, batch)
    out = writer.pre_commit().result(timeout=60)
    io.submit(writer.close).result(timeout=30)
    io.shutdown()
    assert out.rows == sum(b.num_rows for _, b in batches)
    (entry,) = out.files
    assert (entry["run_id"], entry["subtask"], entry["batch"]) == (run_id, 3, 1)
    return str(entry["staged_table"])


def _staged(platform: Platform, batch_table: str, names: list[str]) -> list[Any]:
    """The staged rows of a batch table in sequence order (sequence number first), each
    column also as Postgres' own text (so NaN compares equal, and NULL stays apart from '')."""
    cols = ", ".join(f'"{n}", "{n}"::text' for n in names)
    with platform.engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    f'SELECT "__sluice_seq", {cols} FROM public."{batch_table}"'
                    ' ORDER BY "__sluice_seq"'
                ),
            ).all()
        ]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b) and type(a) is type(b)


def _compare(oracle: list[Any], other: list[Any]) -> None:
    assert len(oracle) == len(other) == 9008
    assert [r[0] for r in other] == list(range(1, 9009))
    for o_row, row in zip(oracle, other, strict=True):
        assert all(_same(x, y) for x, y in zip(o_row, row, strict=True)), (o_row, row)


@pytest.mark.parametrize("partitioned", [True, False])
def test_csv_and_binary_copy_stage_the_same_rows(platform: Platform, partitioned: bool) -> None:
    table = f"copy_{secrets.token_hex(3)}"
    ensure_tables(
        platform.engine, "public", table, SCHEMA, partitioned=partitioned, upsert_key=None
    )
    day = "2026-01-02" if partitioned else ""
    batches = [(day, _batch()), ("2026-01-03" if partitioned else "", _batch(9000))]
    names = [*SCHEMA.names, *(["dt"] if partitioned else [])]

    def staged(via: str, encoder: str | None = None) -> list[Any]:
        name = _stage(
            platform, table, SCHEMA, batches, via=via, partitioned=partitioned, encoder=encoder
        )
        return _staged(platform, name, names)

    binary = staged("rows")
    _compare(binary, staged("csv"))
    _compare(binary, staged("columns", encoder="csv"))  # (a decimal: CSV)
    # The binary path carries the values as given (the oracle of the comparison above).
    first = {n: binary[0][1 + 2 * i] for i, n in enumerate(names)}
    second = {n: binary[1][1 + 2 * i] for i, n in enumerate(names)}
    assert (first["s"], second["s"]) == ("", None)
    assert binary[2][1] == 'say "hi"' and binary[3][1] == "a,b\nc\r\nd"
    assert math.isnan(first["f64"]) and math.isnan(first["f32"])
    assert first["at"] == datetime(1, 1, 1, tzinfo=UTC)
    assert second["naive"] == datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert second["amount"] == Decimal("-9999999999999999999999999999.9999999999")
    if partitioned:
        assert (first["dt"], binary[-1][-2]) == (date(2026, 1, 2), date(2026, 1, 3))


@pytest.mark.parametrize("partitioned", [True, False])
def test_columnar_binary_copy_stages_the_rows_write_row_does(
    platform: Platform, partitioned: bool
) -> None:
    table = f"copyc_{secrets.token_hex(3)}"
    ensure_tables(
        platform.engine, "public", table, COLUMNAR, partitioned=partitioned, upsert_key=None
    )
    day = "1999-12-31" if partitioned else ""
    batches = [
        (day, _batch(schema=COLUMNAR)),
        ("2026-01-03" if partitioned else "", _batch(9001, COLUMNAR).slice(1)),
    ]
    names = [*COLUMNAR.names, *(["dt"] if partitioned else [])]
    rows, columns = (
        _staged(
            platform,
            _stage(platform, table, COLUMNAR, batches, via=via, partitioned=partitioned),
            names,
        )
        for via in ("rows", "columns")
    )
    _compare(rows, columns)
    first = {n: columns[0][1 + 2 * i] for i, n in enumerate(names)}
    assert bytes(first["raw"]) == b'\x00\xff,"\n' and first["i64"] == -(2**63)
    assert first["at"] == datetime(1, 1, 1, tzinfo=UTC) and first["s"] == ""
    if partitioned:
        assert (first["dt"], columns[-1][-2]) == (date(1999, 12, 31), date(2026, 1, 3))


def test_an_output_with_a_binary_field_keeps_binary_copy(platform: Platform) -> None:
    schema = pa.schema([("id", pa.int64()), ("raw", pa.binary()), ("s", pa.string())])
    table = f"copyb_{secrets.token_hex(3)}"
    ensure_tables(platform.engine, "public", table, schema, partitioned=False, upsert_key=None)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([1, 2, 3]),
            pa.array([b'\x00\xff,"\n', b"", None], pa.binary()),
            pa.array(["x", "", None]),
        ],
        schema=schema,
    )
    staged = _stage(
        platform, table, schema, [("", batch)], via="csv", partitioned=False, encoder="rows"
    )
    rows = _staged(platform, staged, schema.names)
    assert [(r[1], bytes(r[3]) if r[3] is not None else None, r[5]) for r in rows] == [
        (1, b'\x00\xff,"\n', "x"),
        (2, b"", ""),
        (3, None, None),
    ]
