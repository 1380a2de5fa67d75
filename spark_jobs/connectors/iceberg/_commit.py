"""The commit side of the Iceberg sink: one snapshot per completed checkpoint and table.

A checkpoint's staged entries (``{"staged", "final", "rows", "table", "catalog"}``: Parquet
files already under the table's data folder, invisible until a snapshot references them)
commit in Postgres with the checkpoint; ``publish`` then adds them to the table, after the
completion transaction and again on recovery. Exactly once (Flink's Iceberg committer rule):

1. under ``table_lock`` (no other Sluice committer of the table between check and commit),
2. the table is loaded fresh and its snapshot history (the current snapshot's ancestors)
   walked for the largest ``sluice.checkpoint-id`` committed by the same run;
3. only a group whose checkpoint id is larger is committed — one ``fast_append`` snapshot
   with ``sluice.run-id`` / ``sluice.checkpoint-id`` in its summary. A publish repeated after
   a crash between "snapshot committed" and "marked published" finds its id and adds nothing;
4. a ``CommitFailedException`` (another writer — Sluice's maintenance or a foreign engine —
   committed meanwhile) reloads the table and repeats 2-3, a bounded number of times, then
   fails loudly (the transactions stay committed and unpublished; recovery retries).

PyIceberg (0.12) itself retries a conflicting commit a few times by re-applying the same
append onto the refreshed table, without our step 2: safe, because the table lock keeps any
other Sluice committer (the only writer of ``sluice.checkpoint-id`` snapshots) out until we
are done; a foreign writer's snapshots never carry our ids.

The rule relies on one run's completions being published in checkpoint order, which the
coordinator guarantees (it publishes each completion before starting the next). The group's
id is the largest ``checkpoint_id`` of its transactions (output of an aborted checkpoint
rolls into the next completion: it is published with it).

Rebuild members' files (output partition ``_rebuilds/dt=D/<r>/``) are not added here: the
rebuild's ``overwrite`` adds them (``_rebuild``). An upsert sink's group is one
``overwrite`` snapshot instead: delete by key, then append (``_upsert``).

Threading: ``publish`` blocks on the database, the catalog and the store; the coordinator,
the driver or recovery calls it, never a mailbox thread.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table, Transaction
from pyiceberg.table.snapshots import ancestors_of
from sqlalchemy.engine import Connection, Engine

from enumerator_service import StagedTransaction, StorageOptions, is_uri, open_location
from spark_jobs.connectors.iceberg._catalog import lock_name, open_catalog, table_uri
from spark_jobs.connectors.iceberg._upsert import stage_upsert
from spark_jobs.sink._object_store import delete_object
from spark_jobs.sink._rebuild_swap import REBUILDS_FOLDER
from spark_jobs.sink._table_lock import table_lock

__all__ = [
    "CHECKPOINT_ID",
    "REBUILD_ID",
    "RUN_ID",
    "SINK_NAME",
    "IcebergCommitter",
    "commit_with_retries",
    "data_files",
    "delete_staged",
    "is_rebuild_entry",
    "snapshot_values",
]

_log = logging.getLogger(__name__)

SINK_NAME = "iceberg"
RUN_ID = "sluice.run-id"
CHECKPOINT_ID = "sluice.checkpoint-id"
REBUILD_ID = "sluice.rebuild-id"
_FIELD_ID = b"PARQUET:field_id"
#: How long a publish keeps retrying against concurrent writers before it fails (the output
#: stays committed in Postgres: the next completion or recovery publishes it).
RETRY_SECONDS = 120.0
#: The longest pause between two tries (jittered exponential backoff from 50 ms).
_MAX_BACKOFF = 2.0


def is_rebuild_entry(entry: dict[str, Any]) -> bool:
    """Whether a staged file belongs to a rebuild (added by its overwrite, not by publish)."""
    return REBUILDS_FOLDER in str(entry["final"]).split("/")


def snapshot_values(table: Table, key: str, run: str | None = None) -> Iterable[str]:
    """``key``'s values in the summaries of the current snapshot and its ancestors (only
    snapshots of ``run`` when given)."""
    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        summary = snapshot.summary
        if summary is None:
            continue
        if run is not None and summary.get(RUN_ID) != run:
            continue
        value = summary.get(key)
        if value is not None:
            yield value


def data_files(table: Table, entries: Sequence[dict[str, Any]]) -> list[DataFile]:
    """The DataFiles of staged Parquet files (their footers read for statistics), each
    checked to carry the table's field ids (a column renamed or re-added by another engine
    since the run started would otherwise be read as the wrong column)."""
    schema = table.schema()
    found = []
    for entry in entries:
        uri = table_uri(str(entry["staged"]))
        with table.io.new_input(uri).open() as stream:
            fields = pq.read_schema(stream)
        for field in fields:
            raw = (field.metadata or {}).get(_FIELD_ID)
            given = None if raw is None else int(raw)
            column = schema._name_to_id.get(field.name)
            if given is None or given != column:
                raise ValueError(
                    f"data file {uri}: field {field.name!r} has id {given!r}, the table's "
                    f"column has {column!r} (the table's schema changed during the run)"
                )
        found.append(parquet_file_to_data_file(table.io, table.metadata, uri))
    return found


def commit_with_retries(
    catalog: Catalog,
    identifier: str,
    attempt: Callable[[Table], bool],
    what: str,
    budget: float = RETRY_SECONDS,
) -> None:
    """``attempt(fresh table)`` until it commits or finds nothing to do (returns False); a
    conflicting concurrent commit reloads and retries for ``budget`` seconds at most.

    The pause between tries grows (50 ms, doubling, at most 2 s) and is jittered: a writer
    committing every fraction of a second would otherwise win every race against a publish
    whose load-to-commit window is longer than its pause.
    """
    deadline, tries = time.monotonic() + budget, 0
    while True:
        table = catalog.load_table(identifier)
        try:
            attempt(table)
            return
        except CommitFailedException as exc:
            tries += 1
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"iceberg table {identifier}: {what} not committed after {tries} conflicting"
                    f" concurrent commits in {budget:.0f} s (it stays committed in Postgres; the"
                    " next completion or recovery retries)"
                ) from exc
            _log.info("iceberg %s: %s conflicted (%s); retrying", identifier, what, exc)
            pause = min(_MAX_BACKOFF, 0.05 * 2 ** min(tries, 6))
            time.sleep(pause * random.uniform(0.5, 1.5))


def delete_staged(entries: Iterable[dict[str, Any]], storage: StorageOptions | None) -> None:
    for entry in entries:
        staged = str(entry["staged"])
        if is_uri(staged):
            delete_object(open_location(staged, storage))
        else:
            Path(staged).unlink(missing_ok=True)


class IcebergCommitter:
    """Commit side of the Iceberg sink (coordinator and recovery). ``engine``: the platform
    database (Sluice's catalog lives in it, and the table lock); ``storage``: object-store
    client settings."""

    name = SINK_NAME

    def __init__(self, engine: Engine | None, storage: StorageOptions | None = None) -> None:
        self._engine = engine
        self._storage = storage

    def commit(self, conn: Connection, txns: Sequence[StagedTransaction]) -> None:
        return None  # a snapshot is committed after the transaction (publish), not in it

    def publish(self, txns: Sequence[StagedTransaction]) -> None:
        if self._engine is None:
            raise RuntimeError("the iceberg sink publishes with the platform database")
        groups: dict[tuple[str | None, str], dict[str, list[StagedTransaction]]] = {}
        for txn in txns:
            for entry in txn.staged:
                runs = groups.setdefault((entry.get("catalog"), entry["table"]), {})
                if txn not in runs.setdefault(txn.run_id, []):
                    runs[txn.run_id].append(txn)
        for (catalog_name, identifier), runs in sorted(groups.items(), key=str):
            with table_lock(self._engine, lock_name(catalog_name, identifier)):
                catalog = open_catalog(self._engine, catalog_name, self._storage)
                for run, group in sorted(runs.items()):
                    self._publish_group(catalog, identifier, run, group)

    def _publish_group(
        self, catalog: Catalog, identifier: str, run: str, group: list[StagedTransaction]
    ) -> None:
        # Step 1: the group's id and files (a rebuild's files wait for its overwrite).
        checkpoint = max(txn.checkpoint_id for txn in group)
        entries = [
            e
            for txn in group
            for e in txn.staged
            if e["table"] == identifier and not is_rebuild_entry(e)
        ]
        if not entries:
            return
        key = entries[0].get("upsert_key")
        props = {RUN_ID: run, CHECKPOINT_ID: str(checkpoint)}

        def attempt(table: Table) -> bool:
            # Step 2: the largest checkpoint of this run the table has (Flink's rule).
            done = max((int(v) for v in snapshot_values(table, CHECKPOINT_ID, run)), default=-1)
            if done >= checkpoint:
                return False  # published before a crash, or by a concurrent recovery
            # Step 3: one snapshot for the whole group (an overwrite for an upsert).
            tx = Transaction(table, autocommit=False)
            if key:
                stage_upsert(tx, table, entries, key, self._storage, props)
            else:
                with tx.update_snapshot(snapshot_properties=props).fast_append() as append:
                    for data_file in data_files(table, entries):
                        append.append_data_file(data_file)
            tx.commit_transaction()
            return True

        # Step 4: conflicts with concurrent writers reload and retry.
        commit_with_retries(catalog, identifier, attempt, f"checkpoint {checkpoint} of run {run}")

    def abort(self, txns: Sequence[StagedTransaction]) -> None:
        # Staged files no snapshot references: deleting them changes nothing a reader sees.
        delete_staged((e for txn in txns for e in txn.staged), self._storage)
