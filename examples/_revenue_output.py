"""Where the revenue example writes: a Parquet day folder under the warehouse, replaced whole
by a re-run, and the markdown preview of what it wrote (``examples.clickstream_revenue``).

Threading: no state; one writer of a day at a time (Dagster runs one materialisation of a
partition at a time; two at once would each leave a whole day, the last one's).
"""

import shutil
import uuid
from collections.abc import Sequence
from datetime import date
from typing import TYPE_CHECKING

from dagster_project import parquet_objects
from enumerator_service import Location, Settings
from spark_jobs.pipeline import warehouse_root

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["PREVIEW_ROWS", "REVENUE_TABLE", "output_location", "preview", "replace_day"]

#: Folder of the aggregate under the warehouse root.
REVENUE_TABLE = "daily_revenue_by_country"
#: Rows of the markdown preview.
PREVIEW_ROWS = 20


def output_location(settings: Settings, days: Sequence[date]) -> str:
    """The URI of the aggregate (of its day folder when one day was written)."""
    output = warehouse_root(settings).child(REVENUE_TABLE)
    if len(days) == 1:
        output = output.child(f"dt={days[0].isoformat()}")
    return output.uri


def replace_day(target: Location, day: date, table: "pa.Table") -> None:
    """Make ``table`` the one file of ``target/dt=D``, replacing the previous one.

    A local folder is replaced in one atomic swap (a staging folder, then
    ``renameat2(RENAME_EXCHANGE)``). An object store has no rename: the day is one object with
    a fixed name, replaced by one PUT (a reader sees the previous object or the new one,
    whole), and any other object left in the folder is deleted after it.
    """
    import pyarrow.parquet as pq

    from spark_jobs.sink import replace_folder

    folder = target.child(f"dt={day.isoformat()}")
    if target.object_store:
        name = "part-00000.parquet"
        pq.write_table(table, folder.child(name).path, filesystem=folder.fs)
        for path in parquet_objects(folder):
            if not path.endswith("/" + name):
                folder.fs.delete_file(path)
        return
    # "_" folders are invisible to Spark and pyarrow readers of the table.
    staging = target.local_path / f"_staging-{uuid.uuid4().hex}"
    try:
        new = staging / f"dt={day.isoformat()}"
        new.mkdir(parents=True)
        pq.write_table(table, new / f"part-{uuid.uuid4().hex[:12]}.parquet")
        replace_folder(new, folder.local_path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def preview(written: "dict[date, pa.Table]") -> str:
    """A markdown table of the first rows (by day, then revenue, highest first)."""
    lines = ["| dt | user_country | revenue | orders | events |", "|---|---|---:|---:|---:|"]
    shown, total = 0, sum(table.num_rows for table in written.values())
    for day, table in sorted(written.items()):
        for row in table.sort_by([("revenue", "descending")]).to_pylist():
            if shown == PREVIEW_ROWS:
                lines.append(f"| … | {total - shown} more rows | | | |")
                return "\n".join(lines)
            country = row["user_country"] if row["user_country"] is not None else "(unknown)"
            lines.append(
                f"| {day.isoformat()} | {country} | {row['revenue']:,.2f} | {row['orders']} "
                f"| {row['events']} |"
            )
            shown += 1
    return "\n".join(lines)
