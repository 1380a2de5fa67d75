"""The spec of the Postgres change-data-capture source: what a user writes in a pipeline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from spark_jobs.pipeline._sources import LatePolicy
from spark_jobs.pipeline._types import Duration, TypeSpec

__all__ = ["CDC_FIELDS", "COMMIT_TIME", "PostgresCdcSource"]

#: The commit time field (the default event time).
COMMIT_TIME = "_commit_time"
#: The fields every CDC record carries after the declared ones (name → type).
CDC_FIELDS: dict[str, TypeSpec] = {
    "_op": "string",
    "_lsn": "int64",
    COMMIT_TIME: "timestamp",
    "_before": "string",
    "_table": "string",
}


@dataclass(frozen=True)
class PostgresCdcSource:
    """Every row of Postgres tables, then every change to them: a snapshot of the rows
    present, then the changes streamed from a logical replication slot (``pgoutput``).

    The first discovery creates the publication and the slot (when missing) and registers
    the snapshot: ranges of the integer `key` of each table (`rows_per_chunk` rows), read
    without locking. Once every chunk is read and committed, one stream split reads the slot
    from the slot's start on; a continuous run follows it, a bounded run reads up to the WAL
    position when it opens it. Records carry the declared columns (a delete: the key
    columns, or the whole old row under `REPLICA IDENTITY FULL`) and `_op` (`r` snapshot,
    `c` insert, `u` update, `d` delete), `_lsn` (the commit LSN; a snapshot row: the slot's
    start), `_commit_time` (the event time), `_before` (the old row as JSON text when the
    table's replica identity gives one, else null) and `_table` (`schema.table`). An upsert
    sink keeps the row of the greatest `_lsn` per key and applies deletes. The output is
    unpartitioned. See docs/how-to/postgres-cdc-source.md.

    ```python
    from spark_jobs import PostgresCdcSource

    source = PostgresCdcSource(
        tables=["shop.orders"],
        key="id",
        schema={"id": "int64", "amount": "decimal(12,2)", "status": "string"},
    )
    ```

    Args:
        tables: `"schema.table"` names (or one name); each has `key` and the declared
            columns, and a primary key (or a replica identity other than `NOTHING`).
        key: An integer column of every table (its primary key): snapshot chunks are ranges
            of it.
        schema: Columns to read → types (checked against the catalog when a run opens).
        publication: The publication to read (created by the first discovery when
            missing; one that exists must list exactly `tables` and is never altered, nor
            recreated once the stream started); default `sluice_<pipeline>`.
        url_env: The name of an environment variable holding the URL of the database the
            tables are in (`postgresql://user:password@host:port/dbname`), when it is not
            the platform database: the publication and the slot are made there, Sluice's
            records of the source stay in the platform database. Read on the driver and
            in each Spark task (every executor's environment must have it); the URL never
            enters the pipeline, a task or a log. Default: the platform database.
        slot: The logical replication slot (created when missing; it belongs to the
            pipeline that created it: another pipeline's is refused); default
            `sluice_<pipeline>`.
        required: As for `FileSource` (a delete carries only the key columns unless the
            table's replica identity is `FULL`: require key columns only).
        event_time: Default `_commit_time`.
        rows_per_chunk: Target number of rows per snapshot chunk.
        out_of_orderness: As for `FileSource`.
        idle_timeout: As for `FileSource`.
        late_records: As for `FileSource`.
    """

    tables: Sequence[str] | str
    key: str
    schema: Mapping[str, TypeSpec] = field(default_factory=dict)
    publication: str | None = None
    slot: str | None = None
    required: Sequence[str] = ()
    event_time: str | None = COMMIT_TIME
    rows_per_chunk: int = 100_000
    out_of_orderness: Duration = "5s"
    idle_timeout: Duration = "60s"
    late_records: LatePolicy = "reopen"
    url_env: str | None = None

    @property
    def partition_by(self) -> None:
        return None
