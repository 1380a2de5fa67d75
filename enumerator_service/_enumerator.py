"""FLIP-27 work discovery: split enumerators over landing folders.

Discovery is separate from reading: an enumerator finds files, registers their splits in the
split store, and hands splits to the reader subtasks that ask for them (pull-based, so idle
readers take more work). Every enumerator works bounded (``StaticFileEnumerator``: lists once,
optionally only some dates — backfills) and continuous (``ContinuousFileEnumerator``: each
``discover()`` is one tick, resumed from a bounded cursor persisted in ``enumerator_state``);
the file enumerators are in ``_file_enumerators``.

Threading: methods block on Postgres and the file system; the enumerator is owned by one
thread (the Dagster sensor tick, or the job driver).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine

from enumerator_service._schema import enumerator_state
from enumerator_service._split_store import SplitStore
from enumerator_service._splits import SplitAssignment

__all__ = ["DiscoveryResult", "SplitEnumerator"]


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
    #: Files changed within the settle time (still being written): left for a later tick.
    unsettled_files: int = 0
    #: Known files whose identity changed (replaced, re-created, grown): registered as a new
    #: version, quarantined (policy ``refuse``) or to be read whole (``reprocess``).
    changed_files: int = 0
    #: Data files skipped because their names are not UTF-8.
    skipped_names: int = 0
    #: One line each, for a person: why a tick registered less than one might expect (a
    #: day with no message in its time range, day splits registered before). Printed by
    #: ``sluice discover``; never secrets.
    notes: tuple[str, ...] = ()
    #: What ``files_seen`` counts, plural: files, or an enumerator's own inputs (a Kafka
    #: topic's partitions, a CDC source's chunks or stream, a table's key ranges).
    seen_unit: str = "files"

    @property
    def seen(self) -> str:
        """``files_seen`` for a person: "12 files seen", "1 stream seen"."""
        unit = self.seen_unit if self.files_seen != 1 else self.seen_unit.removesuffix("s")
        return f"{self.files_seen:,} {unit} seen"

    @property
    def of_files(self) -> bool:
        """The tick listed files (the file-only counts mean something)."""
        return self.seen_unit == "files"

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

    def load_cursor(self, empty: dict[str, Any]) -> dict[str, Any]:
        """The discovery cursor persisted in ``enumerator_state`` (``empty`` before any)."""
        return self._load_cursor(empty)

    def save_cursor(self, cursor: dict[str, Any], conn: sa.Connection | None = None) -> None:
        """Persist the discovery cursor (a small JSON value: bounded state); in ``conn``'s
        transaction when given (with the split changes it describes)."""
        self._save_cursor(cursor, conn)

    def _load_cursor(self, empty: dict[str, Any]) -> dict[str, Any]:
        stmt = sa.select(enumerator_state.c.cursor).where(enumerator_state.c.source == self._source)
        with self._engine.connect() as conn:
            cursor = conn.execute(stmt).scalar()
        return dict(cursor) if cursor else empty

    def _save_cursor(self, cursor: dict[str, Any], conn: sa.Connection | None = None) -> None:
        stmt = insert(enumerator_state).values(source=self._source, cursor=cursor)
        stmt = stmt.on_conflict_do_update(
            index_elements=["source"], set_={"cursor": cursor, "updated_at": sa.func.now()}
        )
        if conn is not None:
            conn.execute(stmt)
            return
        with self._engine.begin() as own:
            own.execute(stmt)

    def _require_run(self) -> str:
        if self._run_id is None:
            raise RuntimeError("the enumerator serves no run: call start(run_id) first")
        return self._run_id
