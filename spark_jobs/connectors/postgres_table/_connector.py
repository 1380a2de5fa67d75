"""The Postgres table source connector: a table's rows in ranges of its integer key
(:class:`~enumerator_service.TableRangeEnumerator`, :class:`TableRangeSplitReader`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from enumerator_service import Settings, TableDiscovery
from spark_jobs.connectors._interface import (
    ReaderContext,
    SourceConnector,
    SourceDetails,
    TableInput,
    UpstreamAsset,
)
from spark_jobs.pipeline._catalog import check_fields, table_catalog
from spark_jobs.pipeline._errors import (
    MissingTableError,
    PipelineDefinitionError,
    check_identifier,
    check_table,
)
from spark_jobs.pipeline._types import catalog_arrow_type, type_family
from spark_jobs.source._table_reader import TableRangeSplitReader

if TYPE_CHECKING:
    from enumerator_service import Discovery
    from spark_jobs.pipeline._checks import Context
    from spark_jobs.pipeline._definition import Pipeline
    from spark_jobs.pipeline._plan import Plan, SourcePlan
    from spark_jobs.source._batch import RecordSchema
    from spark_jobs.source._records import BlockReader

__all__ = ["TableConnector", "TableOptions"]


@dataclass(frozen=True, slots=True)
class TableOptions:
    """The table (schema, name), its integer key column and rows per split."""

    table: tuple[str, str]
    key: str
    rows_per_split: int


class TableConnector(SourceConnector):
    name = "table"
    split_kinds = ("table",)

    def validate(self, spec: Any, ctx: Context) -> SourceDetails:
        table = ctx.check(check_table, spec.table, "table")
        key = ctx.check(check_identifier, spec.key, "key")
        if not isinstance(spec.rows_per_split, int) or spec.rows_per_split < 1:
            raise ctx.fail("rows_per_split must be a positive integer")
        return SourceDetails(TableOptions(table, key, spec.rows_per_split))

    def describe(self, plan: SourcePlan, pipeline: str, where: str | None = None) -> str:
        options: TableOptions = plan.options
        schema, table = options.table
        return f"table {schema}.{table} by {options.key} ranges"

    def discovery(self, pipeline: Pipeline, settings: Settings) -> Discovery:
        options: TableOptions = pipeline.plan.source.options
        schema, table = options.table
        return TableDiscovery(pipeline.name, schema, table, options.key, options.rows_per_split)

    def check_catalog(self, conn: sa.Connection, plan: Plan) -> None:
        options: TableOptions = plan.source.options
        schema, table = options.table
        catalog = table_catalog(conn, schema, table)
        where = "source"
        if catalog is None:
            raise MissingTableError(plan.name, where, f"table {schema}.{table} does not exist")
        key_kind = catalog.get(options.key)
        if key_kind is None or type_family(catalog_arrow_type(key_kind)[0]) != "integer":
            raise PipelineDefinitionError(
                plan.name,
                where,
                f"key {options.key!r} must be an integer column of {schema}.{table}",
            )
        check_fields(plan.name, where, f"{schema}.{table}", plan.source.columns, catalog)

    def split_reader(self, schema: RecordSchema, context: ReaderContext) -> BlockReader:
        return TableRangeSplitReader(schema, context.dsn)

    def upstream_assets(self, plan: Plan) -> list[UpstreamAsset]:
        options: TableOptions = plan.source.options
        return [TableInput(*options.table)]
