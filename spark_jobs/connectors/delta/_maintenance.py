"""Maintenance of a Delta table written by Sluice (deltalake 1.6): compact a day, vacuum and
clean up the log, remove orphan data files.

Every function takes the table URI, the delta-rs ``storage_options`` and the Sluice
database ``Engine`` and works under ``table_lock(engine, <uri>)`` (``lock=`` names another
key), the lock every Sluice committer of the table takes, so it never runs between a
committer's "is this checkpoint committed already?" check and its commit. Writers outside
Sluice are handled by Delta's optimistic concurrency (a conflicting OPTIMIZE fails,
nothing is lost).

``storage_options`` are delta-rs's (they may hold credentials): they are passed to delta-rs
and never logged, formatted into an error or returned. The orphan sweep lists the table
through ``pyarrow.fs`` with only the non-secret endpoint and region taken from them
(credentials from the standard chain, as everywhere in Sluice).

Threading: each call blocks on the database lock and the store; run it on a job thread.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from sqlalchemy.engine import Engine

from enumerator_service import StorageOptions, open_location
from spark_jobs.connectors._maintenance import (
    CompactionResult,
    ExpiryResult,
    OrphanResult,
    pending_files,
    sweep_orphans,
)
from spark_jobs.sink import table_lock

__all__ = [
    "COMPACTION_PROPERTY",
    "DeltaMaintenance",
    "compact_day",
    "remove_orphans",
    "vacuum",
]

#: The commit-info key of a compaction's commit (its value: the day).
COMPACTION_PROPERTY = "sluice.compaction"
_LOG = "_delta_log"


def _open(uri: str, storage_options: Mapping[str, str] | None) -> DeltaTable:
    return DeltaTable(uri, storage_options=dict(storage_options or {}))


def _day_files(table: DeltaTable, column: str, day: date) -> tuple[int, int, int]:
    """(files, rows, bytes) of ``day``'s partition in the table's current version."""
    actions = pa.table(table.get_add_actions(flatten=True))
    key = f"partition.{column}"
    if key not in actions.column_names:
        raise ValueError(f"Delta table is not partitioned by {column!r}")
    values = actions.column(key).cast(pa.string()).to_pylist()
    picked = [i for i, value in enumerate(values) if value == day.isoformat()]
    rows = actions.column("num_records").to_pylist()
    sizes = actions.column("size_bytes").to_pylist()
    return len(picked), sum(rows[i] or 0 for i in picked), sum(sizes[i] or 0 for i in picked)


def compact_day(
    uri: str,
    storage_options: Mapping[str, str] | None,
    engine: Engine,
    day: date,
    *,
    column: str = "dt",
    target_file_bytes: int | None = None,
    lock: str | None = None,
) -> CompactionResult:
    """``OPTIMIZE`` (bin-packing compaction) of the partition ``column = day``: one commit
    removing the small files and adding the compacted ones (commit info
    ``sluice.compaction=<day>``). Skipped when the day has ≤ 1 file; delta-rs itself
    commits nothing when no bin holds two files, so a second run is a no-op."""
    with table_lock(engine, lock or uri):
        # Step 1: the day's files at the current version (read under the lock).
        table = _open(uri, storage_options)
        files, rows, size = _day_files(table, column, day)
        if files <= 1:
            return CompactionResult(uri, day, files, files, rows, size, size, None, True)
        # Step 2: one OPTIMIZE commit of that partition.
        before = table.version()
        table.optimize.compact(
            partition_filters=[(column, "=", day.isoformat())],
            target_size=target_file_bytes,
            commit_properties=CommitProperties(
                custom_metadata={COMPACTION_PROPERTY: day.isoformat()}
            ),
        )
        # Step 3: what the table holds now (the same rows, fewer files).
        table.update_incremental()
        after, rows_after, size_after = _day_files(table, column, day)
        if rows_after != rows:
            raise RuntimeError(f"{uri} {day}: {rows} rows before OPTIMIZE, {rows_after} after")
        version = table.version()
        return CompactionResult(
            table=uri,
            day=day,
            files_before=files,
            files_after=after,
            rows=rows,
            bytes_before=size,
            bytes_after=size_after,
            snapshot=version if version != before else None,
            skipped=version == before,
        )


def _log_versions(fs: pafs.FileSystem, root: str) -> list[str]:
    """The paths of the commit files (``NNN.json``) in the table's log."""
    selector = pafs.FileSelector(f"{root}/{_LOG}", allow_not_found=True)
    return sorted(
        info.path
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.File
        and info.base_name.split(".")[0].isdigit()
        and info.base_name.endswith(".json")
    )


def vacuum(
    uri: str,
    storage_options: Mapping[str, str] | None,
    engine: Engine,
    retention: timedelta,
    *,
    storage: StorageOptions | None = None,
    lock: str | None = None,
) -> ExpiryResult:
    """``VACUUM`` the files that versions older than ``retention`` removed (the current
    version's files are never touched; ``enforce_retention_duration=False`` so a retention
    shorter than the table's default is honoured), then checkpoint and clean up the log
    (versions older than the table's ``delta.logRetentionDuration``). Idempotent: a second
    run finds nothing to remove."""
    if retention < timedelta(0):
        raise ValueError(f"retention {retention} is negative")
    location = open_location(uri, storage or _storage(storage_options))
    hours = int(retention.total_seconds() // 3600)
    with table_lock(engine, lock or uri):
        table = _open(uri, storage_options)
        before = len(_log_versions(location.fs, location.path))
        # Step 1: the expired tombstones whose files still exist. delta-rs lists a tombstone
        # again after its file is gone and commits VACUUM START/END every time: only a run
        # with something to delete vacuums, so a second run commits nothing.
        # ``full=False`` (delta-rs' "lite" vacuum): only files of removed versions. A full
        # one would also delete files no log entry names — files a run staged and has not
        # committed yet, whatever the retention.
        planned = table.vacuum(
            retention_hours=hours, enforce_retention_duration=False, dry_run=True, full=False
        )
        paths = [_fs_path(location.path, unquote(p)) for p in planned]
        present = [i for i in location.fs.get_file_info(paths) if i.type == pafs.FileType.File]
        if present:
            table.vacuum(
                retention_hours=hours, enforce_retention_duration=False, dry_run=False, full=False
            )
        # Step 2: a checkpoint of the current version (unless there is one), so the log
        # before it can go; then the log older than delta.logRetentionDuration goes.
        if _last_checkpoint(location.fs, location.path) != table.version():
            table.create_checkpoint()
        table.cleanup_metadata()
        return ExpiryResult(
            table=uri,
            snapshots_before=before,
            snapshots_after=len(_log_versions(location.fs, location.path)),
            current=table.version(),
            files_removed=len(present),
        )


def _last_checkpoint(fs: pafs.FileSystem, root: str) -> int | None:
    """The version of the log's latest checkpoint (``_last_checkpoint``), or None."""
    try:
        with fs.open_input_stream(f"{root}/{_LOG}/_last_checkpoint") as stream:
            return int(json.loads(stream.read())["version"])
    except FileNotFoundError:
        return None


def _paths_in_checkpoint(fs: pafs.FileSystem, path: str) -> set[str]:
    with fs.open_input_file(path) as stream:
        parquet = pq.ParquetFile(stream)
        names = [n for n in ("add", "remove") if n in parquet.schema_arrow.names]
        data = parquet.read(columns=names)
    found: set[str] = set()
    for name in names:
        for action in data.column(name).to_pylist():
            if action and action.get("path"):
                found.add(action["path"])
    return found


def _referenced(fs: pafs.FileSystem, root: str) -> set[str]:
    """Every data file any commit or checkpoint left in the log names (added or removed:
    a removed file is still read by the versions before its removal), as paths on ``fs``."""
    log = f"{root}/{_LOG}"
    found: set[str] = set()
    for info in fs.get_file_info(pafs.FileSelector(log, allow_not_found=True)):
        if info.type != pafs.FileType.File:
            continue
        if ".checkpoint" in info.base_name and info.base_name.endswith(".parquet"):
            found |= _paths_in_checkpoint(fs, info.path)
        elif info.base_name.endswith(".json") and info.base_name.split(".")[0].isdigit():
            with fs.open_input_stream(info.path) as stream:
                for line in stream.read().decode().splitlines():
                    action = json.loads(line) if line.strip() else {}
                    for kind in ("add", "remove"):
                        if kind in action:
                            found.add(action[kind]["path"])
    # Log paths are relative to the table root and percent-encoded (or absolute URIs).
    return {_fs_path(root, unquote(p)) for p in found}


def _fs_path(root: str, path: str) -> str:
    """A log path on the table's file system: relative ones under ``root``; a URI without
    its scheme (``s3://b/k`` → ``b/k``, ``file:///p`` → ``/p``)."""
    if "://" not in path:
        return posixpath.join(root, path)
    parts = urlsplit(path)
    return parts.path if parts.scheme == "file" else f"{parts.netloc}{parts.path}"


def remove_orphans(
    uri: str,
    storage_options: Mapping[str, str] | None,
    engine: Engine,
    grace: timedelta,
    *,
    storage: StorageOptions | None = None,
    now: datetime | None = None,
    dry_run: bool = False,
    lock: str | None = None,
) -> OrphanResult:
    """Delete the files under the table folder that no commit or checkpoint in the log
    names and that are older than ``grace`` (hidden ``_``/``.`` paths, the log among them,
    are never touched; nor are files Sluice still expects to commit, ``pending_files``: the
    Delta sink writes in place, so a checkpoint whose publish failed and a rebuild waiting
    for its swap have files the log does not name yet)."""
    location = open_location(uri, storage or _storage(storage_options))
    with table_lock(engine, lock or uri):
        referenced = _referenced(location.fs, location.path)
        return sweep_orphans(
            uri,
            location.fs,
            location.path,
            referenced,
            grace,
            pending=pending_files(engine, location.path),
            now=now or datetime.now(UTC),
            skip_hidden=True,
            dry_run=dry_run,
        )


def _storage(options: Mapping[str, str] | None) -> StorageOptions:
    """The non-secret endpoint and region among delta-rs's storage options."""
    lower = {key.lower(): value for key, value in (options or {}).items()}
    endpoint = lower.get("aws_endpoint_url") or lower.get("endpoint_url") or lower.get("endpoint")
    region = lower.get("aws_region") or lower.get("region")
    return StorageOptions(s3_endpoint_url=endpoint, s3_region=region)


class DeltaMaintenance:
    """``TableMaintenance`` of one Delta table for the Dagster jobs (its repr shows the URI,
    never the storage options).

    Threading: one instance per job run; each call locks the table (see the module)."""

    def __init__(
        self,
        uri: str,
        storage_options: Mapping[str, str] | None,
        engine: Engine,
        *,
        column: str = "dt",
    ) -> None:
        self._uri = uri
        self._options = dict(storage_options or {})
        self._engine = engine
        self._column = column

    def __repr__(self) -> str:
        return f"DeltaMaintenance({self._uri!r})"

    @property
    def table(self) -> str:
        return self._uri

    def compact_day(self, day: date) -> CompactionResult:
        return compact_day(self._uri, self._options, self._engine, day, column=self._column)

    def expire(self, retention: timedelta) -> ExpiryResult:
        return vacuum(self._uri, self._options, self._engine, retention)

    def remove_orphans(self, grace: timedelta) -> OrphanResult:
        return remove_orphans(self._uri, self._options, self._engine, grace)
