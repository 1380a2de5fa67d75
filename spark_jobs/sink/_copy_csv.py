"""The table sink's staged rows as ``COPY … FROM STDIN (FORMAT CSV)`` input, rendered by
Arrow's CSV writer (C++) instead of one Python ``write_row`` per row: the sequence column
is added as an Arrow array, so no Python loop runs per row.

Why this is exact for every type but ``binary``: Arrow quotes every string value and writes
a null as an empty unquoted field, which is Postgres' CSV rule for NULL vs ``''``; quotes
are doubled and newlines stay inside quotes (backslash is not special in CSV). Floats are
written as the shortest text that parses back to the same value (``nan``, ``inf``, ``-0``
and subnormals included), decimals with their scale, booleans as ``true``/``false``, dates
as ISO, ``timestamp("us")`` as ISO with microseconds, and ``timestamp("us", "UTC")`` the same
with ``Z`` — rendered here as the naive text plus ``Z``: Arrow's cast of a zoned timestamp
goes through its time-zone database for every value, 30x the naive cast, and was 70 % of
the encoding of an orders batch. The payload is UTF-8 and the COPY says so, whatever the
client encoding. A ``binary`` field would be written as raw bytes, which ``bytea`` does not
read: schemas with one keep binary COPY (``csv_exact``).

Threading: pure functions and an immutable encoder, any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

__all__ = ["CSV_COPY_OPTIONS", "CsvRows", "csv_exact"]

#: The COPY options matching ``CsvRows``' output (NULL is an empty unquoted field).
CSV_COPY_OPTIONS = "(FORMAT CSV, ENCODING 'UTF8')"

_WRITE = pacsv.WriteOptions(include_header=False, quoting_style="needed")


def csv_exact(schema: pa.Schema) -> bool:
    """True when every field of ``schema`` goes through CSV COPY unchanged."""
    return not any(pa.types.is_binary(f.type) for f in schema)


class CsvRows:
    """Renders batches of ``schema`` as staging rows of the COPY columns ``names``: the
    sequence, the fields, then the partition date when ``partitioned``."""

    def __init__(self, schema: pa.Schema, *, partitioned: bool, names: Sequence[str]) -> None:
        if not csv_exact(schema):
            raise ValueError(f"schema ({schema}) has a field CSV COPY cannot carry exactly")
        self._partitioned = partitioned
        self._names = list(names)  # the COPY's columns, in the rendered order
        fields = [pa.field("seq", pa.int64())]
        # UTC timestamps go to the writer as text, rendered by ``_utc_text``.
        self._utc = frozenset(i for i, f in enumerate(schema) if _is_utc(f.type))
        fields.extend(
            pa.field(f"c{i}", pa.string() if i in self._utc else f.type)
            for i, f in enumerate(schema)
        )
        if partitioned:
            fields.append(pa.field("dt", pa.date32()))
        self._schema = pa.schema(fields)

    def encode(
        self,
        batches: list[tuple[str, pa.RecordBatch]],
        seq: int,
    ) -> tuple[pa.Buffer, int, list[str]]:
        """(CSV of ``batches``' rows with sequence numbers ``seq + 1`` …, the last sequence
        number, the COPY columns: ``names``, as :class:`~._copy_binary.BinaryRows` returns
        its own order). A batch's partition is an ISO date, or ``""`` unpartitioned."""
        out = pa.BufferOutputStream()
        with pacsv.CSVWriter(out, self._schema, write_options=_WRITE) as writer:
            for partition, batch in batches:
                n = batch.num_rows
                if not n:
                    continue
                ones = pa.repeat(pa.scalar(1, pa.int64()), n)
                columns = [pc.add(pc.cumulative_sum(ones), pa.scalar(seq, pa.int64()))]
                columns.extend(
                    _utc_text(column) if i in self._utc else column
                    for i, column in enumerate(batch.columns)
                )
                if self._partitioned:
                    day = pa.scalar(date.fromisoformat(partition), pa.date32())
                    columns.append(pa.repeat(day, n))
                writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=self._schema))
                seq += n
        return out.getvalue(), seq, self._names


def _is_utc(kind: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(kind) and kind.tz == "UTC")


def _utc_text(column: pa.Array) -> pa.Array:
    """A UTC timestamp column as Arrow's CSV writer renders it (``… 10:00:00.000123Z``): the
    zone dropped (the stored instants are UTC wall times), cast to text, ``Z`` appended."""
    naive = column.cast(pa.timestamp(column.type.unit))
    text = pc.cast(naive, pa.string())
    return pc.binary_join_element_wise(text, pa.scalar("Z"), "")
