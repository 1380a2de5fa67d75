"""The file enumerators: landing folders listed into splits, bounded (``StaticFileEnumerator``)
or continuous (``ContinuousFileEnumerator``: each ``discover()`` one tick resumed from a bounded
cursor), with the settle, identity and change-time rules of ``_file_identity``.

The landing is a local folder (``Path``, with the symbolic-link and inode protections of
``_landing``) or a :class:`~enumerator_service._storage.Location` on an object store (listed
per ``dt=`` prefix through ``pyarrow.fs``, identity size + mtime, no settle time: see
``_object_landing``). Split paths are then the objects' URIs (``s3://bucket/…``).

Threading: as ``SplitEnumerator`` — one owner thread; methods block on Postgres and the file
system.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import date
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Connection, Engine

from enumerator_service._enumerator import DiscoveryResult, SplitEnumerator
from enumerator_service._file_identity import ChangePolicy, FileIdentity, change_time
from enumerator_service._file_versions import (
    cut_splits,
    grew_in_place,
    known_versions,
    register_append,
    register_version,
)
from enumerator_service._landing import LandingRoot, data_files
from enumerator_service._object_landing import ObjectLanding
from enumerator_service._quarantine import reread_refused
from enumerator_service._splits import FileSplit
from enumerator_service._storage import Location, StorageOptions

__all__ = ["ContinuousFileEnumerator", "StaticFileEnumerator"]

#: A listed data file: (path, kind, partition date, identity).
_Listed = tuple[str, str, date | None, FileIdentity]


class _FileEnumerator(SplitEnumerator):
    """Lists ``<landing>/dt=YYYY-MM-DD/*`` (``partitioned``) or ``<landing>/*`` and cuts
    large files into byte ranges. Symbolic links (files and ``dt=`` folders) are followed
    only inside the landing folder unless ``follow_symlinks`` (see ``LandingRoot``).

    A file is registered with its identity (see ``_file_identity``) once it has been quiet
    for ``settle_seconds`` (by ``clock``); a known file listed with another identity is
    registered again as a new version under ``change_policy`` (see ``_file_versions``)."""

    def __init__(
        self,
        engine: Engine,
        source: str,
        landing: Path | Location,
        *,
        lease_seconds: float = 60.0,
        target_split_bytes: int = 128 << 20,
        partitioned: bool = True,
        follow_symlinks: bool = False,
        settle_seconds: float = 0.0,
        change_policy: ChangePolicy = ChangePolicy.REFUSE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(engine, source, lease_seconds=lease_seconds)
        if target_split_bytes < 1:
            raise ValueError("target_split_bytes must be positive")
        if settle_seconds < 0:
            raise ValueError("settle_seconds must not be negative")
        #: The landing on an object store (None: a local folder, ``self._landing``).
        self._objects: ObjectLanding | None = None
        self._storage = StorageOptions()
        if isinstance(landing, Location):
            self._storage = landing.options
            if landing.object_store:
                self._objects = ObjectLanding(landing)
                landing = Path(landing.path)  # (unused on a store: only for the type)
            else:
                landing = landing.local_path
        self._landing = landing
        self._target = target_split_bytes
        self._partitioned = partitioned
        self._root = LandingRoot.of(landing, follow_symlinks=follow_symlinks)
        self._skipped: list[str] = []  # links the current listing did not follow
        self._bad_names: list[str] = []  # names (escaped) the current listing skipped
        self._settle = settle_seconds
        self._policy = change_policy
        self._clock = clock

    def _files(self, dates: frozenset[date] | None) -> Iterator[_Listed]:
        """(path, kind, partition date, identity) of every data file; the links not
        followed are collected in ``self._skipped`` (reset by each listing)."""
        self._skipped, self._bad_names = [], []
        if self._objects is not None:
            yield from self._objects.data_files(
                partitioned=self._partitioned, dates=dates, bad_names=self._bad_names
            )
            return
        yield from data_files(
            self._landing,
            self._root,
            self._skipped,
            partitioned=self._partitioned,
            dates=dates,
            bad_names=self._bad_names,
        )

    def _settled_before(self) -> float:
        """Files that changed after this moment are still settling (not registered yet).
        Objects never settle: a store shows an object only once its upload is complete."""
        if self._objects is not None:
            return float("inf")
        return self._clock() - self._settle

    def _register_files(self, files: Sequence[_Listed]) -> tuple[int, int]:
        """Register the splits of ``files``: a file not known yet as version 0, a known one
        only if its identity changed (a new version, see ``_file_versions``). Returns (new
        splits, changed files)."""
        changed = 0
        if self._policy is ChangePolicy.REPROCESS:
            # Files a reader refused as changed: registered again as they are now.
            changed += reread_refused(
                self._engine, self._source, target_split_bytes=self._target, storage=self._storage
            )
        fresh: list[FileSplit] = []
        with self._engine.begin() as conn:
            known = known_versions(conn, self._source, (path for path, *_ in files))
            for path, kind, day, identity in files:
                version, recorded = known.get(path, (-1, None))
                if version < 0:
                    fresh.extend(self._cut(path, kind, day, identity, 0))
                elif recorded is not None and not identity.same_as(recorded):
                    changed += 1
                    self._register_change(conn, (path, kind, day, identity), version, recorded)
        return self._store.register(fresh), changed

    def _register_change(
        self, conn: Connection, file: _Listed, version: int, recorded: FileIdentity
    ) -> None:
        """A known file listed with another identity: appended to (only the new lines are
        new splits) or replaced / rewritten (a new version, read whole)."""
        path, kind, day, identity = file
        refused = self._policy is ChangePolicy.REFUSE
        if grew_in_place(kind, recorded, identity, gz=False):
            known = FileSplit(self._source, kind, path, 0, None, day, recorded, version)
            register_append(conn, known, recorded, identity, target=self._target, refused=refused)
            return
        cut = self._cut(path, kind, day, identity, version + 1)
        register_version(conn, cut, policy=self._policy, change=identity.difference(recorded))

    def _cut(
        self, path: str, kind: str, day: date | None, identity: FileIdentity, version: int
    ) -> list[FileSplit]:
        return cut_splits(
            self._source,
            path,
            kind,
            day,
            identity,
            target=self._target,
            version=version,
            open_file=self._root.open if self._objects is None else self._objects.open_native,
        )


class StaticFileEnumerator(_FileEnumerator):
    """Bounded: lists the landing folder once (only ``dates`` if given). For backfills."""

    def __init__(
        self,
        engine: Engine,
        source: str,
        landing: Path | Location,
        *,
        dates: Sequence[date] | None = None,
        lease_seconds: float = 60.0,
        target_split_bytes: int = 128 << 20,
        partitioned: bool = True,
        follow_symlinks: bool = False,
        settle_seconds: float = 0.0,
        change_policy: ChangePolicy = ChangePolicy.REFUSE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            engine,
            source,
            landing,
            lease_seconds=lease_seconds,
            target_split_bytes=target_split_bytes,
            partitioned=partitioned,
            follow_symlinks=follow_symlinks,
            settle_seconds=settle_seconds,
            change_policy=change_policy,
            clock=clock,
        )
        self._dates = frozenset(dates) if dates is not None else None

    def discover(self) -> DiscoveryResult:
        listed = list(self._files(self._dates))
        settled_before = self._settled_before()
        settled = [file for file in listed if file[3].changed_at <= settled_before]
        registered, changed = self._register_files(settled)
        return DiscoveryResult(
            len(listed),
            registered,
            {},
            skipped_links=len(self._skipped),
            skipped_names=len(self._bad_names),
            unsettled_files=len(listed) - len(settled),
            changed_files=changed,
        )


class ContinuousFileEnumerator(_FileEnumerator):
    """Continuous: each ``discover()`` registers the files that appeared since the last tick.

    The cursor is bounded: a change-time watermark (``mtime_watermark``: the later of mtime
    and ctime, see ``_file_identity``) plus the paths seen inside the last
    ``lookback_seconds`` before it — never the set of every path ever seen (Flink's FileSource
    runs out of memory that way). Files older than the window are known since an earlier
    tick: a file appearing now has a change time of now whatever its mtime (rename and
    ``utime`` set ctime), so it is inside the window. Registration is idempotent, so a file
    seen twice is still registered once; a known file seen with another identity is a new
    version (see ``_file_versions``).

    A tick registers at most ``max_files_per_tick`` new files (None: no cap): the oldest ones
    in (time, path) order (``file_time`` is the time rule: ``modification_time`` only for
    synthetic folders whose made-up mtimes must order them). The cursor then describes
    exactly that prefix of the order, so the next tick continues at the first file not taken
    (see :meth:`discover`), and ``DiscoveryResult.backlog_files`` says how many were left.
    """

    def __init__(
        self,
        engine: Engine,
        source: str,
        landing: Path | Location,
        *,
        lease_seconds: float = 60.0,
        lookback_seconds: float = 600.0,
        target_split_bytes: int = 128 << 20,
        max_files_per_tick: int | None = None,
        partitioned: bool = True,
        follow_symlinks: bool = False,
        settle_seconds: float = 0.0,
        change_policy: ChangePolicy = ChangePolicy.REFUSE,
        clock: Callable[[], float] = time.time,
        file_time: Callable[[FileIdentity], float] = change_time,
    ) -> None:
        super().__init__(
            engine,
            source,
            landing,
            lease_seconds=lease_seconds,
            target_split_bytes=target_split_bytes,
            partitioned=partitioned,
            follow_symlinks=follow_symlinks,
            settle_seconds=settle_seconds,
            change_policy=change_policy,
            clock=clock,
        )
        self._file_time = file_time
        if max_files_per_tick is not None and max_files_per_tick < 1:
            raise ValueError("max_files_per_tick must be positive (or None: no cap)")
        if settle_seconds > lookback_seconds:
            raise ValueError("settle_seconds must not exceed lookback_seconds")
        self._lookback = lookback_seconds
        self._max_files = max_files_per_tick

    def cursor(self) -> dict[str, Any]:
        return self._load_cursor({"mtime_watermark": None, "recent_paths": []})

    def discover(self) -> DiscoveryResult:
        """One tick: register the unknown files (at most ``max_files_per_tick``, oldest first).

        Files are ordered by *change time* (``FileIdentity.changed_at``: the later of mtime
        and ctime), so a file moved in with an old mtime (``mv``, ``cp -p``, ``rsync -a``)
        sorts at the moment it appeared, inside the window, and is never missed.

        Why a capped tick neither skips nor repeats a file: the candidates (files inside the
        window and not among the cursor's recent paths) are taken in (time, path) order, a
        total order, so what is taken is a prefix ending at some position P and what is left
        (the backlog) lies strictly after P. The new cursor is computed as if the listing held
        only the known files and the prefix: its watermark W' is the newest of those times
        and its recent paths are those of them with time >= W' - lookback. A backlog file is
        after P, so its time is >= W' whenever W' moved (and >= the old horizon otherwise),
        and it is not a recent path: the next tick sees it as a candidate again, in the same
        order. Every taken file is either a recent path of the new cursor or older than its
        horizon, so it is never a candidate again. Files sharing P's time are split by path
        and the ones taken are recent paths, so a chunk boundary inside one time is exact.
        Files still settling (changed after now - settle) are the newest of the order, a
        suffix of it: they are left exactly like a backlog (settle <= lookback keeps them
        inside the next tick's window). A recent path that changed after the watermark
        (replaced, re-created, appended to since the last tick) is a candidate again: its
        registration compares its identity with the registered one (a new version, or
        nothing when it is the same).
        """
        cursor = self.cursor()
        watermark: float | None = cursor["mtime_watermark"]
        known = set(cursor["recent_paths"])
        horizon = float("-inf") if watermark is None else watermark - self._lookback
        window: dict[str, float] = {}  # known files changed inside the lookback window
        candidates: list[tuple[float, str, str, date | None, FileIdentity]] = []
        seen = 0
        for path, kind, day, identity in self._files(None):
            seen += 1
            changed_at = self._file_time(identity)
            if changed_at < horizon:
                continue  # older than the window: known since an earlier tick
            if path in known and watermark is not None and changed_at <= watermark:
                window[path] = changed_at
            else:  # new, or a known file changed since the last tick (re-created, replaced)
                candidates.append((changed_at, path, kind, day, identity))
        settled_before = self._settled_before()
        settled = [c for c in candidates if c[0] <= settled_before]
        unsettled = len(candidates) - len(settled)
        backlog = 0
        if self._max_files is not None and len(settled) > self._max_files:
            backlog = len(settled) - self._max_files
            # Paths are unique, so tuples never compare past (time, path): the total order.
            settled = heapq.nsmallest(self._max_files, settled)
        else:
            settled.sort()  # registration (and split id) order follows the same order
        added, changed = self._register_files([(p, k, d, i) for _, p, k, d, i in settled])
        for changed_at, path, *_ in settled:
            window[path] = changed_at
        if window:
            newest = max(window.values())
            watermark = newest if watermark is None else max(watermark, newest)
        keep_after = float("-inf") if watermark is None else watermark - self._lookback
        # Only paths inside the window are remembered: the cursor stays bounded.
        recent = sorted(path for path, changed_at in window.items() if changed_at >= keep_after)
        new_cursor: dict[str, Any] = {"mtime_watermark": watermark, "recent_paths": recent}
        if backlog:
            # Informational (the two keys above alone decide what the next tick takes).
            last_time, last_path = settled[-1][:2]
            new_cursor["backlog_files"] = backlog
            new_cursor["resume_after"] = [last_time, last_path]
        self._save_cursor(new_cursor)
        return DiscoveryResult(
            seen,
            added,
            new_cursor,
            backlog_files=backlog,
            skipped_links=len(self._skipped),
            skipped_names=len(self._bad_names),
            unsettled_files=unsettled,
            changed_files=changed,
        )
