"""The commit side of the Delta sink: one Delta commit per completed checkpoint, exactly once.

``publish`` (after the checkpoint's Postgres transaction; again by recovery after a crash)
adds the checkpoint's staged files to the table in ONE commit that carries the app
transaction ``sluice-<pipeline>-<run id>`` with the checkpoint id as its version. delta-rs
does not deduplicate by app transaction (delta-rs #2580, #3821), so the committer does,
under the table's advisory lock (``table_lock``: no other Sluice process interleaves):

1. reload the table and read ``transaction_version(app id)``;
2. keep the transactions with a larger checkpoint id (the rest are in the table already —
   a completion commits every staged transaction up to its checkpoint, so the checkpoint
   ids a run publishes only grow);
3. commit them with the largest of their checkpoint ids as the version;
4. a conflict with a writer outside Sluice (delta-rs' own conflict check failed): back to 1,
   a bounded number of times, then fail loudly (the checkpoint stays committed in Postgres
   and unpublished: the next recovery publishes it).

Files of a rebuild's members (``dt=D/rebuild-<r>/``) are not added here: the rebuild's
``finish_rebuilds`` replaces day D with them in one commit (``_rebuild``). An upsert sink
merges instead of appending (``_merge``). ``abort`` deletes staged files no commit added.

Threading: blocking calls (database lock, store I/O); the coordinator or a recovery thread.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction
from sqlalchemy.engine import Connection, Engine

from enumerator_service import StagedTransaction, StorageOptions, open_location
from spark_jobs.connectors.delta._merge import merge_files
from spark_jobs.connectors.delta._paths import delta_storage
from spark_jobs.connectors.delta._table import first_line, live_paths, load_table
from spark_jobs.connectors.delta._writer import rebuild_of
from spark_jobs.sink._object_store import delete_object
from spark_jobs.sink._table_lock import table_lock

__all__ = ["SINK_NAME", "DeltaCommitter", "add_action", "commit_retrying", "run_app_id"]

#: Commit-info keys of a checkpoint's commit.
RUN_ID = "sluice.run-id"
CHECKPOINT_ID = "sluice.checkpoint-id"
ROWS = "sluice.rows"
FILES = "sluice.files"

_log = logging.getLogger(__name__)

SINK_NAME = "delta"
#: Commit attempts against conflicting writers before a publish fails.
ATTEMPTS = 8


def run_app_id(pipeline: str, run_id: str) -> str:
    """The app id of a run's checkpoint commits."""
    return f"sluice-{pipeline}-{run_id}"


def is_rebuild_file(entry: dict[str, Any]) -> bool:
    """A file of a rebuild's member (added by the rebuild's day swap, not by publish)."""
    return rebuild_of(str(entry["path"])) is not None


def add_action(entry: dict[str, Any]) -> AddAction:
    """The add action of one staged file (partition values in the action, not the file)."""
    partition = entry.get("partition")
    values: dict[str, str | None] = {partition: entry["day"]} if partition else {}
    now = int(time.time() * 1000)
    return AddAction(entry["path"], int(entry["size"]), values, now, True, entry["stats"])


def commit_retrying(
    table_uri: str,
    storage: dict[str, str],
    app_id: str,
    commit: Callable[[DeltaTable, int | None], bool],
) -> None:
    """Step 1-4 of the module docstring: ``commit(table, done)`` gets the reloaded table and
    ``app_id``'s committed version, and returns False when nothing is left to commit."""
    for attempt in range(ATTEMPTS):
        table = load_table(table_uri, storage)
        if table is None:
            raise FileNotFoundError(f"Delta table {table_uri} is gone")
        try:
            commit(table, table.transaction_version(app_id))
            return
        except CommitFailedError as exc:
            _log.warning("delta commit of %s conflicted (%s), retrying", app_id, first_line(exc))
            time.sleep(min(0.05 * 2**attempt, 2.0))
    raise RuntimeError(
        f"delta table {table_uri}: {app_id} conflicted {ATTEMPTS} times with other writers"
    )


class DeltaCommitter:
    """Commit side of the Delta sink (coordinator, recovery). ``engine``: for the table's
    advisory lock (None: publishing fails — only AT_LEAST_ONCE acknowledgements, which call
    ``commit``, use a committer without one); ``options``: how object stores are reached."""

    name = SINK_NAME

    def __init__(self, engine: Engine | None, options: StorageOptions | None = None) -> None:
        self._engine = engine
        self._options = options

    def commit(self, conn: Connection, txns: Sequence[StagedTransaction]) -> None:
        # The Delta commit follows the Postgres transaction (publish), never inside it.
        return None

    def publish(self, txns: Sequence[StagedTransaction]) -> None:
        if self._engine is None:
            raise RuntimeError("the Delta committer needs the database to publish")
        for (uri, app_id), group in _by_commit(txns):
            storage = delta_storage(open_location(uri, self._options))
            with table_lock(self._engine, uri):
                publish_group(uri, storage, app_id, group, self._options)

    def abort(self, txns: Sequence[StagedTransaction]) -> None:
        entries = [entry for txn in txns for entry in txn.staged]
        for uri, group in itertools.groupby(
            sorted(entries, key=lambda e: str(e["table"])), key=lambda e: str(e["table"])
        ):
            table = load_table(uri, delta_storage(open_location(uri, self._options)))
            live = live_paths(table) if table is not None else set()
            for entry in group:
                if entry["path"] not in live:  # (an unaligned append made it live already)
                    with contextlib.suppress(FileNotFoundError):
                        delete_object(open_location(entry["staged"], self._options))


def _by_commit(
    txns: Sequence[StagedTransaction],
) -> Iterator[tuple[tuple[str, str], list[StagedTransaction]]]:
    """Transactions with files, grouped by (table URI, app id), by checkpoint id."""
    keyed: dict[tuple[str, str], list[StagedTransaction]] = {}
    for txn in sorted(txns, key=lambda t: (t.run_id, t.checkpoint_id, t.id)):
        if txn.staged:
            first = txn.staged[0]
            key = (str(first["table"]), run_app_id(first["pipeline"], txn.run_id))
            keyed.setdefault(key, []).append(txn)
    yield from keyed.items()


def publish_group(
    uri: str,
    storage: dict[str, str],
    app_id: str,
    txns: Sequence[StagedTransaction],
    options: StorageOptions | None = None,
) -> None:
    """One run's transactions into one Delta commit (steps 1-4), holding the table lock."""

    def commit(table: DeltaTable, done: int | None) -> bool:
        # Step 2: what the table does not have yet.
        pending = [t for t in txns if done is None or t.checkpoint_id > done]
        key = txns[0].staged[0].get("upsert_key")
        # (an upsert's rebuild members are merged by key like any rows: no day swap)
        entries = [e for t in pending for e in t.staged if key or not is_rebuild_file(e)]
        if not entries:
            return False
        version = max(t.checkpoint_id for t in pending)
        # The app transaction is the rule; the commit info tells people (and Dagster's
        # metadata) which run and checkpoint a version is, with its rows.
        info = {
            RUN_ID: txns[0].run_id,
            CHECKPOINT_ID: str(version),
            ROWS: str(sum(int(e.get("rows", 0)) for e in entries)),
            FILES: str(len(entries)),
        }
        properties = CommitProperties(
            custom_metadata=info, app_transactions=[Transaction(app_id, version)]
        )
        if key:
            merge_files(table, entries, list(key), properties, options)
            return True
        # Step 3: one commit, the app transaction with it.
        partition = entries[0].get("partition")
        table.create_write_transaction(
            [add_action(e) for e in entries],
            mode="append",
            schema=table.schema(),
            partition_by=[partition] if partition else None,
            commit_properties=properties,
        )
        _log.info("delta %s: checkpoint %d committed (%d files)", uri, version, len(entries))
        return True

    commit_retrying(uri, storage, app_id, commit)


def append_unaligned(staged: list[dict[str, Any]], options: StorageOptions) -> None:
    """AT_LEAST_ONCE: one subtask's staged files appended at once (a replay may duplicate,
    never lose); no app transaction and no lock (the task has no database engine)."""
    entries = [e for e in staged if not is_rebuild_file(e)]
    if not entries:
        return
    uri = str(entries[0]["table"])
    storage = delta_storage(open_location(uri, options))
    partition = entries[0].get("partition")

    def commit(table: DeltaTable, done: int | None) -> bool:
        table.create_write_transaction(
            [add_action(e) for e in entries],
            mode="append",
            schema=table.schema(),
            partition_by=[partition] if partition else None,
        )
        return True

    commit_retrying(uri, storage, "sluice-unaligned", commit)
