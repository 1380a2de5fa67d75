"""Resolve a pipeline against the Postgres catalog when a run opens.

What a definition cannot know on its own: the types of the looked-up columns (and so of
everything a later step derives from them), and whether the tables and key columns exist
with types that match the record fields. ``resolve`` reads the catalog once, derives the
complete plan and checks every key; each problem is one :class:`PipelineDefinitionError`
naming the pipeline, the step and the field.

Threading: blocks on the database; the driver (or the CLI) calls it before any task runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from enumerator_service import qualified_name
from spark_jobs._url_env import LOOKUP_URL_SETTING, database_note, engine_of
from spark_jobs.connectors._registry import source_connector_named
from spark_jobs.pipeline._definition import Pipeline
from spark_jobs.pipeline._derive import derive
from spark_jobs.pipeline._errors import MissingTableError, PipelineDefinitionError
from spark_jobs.pipeline._plan import Column, LookupPlan, Plan
from spark_jobs.pipeline._types import catalog_arrow_type, type_family, type_name

__all__ = ["Resolved", "check_fields", "resolve", "table_catalog"]

_COLUMNS = sa.text(
    "SELECT attname, format_type(atttypid, atttypmod) FROM pg_catalog.pg_attribute"
    " WHERE attrelid = to_regclass(:table) AND attnum > 0 AND NOT attisdropped"
)


@dataclass(frozen=True)
class Resolved:
    """A pipeline's complete plan, and each lookup step's column types (step index →
    table column → Arrow type)."""

    plan: Plan
    lookup_types: dict[int, dict[str, pa.DataType]]


def table_catalog(conn: Connection, schema: str, table: str) -> dict[str, str] | None:
    """Column → SQL type of ``schema.table``; None if the table does not exist."""
    qualified = qualified_name(schema, table)
    exists = conn.execute(sa.text("SELECT to_regclass(:t)"), {"t": qualified}).scalar()
    if exists is None:
        return None
    return {str(n): str(t) for n, t in conn.execute(_COLUMNS, {"table": qualified}).all()}


def resolve(pipeline: Pipeline, engine: Engine) -> Resolved:
    """Read the catalog for ``pipeline``'s tables and derive its complete plan."""
    plan = pipeline.plan
    name = pipeline.name
    lookup_types: dict[int, dict[str, pa.DataType]] = {}
    catalogs: dict[int, dict[str, str]] = {}
    with engine.connect() as conn:
        source_connector_named(plan.source.kind).check_catalog(conn, plan)
    for step in plan.lookups():
        # A lookup's table is in the platform database, or on the server of its url_env.
        with engine_of(step.url_env, engine, LOOKUP_URL_SETTING).connect() as conn:
            catalog = table_catalog(conn, step.schema_name, step.table)
        if catalog is None:
            where = database_note(step.url_env)
            raise MissingTableError(
                name, step.where, f"table {step.qualified}{where} does not exist"
            )
        wanted = [column for _, column in step.keys] + [column for column, _ in step.columns]
        for column in wanted:
            if column not in catalog:
                raise PipelineDefinitionError(
                    name, step.where, f"table {step.qualified} has no column {column!r}"
                )
        catalogs[step.index] = catalog
        lookup_types[step.index] = {
            column: catalog_arrow_type(catalog[column])[0] for column, _ in step.columns
        }
    resolved = derive(pipeline, lookup_types)
    for step in resolved.lookups():
        _check_keys(name, step, catalogs[step.index])
    if not resolved.complete:  # pragma: no cover - derive probes every map once types are known
        raise PipelineDefinitionError(name, "", "the output schema could not be derived")
    return Resolved(resolved, lookup_types)


def _check_keys(pipeline: str, step: LookupPlan, catalog: dict[str, str]) -> None:
    fields = {c.name: c.type for c in step.inputs}
    for field_name, column in step.keys:
        kind = fields[field_name]
        assert kind is not None  # resolved
        column_kind, as_text = catalog_arrow_type(catalog[column])
        # Text-like columns (varchar, uuid, …) take string keys.
        family = "string" if as_text else type_family(column_kind)
        if type_family(kind) != family:
            raise PipelineDefinitionError(
                pipeline,
                step.where,
                f"key field {field_name!r} is {type_name(kind)} but {step.qualified}.{column} "
                f"is {catalog[column]}",
            )


def _narrower(declared: pa.DataType, column: pa.DataType) -> bool:
    """The declared type holds less than the column's of the same family: fewer bits, or
    (a decimal) fewer digits before or after the point."""
    if type_family(declared) in ("integer", "float"):
        return bool(declared.bit_width < column.bit_width)
    if pa.types.is_decimal(declared) and pa.types.is_decimal(column):
        fewer_after = declared.scale < column.scale
        fewer_before = declared.precision - declared.scale < column.precision - column.scale
        return bool(fewer_after or fewer_before)
    return False


def check_fields(
    pipeline: str, where: str, table: str, columns: Sequence[Column], catalog: dict[str, str]
) -> None:
    """PipelineDefinitionError naming every declared field ``table`` lacks, holds with
    another type family, or holds wider than declared (an ``int32`` of a ``bigint``
    column) — one line: fixing the first would only show the next."""
    problems = []
    for column in columns:
        name, kind = column.name, column.type
        assert kind is not None  # declared by the source
        if name not in catalog:
            problems.append(f"table {table} has no column {name!r}")
            continue
        found, as_text = catalog_arrow_type(catalog[name])
        family = "string" if as_text else type_family(found)
        if family != type_family(kind):
            problems.append(
                f"field {name!r} is declared {type_name(kind)} but {table}.{name} is "
                f"{catalog[name]}"
            )
        elif _narrower(kind, found):
            # Values past the narrower range would be dead letters (or rounded): declare
            # the column's width.
            problems.append(
                f"field {name!r} is declared {type_name(kind)}, narrower than {table}.{name}"
                f" ({catalog[name]}): declare {type_name(found)}"
            )
    if problems:
        raise PipelineDefinitionError(pipeline, where, "; ".join(problems))
