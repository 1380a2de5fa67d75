"""The Postgres CDC source connector: snapshot chunks, then one stream split from a logical
replication slot (:class:`~._enumerator.CdcEnumerator`, :class:`CdcSplitReader`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import ConfigError, EnumeratorDiscovery, Settings, StreamSplit
from spark_jobs._outcomes import BadInputFailure, bad_input_line
from spark_jobs._url_env import check_env_name, database_note
from spark_jobs.connectors._interface import (
    ReaderContext,
    SourceConnector,
    SourceDetails,
    TableInput,
    UpstreamAsset,
)
from spark_jobs.connectors._registry import sink_connector_named
from spark_jobs.connectors.postgres_cdc._enumerator import (
    CHUNK_KIND,
    STREAM_KIND,
    CdcEnumerator,
    recorded_start,
    require_own_slot,
)
from spark_jobs.connectors.postgres_cdc._slot import (
    SlotInfo,
    SlotMissingError,
    check_wal_level,
    lsn_text,
    release_source,
    slot_info,
)
from spark_jobs.connectors.postgres_cdc._snapshot import ChunkReader
from spark_jobs.connectors.postgres_cdc._source_db import (
    source_engine,
    task_dsn,
    where_of,
)
from spark_jobs.connectors.postgres_cdc._spec import CDC_FIELDS
from spark_jobs.connectors.postgres_cdc._stream import StreamReader
from spark_jobs.pipeline._catalog import check_fields, resolve, table_catalog
from spark_jobs.pipeline._errors import (
    MissingTableError,
    PipelineDefinitionError,
    check_identifier,
    check_table,
)
from spark_jobs.pipeline._types import arrow_type, catalog_arrow_type, type_family
from spark_jobs.source._records import SplitRead

if TYPE_CHECKING:
    from datetime import date

    from enumerator_service import Discovery
    from spark_jobs.pipeline._checks import Context
    from spark_jobs.pipeline._definition import Pipeline
    from spark_jobs.pipeline._plan import Plan, SourcePlan
    from spark_jobs.source._batch import ParsedBlock, RecordSchema
    from spark_jobs.source._records import BlockReader

__all__ = ["CdcConnector", "CdcOptions", "CdcSplitReader"]

_IDENTITY = sa.text(
    "SELECT c.relreplident, EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid"
    " AND i.indisprimary) FROM pg_class c WHERE c.oid = to_regclass(:t)"
)


@dataclass(frozen=True, slots=True)
class CdcOptions:
    """The tables, their integer key, publication, slot, rows per chunk and the declared
    columns (in schema order)."""

    tables: tuple[tuple[str, str], ...]
    key: str
    publication: str
    slot: str
    rows_per_chunk: int
    declared: tuple[str, ...]
    #: The environment variable holding the source database's URL (None: the platform's).
    url_env: str | None = None

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(f"{s}.{t}" for s, t in self.tables)


class CdcSplitReader:
    """The task's reader of a CDC source's splits: chunks by the chunk reader, the stream
    split by the stream reader (one read at a time, see ``BlockReader``)."""

    def __init__(self, schema: RecordSchema, context: ReaderContext) -> None:
        options: CdcOptions = context.options
        # The tables and the slot are the source database's; the splits' records (slot
        # start, committed offsets) the platform's (``context.dsn``).
        dsn, where = task_dsn(options.url_env, context.dsn), where_of(options.url_env)
        self._chunks = ChunkReader(
            schema, dsn, state_dsn=context.dsn, declared=options.declared, where=where
        )
        self._stream = StreamReader(
            schema,
            dsn,
            state_dsn=context.dsn,
            where=where,
            publication=options.publication,
            tables=options.table_names,
            declared=options.declared,
            key=options.key,
            continuous=context.continuous,
        )
        self._current: ChunkReader | StreamReader = self._chunks

    def open(self, read: SplitRead) -> None:
        self._current = self._stream if isinstance(read.split, StreamSplit) else self._chunks
        self._current.open(read)

    def fetch(self) -> tuple[ParsedBlock | None, bool]:
        return self._current.fetch()

    def wake_up(self) -> None:
        self._current.wake_up()

    def close(self) -> None:
        self._chunks.close()
        self._stream.close()


def _tables(spec: Any) -> list[str]:
    tables = [spec.tables] if isinstance(spec.tables, str) else spec.tables
    if not isinstance(tables, Sequence) or not tables:
        raise ValueError("tables must name at least one table")
    return list(tables)


def _declared_integer(kind: Any) -> bool:
    """Whether a declared field type is an integer (an unknown type passes here: the schema's
    own check names it)."""
    try:
        return type_family(arrow_type(kind, "schema")) == "integer"
    except ValueError:
        return True


class CdcConnector(SourceConnector):
    name = "postgres_cdc"
    split_kinds = (CHUNK_KIND, STREAM_KIND)

    def added_fields(self, spec: Any) -> Mapping[str, Any]:
        return CDC_FIELDS

    def validate(self, spec: Any, ctx: Context) -> SourceDetails:
        names = ctx.check(_tables, spec)
        tables = tuple(ctx.check(check_table, name, "tables") for name in names)
        if len(set(tables)) != len(tables):
            raise ctx.fail("tables names a table twice")
        key = ctx.check(check_identifier, spec.key, "key")
        declared = tuple(n for n in spec.schema if n not in CDC_FIELDS)
        if key not in declared:
            raise ctx.fail(f"key {key!r} must be a declared field of the schema")
        if not _declared_integer(spec.schema[key]):
            raise ctx.fail(
                f"key {key!r} is declared {spec.schema[key]!r}: the key must be an integer"
                " (the snapshot reads the table in key ranges)"
            )
        default = f"sluice_{ctx.pipeline}"
        publication = ctx.check(check_identifier, spec.publication or default, "publication")
        slot = ctx.check(check_identifier, spec.slot or default, "slot")
        if not isinstance(spec.rows_per_chunk, int) or spec.rows_per_chunk < 1:
            raise ctx.fail("rows_per_chunk must be a positive integer")
        url_env = ctx.check(check_env_name, spec.url_env)
        options = CdcOptions(tables, key, publication, slot, spec.rows_per_chunk, declared, url_env)
        return SourceDetails(options, order_field="_lsn", op_field="_op", row_key=(key,))

    def describe(self, plan: SourcePlan, pipeline: str, where: str | None = None) -> str:
        options: CdcOptions = plan.options
        return (
            f"changes of {', '.join(options.table_names)} (snapshot by {options.key}, then"
            f" slot {options.slot}, publication {options.publication}"
            + (f", in the database of ${options.url_env})" if options.url_env else ")")
        )

    def discovery(self, pipeline: Pipeline, settings: Settings) -> Discovery:
        options: CdcOptions = pipeline.plan.source.options

        def make(engine: Engine, settings: Settings, dates: Any) -> CdcEnumerator:
            # The run's definition check first (tables, key, columns, types, replica
            # identity, lookups): nothing — publication, slot holding WAL — is created for a
            # definition that cannot run.
            resolve(pipeline, engine)
            # An existing sink table that cannot take the changes (an upsert key without
            # a unique index) is said now, not by the first run after the slot exists.
            sink_connector_named(pipeline.plan.sink.kind).check_existing(engine, pipeline, settings)
            return CdcEnumerator(
                engine,
                source_engine(options.url_env, engine),
                pipeline.name,
                tables=options.tables,
                key=options.key,
                publication=options.publication,
                slot=options.slot,
                rows_per_chunk=options.rows_per_chunk,
                lease_seconds=settings.lease_seconds,
            )

        return EnumeratorDiscovery(pipeline.name, make)

    def before_assignment(
        self,
        engine: Engine,
        pipeline: Pipeline,
        settings: Settings,
        *,
        continuous: bool,
        dates: Sequence[date] | None = None,
    ) -> None:
        # A run's start: another pipeline's slot, or a dropped one, is one line — never a
        # run that finds nothing to read and ends as if everything was read.
        # Its line is the one a subtask's dropped slot gives (BadInputFailure, exit 2).
        options: CdcOptions = pipeline.plan.source.options
        try:
            require_own_slot(
                engine, source_engine(options.url_env, engine), pipeline.name, options.slot
            )
        except SlotMissingError as exc:
            raise BadInputFailure(f"pipeline {pipeline.name}: {bad_input_line(exc)}") from exc

    def check_catalog(self, conn: sa.Connection, plan: Plan) -> None:
        with _on_source(conn, plan.source.options) as source:
            self._check_tables(source, plan)

    def _check_tables(self, conn: sa.Connection, plan: Plan) -> None:
        """``check_catalog`` on a connection to the source database."""
        options: CdcOptions = plan.source.options
        check_wal_level(conn)
        declared = [c for c in plan.source.columns if c.name in options.declared]
        for schema, table in options.tables:
            qualified = f"{schema}.{table}"
            catalog = table_catalog(conn, schema, table)
            if catalog is None:
                where = database_note(options.url_env)
                raise MissingTableError(
                    plan.name,
                    "source",
                    f"PostgresCdcSource(tables): table {qualified}{where} does not exist",
                )
            kind = catalog.get(options.key)
            if kind is None or type_family(catalog_arrow_type(kind)[0]) != "integer":
                raise PipelineDefinitionError(
                    plan.name,
                    "source",
                    f"key {options.key!r} must be an integer column of {qualified}",
                )
            check_fields(plan.name, "source", qualified, declared, catalog)
            identity, has_key = conn.execute(_IDENTITY, {"t": f'"{schema}"."{table}"'}).one()
            if identity == "n" or (identity == "d" and not has_key):
                raise PipelineDefinitionError(
                    plan.name,
                    "source",
                    f"table {qualified} has no primary key and no replica identity: updates"
                    " and deletes cannot be captured (add a primary key, or ALTER TABLE"
                    f" {qualified} REPLICA IDENTITY FULL)",
                )

    def split_reader(self, schema: RecordSchema, context: ReaderContext) -> BlockReader:
        return CdcSplitReader(schema, context)

    def upstream_assets(self, plan: Plan) -> list[UpstreamAsset]:
        options: CdcOptions = plan.source.options
        return [TableInput(s, t, options.url_env) for s, t in options.tables]

    def source_status(self, conn: sa.Connection, plan: Plan) -> Mapping[str, Any]:
        options: CdcOptions = plan.source.options
        try:
            info = _slot_info(conn, options)
        except ConfigError as exc:  # the source server unknown or unreachable: said, not fatal
            return {"slot": options.slot, "slot_exists": None, "slot_unknown": str(exc)}
        if info is None:  # not created yet, or dropped under the pipeline (changes lost)
            dropped = recorded_start(conn, plan.name) is not None
            return {"slot": options.slot, "slot_exists": False, "slot_dropped": dropped}
        return {
            "slot": options.slot,
            "slot_exists": True,
            "slot_active": info.active,
            "retained_wal_bytes": info.retained_bytes,
            "confirmed_flush_lsn": None
            if info.confirmed_flush is None
            else lsn_text(info.confirmed_flush),
        }

    def health_description(self, plan: Plan) -> str | None:
        options: CdcOptions = plan.source.options
        return (
            f"Replication slot {options.slot} retains at most SLUICE_CDC_MAX_RETAINED_WAL_MB of"
            " WAL on the source server."
        )

    def health(
        self, conn: sa.Connection, plan: Plan, settings: Settings
    ) -> tuple[bool, str, Mapping[str, Any]]:
        options: CdcOptions = plan.source.options
        bound = settings.cdc_max_retained_wal_mb
        try:
            info = _slot_info(conn, options)
        except ConfigError as exc:  # what the slot retains cannot be known: not healthy
            return False, str(exc), {"slot": options.slot}
        if info is None:
            return True, f"no replication slot {options.slot} (nothing retained)", {}
        retained_mb = info.retained_bytes / (1 << 20)
        metadata = {
            "slot": options.slot,
            "active": info.active,
            "retained_wal_mb": round(retained_mb, 1),
            "max_retained_wal_mb": bound,
        }
        if retained_mb > bound:
            state = "read by a run" if info.active else "not read by any run"
            return (
                False,
                f"replication slot {options.slot} retains {retained_mb:,.0f} MB of WAL (bound"
                f" SLUICE_CDC_MAX_RETAINED_WAL_MB={bound}; {state}): run the pipeline, or drop"
                f" the slot with 'sluice cdc drop {plan.name}'",
                metadata,
            )
        return True, f"replication slot {options.slot} retains {retained_mb:,.1f} MB", metadata

    def release(self, engine: Engine, plan: Plan) -> list[str] | None:
        options: CdcOptions = plan.source.options
        return release_source(
            engine,
            plan.name,
            options.slot,
            options.publication,
            list(options.tables),
            source_db=source_engine(options.url_env, engine),
        )


@contextmanager
def _on_source(conn: sa.Connection, options: CdcOptions) -> Iterator[sa.Connection]:
    """A connection to the source database: ``conn`` itself (the platform database's)
    unless the source names ``url_env``."""
    if options.url_env is None:
        yield conn
        return
    with source_engine(options.url_env, conn.engine).connect() as source:
        yield source


def _slot_info(conn: sa.Connection, options: CdcOptions) -> SlotInfo | None:
    """The slot as its server shows it (``conn``: the platform database's)."""
    with _on_source(conn, options) as source:
        return slot_info(source, options.slot)
