"""The Postgres table sink connector: rows staged per checkpoint in the target's staging
table, moved into it in the checkpoint's own transaction (:mod:`spark_jobs.sink._table_commit`);
an upsert sink replaces rows by key, so a rebuilt day overwrites its rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import (
    Settings,
    StorageOptions,
    TransactionalSink,
    connect_engine,
    database_url,
)
from spark_jobs.connectors._interface import SinkConnector, SinkDetails, SinkWriterContext
from spark_jobs.pipeline._checks import upsert_key
from spark_jobs.pipeline._errors import check_table, quote
from spark_jobs.sink._postgres_table import TABLE_SINK_NAME, PostgresTableSinkWriter
from spark_jobs.sink._table_commit import PostgresTableSink
from spark_jobs.sink._table_setup import check_existing_target, ensure_tables, sweep_staged

if TYPE_CHECKING:
    from spark_jobs.pipeline._checks import Context
    from spark_jobs.pipeline._definition import Pipeline
    from spark_jobs.pipeline._plan import Column, Plan, SinkPlan

__all__ = ["PostgresConnector", "PostgresOptions"]

_TABLE_ROWS = """
SELECT f.value -> 'rows_by_partition' AS days, CAST(f.value ->> 'rows' AS bigint) AS rows
FROM sluice.sink_transactions AS t, jsonb_array_elements(t.staged) AS f(value)
WHERE t.committed AND t.sink = 'postgres' AND t.source = :source
"""
#: Duplicated keys listed in a failed check's metadata.
_SAMPLE_KEYS = 5


@dataclass(frozen=True, slots=True)
class PostgresOptions:
    """The target table (schema, name)."""

    table: tuple[str, str]

    @property
    def quoted(self) -> str:
        return f"{quote(self.table[0])}.{quote(self.table[1])}"


class PostgresConnector(SinkConnector):
    name = "postgres"

    def validate(
        self,
        spec: Any,
        ctx: Context,
        *,
        pipeline: str,
        columns: tuple[Column, ...],
        is_open: bool,
    ) -> SinkDetails:
        table = ctx.check(check_table, spec.table, "table")
        upsert = upsert_key(ctx, spec.upsert_key, columns, is_open)
        return SinkDetails(PostgresOptions(table), upsert)

    def describe(self, plan: Plan) -> str:
        options: PostgresOptions = plan.sink.options
        upsert = plan.sink.upsert_key
        where = f"postgres {options.table[0]}.{options.table[1]}"
        return where + (f", upsert on {', '.join(upsert)}" if upsert else ", append")

    def location(self, pipeline: Pipeline, settings: Settings, days: Sequence[date]) -> str:
        options: PostgresOptions = pipeline.plan.sink.options
        where = f"postgres {options.table[0]}.{options.table[1]}"
        return where if not days else f"{where} (dt {days[0]}..{days[-1]})"

    def committers(
        self, engine: Engine | None, storage: StorageOptions | None = None
    ) -> Mapping[str, TransactionalSink]:
        # Without an engine the sink's abort() leaves staged rows to sweep_staged.
        return {TABLE_SINK_NAME: PostgresTableSink(engine)}

    def open_writer(
        self, plan: SinkPlan, io: ThreadPoolExecutor, context: SinkWriterContext
    ) -> PostgresTableSinkWriter:
        options: PostgresOptions = plan.options
        schema_name, table = options.table
        return PostgresTableSinkWriter(
            io,
            dsn=context.dsn,
            schema_name=schema_name,
            table=table,
            columns=context.schema,
            partitioned=context.partitioned,
            upsert_key=plan.upsert_key,
            latest_by=plan.latest_by,
            op_field=plan.op_field,
            run_id=context.run_id,
            subtask=context.subtask,
            attempt=context.attempt,
        )

    def can_replace(self, plan: SinkPlan) -> bool:
        # An upsert sink's rows are replaced by key; an append sink cannot replace rows:
        # re-materialising a day then only processes its new splits.
        return bool(plan.upsert_key)

    def check_existing(self, engine: Engine, pipeline: Pipeline, settings: Settings) -> None:
        options: PostgresOptions = pipeline.plan.sink.options
        check_existing_target(engine, *options.table, pipeline.plan.sink.upsert_key)

    def prepare(self, engine: Engine, plan: Plan, pipeline: Pipeline, settings: Settings) -> None:
        options: PostgresOptions = plan.sink.options
        schema, table = options.table
        ensure_tables(
            engine,
            schema,
            table,
            plan.output_schema(),
            partitioned=plan.source.partitioned,
            upsert_key=plan.sink.upsert_key,
        )
        sweep_staged(engine, schema, table)

    def wrap_up(self, engine: Engine, plan: Plan) -> None:
        options: PostgresOptions = plan.sink.options
        sweep_staged(engine, *options.table)

    def committed_rows(
        self, conn: sa.Connection, pipeline: Pipeline, settings: Settings, days: list[date]
    ) -> dict[date | None, int]:
        found: dict[date | None, int] = {}
        for per_day, rows in conn.execute(sa.text(_TABLE_ROWS), {"source": pipeline.name}):
            if not days:
                found[None] = found.get(None, 0) + int(rows)
                continue
            for key, count in (per_day or {}).items():
                day = date.fromisoformat(key)
                found[day] = found.get(day, 0) + int(count)
        return found

    def rows_out(
        self,
        conn: sa.Connection,
        pipeline: Pipeline,
        settings: Settings,
        days: Sequence[date | None],
    ) -> dict[date | None, int]:
        table = pipeline.plan.sink.options.quoted
        exists = conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": table}).scalar()
        out: dict[date | None, int] = {}
        for day in days:
            if exists is None:
                out[day] = 0
            elif day is None:
                out[day] = int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())
            else:
                query = sa.text(f"SELECT count(*) FROM {table} WHERE dt = :day")
                out[day] = int(conn.execute(query, {"day": day}).scalar_one())
        return out

    def duplicate_keys(
        self, pipeline: Pipeline, settings: Settings, day: date | None, key: list[str]
    ) -> tuple[int, list[str]]:
        table = pipeline.plan.sink.options.quoted
        columns = ", ".join(quote(k) for k in key)
        where = "" if day is None else "WHERE dt = :day"
        engine = connect_engine(database_url(settings, create=False), pool_size=1)
        try:
            with engine.connect() as conn:
                if conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": table}).scalar() is None:
                    return 0, []
                rows = conn.execute(
                    sa.text(
                        f"SELECT {columns}, count(*) FROM {table} {where} GROUP BY {columns} "
                        "HAVING count(*) > 1 ORDER BY count(*) DESC"
                    ),
                    {"day": day},
                ).all()
        finally:
            engine.dispose()
        sample = [str(tuple(r[:-1])) for r in rows[:_SAMPLE_KEYS]]
        return sum(int(r[-1]) - 1 for r in rows), sample
