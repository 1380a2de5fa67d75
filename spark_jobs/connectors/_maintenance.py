"""Lakehouse table maintenance: what a table-format sink gives the Dagster jobs that keep its
table healthy, and the orphan sweep both formats share.

Continuous mode writes one data file per subtask per checkpoint, so small files pile up; old
snapshots (Iceberg) or log versions and tombstoned files (Delta) accumulate; a writer that
died between writing a data file and committing it leaves a file no snapshot references.
Three operations undo that, each idempotent (running it again does nothing new):

- **compact a day**: rewrite a complete day's many small files as one or a few, in ONE
  commit that removes the old files and adds the new (rows and content unchanged);
- **expire**: forget snapshots / log versions older than a retention (the current one is
  always kept) and remove the files only they referenced;
- **remove orphans**: delete files under the table's data location that no retained
  snapshot (Iceberg: all manifests of all snapshots; Delta: the log) references and that
  are older than a grace period, so a file of a checkpoint being committed right now
  (written, not yet committed) is never taken. Nor is, whatever its age, a file Sluice's
  own bookkeeping still expects to commit (:func:`pending_files`): a lakehouse sink writes
  its files in place, so a checkpoint committed in Postgres whose table commit (publish)
  failed, and a rebuild's files waiting for their swap, are unreferenced until recovery or
  ``finish_rebuilds`` commits them — possibly days later.

A sink connector offers them through ``SinkConnector.maintenance`` (a
:class:`TableMaintenance`, or None: the sink needs none); the Dagster factory then builds the
pipeline's compaction and expiry jobs. Each operation runs under the table's advisory lock
(``spark_jobs.sink.table_lock``), the one every committer of the table holds, so
maintenance never interleaves with a checkpoint's commit.

Threading: the results are immutable values; :func:`sweep_orphans` blocks on the file
system and may run on any thread (a Dagster op's).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Protocol, runtime_checkable
from urllib.parse import unquote, urlsplit

import pyarrow.fs as pafs
import sqlalchemy as sa
from sqlalchemy.engine import Engine

__all__ = [
    "DEFAULT_GRACE",
    "DEFAULT_RETENTION",
    "CompactionResult",
    "ExpiryResult",
    "OrphanResult",
    "TableMaintenance",
    "pending_files",
    "sweep_orphans",
]

#: Files younger than this are never orphans (a checkpoint writes, then commits; a commit
#: of a file written an hour ago is not in flight any more).
DEFAULT_GRACE = timedelta(hours=1)
#: Snapshots / log versions younger than this stay (time travel, readers of a recent one).
DEFAULT_RETENTION = timedelta(days=7)


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """One day's compaction: ``skipped`` when there was nothing to gain (≤ 1 file, or no
    fewer files would result), then ``files_after == files_before`` and no snapshot."""

    table: str
    day: date
    files_before: int
    files_after: int
    rows: int
    bytes_before: int
    bytes_after: int
    #: The compaction's snapshot id (Iceberg) or table version (Delta); None when skipped.
    snapshot: int | None
    skipped: bool


@dataclass(frozen=True, slots=True)
class ExpiryResult:
    """Snapshots (Iceberg) or versions (Delta) before and after, and the files removed
    because only expired ones referenced them (Delta's vacuum; Iceberg leaves them to the
    orphan sweep)."""

    table: str
    snapshots_before: int
    snapshots_after: int
    #: The current snapshot id (Iceberg) or version (Delta), always kept.
    current: int | None
    files_removed: int


@dataclass(frozen=True, slots=True)
class OrphanResult:
    """The sweep of the table's data location: files seen, those referenced, the orphans
    found and removed (``dry_run``: none removed), the young unreferenced files kept."""

    table: str
    files_seen: int
    referenced: int
    orphans_removed: int
    bytes_removed: int
    young_kept: int
    #: Unreferenced files Sluice still expects to commit (``pending_files``): kept.
    pending_kept: int = 0
    dry_run: bool = False


@runtime_checkable
class TableMaintenance(Protocol):
    """A lakehouse table's maintenance, bound to its table and the platform database.

    Threading: each call blocks (database lock, object store) and may run on any thread;
    calls on one table serialise on its advisory lock.
    """

    @property
    def table(self) -> str:
        """The table as people read it (catalog identifier or URI), for run metadata."""
        ...

    def compact_day(self, day: date) -> CompactionResult:
        """Rewrite ``day``'s data files as one or a few, in one commit (no-op when ≤ 1)."""
        ...

    def expire(self, retention: timedelta) -> ExpiryResult:
        """Forget snapshots / versions older than ``retention`` (never the current one)."""
        ...

    def remove_orphans(self, grace: timedelta) -> OrphanResult:
        """Remove unreferenced data files older than ``grace``."""
        ...


# Every string in the staged entries of a transaction that is not final yet — in flight (not
# committed; an abort deletes the row), committed and not published, or a member of a
# rebuild that has not swapped (its files are committed by finish_rebuilds) — that contains
# the table's root. Generic over sinks: entries name their files by URI or path.
_PENDING = sa.text(
    """
    SELECT DISTINCT v.value #>> '{}'
    FROM sluice.sink_transactions AS t
    CROSS JOIN LATERAL jsonb_path_query(t.staged, '$.** ? (@.type() == "string")') AS v(value)
    WHERE strpos(v.value #>> '{}', :root) > 0
      AND (
        NOT (t.committed AND t.published)
        OR EXISTS (
            SELECT 1 FROM sluice.partition_rebuilds AS r
            WHERE r.source = t.source
              AND r.status IN ('BUILDING', 'SWAPPING')
              AND t.created_at >= r.created_at
        )
      )
    """
)


def _fs_path(value: str) -> str:
    """A URI or path as a ``pyarrow.fs`` path (``s3://b/k`` → ``b/k``, ``file:///p`` → ``/p``)."""
    if "://" not in value:
        return value
    parts = urlsplit(value)
    path = unquote(parts.path)
    return path if parts.scheme == "file" else f"{parts.netloc}{path}"


def pending_files(engine: Engine, root: str) -> set[str]:
    """The files under ``root`` (a path on the table's file system) that Sluice's
    ``sink_transactions`` still expect to commit (see the module's docstring), as paths on
    that file system. Read with the table's lock held: a committer cannot change them
    meanwhile."""
    base = root.rstrip("/") + "/"
    with engine.connect() as conn:
        values = conn.execute(_PENDING, {"root": base}).scalars().all()
    return {path for path in map(_fs_path, values) if path.startswith(base)}


def sweep_orphans(
    table: str,
    fs: pafs.FileSystem,
    root: str,
    referenced: Iterable[str],
    grace: timedelta,
    *,
    pending: Iterable[str] = (),
    now: datetime | None = None,
    skip_hidden: bool = False,
    keep: tuple[str, ...] = (),
    dry_run: bool = False,
) -> OrphanResult:
    """Delete every file under ``root`` (a path on ``fs``, listed recursively) that is not
        in ``referenced`` (paths on ``fs``) and was last modified more than ``grace`` before
        ``now``. ``skip_hidden``: never touch a file with a path component (below ``root``) that
    starts with ``_`` or ``.`` (Delta's rule: its log, change data, checkpoints' temporaries);
    ``keep``: prefixes (below ``root``) of files that are never data (the Iceberg sink's
    ``_sluice/`` folder of field ids its writers read).

        Called with the table's lock held: a committer cannot reference a file between the
        listing of references and the deletion (and a file written after the listing is young).
    """
    if grace < timedelta(0):
        raise ValueError(f"grace {grace} is negative")
    cutoff = (now or datetime.now(UTC)) - grace
    wanted = {path.rstrip("/") for path in referenced}
    expected = {path.rstrip("/") for path in pending} - wanted
    base = root.rstrip("/") + "/"
    seen = removed = removed_bytes = young = kept = 0
    selector = pafs.FileSelector(root, allow_not_found=True, recursive=True)
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(base) :] if info.path.startswith(base) else info.path
        if skip_hidden and any(part.startswith(("_", ".")) for part in relative.split("/")):
            continue
        if relative.startswith(keep):
            continue
        seen += 1
        if info.path in wanted:
            continue
        if info.path in expected:
            kept += 1
            continue
        # An object store's listing gives the upload time; a file without one is taken as
        # young (never removed on a guess).
        mtime = info.mtime
        if mtime is None or mtime.astimezone(UTC) > cutoff:
            young += 1
            continue
        if not dry_run:
            fs.delete_file(info.path)
        removed += 1
        removed_bytes += info.size or 0
    return OrphanResult(
        table=table,
        files_seen=seen,
        referenced=seen - removed - young - kept,
        orphans_removed=removed,
        bytes_removed=removed_bytes,
        young_kept=young,
        pending_kept=kept,
        dry_run=dry_run,
    )
