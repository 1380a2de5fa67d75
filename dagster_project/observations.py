"""A pipeline's inputs as observable assets: its landing folder (or source table) and each
table its lookups read. Observing never reads data: a folder is listed (one ``stat`` per
file, aggregated as it goes) and a table is sized from the Postgres catalog. Each
observation records a data version, so the output asset shows when its inputs changed."""

import warnings
from typing import Any

import sqlalchemy as sa
from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    AssetSpec,
    BetaWarning,
    DataVersion,
    MetadataValue,
    ObserveResult,
    multi_observable_source_asset,
)

from dagster_project.resources import SluiceResource
from enumerator_service import connect_engine, database_url, qualified_name
from spark_jobs.connectors import ObservedInput, TableInput, source_connector_named
from spark_jobs.pipeline import Pipeline, database_note, url_env_engine

__all__ = ["observed_asset", "table_asset", "table_key", "upstream_assets"]


def table_key(schema: str, table: str, url_env: str | None = None) -> AssetKey:
    """The asset of a Postgres table (shared by every pipeline that reads it): ``[schema,
    table]`` in the platform database, ``[url_env, schema, table]`` in the database whose URL
    the environment variable ``url_env`` holds."""
    return AssetKey([schema, table] if url_env is None else [url_env, schema, table])


def _metadata_value(value: Any, *, path: bool) -> Any:
    if path:
        return MetadataValue.path(str(value))
    if isinstance(value, bool):
        return MetadataValue.bool(value)
    if isinstance(value, int):
        return MetadataValue.int(value)
    if isinstance(value, float):
        return MetadataValue.float(value)
    return MetadataValue.text(str(value))


def observed_asset(pipeline: Pipeline, observed: ObservedInput) -> AssetsDefinition:
    """``<pipeline>_<name>``: an input its source connector observes (files: the landing
    folder's file count, total bytes and newest mtime)."""
    spec = AssetSpec(
        f"{pipeline.name}_{observed.name}",
        description=observed.description,
        group_name=pipeline.name,
        kinds=set(observed.kinds),
    )

    def observe(context: AssetExecutionContext, sluice: SluiceResource) -> ObserveResult:
        version, found = observed.observe(pipeline, sluice.settings())
        context.log.info(f"{spec.key.to_user_string()}: {dict(found)}")
        metadata = {
            key: _metadata_value(value, path=key == observed.path_key)
            for key, value in found.items()
        }
        return ObserveResult(
            asset_key=spec.key,
            data_version=DataVersion(version) if version is not None else None,
            metadata=metadata,
        )

    return _observable(spec, f"observe_{pipeline.name}_{observed.name}", observe)


def upstream_assets(pipeline: Pipeline) -> list[AssetsDefinition]:
    """The Dagster assets of the pipeline's input, as its source connector declares them."""
    found: list[AssetsDefinition] = []
    connector = source_connector_named(pipeline.plan.source.kind)
    for upstream in connector.upstream_assets(pipeline.plan):
        if isinstance(upstream, TableInput):
            found.append(
                table_asset(
                    upstream.schema,
                    upstream.table,
                    group=pipeline.name,
                    used_by=pipeline.name,
                    url_env=upstream.url_env,
                )
            )
        else:
            found.append(observed_asset(pipeline, upstream))
    return found


def table_asset(
    schema: str, table: str, *, group: str, used_by: str, url_env: str | None = None
) -> AssetsDefinition:
    """``[schema, table]`` (``[url_env, schema, table]``): a table a pipeline reads, sized
    from the catalog of its database."""
    qualified = qualified_name(schema, table)
    spec = AssetSpec(
        table_key(schema, table, url_env),
        description=(
            f"The Postgres table {schema}.{table}{database_note(url_env)}, read by {used_by}."
        ),
        group_name=group,
        kinds={"postgres"},
    )

    def observe(context: AssetExecutionContext, sluice: SluiceResource) -> ObserveResult:
        # The platform database: an engine of this observation's; a url_env database: the
        # process's engine of that URL (kept, like a run's).
        own = None
        if url_env:
            engine = url_env_engine(url_env, "url_env")
        else:
            settings = sluice.settings()
            engine = own = connect_engine(database_url(settings, create=False), pool_size=1)
        try:
            with engine.connect() as conn:
                row = conn.execute(
                    sa.text(
                        "SELECT c.reltuples::bigint, "
                        "COALESCE(s.n_tup_ins + s.n_tup_upd + s.n_tup_del, 0) "
                        "FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
                        "WHERE c.oid = to_regclass(:name)"
                    ),
                    {"name": qualified},
                ).first()
                if row is None:
                    rows, changes, estimated = 0, 0, False
                else:
                    rows, changes, estimated = int(row[0]), int(row[1]), True
                    if rows < 0:  # never vacuumed or analyzed: count (small tables only)
                        rows = int(
                            conn.execute(sa.text(f"SELECT count(*) FROM {qualified}")).scalar_one()
                        )
                        estimated = False
        finally:
            if own is not None:
                own.dispose()
        context.log.info(f"{schema}.{table}: {rows} rows{' (estimate)' if estimated else ''}")
        version = DataVersion(f"rows={rows};changes={changes}" if row is not None else "missing")
        return ObserveResult(
            asset_key=spec.key,
            data_version=version,
            metadata={
                "table": MetadataValue.text(f"{schema}.{table}"),
                "exists": MetadataValue.bool(row is not None),
                "row_count": MetadataValue.int(rows),
                "row_count_is_estimate": MetadataValue.bool(estimated),
            },
        )

    prefix = f"{url_env.lower()}_" if url_env else ""
    return _observable(spec, f"observe_{prefix}{schema}_{table}", observe)


def _observable(spec: AssetSpec, name: str, observe: Any) -> AssetsDefinition:
    # Observable source assets are beta in dagster 1.13: opting in is deliberate here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        definition: AssetsDefinition = multi_observable_source_asset(specs=[spec], name=name)(
            observe
        )
    return definition
