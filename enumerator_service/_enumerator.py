"""FLIP-27 work discovery: split enumerators over landing folders.

Discovery is separate from reading: an enumerator finds files, registers their splits in the
split store, and hands splits to the reader subtasks that ask for them (pull-based, so idle
readers take more work). Every enumerator works bounded (``StaticFileEnumerator``: lists once,
optionally only some dates — backfills) and continuous (``ContinuousFileEnumerator``: each
``discover()`` is one tick, resumed from a bounded cursor persisted in ``enumerator_state``).

Threading: methods block on Postgres and the file system; the enumerator is owned by one
thread (the Dagster sensor tick, or the job driver).
"""

from __future__ import annotations

import abc
import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine

from enumerator_service._landing import LandingRoot, data_files
from enumerator_service._schema import enumerator_state
from enumerator_service._split_store import SplitStore
from enumerator_service._splits import FileSplit, SplitAssignment

__all__ = [
    "ContinuousFileEnumerator",
    "DiscoveryResult",
    "SplitEnumerator",
    "StaticFileEnumerator",
]

#: Kinds that can be cut into byte ranges (a record is one line). A gzip stream cannot be
#: entered mid-way and is one whole-file split; Parquet is cut at row-group boundaries.
_SPLITTABLE = frozenset({"jsonl", "csv"})


@dataclass(frozen=True, slots=True)
class DiscoveryResult:
    """What one discovery tick found.

    ``backlog_files``: new files this tick left for the next one (its per-tick cap was hit).
    ``skipped_links``: links in the landing folder that were not followed (``LandingRoot``).
    ``skipped_names``: data files whose names are not UTF-8 (each logged once, escaped).
    """

    files_seen: int
    splits_registered: int
    cursor: dict[str, Any]
    backlog_files: int = 0
    #: Symbolic links skipped: leading out of the landing folder, broken, or loops.
    skipped_links: int = 0
    #: Data files skipped because their names are not UTF-8.
    skipped_names: int = 0

    @property
    def complete(self) -> bool:
        """True when the tick registered every new file it listed (no backlog left)."""
        return self.backlog_files == 0


class SplitEnumerator(abc.ABC):
    """Discovers splits and hands them to the reader subtasks of one run, on request.

    Assignment state lives in the split store: ``snapshot_state`` records which hand-outs a
    checkpoint captured, and a reader restoring checkpoint k gets back exactly what it held
    at k (see ``SplitStore.restore_assignments``).
    """

    def __init__(self, engine: Engine, source: str, *, lease_seconds: float = 60.0) -> None:
        self._engine = engine
        self._store = SplitStore(engine)
        self._source = source
        self._lease = lease_seconds
        self._run_id: str | None = None
        self._readers: set[int] = set()
        self._completed_checkpoint: int | None = None

    @property
    def store(self) -> SplitStore:
        return self._store

    @property
    def source(self) -> str:
        return self._source

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, run_id: str | None = None) -> DiscoveryResult:
        """Begin serving ``run_id`` (if given) and run a first discovery."""
        self._run_id = run_id
        return self.discover()

    def close(self) -> None:
        self._readers.clear()
        self._run_id = None

    @abc.abstractmethod
    def discover(self) -> DiscoveryResult:
        """Find new splits and register them (idempotent). Blocks on I/O."""

    def assign_pending(self, dates: Sequence[date] | None = None) -> int:
        """Level-1 assignment: give the source's unassigned splits to this run."""
        return self._store.assign_to_run(
            self._require_run(), self._source, lease_seconds=self._lease, partition_keys=dates
        )

    # -- readers -------------------------------------------------------------------------

    def add_reader(self, subtask: int) -> None:
        self._readers.add(subtask)

    def remove_reader(self, subtask: int) -> None:
        self._readers.discard(subtask)

    def handle_split_request(self, subtask: int) -> SplitAssignment | None:
        """The next split for a registered reader; a reader that has gone away gets nothing."""
        if subtask not in self._readers:
            return None
        return self._store.pull_next(self._require_run(), subtask, self._lease)

    def handle_split_requests(
        self, subtask: int, *, max_splits: int, max_bytes: int
    ) -> list[SplitAssignment]:
        """Up to ``max_splits`` small splits for a registered reader in one request (see
        ``SplitStore.pull_splits``); [] when none is left or the reader has gone away. May block.
        """
        if subtask not in self._readers:
            return []
        return self._store.pull_splits(
            self._require_run(), subtask, self._lease, max_splits=max_splits, max_bytes=max_bytes
        )

    def add_splits_back(self, split_ids: Sequence[int], subtask: int) -> int:
        """Splits of a failed ``subtask`` that no completed checkpoint covers: back to the pool."""
        self._readers.discard(subtask)
        return self._store.return_splits(self._require_run(), split_ids)

    # -- checkpoints ---------------------------------------------------------------------

    def snapshot_state(self, checkpoint_id: int) -> dict[str, Any]:
        """Record the hand-outs checkpoint ``checkpoint_id`` captures; the enumerator state."""
        captured = self._store.snapshot_assignments(self._require_run(), checkpoint_id)
        return {"checkpoint_id": checkpoint_id, "captured": captured, "cursor": self.cursor()}

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Completing k forgets what k covers: only hand-outs after it are ever returned."""
        if self._completed_checkpoint is None or checkpoint_id > self._completed_checkpoint:
            self._completed_checkpoint = checkpoint_id

    def restore(self, subtask: int | None) -> list[int]:
        """A reader (None: all) restarts from the last completed checkpoint."""
        return self._store.restore_assignments(
            self._require_run(), subtask, self._completed_checkpoint
        )

    def cursor(self) -> dict[str, Any]:
        return {}

    def _load_cursor(self, empty: dict[str, Any]) -> dict[str, Any]:
        """The discovery cursor persisted in ``enumerator_state`` (``empty`` before any)."""
        stmt = sa.select(enumerator_state.c.cursor).where(enumerator_state.c.source == self._source)
        with self._engine.connect() as conn:
            cursor = conn.execute(stmt).scalar()
        return dict(cursor) if cursor else empty

    def _save_cursor(self, cursor: dict[str, Any]) -> None:
        stmt = insert(enumerator_state).values(source=self._source, cursor=cursor)
        stmt = stmt.on_conflict_do_update(
            index_elements=["source"], set_={"cursor": cursor, "updated_at": sa.func.now()}
        )
        with self._engine.begin() as conn:
            conn.execute(stmt)

    def _require_run(self) -> str:
        if self._run_id is None:
            raise RuntimeError("the enumerator serves no run: call start(run_id) first")
        return self._run_id


class _FileEnumerator(SplitEnumerator):
    """Lists ``<landing>/dt=YYYY-MM-DD/*`` (``partitioned``) or ``<landing>/*`` and cuts
    large files into byte ranges. Symbolic links (files and ``dt=`` folders) are followed
    only inside the landing folder unless ``follow_symlinks`` (see ``LandingRoot``)."""

    def __init__(
        self,
        engine: Engine,
        source: str,
        landing: Path,
        *,
        lease_seconds: float = 60.0,
        target_split_bytes: int = 128 << 20,
        partitioned: bool = True,
        follow_symlinks: bool = False,
    ) -> None:
        super().__init__(engine, source, lease_seconds=lease_seconds)
        if target_split_bytes < 1:
            raise ValueError("target_split_bytes must be positive")
        self._landing = landing
        self._target = target_split_bytes
        self._partitioned = partitioned
        self._root = LandingRoot.of(landing, follow_symlinks=follow_symlinks)
        self._skipped: list[str] = []  # links the current listing did not follow
        self._bad_names: list[str] = []  # names (escaped) the current listing skipped

    def _files(
        self, dates: frozenset[date] | None
    ) -> Iterator[tuple[str, str, date | None, int, float]]:
        """(path, kind, partition date, size, mtime) of every data file; the links not
        followed are collected in ``self._skipped`` (reset by each listing)."""
        self._skipped, self._bad_names = [], []
        yield from data_files(
            self._landing,
            self._root,
            self._skipped,
            partitioned=self._partitioned,
            dates=dates,
            bad_names=self._bad_names,
        )

    def _splits_of(self, path: str, kind: str, day: date | None, size: int) -> list[FileSplit]:
        if kind == "parquet" and size > self._target:
            return self._row_group_splits(path, day)
        if kind not in _SPLITTABLE:
            return [FileSplit(self._source, kind, path, 0, None, day)]  # the whole file
        if size <= self._target:
            return [FileSplit(self._source, kind, path, 0, size, day)]
        # Byte ranges; the reader applies the line rule at each boundary.
        return [
            FileSplit(self._source, kind, path, start, min(start + self._target, size), day)
            for start in range(0, size, self._target)
        ]

    def _row_group_splits(self, path: str, day: date | None) -> list[FileSplit]:
        """Row-group ranges ``[start, end)`` of about the target size, from the footer.

        A Parquet split's offsets are row indices while its bounds are row-group indices; a
        range may start at group k only where the file's first row of group k is >= k, so a
        fresh split's resume offset (k) can never be mistaken for a row inside it (only
        files with empty row groups ever violate this; such groups join the range before).
        """
        import pyarrow.parquet as pq  # only discovery of large Parquet files needs it

        with self._root.open(path) as file:  # the footer of the file that was checked
            metadata = pq.ParquetFile(file).metadata
        starts: list[int] = [0]
        first_row = bytes_in_range = 0
        for group in range(metadata.num_row_groups):
            if group > 0 and bytes_in_range >= self._target and first_row >= group:
                starts.append(group)
                bytes_in_range = 0
            row_group = metadata.row_group(group)
            bytes_in_range += row_group.total_byte_size
            first_row += row_group.num_rows
        ends: list[int | None] = [*starts[1:], None]
        return [
            FileSplit(self._source, "parquet", path, start, end, day)
            for start, end in zip(starts, ends, strict=True)
        ]


class StaticFileEnumerator(_FileEnumerator):
    """Bounded: lists the landing folder once (only ``dates`` if given). For backfills."""

    def __init__(
        self,
        engine: Engine,
        source: str,
        landing: Path,
        *,
        dates: Sequence[date] | None = None,
        lease_seconds: float = 60.0,
        target_split_bytes: int = 128 << 20,
        partitioned: bool = True,
        follow_symlinks: bool = False,
    ) -> None:
        super().__init__(
            engine,
            source,
            landing,
            lease_seconds=lease_seconds,
            target_split_bytes=target_split_bytes,
            partitioned=partitioned,
            follow_symlinks=follow_symlinks,
        )
        self._dates = frozenset(dates) if dates is not None else None

    def discover(self) -> DiscoveryResult:
        found: list[FileSplit] = []
        seen = 0
        for path, kind, day, size, _mtime in self._files(self._dates):
            seen += 1
            found.extend(self._splits_of(path, kind, day, size))
        registered = self._store.register(found)
        return DiscoveryResult(
            seen,
            registered,
            {},
            skipped_links=len(self._skipped),
            skipped_names=len(self._bad_names),
        )


class ContinuousFileEnumerator(_FileEnumerator):
    """Continuous: each ``discover()`` registers the files that appeared since the last tick.

    The cursor is bounded: a modification-time watermark plus the paths seen inside the last
    ``lookback_seconds`` before it — never the set of every path ever seen (Flink's FileSource
    runs out of memory that way). Files older than the window are assumed known; landing files
    must be written under a hidden name and renamed into place (immutable once visible).
    Registration is idempotent, so a file seen twice is still registered once.

    A tick registers at most ``max_files_per_tick`` new files (None: no cap): the oldest ones
    in (mtime, path) order. The cursor then describes exactly that prefix of the order, so the
    next tick continues at the first file not taken (see :meth:`discover`), and
    ``DiscoveryResult.backlog_files`` says how many were left.
    """

    def __init__(
        self,
        engine: Engine,
        source: str,
        landing: Path,
        *,
        lease_seconds: float = 60.0,
        lookback_seconds: float = 600.0,
        target_split_bytes: int = 128 << 20,
        max_files_per_tick: int | None = None,
        partitioned: bool = True,
        follow_symlinks: bool = False,
    ) -> None:
        super().__init__(
            engine,
            source,
            landing,
            lease_seconds=lease_seconds,
            target_split_bytes=target_split_bytes,
            partitioned=partitioned,
            follow_symlinks=follow_symlinks,
        )
        if max_files_per_tick is not None and max_files_per_tick < 1:
            raise ValueError("max_files_per_tick must be positive (or None: no cap)")
        self._lookback = lookback_seconds
        self._max_files = max_files_per_tick

    def cursor(self) -> dict[str, Any]:
        return self._load_cursor({"mtime_watermark": None, "recent_paths": []})

    def discover(self) -> DiscoveryResult:
        """One tick: register the unknown files (at most ``max_files_per_tick``, oldest first).

        Why a capped tick neither skips nor repeats a file: the candidates (files inside the
        window and not among the cursor's recent paths) are taken in (mtime, path) order, a
        total order, so what is taken is a prefix ending at some position P and what is left
        (the backlog) lies strictly after P. The new cursor is computed as if the listing held
        only the known files and the prefix: its watermark W' is the newest of those mtimes
        and its recent paths are those of them with mtime >= W' - lookback. A backlog file is
        after P, so its mtime is >= W' whenever W' moved (and >= the old horizon otherwise),
        and it is not a recent path: the next tick sees it as a candidate again, in the same
        order. Every taken file is either a recent path of the new cursor or older than its
        horizon, so it is never a candidate again. Files sharing P's mtime are split by path
        and the ones taken are recent paths, so a chunk boundary inside one mtime is exact.
        """
        cursor = self.cursor()
        watermark: float | None = cursor["mtime_watermark"]
        known = set(cursor["recent_paths"])
        horizon = float("-inf") if watermark is None else watermark - self._lookback
        window: dict[str, float] = {}  # known files modified inside the lookback window
        candidates: list[
            tuple[float, str, str, date | None, int]
        ] = []  # mtime, path, kind, day, size
        seen = 0
        for path, kind, day, size, mtime in self._files(None):
            seen += 1
            if mtime < horizon:
                continue  # older than the window: known since an earlier tick
            if path in known:
                window[path] = mtime
            else:
                candidates.append((mtime, path, kind, day, size))
        backlog = 0
        if self._max_files is not None and len(candidates) > self._max_files:
            backlog = len(candidates) - self._max_files
            # Paths are unique, so tuples never compare past (mtime, path): the total order.
            candidates = heapq.nsmallest(self._max_files, candidates)
        else:
            candidates.sort()  # registration (and split id) order follows the same order
        fresh: list[FileSplit] = []
        for mtime, path, kind, day, size in candidates:
            fresh.extend(self._splits_of(path, kind, day, size))
            window[path] = mtime
        added = self._store.register(fresh)
        if window:
            newest = max(window.values())
            watermark = newest if watermark is None else max(watermark, newest)
        keep_after = float("-inf") if watermark is None else watermark - self._lookback
        # Only paths inside the window are remembered: the cursor stays bounded.
        recent = sorted(path for path, mtime in window.items() if mtime >= keep_after)
        new_cursor: dict[str, Any] = {"mtime_watermark": watermark, "recent_paths": recent}
        if backlog:
            # Informational (the two keys above alone decide what the next tick takes).
            last_mtime, last_path = candidates[-1][:2]
            new_cursor["backlog_files"] = backlog
            new_cursor["resume_after"] = [last_mtime, last_path]
        self._save_cursor(new_cursor)
        return DiscoveryResult(
            seen,
            added,
            new_cursor,
            backlog_files=backlog,
            skipped_links=len(self._skipped),
            skipped_names=len(self._bad_names),
        )
