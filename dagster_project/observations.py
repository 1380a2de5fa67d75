"""A pipeline's inputs as observable assets: its landing folder (or source table) and each
table its lookups read. Observing never reads data: a folder is listed (one ``stat`` per
file, aggregated as it goes) and a table is sized from the Postgres catalog. Each
observation records a data version, so the output asset shows when its inputs changed."""

import hashlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
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
from enumerator_service._landing import _PARTITION_DIR, _kind_of
from enumerator_service._object_landing import ObjectLanding
from enumerator_service._storage import Location
from spark_jobs.pipeline import Pipeline
from spark_jobs.pipeline._paths import landing_location

__all__ = ["LandingListing", "landing_asset", "list_landing", "table_asset", "table_key"]


@dataclass(frozen=True, slots=True)
class LandingListing:
    """Aggregates of one listing of a landing folder."""

    files: int
    total_bytes: int
    newest_mtime_ns: int
    partitions: int

    @property
    def data_version(self) -> DataVersion:
        key = f"{self.files}:{self.total_bytes}:{self.newest_mtime_ns}"
        return DataVersion(hashlib.sha256(key.encode()).hexdigest()[:16])


def list_landing(landing: Path | Location, *, partitioned: bool = True) -> LandingListing:
    """Count the data files the enumerators would register (same folder and name rules)."""
    files = total = newest = partitions = 0
    if isinstance(landing, Location) and landing.object_store:
        days = set()
        for _uri, _kind, day, identity in ObjectLanding(landing).data_files(
            partitioned=partitioned, dates=None
        ):
            files += 1
            total += identity.size
            newest = max(newest, identity.mtime_ns)
            days.add(day)
        return LandingListing(files, total, newest, len(days) if partitioned else 0)
    if isinstance(landing, Location):
        landing = landing.local_path
    if not landing.is_dir():
        return LandingListing(0, 0, 0, 0)
    folders = [landing]
    if partitioned:
        folders = [f for f in landing.iterdir() if _PARTITION_DIR.match(f.name) and f.is_dir()]
    for folder in folders:
        partitions += partitioned
        with os.scandir(folder) as entries:
            for entry in entries:
                # Hidden and "_" files are in-flight writes or markers, never data.
                if entry.name.startswith((".", "_")) or _kind_of(entry.name) is None:
                    continue
                if not entry.is_file():
                    continue
                stat = entry.stat()
                files += 1
                total += stat.st_size
                newest = max(newest, stat.st_mtime_ns)
    return LandingListing(files, total, newest, partitions)


def table_key(schema: str, table: str) -> AssetKey:
    """The asset of a Postgres table (shared by every pipeline that reads it)."""
    return AssetKey([schema, table])


def landing_asset(pipeline: Pipeline) -> AssetsDefinition:
    """``<pipeline>_landing``: file count, total bytes and newest mtime of the landing folder."""
    source = pipeline.plan.source
    spec = AssetSpec(
        f"{pipeline.name}_landing",
        description=f"The files pipeline {pipeline.name} reads (its landing folder).",
        group_name=pipeline.name,
        kinds={"file"},
    )

    def observe(context: AssetExecutionContext, sluice: SluiceResource) -> ObserveResult:
        landing = landing_location(pipeline, sluice.settings())
        listing = list_landing(landing, partitioned=source.partitioned)
        context.log.info(f"{landing}: {listing.files} files, {listing.total_bytes} bytes")
        metadata: dict[str, Any] = {
            "path": MetadataValue.path(landing.uri),
            "files": MetadataValue.int(listing.files),
            "total_bytes": MetadataValue.int(listing.total_bytes),
            "partitions": MetadataValue.int(listing.partitions),
        }
        if listing.files:
            metadata["newest_mtime"] = MetadataValue.timestamp(listing.newest_mtime_ns / 1e9)
        return ObserveResult(
            asset_key=spec.key, data_version=listing.data_version, metadata=metadata
        )

    return _observable(spec, f"observe_{pipeline.name}_landing", observe)


def table_asset(schema: str, table: str, *, group: str, used_by: str) -> AssetsDefinition:
    """``[schema, table]``: a table a pipeline reads, sized from the catalog."""
    qualified = qualified_name(schema, table)
    spec = AssetSpec(
        table_key(schema, table),
        description=f"The Postgres table {schema}.{table}, read by {used_by}.",
        group_name=group,
        kinds={"postgres"},
    )

    def observe(context: AssetExecutionContext, sluice: SluiceResource) -> ObserveResult:
        engine = connect_engine(database_url(sluice.settings(), create=False), pool_size=1)
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
            engine.dispose()
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

    return _observable(spec, f"observe_{schema}_{table}", observe)


def _observable(spec: AssetSpec, name: str, observe: Any) -> AssetsDefinition:
    # Observable source assets are beta in dagster 1.13: opting in is deliberate here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BetaWarning)
        definition: AssetsDefinition = multi_observable_source_asset(specs=[spec], name=name)(
            observe
        )
    return definition
