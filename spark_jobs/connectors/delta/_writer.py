"""The task side of the Delta sink: Parquet files staged in place, described for the log.

:class:`DeltaSinkWriter` is a :class:`~spark_jobs.sink.ParquetSinkWriter` that writes each
checkpoint interval's files straight at their final names inside the table folder, under
their partition folder (``dt=D/``; a rebuild's members, whose output partition is
``_rebuilds/dt=D/<r>``, in ``dt=D/rebuild-<r>/``: see :func:`data_folder`). A
file that no commit in ``_delta_log`` adds is invisible to every Delta reader, so there is
no rename (which an object store does not have). The Parquet writer verifies every file's
footer and fails the pre-commit on any write error; this wrapper then adds to each staged
entry what the committer needs for its add action: the table, the path relative to it, the
partition values (the output day, never a column of the file), the size and the statistics
(``numRecords``, ``minValues``/``maxValues``/``nullCount`` from the footer's row groups).

Threading: as ``ParquetSinkWriter`` — the mailbox thread calls, file I/O runs on ``io`` (one
thread: the description of an interval runs after the pre-commit that closed its files).
"""

from __future__ import annotations

import datetime as dt
import json
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from enumerator_service import Location
from spark_jobs.sink import ParquetSinkWriter, StagedOutput
from spark_jobs.sink._rebuild_swap import REBUILDS_FOLDER

__all__ = ["DeltaSinkWriter", "data_folder", "file_stats", "rebuild_of", "relative_path"]

#: The folder of a rebuild's files inside its day's folder: ``rebuild-<r>``.
REBUILD_PREFIX = "rebuild-"
#: Longest string kept as an exact min/max (Delta truncates longer ones; we omit them).
_MAX_STRING = 32


class DeltaSinkWriter:
    """Stages Delta data files; ``pre_commit`` returns entries ready for add actions."""

    def __init__(
        self,
        io: ThreadPoolExecutor,
        *,
        schema: pa.Schema,
        compression: str,
        table: Location,
        meta: dict[str, Any],
        run_id: str,
        subtask: int,
        attempt: str,
    ) -> None:
        self._io = io
        self._table = table
        self._meta = meta  # table URI, pipeline, partition column, upsert key
        self._parquet = ParquetSinkWriter(
            io,
            schema=schema,
            dictionary=(),
            compression=compression,
            staging_root=table,
            output_root=table,
            run_id=run_id,
            subtask=subtask,
            attempt=attempt,
            stage_in_place=True,
        )

    def write_batch(self, partition: str, batch: pa.RecordBatch) -> None:
        """Rows into ``partition``'s file (an ``output_partition`` result)."""
        self._parquet.write_batch(data_folder(partition), batch)

    def __getattr__(self, name: str) -> Any:
        # write_batch, count_dropped, dead_letter, abort, close, output_partition, …
        return getattr(self._parquet, name)

    def pre_commit(self) -> Future[StagedOutput]:
        closed = self._parquet.pre_commit()
        # Same single I/O thread: runs after the close, which is done (or failed) by then.
        return self._io.submit(self._describe, closed)

    def _describe(self, closed: Future[StagedOutput]) -> StagedOutput:
        out = closed.result()  # a failed close fails the pre-commit
        for entry in out.files:
            path = relative_path(self._table, entry["final"])
            metadata = pq.read_metadata(
                self._table.child(*path.split("/")).path, filesystem=self._table.fs
            )
            size = self._table.fs.get_file_info(self._table.child(*path.split("/")).path).size
            entry.update(self._meta)
            entry.update(
                path=path,
                day=_day_of(path),
                size=int(size or 0),
                stats=file_stats(metadata, entry["rows"]),
            )
        return out


def data_folder(partition: str) -> str:
    """Where the files of an output partition go in the table folder: the partition itself,
    except a rebuild's (``_rebuilds/dt=D/<r>``), which goes to ``dt=D/rebuild-<r>``. VACUUM
    never looks into ``_`` folders, so files there would outlive their removal from the
    table; inside the day's folder the removed generation is vacuumed like any file."""
    parts = partition.split("/")
    if len(parts) == 3 and parts[0] == REBUILDS_FOLDER and parts[2].isdigit():
        return f"{parts[1]}/{REBUILD_PREFIX}{parts[2]}"
    return partition


def rebuild_of(path: str) -> int | None:
    """The rebuild id of a data file staged by a rebuild's member (``dt=D/rebuild-<r>/…``)."""
    parts = path.split("/")
    if len(parts) == 3 and parts[1].startswith(REBUILD_PREFIX):
        number = parts[1].removeprefix(REBUILD_PREFIX)
        return int(number) if number.isdigit() else None
    return None


def relative_path(table: Location, final: str) -> str:
    """``final`` (a staged entry's URI or local path) relative to the table folder."""
    root = table.uri.rstrip("/") + "/"
    if not final.startswith(root):
        raise ValueError(f"{final} is not inside the table folder {table.uri}")
    return final[len(root) :]


def _day_of(path: str) -> str | None:
    """The output day of a data file from its partition folder (``dt=D/…`` or
    ``dt=D/rebuild-<r>/…``), or None at the root (an unpartitioned table)."""
    for part in path.split("/")[:-1]:
        if part.startswith("dt="):
            return dt.date.fromisoformat(part[3:]).isoformat()
    return None


def _json_value(value: Any) -> Any:
    if isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return value if len(value) <= _MAX_STRING else None
    if isinstance(value, dt.datetime):
        aware = value.tzinfo is not None  # timestamp (UTC, "Z") or timestamp_ntz (none)
        if aware:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.isoformat(timespec="microseconds") + ("Z" if aware else "")
    if isinstance(value, dt.date):
        return value.isoformat()
    return None  # floats (NaN is not in Parquet statistics), decimals, bytes: no pruning


def file_stats(metadata: pq.FileMetaData, rows: int) -> str:
    """Delta ``stats`` JSON of one file from its row groups' statistics (a column whose
    statistics are missing in any row group gets no min/max, only what is sure)."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    schema = metadata.schema.to_arrow_schema()
    for index, field in enumerate(schema):
        if pa.types.is_nested(field.type):
            continue
        low = high = None
        count = 0
        usable = True
        for group in range(metadata.num_row_groups):
            stats = metadata.row_group(group).column(index).statistics
            if stats is None or not stats.has_null_count:
                usable = False
                break
            count += stats.null_count
            if stats.has_min_max:
                low = stats.min if low is None else min(low, stats.min)
                high = stats.max if high is None else max(high, stats.max)
        if not usable:
            continue
        nulls[field.name] = count
        low, high = _json_value(low), _json_value(high)
        if low is not None and high is not None:
            mins[field.name], maxs[field.name] = low, high
    return json.dumps(
        {"numRecords": rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    )
