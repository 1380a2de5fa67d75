"""A landing file's identity, and the rules that keep a changing file from being read as a mix.

Identity: ``(size, mtime_ns, inode)`` of the file under its path, taken at discovery and
recorded with the file's splits (``splits.file_size``, ``file_mtime_ns``, ``file_inode``),
and taken again when a reader opens the file. A replaced file (rename over it: a new inode),
one appended to (a new size) or rewritten in place (a new mtime) has another identity. The
inode change time is deliberately not part of it: ``chmod``/``chown``/a hard link change it
without changing the content.

Settle rule: a file is registered only once it has been quiet for ``settle_seconds``: its
*change time* (:attr:`FileIdentity.changed_at`, the later of mtime and ctime) is at least that
long ago. A writer still appending keeps moving it, so a half-written file is left for a
later discovery tick instead of being cut at the size seen (Spark Auto Loader and Flink's
FileSource have no such rule and read whatever size they listed; landing files should still
be written under a hidden name and renamed into place, which needs no settling at all).

Change time, not mtime, orders discovery: ``mv``, ``cp -p`` and ``rsync -a`` give a file an old
mtime but set its ctime to the moment it appeared (rename and ``utime`` both touch ctime), so
``max(mtime, ctime)`` is when the file became visible or last changed, never earlier.

On an object store (S3, GCS, ADLS, HDFS through ``pyarrow.fs``) there is no inode, no ctime
and no symbolic link: identity is ``(size, mtime)`` with the mtime the object's
``Last-Modified`` cut to whole seconds (:meth:`FileIdentity.of_object`: S3 gives it to the
second in a HEAD, to the millisecond in a listing — cutting both makes them agree). An
overwrite (a PUT of the same key) gives the object a new ``Last-Modified``, so it is another
version. Not seen: an overwrite within the same second with the same size (pyarrow does not
expose the ETag, which would tell them apart).

Pure values and functions; any thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

__all__ = [
    "CHANGED_REASON",
    "ChangePolicy",
    "FileChangedError",
    "FileIdentity",
    "change_time",
    "check_unchanged",
    "current",
    "modification_time",
    "recorded_identity",
]


class ChangePolicy(StrEnum):
    """What happens to a file whose identity changed after its splits were registered."""

    #: Never read it: its splits are quarantined (FAILED) with the change as their reason,
    #: until ``sluice retry`` re-reads the file as it is then.
    REFUSE = "refuse"
    #: Read it whole again as a new version (new splits for the new identity); output of the
    #: old version that was already committed stays.
    REPROCESS = "reprocess"


#: ``splits.failure_reason`` of a split refused because its file changed.
CHANGED_REASON = "changed since discovery"


class FileChangedError(OSError):
    """The file under a split's path is not the one its splits were registered for."""


@dataclass(frozen=True, slots=True)
class FileIdentity:
    """What identifies one version of a file; ``ctime_ns`` orders discovery only."""

    size: int
    mtime_ns: int
    inode: int | None = None
    ctime_ns: int = field(default=0, compare=False)

    @classmethod
    def of(cls, st: os.stat_result) -> FileIdentity:
        return cls(st.st_size, st.st_mtime_ns, st.st_ino or None, st.st_ctime_ns)

    @classmethod
    def of_object(cls, size: int, mtime_ns: int) -> FileIdentity:
        """An object's identity: no inode, no ctime, the mtime cut to whole seconds."""
        return cls(size, mtime_ns // 1_000_000_000 * 1_000_000_000, None, 0)

    @property
    def changed_at(self) -> float:
        """When the file last changed or appeared under its name (seconds since the epoch)."""
        return max(self.mtime_ns, self.ctime_ns) / 1e9

    def same_as(self, recorded: FileIdentity) -> bool:
        """Whether this is the version ``recorded`` describes (an inode not recorded on
        either side is not compared)."""
        if (self.size, self.mtime_ns) != (recorded.size, recorded.mtime_ns):
            return False
        return self.inode is None or recorded.inode is None or self.inode == recorded.inode

    def difference(self, recorded: FileIdentity) -> str:
        """What changed from ``recorded`` to this one, e.g. ``size 61 -> 200``."""
        parts = []
        if self.size != recorded.size:
            parts.append(f"size {recorded.size} -> {self.size}")
        if self.inode is not None and recorded.inode is not None and self.inode != recorded.inode:
            parts.append("replaced (another inode)")
        if self.mtime_ns != recorded.mtime_ns:
            parts.append(f"mtime {recorded.mtime_ns / 1e9:.3f} -> {self.mtime_ns / 1e9:.3f}")
        return ", ".join(parts) or "unchanged"


def change_time(identity: FileIdentity) -> float:
    """Discovery's order: when the file last changed or appeared (the default)."""
    return identity.changed_at


def modification_time(identity: FileIdentity) -> float:
    """The mtime alone: only for synthetic landing folders whose files got made-up mtimes
    (benchmarks, tests of the cursor's order), since ``utime`` sets their ctime to now."""
    return identity.mtime_ns / 1e9


def current(path: str) -> FileIdentity | None:
    """The identity of the file at ``path`` now (through links); None when it is gone."""
    try:
        return FileIdentity.of(os.stat(path))
    except FileNotFoundError:
        return None


def check_unchanged(
    path: str,
    recorded: FileIdentity | None,
    identity_of: Callable[[str], FileIdentity | None] = current,
) -> None:
    """Raise :class:`FileChangedError` when ``path`` is no longer the ``recorded`` version
    (nothing recorded: splits registered before identities were kept, never refused). A file
    that is gone is left to the reader's open (``file not found``). ``identity_of``: how the
    identity is taken now (a local ``stat`` by default; an object store's HEAD)."""
    if recorded is None:
        return
    now = identity_of(path)
    if now is not None and not now.same_as(recorded):
        raise FileChangedError(f"{path} {CHANGED_REASON}: {now.difference(recorded)}")


def recorded_identity(row: Any) -> FileIdentity | None:
    """The identity recorded in a ``splits`` row mapping (None: none recorded)."""
    if row["file_size"] is None or row["file_mtime_ns"] is None:
        return None
    return FileIdentity(row["file_size"], row["file_mtime_ns"], row["file_inode"])
