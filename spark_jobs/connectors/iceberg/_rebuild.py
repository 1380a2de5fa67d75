"""Rebuilding one day of an Iceberg sink: the rebuild's files replace the day's data files
in ONE ``overwrite`` snapshot.

The steps of ``spark_jobs.sink._rebuild_swap.finish_rebuilds`` with the folder swap
replaced by a table commit: (1) committed output is published, (2) the rebuild becomes
SWAPPING, (3) under the table lock: unless a snapshot with its ``sluice.rebuild-id``
exists, one overwrite deletes every current data file of day D (found by a partition-pruned
scan plan) and adds the members' files (found in their committed ``sink_transactions``) —
for an upsert table, one overwrite upserting the members' rows by key and event time
(``_upsert``) instead, (4)
DONE. Each step is idempotent, so a crash anywhere is finished by the next call (any run's
recovery). Other days' data files are not touched.

Threading: blocks on the database, the catalog and the store; driver or recovery thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import date, timedelta
from typing import Any

import sqlalchemy as sa
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import And, BooleanExpression, GreaterThanOrEqual, LessThan
from pyiceberg.table import Table, Transaction
from sqlalchemy.engine import Engine

from enumerator_service import (
    Rebuild,
    RebuildStatus,
    RebuildStore,
    StorageOptions,
    TransactionalSink,
    partition_rebuilds,
    publish_committed,
    sink_transactions,
)
from spark_jobs.connectors.iceberg._catalog import lock_name, open_catalog
from spark_jobs.connectors.iceberg._commit import (
    REBUILD_ID,
    RUN_ID,
    SINK_NAME,
    commit_with_retries,
    data_files,
    snapshot_values,
)
from spark_jobs.connectors.iceberg._upsert import stage_upsert
from spark_jobs.sink._rebuild_swap import rebuild_folder
from spark_jobs.sink._table_lock import table_lock

__all__ = ["day_files", "day_filter", "finish_iceberg_rebuilds"]

_log = logging.getLogger(__name__)
_EPOCH = date(1970, 1, 1)


def day_filter(field: str, day: date) -> BooleanExpression:
    """Rows whose ``field`` (timestamptz) falls on ``day`` (UTC)."""
    start, end = day.isoformat(), (day + timedelta(days=1)).isoformat()
    return And(
        GreaterThanOrEqual(term=field, value=f"{start}T00:00:00+00:00"),
        LessThan(term=field, value=f"{end}T00:00:00+00:00"),
    )


def day_files(table: Table, field: str, day: date) -> list[Any]:
    """The current snapshot's data files of partition ``day(field) = day`` (from the
    manifests: DataFiles a delete can name)."""
    ordinal = (day - _EPOCH).days
    tasks = table.scan(row_filter=day_filter(field, day)).plan_files()
    return [t.file for t in tasks if t.file.partition[0] == ordinal]


def _member_entries(engine: Engine, rebuild: Rebuild) -> list[dict[str, Any]]:
    folder = f"/{rebuild_folder(rebuild.partition_key.isoformat(), rebuild.id)}/"
    with engine.connect() as conn:
        staged = conn.execute(
            sa.select(sink_transactions.c.staged).where(
                sink_transactions.c.committed,
                sink_transactions.c.sink == SINK_NAME,
                sink_transactions.c.source == rebuild.source,
            )
        ).scalars()
        return [e for entries in staged for e in entries if folder in str(e["final"])]


def _status_of(engine: Engine, rebuild_id: int) -> str | None:
    with engine.connect() as conn:
        status: str | None = conn.execute(
            sa.select(partition_rebuilds.c.status).where(partition_rebuilds.c.id == rebuild_id)
        ).scalar_one_or_none()
    return status


def _replace_day(
    catalog: Catalog,
    identifier: str,
    field: str,
    rebuild: Rebuild,
    entries: list[dict[str, Any]],
    storage: StorageOptions | None,
) -> None:
    props = {REBUILD_ID: str(rebuild.id), RUN_ID: rebuild.run_id}
    key = entries[0].get("upsert_key") if entries else None

    def attempt(table: Table) -> bool:
        if str(rebuild.id) in set(snapshot_values(table, REBUILD_ID)):
            return False  # replaced before a crash
        tx = Transaction(table, autocommit=False)
        if key:
            # An upsert table: the day's rows are upserted again, by key and event time (a
            # key's row may live on another day; dropping day D would lose or double it).
            stage_upsert(tx, table, entries, key, storage, props)
            tx.commit_transaction()
            return True
        old, new = day_files(table, field, rebuild.partition_key), data_files(table, entries)
        if not old and not new:
            return False
        with tx.update_snapshot(snapshot_properties=props).overwrite() as overwrite:
            for data_file in old:
                overwrite.delete_data_file(data_file)
            for data_file in new:
                overwrite.append_data_file(data_file)
        tx.commit_transaction()
        return True

    commit_with_retries(catalog, identifier, attempt, f"rebuild {rebuild.id}")


def finish_iceberg_rebuilds(
    engine: Engine,
    source: str,
    sinks: Mapping[str, TransactionalSink],
    *,
    catalog: str | None,
    identifier: str,
    field: str | None,
    storage: StorageOptions | None,
) -> list[Rebuild]:
    """Make every ready rebuild of ``source`` live; returns the ones now live."""
    store = RebuildStore(engine)
    ready = store.ready(source)
    swapped: list[Rebuild] = []
    if ready:
        # Step 1: committed output is in the table (the rebuild's files wait for step 3).
        publish_committed(engine, sinks)
    for rebuild in ready:
        # Step 2: SWAPPING (re-checks, under the rebuild lock, that every member completed).
        if not store.begin_swap(rebuild):
            continue
        with table_lock(engine, lock_name(catalog, identifier)):
            if _status_of(engine, rebuild.id) != RebuildStatus.SWAPPING:
                continue  # another process finished it while we waited
            # Step 3: one overwrite snapshot (skipped when a crash came after it).
            if field is None:
                raise RuntimeError(f"rebuild {rebuild.id} of an unpartitioned iceberg table")
            entries = _member_entries(engine, rebuild)
            _replace_day(
                open_catalog(engine, catalog, storage), identifier, field, rebuild, entries, storage
            )
            # Step 4: DONE; the previous generation's dead letters go, HELD splits released.
            store.end_swap(rebuild)
        swapped.append(rebuild)
        _log.info("rebuild %d of %s is live in %s", rebuild.id, rebuild.partition_key, identifier)
    return swapped
