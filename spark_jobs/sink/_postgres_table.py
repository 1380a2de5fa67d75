"""A pipeline's output into a Postgres table as a two-phase-commit sink whose rows commit in
the same transaction as the split states.

Task side, :class:`PostgresTableSinkWriter`: record batches (the pipeline's output schema)
are COPYed into a table of their batch (``_batch_tables``: named by the staging key — run,
subtask, attempt, batch — with a sequence number per row). One batch is what a task attempt
wrote between two pre-commits; its table is created and loaded in one transaction on the
writer's own connection, and the pre-commit commits that transaction — durable, and
invisible to readers of the target table. A task that dies mid-batch leaves nothing: its
transaction, table and all, rolls back. (That
transaction stays open for one checkpoint interval; a server-side
``idle_in_transaction_session_timeout`` shorter than the interval fails the task.) Rows go
over binary COPY built column-wise (``_copy_binary``: no Python work per row, and Postgres
parses no text), 8192 per hand-over; an output with a ``decimal`` field, which that encoder
does not build, goes over CSV COPY rendered by Arrow (``_copy_csv``), and one with both a
``decimal`` and a ``binary`` field (CSV cannot carry bytes exactly) over binary COPY row by
row with the column types of ``postgres_type``, a ``timestamp`` (UTC) field time-zone aware
for its ``timestamptz`` column, naive values taken as UTC, as in Parquet. All three stage the
same rows (tests/integration/test_table_sink_copy.py). An
unpartitioned upsert sink stages, of each hand-over, only the row of each key the commit's
upsert would keep (``latest_rows``: the latest ``latest_by``, then the last): the others
could never win, so COPY, staging and the commit skip them (a change stream's updates and
deletes of rows inserted moments before); they still count as rows written.

The pre-commit's staged entry describes itself (table, columns, partitioning, upsert key,
batch table), so the commit side (``_table_commit``) needs no pipeline. Leftovers of attempts
that died after a pre-commit are dropped by ``sweep_staged`` (``_table_setup``).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, date, datetime
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql

from enumerator_service import encode_dead_letters
from spark_jobs.pipeline._types import postgres_type
from spark_jobs.sink._batch_tables import batch_table_ddl, batch_table_name
from spark_jobs.sink._copy_binary import BINARY_COPY_OPTIONS, BinaryRows, binary_columnar
from spark_jobs.sink._copy_csv import CSV_COPY_OPTIONS, CsvRows, csv_exact
from spark_jobs.sink._latest import born_rows, latest_rows
from spark_jobs.sink._staged import StagedOutput, conform_batch
from spark_jobs.sink._table_layout import (
    BORN_COLUMN,
    CREATED_OP,
    PARTITION_COLUMN,
    SEQ_COLUMN,
    TABLE_SINK_NAME,
    TableLayout,
    column_list,
)

__all__ = ["TABLE_SINK_NAME", "PostgresTableSinkWriter"]

_CHUNK = 8192  # rows per hand-over to the writer thread (one COPY each)


def _copy_type(kind: pa.DataType) -> str:
    """The type name binary COPY sends a field as (``postgres_type`` without a modifier)."""
    return postgres_type(kind).split("(", 1)[0]


def _encoder(
    columns: pa.Schema, partitioned: bool, via: str, names: list[str]
) -> tuple[BinaryRows | CsvRows | None, str]:
    """The writer's batch encoder and COPY options for ``via`` (see the writer; None: binary
    COPY row by row, of the columns ``names``)."""
    if via not in ("columns", "csv", "rows"):
        raise ValueError(f"via: {via!r} is not 'columns', 'csv' or 'rows'")
    if via == "columns" and binary_columnar(columns):
        return BinaryRows(columns, partitioned=partitioned, names=names), BINARY_COPY_OPTIONS
    if via != "rows" and csv_exact(columns):
        return CsvRows(columns, partitioned=partitioned, names=names), CSV_COPY_OPTIONS
    return None, BINARY_COPY_OPTIONS


def _as_utc(values: list[Any]) -> list[Any]:
    return [
        v.replace(tzinfo=UTC) if isinstance(v, datetime) and v.tzinfo is None else v for v in values
    ]


class PostgresTableSinkWriter:
    """Stages one task attempt's output in the staging table.

    Threading: ``write_batch``/``count_dropped``/``dead_letter``/``pre_commit`` are called on
    the mailbox thread and never block — they only check and buffer batches and hand chunks
    to ``io`` (one thread, so chunks and pre-commits keep their order). Everything touching
    the database (COPY, the batch's commit, ``abort``/``close``) runs on that writer thread,
    which owns the connection.
    """

    def __init__(
        self,
        io: ThreadPoolExecutor,
        *,
        dsn: str,
        schema_name: str,
        table: str,
        columns: pa.Schema,
        partitioned: bool,
        upsert_key: Sequence[str] | None,
        run_id: str,
        subtask: int,
        attempt: str,
        via: str = "columns",
        latest_by: str | None = None,
        op_field: str | None = None,
    ) -> None:
        """``via``: "columns" (binary COPY built column-wise, else CSV when a field is a
        decimal, else "rows"), "csv" (CSV, else "rows") or "rows" (binary COPY row by row):
        tests compare the paths."""
        self._layout = TableLayout.build(
            schema_name,
            table,
            columns.names,
            partitioned=partitioned,
            upsert_key=upsert_key,
            latest_by=latest_by,
            op_field=op_field,
        )
        self._io = io
        self._dsn = dsn
        self._schema = columns
        # A change stream's unpartitioned upsert stages, per kept row, whether its key was
        # created in the hand-over (``BORN_COLUMN``; see ``_table_merge``).
        self._born = bool(upsert_key) and op_field is not None and not partitioned
        staged = columns
        if self._born:
            staged = columns.append(pa.field(BORN_COLUMN, pa.bool_(), nullable=False))
        self._staged_schema = staged
        # The batch table's COPY columns: the sequence, the staged fields, then ``dt``.
        self._copy_names = [SEQ_COLUMN, *staged.names, *([PARTITION_COLUMN] if partitioned else [])]
        self._key = (run_id, subtask, attempt)
        self._encoder, options = _encoder(staged, partitioned, via, self._copy_names)
        # FREEZE: the rows go into a table of the loading transaction (``_batch_copy``).
        self._copy_options = options[:-1] + ", FREEZE)"
        self._copy_types = [
            "bigint",
            *(_copy_type(f.type) for f in staged),
            *(["date"] if partitioned else []),
        ]
        self._utc = [
            i for i, f in enumerate(columns) if pa.types.is_timestamp(f.type) and f.type.tz
        ]
        self._pending: list[tuple[str, pa.RecordBatch]] = []
        self._pending_rows = 0
        self._dead: list[tuple[int, int, bytes, str]] = []
        self._dropped = 0
        #: The COPYs since the last pre-commit (their outcome is checked by it).
        self._copies: list[Future[None]] = []
        # Writer thread only:
        self._conn: psycopg.Connection[Any] | None = None
        self._batch = 1
        self._table: str | None = None  # the open batch's table (created in its transaction)
        self._staged = 0  # rows in the open batch (its transaction is not committed yet)
        self._superseded = 0  # rows of the open batch not staged: a later one of its key won
        self._by_partition: dict[str, int] = {}
        self._error: BaseException | None = None
        self.rows_written = 0

    # -- mailbox thread -------------------------------------------------------------------

    def output_partition(self, day: date | None, rebuild_id: int | None) -> str:
        """The ``dt`` value of a split's rows (ISO date), or ``""`` for an unpartitioned
        output. A member of a partition rebuild writes its rows again: only an upsert sink
        replaces rows (by key), so only it takes part in rebuilds."""
        if rebuild_id is not None and not self._layout.upsert_key:
            raise ValueError(
                f"split of partition {day} belongs to rebuild {rebuild_id}: re-processing a "
                "partition needs an upsert sink (or a parquet sink)"
            )
        if not self._layout.partitioned:
            return ""
        if day is None:
            raise ValueError(
                f"sink {self._layout.qualified} is day-partitioned: a split without a day"
            )
        return day.isoformat()

    def write_batch(self, partition: str, batch: pa.RecordBatch) -> None:
        """Rows of ``batch`` (exactly the output schema) for ``partition`` (an
        ``output_partition`` result). An upsert sink rejects records with a null key."""
        where = f"sink {self._layout.qualified}"
        batch = conform_batch(batch, self._schema, where)
        for name in self._layout.upsert_key or ():
            nulls = batch.column(name).null_count
            if nulls:
                raise ValueError(f"{where}: upsert_key field {name!r} is null in {nulls} record(s)")
        if not batch.num_rows:
            return
        self._pending.append((partition, batch))
        self._pending_rows += batch.num_rows
        if self._pending_rows >= _CHUNK:
            pending, self._pending, self._pending_rows = self._pending, [], 0
            self._submit_copy(pending)

    def _submit_copy(self, batches: list[tuple[str, pa.RecordBatch]]) -> None:
        # A COPY that already failed (the table refused the rows) fails the task now rather
        # than at the next checkpoint; the pre-commit checks every one of them either way.
        while self._copies and self._copies[0].done():
            self._copies.pop(0).result()
        self._copies.append(self._io.submit(self._copy, batches))

    def count_dropped(self, n: int) -> None:
        """``n`` records the pipeline's steps removed (reported by the next pre-commit)."""
        self._dropped += n

    def dead_letter(self, split_id: int, offset: int, raw: bytes, reason: str) -> None:
        self._dead.append((split_id, offset, raw, reason))

    def pre_commit(self) -> Future[StagedOutput]:
        """Hand everything written so far to the writer thread, which commits the batch."""
        if self._pending:
            self._submit_copy(self._pending)
            self._pending, self._pending_rows = [], 0
        dead, self._dead = self._dead, []
        dropped, self._dropped = self._dropped, 0
        copies, self._copies = self._copies, []
        return self._io.submit(self._commit_batch, copies, dead, dropped)

    # -- writer thread --------------------------------------------------------------------

    def _copy(self, batches: list[tuple[str, pa.RecordBatch]]) -> None:
        if self._error is not None:
            return  # the batch is lost already; its pre-commit reports the error
        partitioned = self._layout.partitioned
        counts: dict[str, int] = {}
        try:
            if self._layout.upsert_key and not partitioned:
                batches = self._latest(batches)
            if self._conn is None:
                # UTF8: binary COPY's text goes as UTF-8 bytes (``_copy_binary``).
                self._conn = psycopg.connect(
                    self._dsn, application_name="sluice-sink", client_encoding="UTF8"
                )
            seq = self._staged
            names = self._copy_names
            payload: bytes | pa.Buffer | None = None
            if self._encoder is not None:  # (it picks the COPY's column order)
                payload, seq, names = self._encoder.encode(batches, seq)
            with self._conn.cursor() as cur, cur.copy(self._batch_copy(cur, names)) as copy:
                if payload is not None:
                    copy.write(memoryview(payload))
                else:
                    seq = self._write_rows(copy, batches, seq)
            if partitioned:
                for partition, batch in batches:
                    counts[partition] = counts.get(partition, 0) + batch.num_rows
        except BaseException as exc:
            self._error = exc  # a failed COPY aborted the batch's transaction
            raise
        self.rows_written += seq - self._staged
        self._staged = seq
        for partition, rows in counts.items():
            self._by_partition[partition] = self._by_partition.get(partition, 0) + rows

    def _batch_copy(self, cur: psycopg.Cursor[Any], names: Sequence[str]) -> sql.Composed:
        """The COPY of columns ``names`` into the open batch's table, creating the table
        first in the batch's transaction (``FREEZE``: rows loaded into a table of the loading
        transaction)."""
        if self._table is None:
            name = batch_table_name(self._layout, (*self._key, self._batch))
            ddl = batch_table_ddl(self._layout, name, self._staged_schema, self._key[0])
            for statement in ddl:
                cur.execute(statement)
            self._table = name
        return sql.SQL("COPY {} ({}) FROM STDIN " + self._copy_options).format(
            sql.Identifier(self._layout.schema, self._table),
            column_list(names),
        )

    def _latest(
        self, batches: list[tuple[str, pa.RecordBatch]]
    ) -> list[tuple[str, pa.RecordBatch]]:
        """The rows of ``batches`` (one partition) the upsert can keep (see the docstring)."""
        rows = pa.Table.from_batches([batch for _, batch in batches], schema=self._schema)
        layout = self._layout
        assert layout.upsert_key is not None
        if self._born:
            assert layout.latest_by is not None and layout.op_field is not None
            kept = born_rows(
                rows, layout.upsert_key, layout.latest_by, layout.op_field, CREATED_OP, BORN_COLUMN
            )
        else:
            kept = latest_rows(rows, layout.upsert_key, layout.latest_by)
        self._superseded += rows.num_rows - kept.num_rows
        self.rows_written += rows.num_rows - kept.num_rows
        return [(batches[0][0], batch) for batch in kept.to_batches() if batch.num_rows]

    def _write_rows(
        self,
        copy: psycopg.Copy,
        batches: list[tuple[str, pa.RecordBatch]],
        seq: int,
    ) -> int:
        """Binary COPY, one ``write_row`` per row; returns the last sequence number."""
        copy.set_types(self._copy_types)
        for partition, batch in batches:
            columns = [column.to_pylist() for column in batch.columns]
            for i in self._utc:
                columns[i] = _as_utc(columns[i])
            if self._layout.partitioned:
                columns.append([date.fromisoformat(partition)] * batch.num_rows)
            for row in zip(*columns, strict=True):
                seq += 1
                copy.write_row((seq, *row))
        return seq

    def _commit_batch(
        self,
        copies: list[Future[None]],
        dead: list[tuple[int, int, bytes, str]],
        dropped: int,
    ) -> StagedOutput:
        """Commit the open batch; raises (the snapshot is never acknowledged, the batch rolls
        back with the connection) when any COPY of it failed."""
        if self._error is not None:
            why = next(iter(str(self._error).strip().splitlines()), type(self._error).__name__)
            raise RuntimeError(
                f"staging rows into {self._layout.qualified} failed; the batch cannot commit: {why}"
            ) from self._error
        for copy in copies:  # all done (they ran before us on this thread), none failed
            copy.result()
        out = StagedOutput(dead_letters=encode_dead_letters(dead), dropped=dropped)
        if self._staged and self._conn is not None:
            self._conn.commit()  # durable from here on; the acknowledgement records it
            run_id, subtask, attempt = self._key
            out.files.append(
                {
                    **self._layout.entry(),
                    "run_id": run_id,
                    "subtask": subtask,
                    "attempt": attempt,
                    "batch": self._batch,
                    "staged_table": self._table,
                    **({"born": True} if self._born else {}),
                    "rows": self._staged,
                    "rows_by_partition": dict(sorted(self._by_partition.items())),
                }
            )
            out.rows = self._staged + self._superseded
            self._batch += 1
            self._table = None
            self._staged = self._superseded = 0
            self._by_partition = {}
        return out

    def abort(self) -> None:
        """Writer thread: drop the open batch (the task is failing) and the connection."""
        self.close()

    def close(self) -> None:
        """Writer thread: close the connection; an uncommitted batch is rolled back."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            self._table = None  # (rolled back with its transaction)
