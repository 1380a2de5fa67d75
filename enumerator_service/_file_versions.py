"""Versions of a landing file: its splits cut for one identity, a changed file registered again.

A file's splits are registered for the identity seen at discovery (version 0). When the file
under the same path later has another identity — replaced, re-created, rewritten by its
owner — it is never read as a mix of the two: discovery (or ``sluice retry``) registers a
*new version* (``file_version`` + 1) cut from the file as it is now, and the older versions'
splits that were never read to the end (UNASSIGNED, HELD, FAILED) become SUPERSEDED. What the
new version's splits do depends on the policy (:class:`ChangePolicy`): ``reprocess`` puts
them in the pool (the file is read whole again); ``refuse`` registers them quarantined
(FAILED, reason ``changed since discovery`` and what changed), so nothing is read until
``sluice retry`` — which re-reads the file as it is then.

A file *appended to* in place (the same inode, larger: the rule of tailing readers such as
Filebeat) is not a new version: its splits take the new identity and the appended bytes
become new ranges of the same version (:func:`register_append`) — quarantined under
``refuse``, in the pool under ``reprocess`` — so the lines already read are never read twice.

Older versions' splits that a run holds (ASSIGNED, READING) are left alone: their reader
checks the identity when it opens the file and refuses them (see ``_file_identity``).

Threading: functions taking a Connection run inside the caller's transaction; the others
block on the database and the file system.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import date
from typing import IO

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from enumerator_service._file_identity import (
    CHANGED_REASON,
    ChangePolicy,
    FileIdentity,
    recorded_identity,
)
from enumerator_service._schema import SplitStatus, splits
from enumerator_service._split_store import SplitStore
from enumerator_service._splits import FileSplit

__all__ = [
    "cut_splits",
    "grew_in_place",
    "known_versions",
    "register_append",
    "register_version",
    "supersede",
]

_log = logging.getLogger(__name__)

#: Kinds that can be cut into byte ranges (a record is one line). A gzip stream cannot be
#: entered mid-way and is one whole-file split; Parquet is cut at row-group boundaries.
_SPLITTABLE = frozenset({"jsonl", "csv"})
#: Kinds read as byte ranges of lines: an append is a new range of the same version.
_RANGES = frozenset({"jsonl", "csv"})
#: Splits of an older version that no run reads to the end any more.
_UNREAD = (SplitStatus.UNASSIGNED, SplitStatus.HELD, SplitStatus.FAILED)


def cut_splits(
    source: str,
    path: str,
    kind: str,
    day: date | None,
    identity: FileIdentity,
    *,
    target: int,
    version: int = 0,
    open_file: Callable[[str], IO[bytes]] = lambda p: open(p, "rb"),  # noqa: SIM115
) -> list[FileSplit]:
    """The splits of one version of a file: byte ranges of about ``target`` bytes (line
    files), row-group ranges (large Parquet), else the whole file."""
    size = identity.size

    def split(start: int, end: int | None) -> FileSplit:
        return FileSplit(source, kind, path, start, end, day, identity, version)

    if kind == "parquet" and size > target:
        return [split(s, e) for s, e in _row_group_ranges(open_file(path), target)]
    if kind not in _SPLITTABLE:
        return [split(0, None)]
    if size <= target:
        return [split(0, size)]
    # Byte ranges; the reader applies the line rule at each boundary.
    return [split(start, min(start + target, size)) for start in range(0, size, target)]


def _row_group_ranges(file: IO[bytes], target: int) -> list[tuple[int, int | None]]:
    """Row-group ranges ``[start, end)`` of about ``target`` bytes, from the footer.

    A Parquet split's offsets are row indices while its bounds are row-group indices; a
    range may start at group k only where the file's first row of group k is >= k, so a
    fresh split's resume offset (k) can never be mistaken for a row inside it (only files
    with empty row groups ever violate this; such groups join the range before).
    """
    import pyarrow.parquet as pq  # only discovery of large Parquet files needs it

    with file:  # the footer of the file that was checked
        metadata = pq.ParquetFile(file).metadata
    starts: list[int] = [0]
    first_row = bytes_in_range = 0
    for group in range(metadata.num_row_groups):
        if group > 0 and bytes_in_range >= target and first_row >= group:
            starts.append(group)
            bytes_in_range = 0
        row_group = metadata.row_group(group)
        bytes_in_range += row_group.total_byte_size
        first_row += row_group.num_rows
    ends: list[int | None] = [*starts[1:], None]
    return list(zip(starts, ends, strict=True))


def known_versions(
    conn: Connection, source: str, paths: Iterable[str]
) -> dict[str, tuple[int, FileIdentity | None]]:
    """The latest registered version of each of ``paths`` that is known, with its identity
    (None: registered before identities were kept)."""
    wanted = sorted(set(paths))
    if not wanted:
        return {}
    # One array parameter (a listing may hold 100,000s of paths; an IN list would compile a
    # bind parameter each).
    uris = sa.bindparam("uris", wanted, type_=postgresql.ARRAY(sa.Text))
    stmt = sa.select(
        splits.c.uri,
        splits.c.file_version,
        splits.c.file_size,
        splits.c.file_mtime_ns,
        splits.c.file_inode,
    ).where(splits.c.source == source, splits.c.uri == sa.any_(uris))
    known: dict[str, tuple[int, FileIdentity | None]] = {}
    # Every split of every version (few per file): the latest version's identity wins.
    for row in conn.execute(stmt).all():
        if row.uri not in known or row.file_version > known[row.uri][0]:
            known[row.uri] = (row.file_version, recorded_identity(row._mapping))
    return known


def supersede(conn: Connection, source: str, path: str, below: int) -> int:
    """Mark the unread splits of versions below ``below`` of a file SUPERSEDED."""
    stmt = (
        sa.update(splits)
        .where(
            splits.c.source == source,
            splits.c.uri == path,
            splits.c.file_version < below,
            splits.c.status.in_(_UNREAD),
        )
        .values(status=SplitStatus.SUPERSEDED, lease_expires_at=None, run_id=None)
    )
    return conn.execute(stmt).rowcount


def register_version(
    conn: Connection,
    new_splits: Sequence[FileSplit],
    *,
    policy: ChangePolicy,
    change: str,
) -> list[int]:
    """Register ``new_splits`` (one file's splits of a new version) and supersede the older
    versions' unread splits; under ``refuse`` the new ones are quarantined with ``change``
    (what changed, e.g. ``size 61 -> 200``) as their error. Returns the new split ids."""
    first = new_splits[0]
    supersede(conn, first.source, first.path, first.version)
    ids = SplitStore.insert(conn, new_splits)
    if policy is ChangePolicy.REFUSE and ids:
        _quarantine_new(conn, ids, change)
        _log.warning(
            "landing file %s %s (%s): refused, its splits %s are quarantined; "
            "`sluice retry` reads it as it is then",
            first.path,
            CHANGED_REASON,
            change,
            ids,
        )
    elif ids:
        _log.warning(
            "landing file %s %s (%s): read again whole as version %d",
            first.path,
            CHANGED_REASON,
            change,
            first.version,
        )
    return ids


def grew_in_place(kind: str, recorded: FileIdentity, now: FileIdentity, *, gz: bool) -> bool:
    """Whether the file was appended to: the same inode, larger (the rule of tailing readers
    such as Filebeat: inode + offset). Line files only (``gz``: whole gzip files too, whose
    split resumes in the decompressed stream); a Parquet file rewritten larger is a new file."""
    appendable = kind in _RANGES or (gz and kind.endswith(".gz"))
    same_file = recorded.inode is not None and now.inode == recorded.inode
    return appendable and same_file and now.size > recorded.size


def register_append(
    conn: Connection,
    split: FileSplit,
    recorded: FileIdentity,
    now: FileIdentity,
    *,
    target: int,
    refused: bool,
) -> list[int]:
    """The file of ``split`` (one split of its latest version) grew in place from
    ``recorded`` to ``now``: every split of that version takes the new identity (what they
    cover is unchanged: a line belongs to the range its first byte is in) and the appended
    bytes ``[recorded.size, now.size)`` become new ranges of the same version, so only the
    new lines are read. ``refused``: those are registered quarantined (policy ``refuse``).
    Returns the new split ids."""
    conn.execute(
        sa.update(splits)
        .where(
            splits.c.source == split.source,
            splits.c.uri == split.path,
            splits.c.file_version == split.version,
        )
        .values(file_size=now.size, file_mtime_ns=now.mtime_ns, file_inode=now.inode)
    )
    if split.kind not in _RANGES:
        return []  # a whole gzip file: its split resumes and reads on to the new end
    new = [
        FileSplit(
            split.source,
            split.kind,
            split.path,
            start,
            min(start + target, now.size),
            split.partition_key,
            now,
            split.version,
        )
        for start in range(recorded.size, now.size, target)
    ]
    ids = SplitStore.insert(conn, new)
    change = f"{now.difference(recorded)} (appended)"
    if refused and ids:
        _quarantine_new(conn, ids, change)
    _log.warning(
        "landing file %s %s (%s): %s",
        split.path,
        CHANGED_REASON,
        change,
        f"the appended lines are refused (splits {ids} quarantined; `sluice retry` reads them)"
        if refused
        else "the appended lines will be read",
    )
    return ids


def _quarantine_new(conn: Connection, ids: Sequence[int], change: str) -> None:
    conn.execute(
        sa.update(splits)
        .where(splits.c.id.in_(list(ids)))
        .values(
            status=SplitStatus.FAILED,
            failures=1,
            failure_reason=CHANGED_REASON,
            last_error=change,
            failed_at=sa.func.now(),
        )
    )
