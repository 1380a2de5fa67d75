"""Quarantined (poison) splits: listing them and putting them back.

A split whose content failed ``SLUICE_SPLIT_MAX_ATTEMPTS`` attempts is FAILED (see
``enumerator_service._checkpoint_commit``): no run assigns or reads it, the pipeline goes on
without it. ``retry`` puts such splits back in the pool (UNASSIGNED) with their failure count
reset; they resume at their committed offset, so records committed before the failure are
not read twice.

``retry`` re-reads a file *as it is now*: when the file under a retried split's path no longer
has the identity its splits were registered for (its owner fixed it, it was replaced or
grew), it is read as it is now: appended to in place (the same inode, larger), what was
committed stays and only the rest is read (the new lines are new ranges, a gzip resumes);
otherwise (replaced, rewritten, shrunk) the file is registered again as a new version, cut
from its current size, and the old version's unread splits are SUPERSEDED (see
``_file_versions``) — never a resume of the old byte ranges over another file's content.

Threading: every function blocks on the database.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from enumerator_service._file_identity import (
    CHANGED_REASON,
    ChangePolicy,
    recorded_identity,
)
from enumerator_service._file_versions import (
    cut_splits,
    grew_in_place,
    known_versions,
    register_append,
    register_version,
    supersede,
)
from enumerator_service._object_landing import identity_now, open_for_footer, storage_error
from enumerator_service._schema import SplitStatus, splits
from enumerator_service._splits import FileSplit
from enumerator_service._storage import StorageOptions

__all__ = ["QuarantinedSplit", "quarantined", "reread_refused", "retry_splits"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QuarantinedSplit:
    """A FAILED split: where it is, how often it failed, why, and the last error."""

    id: int
    source: str
    uri: str
    failures: int
    reason: str
    last_error: str
    failed_at: datetime | None
    partition_key: date | None = None

    @classmethod
    def of(cls, row: Any) -> QuarantinedSplit:
        """From a row of the splits table (``partition_key`` optional)."""
        return cls(
            id=row.id,
            source=row.source,
            uri=row.uri,
            failures=row.failures,
            reason=row.failure_reason or "",
            last_error=row.last_error or "",
            failed_at=row.failed_at,
            partition_key=getattr(row, "partition_key", None),
        )

    def line(self, limit: int = 300) -> str:
        """One line: file, reason, attempts and last error, at most ``limit`` characters (the
        error was stored redacted and bounded by the reader)."""
        text = f"{self.uri} — {self.reason} after {self.failures} attempts: {self.last_error}"
        flat = " ".join(text.split())
        return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def quarantined(
    engine: Engine,
    source: str | None = None,
    *,
    days: Sequence[date] | None = None,
    limit: int = 1000,
    retrying: bool = False,
) -> list[QuarantinedSplit]:
    """FAILED splits (of ``source``, of partitions ``days``), oldest failure first, at most
    ``limit``. ``retrying``: instead, the splits back in the pool after a failed attempt on
    their content (UNASSIGNED, failures > 0), not yet quarantined."""
    stmt = (
        sa.select(
            splits.c.id,
            splits.c.source,
            splits.c.uri,
            splits.c.failures,
            splits.c.failure_reason,
            splits.c.last_error,
            splits.c.failed_at,
            splits.c.partition_key,
        )
        .order_by(splits.c.failed_at, splits.c.id)
        .limit(limit)
    )
    if retrying:
        stmt = stmt.where(splits.c.status == SplitStatus.UNASSIGNED, splits.c.failures > 0)
    else:
        stmt = stmt.where(splits.c.status == SplitStatus.FAILED)
    if source is not None:
        stmt = stmt.where(splits.c.source == source)
    if days is not None:
        stmt = stmt.where(splits.c.partition_key.in_(list(days)))
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    return [QuarantinedSplit.of(r) for r in rows]


def retry_splits(
    engine: Engine,
    split_ids: Sequence[int] | None = None,
    *,
    source: str | None = None,
    target_split_bytes: int = 128 << 20,
    storage: StorageOptions | None = None,
) -> list[QuarantinedSplit]:
    """Put FAILED splits back in the pool: the given ones (None: every FAILED split, of
    ``source`` if given). Returns the splits put back (as they were); ids that are not FAILED
    are left alone and missing from the result. A split whose file changed since it was
    registered is re-read as the file is now: a new version of the file, cut into splits of
    ``target_split_bytes``, replaces it (see the module docstring). ``storage``: how files
    on an object store (split URIs ``s3://…``) are reached; a split whose store cannot be
    reached now (unreachable, access denied) stays FAILED — logged, missing from the result."""
    storage = storage or StorageOptions()
    conditions = [splits.c.status == SplitStatus.FAILED]
    if split_ids is not None:
        conditions.append(splits.c.id.in_(list(split_ids)))
    if source is not None:
        conditions.append(splits.c.source == source)
    with engine.begin() as conn:
        rows = conn.execute(sa.select(splits).where(*conditions).with_for_update()).all()
        changed, unreachable = _changed_files(rows, storage)
        rows = [r for r in rows if r.uri not in unreachable]
        for row in changed.values():
            _reread(conn, row, target_split_bytes, storage)
        same = [r.id for r in rows if (r.source, r.uri) not in changed]
        _put_back(conn, same)
    return sorted((QuarantinedSplit.of(r) for r in rows), key=lambda s: s.id)


def reread_refused(
    engine: Engine,
    source: str,
    *,
    target_split_bytes: int,
    storage: StorageOptions | None = None,
) -> int:
    """Policy ``reprocess``: the splits a reader refused because their file changed are
    retried — their file is read whole again as it is now. Returns how many were retried."""
    stmt = sa.select(splits.c.id).where(
        splits.c.source == source,
        splits.c.status == SplitStatus.FAILED,
        splits.c.failure_reason == CHANGED_REASON,
    )
    with engine.connect() as conn:
        ids = list(conn.execute(stmt).scalars())
    if not ids:
        return 0
    return len(retry_splits(engine, ids, target_split_bytes=target_split_bytes, storage=storage))


def _changed_files(
    rows: Sequence[Any], storage: StorageOptions
) -> tuple[dict[tuple[str, str], Any], set[str]]:
    """One retried row per file whose identity now differs from the one recorded, and the
    files whose store could not be asked (each store is given up on after its first error:
    a retry of many splits does not wait out a timeout for each)."""
    changed: dict[tuple[str, str], Any] = {}
    unreachable: set[str] = set()
    down: set[str] = set()  # scheme://netloc of stores that failed
    for row in rows:
        recorded = recorded_identity(row._mapping)
        if recorded is None or (row.source, row.uri) in changed:  # no identity: not a file
            continue
        store = row.uri.split("/", 3)[:3] if "://" in row.uri else None
        root = "/".join(store) if store else ""
        if root in down:
            unreachable.add(row.uri)
            continue
        try:
            now = identity_now(row.uri, storage)
        except OSError as exc:  # the store of an object: unreachable, access denied
            if not root:
                raise
            down.add(root)
            unreachable.add(row.uri)
            error = storage_error(f"retry: {row.uri}", exc, storage)
            _log.warning("%s; its splits stay quarantined (retry again later)", error)
            continue
        if now is not None and not now.same_as(recorded):
            changed[(row.source, row.uri)] = row
    return changed, unreachable


def _reread(conn: Connection, row: Any, target_split_bytes: int, storage: StorageOptions) -> None:
    """Register the file of ``row`` as it is now (unless its latest version already is it,
    then that version's quarantined splits go back) and supersede the older versions."""
    now = identity_now(row.uri, storage)
    if now is None:
        return
    version, latest = known_versions(conn, row.source, [row.uri])[row.uri]
    if latest is not None and now.same_as(latest):
        # Discovery registered the current file already (quarantined under ``refuse``).
        _put_back(conn, _failed_of(conn, row.source, row.uri, version))
        supersede(conn, row.source, row.uri, version)
        return
    if latest is not None and grew_in_place(row.kind, latest, now, gz=True):
        # Appended to (or a truncated file completed): what was committed stays, the
        # version's splits read on (a resumed gzip to its new end, new ranges for new lines).
        known = FileSplit(
            row.source, row.kind, row.uri, 0, None, row.partition_key, latest, version
        )
        register_append(
            conn,
            known,
            latest,
            now,
            target=target_split_bytes,
            refused=False,
        )
        _put_back(conn, _failed_of(conn, row.source, row.uri, version))
        return
    recorded = recorded_identity(row._mapping)
    change = now.difference(recorded) if recorded is not None else "changed"
    new = cut_splits(
        row.source,
        row.uri,
        row.kind,
        row.partition_key,
        now,
        target=target_split_bytes,
        version=version + 1,
        open_file=lambda uri: open_for_footer(uri, storage),
    )
    register_version(conn, new, policy=ChangePolicy.REPROCESS, change=change)
    _log.warning("retry: %s re-read as it is now (%s)", row.uri, change)


def _failed_of(conn: Connection, source: str, uri: str, version: int) -> list[int]:
    """The FAILED splits of one version of a file."""
    stmt = sa.select(splits.c.id).where(
        splits.c.source == source,
        splits.c.uri == uri,
        splits.c.file_version == version,
        splits.c.status == SplitStatus.FAILED,
    )
    return list(conn.execute(stmt).scalars())


def _put_back(conn: Connection, ids: Sequence[int]) -> None:
    if not ids:
        return
    conn.execute(
        sa.update(splits)
        .where(splits.c.id.in_(list(ids)), splits.c.status == SplitStatus.FAILED)
        .values(
            status=SplitStatus.UNASSIGNED,
            failures=0,
            failure_reason=None,
            last_error=None,
            failed_at=None,
            run_id=None,
            subtask=None,
            lease_expires_at=None,
            assigned_checkpoint=None,
        )
    )
