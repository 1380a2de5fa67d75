"""Iceberg compaction of a day (``spark_jobs.connectors.iceberg._compaction.compact_day``)
against the bare PyIceberg way of rewriting the same day (``scan(row_filter=day).to_arrow()``
then ``overwrite(..., overwrite_filter=day)``), same table shape, same invocation.

    python bench/iceberg_compaction.py [--files 200] [--rows 500] [--rounds 3]

Each round builds two identical tables (a SQL catalog on the platform database of
``load_settings()``, warehouse in a temporary folder) whose day holds ``--files`` small
files of ``--rows`` rows (plus as many of another day, all added in one commit), times the
compaction on one and the bare rewrite on the other (wall time of the call, lock and commit
included), checks both hold the same rows, and prints each path's median and the ratio
bare / compaction (target >= 0.5: compaction at most twice as slow as the bare rewrite,
which does less: compaction reads whole files through Iceberg, commits one snapshot that
deletes exactly the old files, and holds the table's advisory lock). The tables are dropped
afterwards.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import EqualTo
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DateType, DoubleType, LongType, NestedField, StringType
from sqlalchemy.engine import make_url

from enumerator_service import load_settings
from enumerator_service._operations import open_platform
from spark_jobs.connectors.iceberg._compaction import compact_day

DAY, OTHER = date(2026, 5, 1), date(2026, 5, 2)
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "dt", DateType(), required=False),
    NestedField(3, "user", StringType(), required=False),
    NestedField(4, "amount", DoubleType(), required=False),
)
SPEC = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="dt")
)


def small_file(start: int, rows: int, day: date) -> pa.Table:
    ids = range(start, start + rows)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "dt": pa.array([day] * rows, pa.date32()),
            "user": [f"u{i % 5000:05d}" for i in ids],
            "amount": pa.array([(i % 10_000) / 100 for i in ids], pa.float64()),
        }
    )


def build(
    catalog: SqlCatalog, namespace: str, name: str, files: int, rows: int, folder: Path
) -> Table:
    """A table whose two days hold ``files`` small files of ``rows`` rows each, added in one
    commit (``add_files``: building it with one append per file costs a commit each, and
    the manifest list grows with every one)."""
    table = catalog.create_table(f"{namespace}.{name}", schema=SCHEMA, partition_spec=SPEC)
    paths = []
    for n in range(files):
        for d, day in enumerate((DAY, OTHER)):
            path = folder / name / f"dt={day}" / f"part-{n:05d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(small_file((2 * n + d) * rows, rows, day), path)
            paths.append(f"file://{path}")
    table.add_files(paths)
    return table


def day_rows(table: Table) -> list[tuple[int, str, float]]:
    table.refresh()
    data = table.scan(row_filter=EqualTo(term="dt", value=DAY)).to_arrow()
    return sorted(zip(*(data.column(c).to_pylist() for c in ("id", "user", "amount")), strict=True))


@dataclass(frozen=True)
class Measurement:
    """Wall seconds of each round's compaction and bare rewrite, and the day's rows."""

    compaction: list[float]
    bare: list[float]
    rows: int  # rows of the rewritten day (per table)

    @property
    def compaction_median(self) -> float:
        return statistics.median(self.compaction)

    @property
    def bare_median(self) -> float:
        return statistics.median(self.bare)


def measure(
    engine: sa.Engine, files: int, rows: int, rounds: int, report: bool = True
) -> Measurement:
    """``rounds`` rounds of compaction vs the bare rewrite, on two fresh identical tables
    each (a SQL catalog on ``engine``'s database, a namespace of its own, a temporary
    warehouse; all dropped at the end). Raises when the two rewrites' rows differ or the
    compaction did not leave one file. Threading: the caller's thread only."""
    url = make_url(engine.url).set(drivername="postgresql+psycopg")
    namespace = f"bench_{secrets.token_hex(4)}"
    compaction: list[float] = []
    bare: list[float] = []
    day = 0
    with tempfile.TemporaryDirectory() as warehouse:
        catalog = SqlCatalog(
            "bench", uri=url.render_as_string(hide_password=False), warehouse=f"file://{warehouse}"
        )
        catalog.create_namespace(namespace)
        try:
            for n in range(rounds):
                a = build(catalog, namespace, f"a{n}", files, rows, Path(warehouse))
                b = build(catalog, namespace, f"b{n}", files, rows, Path(warehouse))
                start = time.perf_counter()
                done = compact_day(a, engine, DAY)
                compaction.append(time.perf_counter() - start)
                start = time.perf_counter()
                data = b.scan(row_filter=EqualTo(term="dt", value=DAY)).to_arrow()
                b.overwrite(data, overwrite_filter=EqualTo(term="dt", value=DAY))
                bare.append(time.perf_counter() - start)
                assert (done.files_before, done.files_after) == (files, 1), done
                assert day_rows(a) == day_rows(b), "the two rewrites differ"
                day = done.rows
                if report:
                    print(
                        f"round {n + 1}: compaction {compaction[-1]:.3f}s, bare {bare[-1]:.3f}s "
                        f"({done.rows} rows, {files} files → 1)"
                    )
        finally:
            for ident in catalog.list_tables(namespace):
                catalog.purge_table(ident)
            catalog.drop_namespace(namespace)
            catalog.engine.dispose()
    return Measurement(compaction, bare, day)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    platform = open_platform(load_settings(), pool_size=2)
    try:
        m = measure(platform.engine, args.files, args.rows, args.rounds)
    finally:
        platform.engine.dispose()
    c, b = m.compaction_median, m.bare_median
    ratio = b / c
    verdict = "OK" if ratio >= 0.5 else "BELOW TARGET"
    print(f"compaction median {c:.3f}s, bare read+overwrite median {b:.3f}s")
    print(f"ratio bare/compaction {ratio:.2f}x (target >= 0.5x): {verdict}")


if __name__ == "__main__":
    main()
