"""Enriched events into a Postgres table as a two-phase-commit sink whose rows commit in the
same transaction as the split states.

Task side, :class:`PostgresTableSinkWriter`: rows are COPYed into the staging table
``<schema>.<table>__staged`` under the key (run_id, subtask, attempt, batch, seq). One batch is
what a task attempt wrote between two pre-commits; it is staged in one transaction on the
writer's own connection, and the pre-commit commits that transaction — durable, and invisible
to readers of the target table. A task that dies mid-batch leaves nothing: its transaction
rolls back. (That transaction stays open for one checkpoint interval; a server-side
``idle_in_transaction_session_timeout`` shorter than the interval fails the task.) Rows go
over binary COPY, 8192 per hand-over; naive timestamps are taken as UTC, as in Parquet.

Commit side, :class:`PostgresTableSink`: ``commit`` moves the staged batches of a checkpoint
into the target table (one ``DELETE … RETURNING`` feeding an ``INSERT``) on the connection of
the completion transaction, so the rows become visible atomically with the split states and
roll back with them. ``publish`` has nothing left to do; ``abort`` deletes staged batches.

AT_LEAST_ONCE: the reader task passes this sink to ``acknowledge``, which runs ``commit`` in
the subtask's acknowledgement transaction — the rows become visible together with that
subtask's split states (no alignment across subtasks; rows of a split whose state was fenced
may be duplicated by a replay).

Leftovers: a batch pre-committed by an attempt that died before acknowledging has no
``sink_transactions`` row; :func:`sweep_staged` deletes the staged rows of runs that hold no
split (the driver calls it after recovery, at the start and at the end of every run).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, date
from typing import Any

import psycopg
import pyarrow as pa
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.engine import Connection, Engine

from enumerator_service._checkpoint_store import StagedTransaction, encode_dead_letters
from enumerator_service._config import ConfigError, validate_identifier
from enumerator_service._schema import SCHEMA, splits
from spark_jobs.sink._parquet import ENRICHED_SCHEMA, StagedOutput

__all__ = [
    "STAGING_SUFFIX",
    "TABLE_COLUMNS",
    "TABLE_SINK_NAME",
    "PostgresTableSink",
    "PostgresTableSinkWriter",
    "ensure_tables",
    "staging_table",
    "sweep_staged",
]

_log = logging.getLogger(__name__)

TABLE_SINK_NAME = "postgres"
STAGING_SUFFIX = "__staged"
_CHUNK = 8192  # rows per hand-over to the writer thread (one COPY each)


def _sql_type(arrow_type: Any) -> str:
    if pa.types.is_string(arrow_type):
        return "text"
    if pa.types.is_int64(arrow_type):
        return "bigint"
    if pa.types.is_float64(arrow_type):
        return "double precision"
    if pa.types.is_timestamp(arrow_type):
        return "timestamptz" if arrow_type.tz else "timestamp"
    raise TypeError(f"no Postgres type for {arrow_type}")


#: (name, SQL type, NOT NULL) of the target table: ENRICHED_SCHEMA plus the event date.
TABLE_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    *((f.name, _sql_type(f.type), not f.nullable) for f in ENRICHED_SCHEMA),
    ("dt", "date", False),
)
_NAMES = [name for name, _, _ in TABLE_COLUMNS]
_KEY = (("run_id", "text"), ("subtask", "integer"), ("attempt", "text"), ("batch", "bigint"))
#: Positions of timestamptz columns in a row: naive values are taken as UTC (as in Parquet).
_UTC_COLUMNS = [i for i, (_, kind, _) in enumerate(TABLE_COLUMNS) if kind == "timestamptz"]
_COPY_TYPES = [kind for _, kind in _KEY] + ["bigint"] + [kind for _, kind, _ in TABLE_COLUMNS]


def staging_table(table: str) -> str:
    return f"{table}{STAGING_SUFFIX}"


def _names(schema: str, table: str) -> tuple[sql.Identifier, sql.Identifier]:
    """(target, staging) as quoted identifiers; names from staged JSON are checked again."""
    validate_identifier(schema, "sink schema")
    validate_identifier(staging_table(validate_identifier(table, "sink table")), "sink table")
    return sql.Identifier(schema, table), sql.Identifier(schema, staging_table(table))


def _columns(names: Iterable[str], prefix: str | None = None) -> sql.Composed:
    return sql.SQL(", ").join(
        sql.Identifier(prefix, n) if prefix else sql.Identifier(n) for n in names
    )


def _execute(conn: Connection, query: sql.Composable, **params: Any) -> int:
    """Run a psycopg-composed statement on a SQLAlchemy connection (its transaction)."""
    return int(conn.exec_driver_sql(query.as_string(), params).rowcount)


def ensure_tables(engine: Engine, schema: str, table: str) -> None:
    """Create the target and staging tables if missing; ConfigError if the target exists
    without the sink's columns. Run by the driver at the start of a run."""
    target, staging = _names(schema, table)
    columns = [
        sql.SQL("{} {}{}").format(
            sql.Identifier(name), sql.SQL(kind), sql.SQL(" NOT NULL" if required else "")
        )
        for name, kind, required in TABLE_COLUMNS
    ]
    key = [sql.SQL("{} {} NOT NULL").format(sql.Identifier(n), sql.SQL(k)) for n, k in _KEY]
    with engine.begin() as conn:
        _execute(conn, sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        _execute(
            conn,
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                target, sql.SQL(", ").join(columns)
            ),
        )
        _execute(
            conn,
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ({}, seq bigint NOT NULL, {}, PRIMARY KEY ({}))"
            ).format(
                staging,
                sql.SQL(", ").join(key),
                sql.SQL(", ").join(columns),
                _columns([n for n, _ in _KEY] + ["seq"]),
            ),
        )
        present = set(
            conn.execute(
                sa.text(
                    "SELECT column_name FROM information_schema.columns"
                    " WHERE table_schema = :schema AND table_name = :table"
                ),
                {"schema": schema, "table": table},
            ).scalars()
        )
    missing = [name for name in _NAMES if name not in present]
    if missing:
        raise ConfigError(
            "SLUICE_SINK_TABLE", f"{schema}.{table} exists without column(s) {', '.join(missing)}"
        )


def sweep_staged(engine: Engine, schema: str, table: str) -> int:
    """Delete staged rows of runs that hold no split any more; how many were deleted.

    Run it after :func:`~enumerator_service.recover`: what a dead run staged can then never
    commit (its uncommitted transactions were aborted, committed ones were moved).
    """
    _, staging = _names(schema, table)
    query = sql.SQL(
        "DELETE FROM {} WHERE run_id NOT IN (SELECT run_id FROM {}"
        " WHERE status IN ('ASSIGNED', 'READING') AND run_id IS NOT NULL)"
    ).format(staging, sql.Identifier(SCHEMA, splits.name))
    with engine.begin() as conn:
        deleted = _execute(conn, query)
    if deleted:
        _log.info("deleted %d staged rows of dead runs from %s.%s", deleted, schema, table)
    return deleted


def _as_utc(row: tuple[Any, ...]) -> tuple[Any, ...]:
    values = list(row)
    for i in _UTC_COLUMNS:
        if values[i] is not None and values[i].tzinfo is None:
            values[i] = values[i].replace(tzinfo=UTC)
    return tuple(values)


class PostgresTableSinkWriter:
    """Stages one task attempt's output in the staging table.

    Threading: ``write``/``dead_letter``/``pre_commit`` are called on the mailbox thread and
    never block — they only buffer and hand chunks to ``io`` (one thread, so chunks and
    pre-commits keep their order). Everything touching the database (COPY, the batch's
    commit, ``abort``/``close``) runs on that writer thread, which owns the connection.
    """

    def __init__(
        self,
        io: ThreadPoolExecutor,
        *,
        dsn: str,
        schema: str,
        table: str,
        run_id: str,
        subtask: int,
        attempt: str,
    ) -> None:
        self._io = io
        self._dsn = dsn
        self._schema, self._table = schema, table
        self._key = (run_id, subtask, attempt)
        _, staging = _names(schema, table)
        self._copy_sql = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
            staging, _columns([n for n, _ in _KEY] + ["seq", *_NAMES])
        )
        self._buffer: list[tuple[str, tuple[Any, ...]]] = []
        self._dead: list[tuple[int, int, bytes, str]] = []
        # Writer thread only:
        self._conn: psycopg.Connection[Any] | None = None
        self._dates: dict[str, date | None] = {}
        self._batch = 1
        self._staged = 0  # rows in the open batch (its transaction is not committed yet)
        self._error: BaseException | None = None
        self.rows_written = 0

    # -- mailbox thread -------------------------------------------------------------------

    @staticmethod
    def output_partition(day: date | None, rebuild_id: int | None) -> str:
        """The ``dt`` value of a split's rows (ISO date). A partition rebuild replaces
        folders: the table sink cannot take part in one."""
        if rebuild_id is not None:
            raise ValueError(
                f"split of partition {day} belongs to rebuild {rebuild_id}: partition "
                "rebuilds need the parquet sink (SLUICE_SINK=parquet)"
            )
        return day.isoformat() if day is not None else "__unknown__"

    def write(self, day: str, row: tuple[Any, ...]) -> None:
        self._buffer.append((day, row))
        if len(self._buffer) >= _CHUNK:
            buffer, self._buffer = self._buffer, []
            self._io.submit(self._copy, buffer)

    def write_batch(self, day: str, batch: pa.RecordBatch) -> None:
        """Rows of an Arrow record batch (``ENRICHED_SCHEMA``): COPY takes them row by row."""
        columns = [column.to_pylist() for column in batch.columns]
        for row in zip(*columns, strict=True):
            self.write(day, row)

    def dead_letter(self, split_id: int, offset: int, raw: bytes, reason: str) -> None:
        self._dead.append((split_id, offset, raw, reason))

    def pre_commit(self) -> Future[StagedOutput]:
        """Hand everything written so far to the writer thread, which commits the batch."""
        if self._buffer:
            self._io.submit(self._copy, self._buffer)
            self._buffer = []
        dead, self._dead = self._dead, []
        return self._io.submit(self._commit_batch, dead)

    # -- writer thread --------------------------------------------------------------------

    def _date(self, day: str) -> date | None:
        if day not in self._dates:
            self._dates[day] = None if day.startswith("__") else date.fromisoformat(day)
        return self._dates[day]

    def _copy(self, rows: list[tuple[str, tuple[Any, ...]]]) -> None:
        if self._error is not None:
            return  # the batch is lost already; its pre-commit reports the error
        try:
            if self._conn is None:
                self._conn = psycopg.connect(self._dsn, application_name="sluice-sink")
            key, seq = (*self._key, self._batch), self._staged
            with self._conn.cursor() as cur, cur.copy(self._copy_sql) as copy:
                copy.set_types(_COPY_TYPES)
                for day, row in rows:
                    seq += 1
                    if any(row[i] is not None and row[i].tzinfo is None for i in _UTC_COLUMNS):
                        row = _as_utc(row)
                    copy.write_row((*key, seq, *row, self._date(day)))
        except BaseException as exc:
            self._error = exc  # a failed COPY aborted the batch's transaction
            raise
        self._staged = seq
        self.rows_written += len(rows)

    def _commit_batch(self, dead: list[tuple[int, int, bytes, str]]) -> StagedOutput:
        if self._error is not None:
            raise RuntimeError("staging rows failed; the batch cannot commit") from self._error
        out = StagedOutput(dead_letters=encode_dead_letters(dead))
        if self._staged and self._conn is not None:
            self._conn.commit()  # durable from here on; the acknowledgement records it
            run_id, subtask, attempt = self._key
            out.files.append(
                {
                    "schema": self._schema,
                    "table": self._table,
                    "run_id": run_id,
                    "subtask": subtask,
                    "attempt": attempt,
                    "batch": self._batch,
                    "rows": self._staged,
                }
            )
            out.rows = self._staged
            self._batch += 1
            self._staged = 0
        return out

    def abort(self) -> None:
        """Writer thread: drop the open batch (the task is failing) and the connection."""
        self.close()

    def close(self) -> None:
        """Writer thread: close the connection; an uncommitted batch is rolled back."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _batches(txns: Sequence[StagedTransaction]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for txn in txns:
        for entry in txn.staged:
            grouped[entry["schema"], entry["table"]].append(entry)
    return grouped


def _keys(entries: list[dict[str, Any]]) -> str:
    return json.dumps([{n: e[n] for n, _ in _KEY} for e in entries])


_KEYS = sql.SQL(
    "SELECT * FROM jsonb_to_recordset(CAST(%(keys)s AS jsonb))"
    " AS k(run_id text, subtask integer, attempt text, batch bigint)"
)
_MATCH = sql.SQL(
    "s.run_id = k.run_id AND s.subtask = k.subtask AND s.attempt = k.attempt AND s.batch = k.batch"
)


class PostgresTableSink:
    """Commit side of the table sink (coordinator, recovery, AT_LEAST_ONCE acknowledgements).

    Threading: no state but the optional engine; safe on any thread. ``commit`` works on the
    caller's connection. ``abort`` needs ``engine``: without one (the module-level registry
    that has no database) it leaves the rows, which are invisible and later removed by
    :func:`sweep_staged`.
    """

    name = TABLE_SINK_NAME

    def __init__(self, engine: Engine | None = None) -> None:
        self._engine = engine

    def commit(self, conn: Connection, txns: Sequence[StagedTransaction]) -> None:
        """Inside the completion transaction: move the staged rows into the target table.

        Runs once per transaction (the caller marks it committed in the same transaction);
        raises if fewer rows are staged than the pre-commit recorded, which rolls back the
        completion instead of committing a checkpoint without its output.
        """
        for (schema, table), entries in sorted(_batches(txns).items()):
            target, staging = _names(schema, table)
            query = sql.SQL(
                "WITH moved AS (DELETE FROM {staging} AS s USING ({keys}) AS k WHERE {match}"
                " RETURNING {returned})"
                " INSERT INTO {target} ({columns}) SELECT {columns} FROM moved"
            ).format(
                staging=staging,
                keys=_KEYS,
                match=_MATCH,
                returned=_columns(_NAMES, "s"),
                target=target,
                columns=_columns(_NAMES),
            )
            moved = _execute(conn, query, keys=_keys(entries))
            expected = sum(int(e["rows"]) for e in entries)
            if moved != expected:
                raise RuntimeError(
                    f"staged output is lost: {expected} rows were staged for {schema}.{table},"
                    f" {moved} are left"
                )

    def publish(self, txns: Sequence[StagedTransaction]) -> None:
        return None  # the rows became visible when the completion transaction committed

    def abort(self, txns: Sequence[StagedTransaction]) -> None:
        """Delete staged rows that will never commit. Idempotent."""
        if self._engine is None:
            _log.debug("no engine: %d staged transaction(s) left to the sweep", len(txns))
            return
        with self._engine.begin() as conn:
            for (schema, table), entries in sorted(_batches(txns).items()):
                _, staging = _names(schema, table)
                query = sql.SQL("DELETE FROM {} AS s USING ({}) AS k WHERE {}").format(
                    staging, _KEYS, _MATCH
                )
                _execute(conn, query, keys=_keys(entries))
