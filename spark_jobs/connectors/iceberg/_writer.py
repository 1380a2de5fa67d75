"""The task side of the Iceberg sink: the Parquet sink's staged-file writer, writing
straight under the table's data folder with the table's field ids.

A file under the data folder is invisible until a snapshot references it, so nothing is
renamed: the staged file *is* the data file (which also suits object stores). Files go to
``<data>/<run>/<output partition>/part-<run>-t<subtask>-<attempt>-<n>.parquet``; the
output partition (``dt=D``, or ``_rebuilds/dt=D/<r>`` for a rebuild member) is kept in the
entry's ``final`` name so the committer can tell a rebuild's files apart. Footers are
verified and write errors fail the pre-commit as in ``ParquetSinkWriter``.

Threading: as ``ParquetSinkWriter`` (mailbox thread calls, file I/O on ``io``).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from enumerator_service import Location
from spark_jobs.connectors.iceberg._table import read_field_ids, with_field_ids
from spark_jobs.sink._parquet import ParquetSinkWriter, StagedOutput

__all__ = ["IcebergSinkWriter"]


class IcebergSinkWriter(ParquetSinkWriter):
    """Stages one task attempt's output as Iceberg data files of table ``table`` (catalog
    ``catalog``; None: Sluice's). ``data``: the table's data folder."""

    def __init__(
        self,
        io: ThreadPoolExecutor,
        *,
        schema: pa.Schema,
        compression: str,
        data: Location,
        table: str,
        catalog: str | None,
        upsert_key: Sequence[str] | None,
        latest_by: str | None,
        run_id: str,
        op_field: str | None = None,
        subtask: int,
        attempt: str,
    ) -> None:
        super().__init__(
            io,
            schema=with_field_ids(schema, read_field_ids(data)),
            dictionary=(),
            compression=compression,
            staging_root=data,
            output_root=data,
            run_id=run_id,
            subtask=subtask,
            attempt=attempt,
        )
        self._tags: dict[str, Any] = {"table": table, "catalog": catalog}
        if upsert_key:
            self._tags["upsert_key"] = list(upsert_key)
            self._tags["latest_by"] = latest_by
            if op_field is not None:
                self._tags["op_field"] = op_field

    def _close_files(
        self,
        writes: list[Future[None]],
        dead: list[tuple[int, int, bytes, str]],
        dropped: int,
    ) -> StagedOutput:
        out = super()._close_files(writes, dead, dropped)
        for entry in out.files:
            entry.update(self._tags)  # the committer needs no plan: the entry says it all
        return out
