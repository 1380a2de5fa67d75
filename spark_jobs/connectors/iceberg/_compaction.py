"""Compaction of one day of an Iceberg table written by Sluice (PyIceberg 0.12): the day's
data files rewritten into few large ones in ONE ``replace`` snapshot, under the table's lock
(see ``_maintenance`` for the locking rule and the threading contract).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.expressions import (
    AlwaysTrue,
    And,
    BooleanExpression,
    EqualTo,
    GreaterThanOrEqual,
    LessThan,
)
from pyiceberg.io.pyarrow import (
    ArrowScan,
    parquet_file_to_data_file,
    schema_to_pyarrow,
)
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask, Table
from pyiceberg.types import DateType, TimestampType, TimestamptzType
from sqlalchemy.engine import Engine

from spark_jobs.connectors._maintenance import CompactionResult
from spark_jobs.sink import table_lock

__all__ = ["COMPACTION_PROPERTY", "compact_day", "data_root", "lock_id"]

log = logging.getLogger(__name__)

#: The snapshot summary property of a compaction's snapshot (its value: the day).
COMPACTION_PROPERTY = "sluice.compaction"
#: Target size of a compacted file (Iceberg's ``write.target-file-size-bytes`` overrides).
_TARGET_BYTES = 128 * 1024 * 1024


def lock_id(table: Table) -> str:
    """The advisory-lock key of ``table``: its identifier without the catalog name."""
    return ".".join(table.name())


def _day_filter(table: Table, column: str, day: date) -> BooleanExpression:
    """The rows of ``day`` in ``column``: equal to it (a ``date`` column, or an ISO string),
    or within its UTC day (a timestamp column, as the Iceberg sink partitions by
    ``day(<event time>)``)."""
    try:
        field = table.schema().find_field(column)
    except ValueError:
        raise ValueError(f"table {lock_id(table)} has no day column {column!r}") from None
    kind = field.field_type
    if isinstance(kind, TimestampType | TimestamptzType):
        start = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
        bounds = [start, start + timedelta(days=1)]
        if isinstance(kind, TimestampType):  # (no zone: the UTC wall clock)
            bounds = [bound.replace(tzinfo=None) for bound in bounds]
        first, end = (bound.isoformat() for bound in bounds)
        return And(GreaterThanOrEqual(term=column, value=first), LessThan(term=column, value=end))
    return EqualTo(term=column, value=day if isinstance(kind, DateType) else day.isoformat())


def _day_column(table: Table) -> str:
    """The column the table is partitioned by day on: the source of its spec's ``day`` field
    (the event-time field of a table the Iceberg sink made) or of an ``identity`` field on a
    date; else a column named ``dt``."""
    schema = table.schema()
    for field in table.spec().fields:
        source = schema.find_field(field.source_id)
        day = str(field.transform) == "day"
        if day or (str(field.transform) == "identity" and isinstance(source.field_type, DateType)):
            return source.name
    try:  # an unpartitioned table with a day column of the conventional name
        schema.find_field("dt")
    except ValueError:
        raise ValueError(
            f"table {lock_id(table)} is not partitioned by day: name its day column"
        ) from None
    return "dt"


def data_root(table: Table) -> str:
    """Where the table's data files go (``write.data.path``, else ``<location>/data``)."""
    default = f"{table.location().rstrip('/')}/data"
    return str(table.properties.get("write.data.path", default)).rstrip("/")


def _write_compacted(
    table: Table, batches: Iterable[pa.RecordBatch], folder: str, per_file: int
) -> tuple[list[DataFile], int]:
    """Stream ``batches`` into files of ``per_file`` rows under ``folder`` (memory: one
    batch, not the day); their DataFiles and the rows written. Files carry the table
    schema's field ids (what every Iceberg reader maps columns by). A failure deletes what
    was written (nothing was committed)."""
    schema = schema_to_pyarrow(table.schema(), include_field_ids=True)
    codec = str(table.properties.get("write.parquet.compression-codec", "zstd"))
    name = f"sluice-compact-{uuid.uuid4().hex}"
    written: list[str] = []
    rows = in_file = 0
    with contextlib.ExitStack() as open_file:
        writer: pq.ParquetWriter | None = None
        try:
            for batch in batches:
                data = pa.Table.from_batches([batch]).select(schema.names).cast(schema)
                offset = 0
                while offset < data.num_rows:
                    if writer is None:
                        path = f"{folder}/{name}-{len(written):05d}.parquet"
                        out = open_file.enter_context(table.io.new_output(path).create())
                        written.append(path)
                        writer = pq.ParquetWriter(out, schema, compression=codec)
                    take = min(per_file - in_file, data.num_rows - offset)
                    writer.write_table(data.slice(offset, take))
                    offset, in_file, rows = offset + take, in_file + take, rows + take
                    if in_file == per_file:
                        writer.close()
                        open_file.close()  # the file's stream: the object is complete
                        writer, in_file = None, 0
            if writer is not None:
                writer.close()
            open_file.close()
            files = [parquet_file_to_data_file(table.io, table.metadata, p) for p in written]
            return files, rows
        except BaseException:
            open_file.close()
            _delete_quietly(table, written)
            raise


def _day_tasks(table: Table, column: str, day: date) -> list[FileScanTask]:
    """The current data files holding rows of ``day`` (whole files: a file is rewritten
    whole, so content outside the day, if any, is kept too)."""
    return list(table.scan(row_filter=_day_filter(table, column, day)).plan_files())


def _commit_rewrite(table: Table, day: date, old: list[DataFile], new: list[DataFile]) -> None:
    """ONE overwrite snapshot deleting ``old`` and adding ``new``. A writer outside Sluice
    that committed meanwhile makes PyIceberg retry on the new head and validate: files added
    to the day since the plan refuse it (``ValidationException``), and so does the catalog
    after the retries (``CommitFailedException``). Refused, the old files stay the table's
    and the new ones are deleted at once; any other failure may have committed (a timeout
    after the catalog's write), so they are left to ``remove_orphans``, which only takes
    files no snapshot names."""
    props = {COMPACTION_PROPERTY: day.isoformat()}
    try:
        with (
            table.transaction() as tx,
            tx.update_snapshot(snapshot_properties=props).overwrite() as rewrite,
        ):
            for data_file in old:
                rewrite.delete_data_file(data_file)
            for data_file in new:
                rewrite.append_data_file(data_file)
    except (CommitFailedException, ValidationException):
        _delete_quietly(table, [f.file_path for f in new])
        raise


def _delete_quietly(table: Table, paths: list[str]) -> None:
    """Delete uncommitted files; one that cannot be deleted is left to ``remove_orphans``
    (the failure being handled is the one to report)."""
    for path in paths:
        try:
            table.io.delete(path)
        except OSError as exc:
            log.warning("uncommitted file %s left for the orphan sweep: %s", path, exc)


def _rewrite(
    table: Table, ident: str, day: date, column: str, small: list[FileScanTask], target: int
) -> tuple[list[DataFile], int]:
    """Read ``small`` whole (deletes applied) and write their rows as files of about
    ``target`` bytes: (their DataFiles, the rows). Rounding the count to the nearest keeps
    each new file above half the target: never small itself."""
    rows = sum(task.file.record_count for task in small)
    wanted = max(1, int(sum(task.file.file_size_in_bytes for task in small) / target + 0.5))
    scan = ArrowScan(table.metadata, table.io, table.schema(), AlwaysTrue())
    folder = f"{data_root(table)}/{column}={day.isoformat()}"
    per_file = max(1, -(-rows // wanted))
    new, read = _write_compacted(table, scan.to_record_batches(small), folder, per_file)
    # Without delete files every row the manifests count must have been read and written.
    if read != rows and not any(task.delete_files for task in small):
        _delete_quietly(table, [f.file_path for f in new])
        raise RuntimeError(f"{ident} {day}: read {read} rows, the manifests say {rows}")
    return new, read


def compact_day(
    table: Table,
    engine: Engine,
    day: date,
    *,
    column: str | None = None,
    target_file_bytes: int | None = None,
    lock: str | None = None,
) -> CompactionResult:
    """Rewrite the small data files of ``day`` (``column``: a ``date`` column equal to the
    day, or a timestamp column; default: the column the table's spec partitions by day;
    small: under half of
    ``target_file_bytes``, default the table's ``write.target-file-size-bytes`` or 128 MiB)
    as one or a few files of about the target, in ONE overwrite snapshot (summary
    ``sluice.compaction=<day>``) that deletes them and adds the new. Files written this way
    are not small, so a second run finds ≤ 1 small file and skips: nothing committed.
    Rows are read through Iceberg (delete files and schema evolution applied), so content
    and row count are unchanged. ``rows``/``bytes_before`` of the result: the day's."""
    ident = lock or lock_id(table)
    target = target_file_bytes or int(
        table.properties.get("write.target-file-size-bytes", _TARGET_BYTES)
    )
    if target <= 0:
        raise ValueError(f"target_file_bytes {target} must be positive")
    with table_lock(engine, ident):
        # Step 1: the day's current files, read after the lock (no commit is in flight).
        table.refresh()
        column = column or _day_column(table)
        tasks = _day_tasks(table, column, day)
        rows = sum(task.file.record_count for task in tasks)
        size = sum(task.file.file_size_in_bytes for task in tasks)
        small = [task for task in tasks if task.file.file_size_in_bytes < target / 2]
        if len(small) <= 1:
            return CompactionResult(
                ident, day, len(tasks), len(tasks), rows, size, size, None, True
            )
        old = [task.file for task in small]
        # Step 2: the new files (invisible until committed; a crash leaves orphans).
        new, read = _rewrite(table, ident, day, column, small, target)
        # Step 3: one snapshot deleting the old files and adding the new.
        _commit_rewrite(table, day, old, new)
        snapshot = table.current_snapshot()
        return CompactionResult(
            table=ident,
            day=day,
            files_before=len(tasks),
            files_after=len(tasks) - len(old) + len(new),
            rows=rows - sum(f.record_count for f in old) + read,
            bytes_before=size,
            bytes_after=size
            - sum(f.file_size_in_bytes for f in old)
            + sum(f.file_size_in_bytes for f in new),
            snapshot=snapshot.snapshot_id if snapshot else None,
            skipped=False,
        )
