"""FLIP-27 work discovery: split enumerators over landing folders.

Discovery is separate from reading: an enumerator lists files, registers one split per file in
the split store, and hands splits to readers that ask for them. Every enumerator works bounded
(``dates`` given: a backfill lists those dates once) and continuous (each ``discover()`` call is
one tick, resumed from a bounded cursor persisted in ``enumerator_state``).
"""

from __future__ import annotations

import abc
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine

from enumerator_service._schema import enumerator_state
from enumerator_service._split_store import SplitStore
from enumerator_service._splits import FileSplit, SplitAssignment

__all__ = ["DiscoveryResult", "FileSplitEnumerator", "SplitEnumerator"]

_PARTITION_DIR = re.compile(r"^dt=(\d{4}-\d{2}-\d{2})$")
_KINDS = {".jsonl": "jsonl", ".json": "jsonl"}


@dataclass(frozen=True, slots=True)
class DiscoveryResult:
    """What one discovery tick found."""

    files_seen: int
    splits_registered: int
    cursor: dict[str, Any]


class SplitEnumerator(abc.ABC):
    """Discovers splits and hands them to reader subtasks on request (pull-based)."""

    @abc.abstractmethod
    def discover(self) -> DiscoveryResult:
        """Run one discovery tick: find new splits and register them. Blocks on I/O."""

    @abc.abstractmethod
    def handle_split_request(self, run_id: str, subtask: int) -> SplitAssignment | None:
        """The next split for ``subtask`` of ``run_id``, or None when there is none."""

    @abc.abstractmethod
    def add_splits_back(self, run_id: str) -> int:
        """Return the run's uncommitted splits to the pool (after a failure)."""

    @abc.abstractmethod
    def snapshot_state(self) -> dict[str, Any]:
        """The enumerator's own state (its discovery cursor) as JSON."""


class FileSplitEnumerator(SplitEnumerator):
    """One split per JSON Lines file under ``<landing>/dt=YYYY-MM-DD/``.

    The continuous cursor is bounded: a modification-time watermark plus the paths seen inside
    the last ``lookback_seconds`` before it — never the set of every path ever seen (Flink's
    FileSource runs out of memory that way). Files older than the window are assumed known;
    registration is idempotent, so a file seen twice is still registered once.
    """

    def __init__(
        self,
        engine: Engine,
        source: str,
        landing: Path,
        *,
        lease_seconds: float = 60.0,
        lookback_seconds: float = 600.0,
        dates: Sequence[date] | None = None,
    ) -> None:
        self._engine = engine
        self._store = SplitStore(engine)
        self._source = source
        self._landing = landing
        self._lease = lease_seconds
        self._lookback = lookback_seconds
        self._dates = frozenset(dates) if dates is not None else None

    @property
    def store(self) -> SplitStore:
        return self._store

    def _list(self) -> Iterator[tuple[FileSplit, float]]:
        with os.scandir(self._landing) as partitions:
            for entry in partitions:
                match = _PARTITION_DIR.match(entry.name)
                if not match or not entry.is_dir():
                    continue
                day = date.fromisoformat(match.group(1))
                if self._dates is not None and day not in self._dates:
                    continue
                with os.scandir(entry.path) as files:
                    for file in files:
                        kind = _KINDS.get(os.path.splitext(file.name)[1])
                        if kind is None or file.name.startswith((".", "_")) or not file.is_file():
                            continue
                        stat = file.stat()
                        split = FileSplit(
                            source=self._source,
                            kind=kind,
                            path=os.path.abspath(file.path),
                            start=0,
                            end=stat.st_size,
                            partition_key=day,
                        )
                        yield split, stat.st_mtime

    def _load_cursor(self) -> dict[str, Any]:
        stmt = sa.select(enumerator_state.c.cursor).where(enumerator_state.c.source == self._source)
        with self._engine.connect() as conn:
            cursor = conn.execute(stmt).scalar()
        return dict(cursor) if cursor else {"mtime_watermark": None, "recent_paths": []}

    def _save_cursor(self, cursor: dict[str, Any]) -> None:
        stmt = insert(enumerator_state).values(source=self._source, cursor=cursor)
        stmt = stmt.on_conflict_do_update(
            index_elements=["source"], set_={"cursor": cursor, "updated_at": sa.func.now()}
        )
        with self._engine.begin() as conn:
            conn.execute(stmt)

    def discover(self) -> DiscoveryResult:
        if self._dates is not None:
            # Bounded (backfill) listing: every file of the requested dates, no cursor.
            found = [split for split, _ in self._list()]
            added = self._store.register(found)
            return DiscoveryResult(len(found), added, self.snapshot_state())

        cursor = self._load_cursor()
        watermark: float | None = cursor["mtime_watermark"]
        known = set(cursor["recent_paths"])
        horizon = float("-inf") if watermark is None else watermark - self._lookback
        fresh: list[FileSplit] = []
        window: dict[str, float] = {}  # files modified inside the lookback window
        seen = 0
        for split, mtime in self._list():
            seen += 1
            if mtime < horizon:
                continue  # older than the window: known since an earlier tick
            window[split.path] = mtime
            if split.path not in known:
                fresh.append(split)
        added = self._store.register(fresh)
        if window:
            watermark = (
                max(window.values()) if watermark is None else max(watermark, *window.values())
            )
        assert watermark is None or isinstance(watermark, float)
        keep_after = float("-inf") if watermark is None else watermark - self._lookback
        # Only paths inside the window are remembered: the cursor stays bounded.
        recent = sorted(path for path, mtime in window.items() if mtime >= keep_after)
        new_cursor = {"mtime_watermark": watermark, "recent_paths": recent}
        self._save_cursor(new_cursor)
        return DiscoveryResult(seen, added, new_cursor)

    def handle_split_request(self, run_id: str, subtask: int) -> SplitAssignment | None:
        return self._store.pull_next(run_id, subtask, self._lease)

    def add_splits_back(self, run_id: str) -> int:
        return self._store.release_run(run_id)

    def snapshot_state(self) -> dict[str, Any]:
        return self._load_cursor()
