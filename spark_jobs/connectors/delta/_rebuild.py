"""Rebuilds of one day of a Delta table: day D replaced in one commit.

A rebuild's members stage their files in ``dt=D/rebuild-<r>/`` inside the table folder and
commit them in Postgres like any checkpoint, but ``publish`` leaves them out of the table.
Once every member completed, :func:`finish_delta_rebuilds` runs the steps of
``spark_jobs.sink._rebuild_swap`` with one Delta commit as its swap:

1. ``publish_committed``: every committed checkpoint is in the table first (the previous
   generation of D included);
2. ``begin_swap`` (SWAPPING; re-checks that every member completed);
3. under the table lock, if the table's app transaction ``sluice-<pipeline>-rebuilds-<D>``
   is not at *r* yet: ONE ``overwrite`` commit with ``partition_filters=[(dt, =, D)]``
   (replaceWhere) removing D's files and adding the members' files, carrying that app
   transaction with version *r* — a crash after it is recognised, never committed twice;
4. ``end_swap`` (DONE: dead letters, statistics, HELD splits).

The app id names the day: rebuild ids grow across days, and a later rebuild of another day
may finish first, so one app id for all days would make an earlier one look done. Other
days' files are not touched (the overwrite's filter is day D). The files swapped out stay
in the folder, unreferenced, until a ``VACUUM``.

Threading: blocking database and store calls; the driver's thread (any process).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from deltalake import CommitProperties, DeltaTable, Transaction
from sqlalchemy.engine import Engine

from enumerator_service import (
    Rebuild,
    RebuildStatus,
    RebuildStore,
    TransactionalSink,
    partition_rebuilds,
    publish_committed,
)
from spark_jobs.connectors.delta._commit import SINK_NAME, add_action, commit_retrying
from spark_jobs.connectors.delta._writer import data_folder
from spark_jobs.sink._rebuild_swap import rebuild_folder
from spark_jobs.sink._table_lock import table_lock

__all__ = ["finish_delta_rebuilds", "rebuild_app_id"]

_log = logging.getLogger(__name__)

_MEMBER_FILES = sa.text(
    """
    SELECT f.value FROM sluice.sink_transactions AS t, jsonb_array_elements(t.staged) AS f(value)
    WHERE t.committed AND t.sink = :sink AND t.source = :source
      AND starts_with(f.value ->> 'path', :prefix)
    ORDER BY t.id
    """
)


def rebuild_app_id(pipeline: str, day: str) -> str:
    """The app id of the rebuild commits of one day."""
    return f"sluice-{pipeline}-rebuilds-{day}"


def finish_delta_rebuilds(
    engine: Engine,
    *,
    source: str,
    uri: str,
    storage: dict[str, str],
    partition: str | None,
    sinks: Mapping[str, TransactionalSink],
) -> list[Rebuild]:
    """Steps 1-4 of the module docstring for every ready rebuild of ``source``."""
    store = RebuildStore(engine)
    ready = store.ready(source)
    swapped: list[Rebuild] = []
    if ready:
        # Step 1: committed checkpoints reach the table first.
        publish_committed(engine, sinks)
    for rebuild in ready:
        # Step 2: SWAPPING.
        if not store.begin_swap(rebuild):
            continue
        day = rebuild.partition_key.isoformat()
        with table_lock(engine, uri):
            if _status_of(engine, rebuild.id) != RebuildStatus.SWAPPING:
                continue  # another process finished it while we waited
            # Step 3: day D replaced in one commit (skipped when it is in the table).
            prefix = data_folder(rebuild_folder(day, rebuild.id)) + "/"
            files = _member_files(engine, source, prefix)
            _replace_day(uri, storage, partition, source, day, rebuild.id, files)
            # Step 4: DONE.
            store.end_swap(rebuild)
        swapped.append(rebuild)
        _log.info("rebuild %d of %s is live in %s", rebuild.id, day, uri)
    return swapped


def _member_files(engine: Engine, source: str, prefix: str) -> list[dict[str, Any]]:
    params = {"sink": SINK_NAME, "source": source, "prefix": prefix}
    with engine.connect() as conn:
        return [dict(row[0]) for row in conn.execute(_MEMBER_FILES, params)]


def _replace_day(
    uri: str,
    storage: dict[str, str],
    partition: str | None,
    source: str,
    day: str,
    rebuild_id: int,
    files: list[dict[str, Any]],
) -> None:
    if partition is None:
        raise ValueError(f"delta table {uri}: a rebuild of {day} needs a partitioned table")
    app_id = rebuild_app_id(source, day)

    def commit(table: DeltaTable, done: int | None) -> bool:
        if done is not None and done >= rebuild_id:
            return False  # committed before a crash
        table.create_write_transaction(
            [add_action(entry) for entry in files],
            mode="overwrite",
            schema=table.schema(),
            partition_by=[partition],
            partition_filters=[(partition, "=", day)],
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id, rebuild_id)]),
        )
        return True

    commit_retrying(uri, storage, app_id, commit)


def _status_of(engine: Engine, rebuild_id: int) -> str | None:
    with engine.connect() as conn:
        status: str | None = conn.execute(
            sa.select(partition_rebuilds.c.status).where(partition_rebuilds.c.id == rebuild_id)
        ).scalar_one_or_none()
    return status
