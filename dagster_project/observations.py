"""The external inputs of the pipeline as observable assets: landing files and the users table.

Observing never reads data: the landing folder is listed (one ``stat`` per file, aggregated as
it goes, so memory does not grow with the number of files) and the users table is sized from
the Postgres catalog.
"""

import hashlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    AssetSpec,
    BetaWarning,
    DataVersion,
    MetadataValue,
    ObserveResult,
    multi_observable_source_asset,
)

from dagster_project.resources import SluiceResource
from enumerator_service import connect_engine, database_url
from enumerator_service._enumerator import _PARTITION_DIR, _kind_of

__all__ = ["LandingListing", "list_landing", "raw_events", "users"]

RAW_EVENTS = AssetSpec(
    "raw_events",
    description="Event files under <landing>/dt=YYYY-MM-DD/ (JSON Lines, CSV, gzip, Parquet).",
    group_name="sluice",
    kinds={"file"},
)
USERS = AssetSpec(
    "users",
    description="The dimension table events are enriched with (SLUICE_LOOKUP_SCHEMA.TABLE).",
    group_name="sluice",
    kinds={"postgres"},
)


@dataclass(frozen=True, slots=True)
class LandingListing:
    """Aggregates of one listing of the landing folder."""

    files: int
    total_bytes: int
    newest_mtime_ns: int
    partitions: int

    @property
    def data_version(self) -> DataVersion:
        key = f"{self.files}:{self.total_bytes}:{self.newest_mtime_ns}"
        return DataVersion(hashlib.sha256(key.encode()).hexdigest()[:16])


def list_landing(landing: Path) -> LandingListing:
    """Count the data files the enumerators would register (same folder and name rules)."""
    files = total = newest = partitions = 0
    if not landing.is_dir():
        return LandingListing(0, 0, 0, 0)
    with os.scandir(landing) as folders:
        for folder in folders:
            if not _PARTITION_DIR.match(folder.name) or not folder.is_dir():
                continue
            partitions += 1
            with os.scandir(folder.path) as entries:
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


def _observe_raw_events(context: AssetExecutionContext, sluice: SluiceResource) -> ObserveResult:
    """File count, total bytes and newest modification time of the landing folder."""
    landing = sluice.settings().landing_path
    listing = list_landing(landing)
    context.log.info(f"{landing}: {listing.files} files, {listing.total_bytes} bytes")
    metadata: dict[str, Any] = {
        "path": MetadataValue.path(str(landing)),
        "files": MetadataValue.int(listing.files),
        "total_bytes": MetadataValue.int(listing.total_bytes),
        "partitions": MetadataValue.int(listing.partitions),
    }
    if listing.files:
        metadata["newest_mtime"] = MetadataValue.timestamp(listing.newest_mtime_ns / 1e9)
    return ObserveResult(
        asset_key=RAW_EVENTS.key, data_version=listing.data_version, metadata=metadata
    )


def _observe_users(context: AssetExecutionContext, sluice: SluiceResource) -> ObserveResult:
    """Row count of the dimension table (the planner's estimate when there is one)."""
    settings = sluice.settings()
    table = f"{settings.lookup_schema}.{settings.lookup_table}"  # validated identifiers
    engine = connect_engine(database_url(settings), pool_size=1)
    try:
        with engine.connect() as conn:
            row = conn.execute(
                sa.text(
                    "SELECT c.reltuples::bigint, "
                    "COALESCE(s.n_tup_ins + s.n_tup_upd + s.n_tup_del, 0) "
                    "FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
                    "WHERE c.oid = to_regclass(:name)"
                ),
                {"name": table},
            ).first()
            if row is None:
                rows, changes, estimated = 0, 0, False
            else:
                rows, changes, estimated = int(row[0]), int(row[1]), True
                if rows < 0:  # never vacuumed or analyzed: count (small tables only)
                    count = sa.text(f"SELECT count(*) FROM {table}")
                    rows = int(conn.execute(count).scalar_one())
                    estimated = False
    finally:
        engine.dispose()
    context.log.info(f"{table}: {rows} rows{' (estimate)' if estimated else ''}")
    version = DataVersion(f"rows={rows};changes={changes}" if row is not None else "missing")
    return ObserveResult(
        asset_key=USERS.key,
        data_version=version,
        metadata={
            "table": MetadataValue.text(table),
            "exists": MetadataValue.bool(row is not None),
            "row_count": MetadataValue.int(rows),
            "row_count_is_estimate": MetadataValue.bool(estimated),
        },
    )


# Observable source assets are beta in dagster 1.13: opting in is deliberate here.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", BetaWarning)
    raw_events: AssetsDefinition = multi_observable_source_asset(
        specs=[RAW_EVENTS], name="observe_raw_events"
    )(_observe_raw_events)
    users: AssetsDefinition = multi_observable_source_asset(specs=[USERS], name="observe_users")(
        _observe_users
    )
