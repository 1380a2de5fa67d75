"""Maintenance of an Iceberg table written by Sluice (PyIceberg 0.12): compact a day, expire
snapshots, remove orphan data files.

Every function takes the PyIceberg ``Table`` and the Sluice database ``Engine`` and does its
work under ``table_lock(engine, <table id>)`` (by default the identifier ``namespace.name``,
the key every Sluice committer of the table takes), after refreshing the table: maintenance
then never runs between a committer's "is this checkpoint committed already?" check and its
commit. A writer outside Sluice does not take the lock; against it Iceberg's optimistic
commit and PyIceberg's conflict validation make the compaction fail (``ValidationException``
when that writer added files to the day) rather than lose that writer's rows — the next
run retries.

Threading: each call blocks on the database lock, the catalog and the object store; run it
on a job thread (a Dagster op), never a mailbox thread. ``Table`` objects are not shared
between threads by these functions (each refreshes the one it is given).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

from pyiceberg.io.pyarrow import (
    PyArrowFileIO,
)
from pyiceberg.table import Table
from sqlalchemy.engine import Engine

from spark_jobs.connectors._maintenance import (
    CompactionResult,
    ExpiryResult,
    OrphanResult,
    pending_files,
    sweep_orphans,
)
from spark_jobs.connectors.iceberg._compaction import (
    COMPACTION_PROPERTY,
    compact_day,
    data_root,
    lock_id,
)
from spark_jobs.sink import table_lock

__all__ = [
    "COMPACTION_PROPERTY",
    "IcebergMaintenance",
    "compact_day",
    "expire_snapshots",
    "lock_id",
    "remove_orphans",
]

log = logging.getLogger(__name__)


def expire_snapshots(
    table: Table,
    engine: Engine,
    retention: timedelta,
    *,
    now: datetime | None = None,
    lock: str | None = None,
) -> ExpiryResult:
    """Expire every snapshot older than ``retention`` that is not a branch head or tag (the
    current snapshot is ``main``'s head: always kept). One metadata commit, none when
    nothing is that old (idempotent). PyIceberg 0.12 removes no files here: the data files
    only expired snapshots referenced become orphans, which ``remove_orphans`` deletes."""
    if retention < timedelta(0):
        raise ValueError(f"retention {retention} is negative")
    ident = lock or lock_id(table)
    with table_lock(engine, ident):
        table.refresh()
        before = len(table.metadata.snapshots)
        cutoff = (now or datetime.now(UTC)) - retention
        # Branch heads (the current snapshot is main's) and tags are protected; commit only
        # when some snapshot is old enough, so a second run commits nothing.
        protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
        old = [
            snapshot.snapshot_id
            for snapshot in table.metadata.snapshots
            if snapshot.timestamp_ms < cutoff.timestamp() * 1000
            and snapshot.snapshot_id not in protected
        ]
        if old:
            table.maintenance.expire_snapshots().by_ids(old).commit()
            table.refresh()
        current = table.current_snapshot()
        return ExpiryResult(
            table=ident,
            snapshots_before=before,
            snapshots_after=len(table.metadata.snapshots),
            current=current.snapshot_id if current else None,
            files_removed=0,
        )


def _referenced(table: Table) -> set[str]:
    """Every file path any retained snapshot references (data and delete files of all its
    manifests), as the table's FileIO spells them."""
    paths: set[str] = set()
    seen_manifests: set[str] = set()
    for snapshot in table.metadata.snapshots:
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            # A DELETED entry names a file its snapshot no longer reads (a retained parent
            # that still reads it lists it as ADDED or EXISTING in its own manifests).
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                paths.add(entry.data_file.file_path)
    return paths


def remove_orphans(
    table: Table,
    engine: Engine,
    grace: timedelta,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    lock: str | None = None,
) -> OrphanResult:
    """Delete the files under the table's data location that no snapshot references (all
    manifests of all snapshots) and that are older than ``grace``; files Sluice still
    expects to commit (``pending_files``: a publish or a rebuild swap to come) are kept.
    Needs the table's FileIO to be PyIceberg's ``PyArrowFileIO`` (local, S3, GCS, ADLS
    through ``pyarrow.fs``)."""
    ident = lock or lock_id(table)
    io = table.io
    if not isinstance(io, PyArrowFileIO):
        raise ValueError(
            f"table {ident}: orphan removal needs py-io-impl PyArrowFileIO, not {type(io).__name__}"
        )
    with table_lock(engine, ident):
        table.refresh()
        root = data_root(table)
        scheme, netloc, path = io.parse_location(root, io.properties)
        fs = io.fs_by_scheme(scheme, netloc)
        referenced = {io.parse_location(p, io.properties)[2] for p in _referenced(table)}
        pending = pending_files(engine, path)
        return sweep_orphans(
            ident,
            fs,
            path,
            referenced,
            grace,
            pending=pending,
            now=now,
            keep=("_sluice/",),  # the sink's field ids (not data; its writers read them)
            dry_run=dry_run,
        )


class IcebergMaintenance:
    """``TableMaintenance`` of one Iceberg table (``spark_jobs.connectors.TableMaintenance``)
    for the Dagster jobs. ``table``: the table, or a function that opens it (called by each
    operation: the Iceberg sink's maintenance opens nothing until a job runs);
    ``column``: the day column (a ``date``) or the timestamp column the table is partitioned
    by day on; ``lock``: the ``table_lock`` name its committers hold (default ``lock_id``).

    Threading: one instance per job run; each call locks the table (see the module)."""

    def __init__(
        self,
        table: Table | Callable[[], Table],
        engine: Engine,
        *,
        column: str = "dt",
        lock: str | None = None,
    ) -> None:
        self._table = table
        self._engine = engine
        self._column = column
        self._lock = lock

    def __repr__(self) -> str:
        return f"IcebergMaintenance({self.table!r})"

    def _open(self) -> Table:
        return self._table if isinstance(self._table, Table) else self._table()

    @property
    def table(self) -> str:
        return self._lock or lock_id(self._open())

    def compact_day(self, day: date) -> CompactionResult:
        return compact_day(self._open(), self._engine, day, column=self._column, lock=self._lock)

    def expire(self, retention: timedelta) -> ExpiryResult:
        return expire_snapshots(self._open(), self._engine, retention, lock=self._lock)

    def remove_orphans(self, grace: timedelta) -> OrphanResult:
        return remove_orphans(self._open(), self._engine, grace, lock=self._lock)
