"""The CSV COPY encoder renders UTC timestamps itself (Arrow's zoned cast is ~30x slower):
the text must be exactly what Arrow's CSV writer gives, for every unit and instant."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from hypothesis import given
from hypothesis import strategies as st

from spark_jobs.sink._copy_csv import CsvRows, _utc_text

# 0001-01-01 .. 9999-12-31 in microseconds since the epoch.
MICROS = st.integers(min_value=-62_135_596_800_000_000, max_value=253_402_300_799_999_999)


@given(st.lists(st.one_of(st.none(), MICROS), max_size=30), st.sampled_from(["s", "ms", "us"]))
def test_utc_text_is_arrows_rendering(values: list[int | None], unit: str) -> None:
    scale = {"s": 1_000_000, "ms": 1_000, "us": 1}[unit]
    column = pa.array([None if v is None else v // scale for v in values], pa.int64())
    stamps = column.cast(pa.timestamp(unit, "UTC"))
    assert _utc_text(stamps).equals(pc.cast(stamps, pa.string()))


@given(st.lists(st.one_of(st.none(), MICROS), min_size=1, max_size=30))
def test_encoded_rows_equal_arrows_csv_of_the_zoned_column(values: list[int | None]) -> None:
    stamps = pa.array(values, pa.int64()).cast(pa.timestamp("us", "UTC"))
    batch = pa.RecordBatch.from_arrays([stamps], names=["at"])
    rows = CsvRows(batch.schema, partitioned=False, names=["seq", "at"])
    encoded, last, names = rows.encode([("", batch)], 0)
    assert names == ["seq", "at"]
    assert last == len(values)
    out = pa.BufferOutputStream()
    options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
    pacsv.write_csv(batch, out, options)
    reference = out.getvalue().to_pybytes().decode().splitlines()
    lines = encoded.to_pybytes().decode().splitlines()
    assert len(lines) == len(reference)
    for n, (line, expected) in enumerate(zip(lines, reference, strict=True), start=1):
        # The sequence first; the timestamp quoted as text (Postgres reads both alike).
        assert line == f"{n},{expected if not expected else chr(34) + expected + chr(34)}"
