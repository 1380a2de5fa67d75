"""The driver's side services of a run: the lease heartbeat, progress, staging cleanup and
the totals read back from Postgres."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from enumerator_service import (
    ACTIVE_SPLIT,
    Location,
    SplitStatus,
    SplitStore,
    dead_letters,
    sink_transactions,
    splits,
)
from spark_jobs.sink._object_store import remove_folder, subfolders

__all__ = ["Heartbeat", "RunTotals", "clean_staging", "run_progress", "run_totals"]

_log = logging.getLogger(__name__)
Progress = Callable[[int, int], None]


class Heartbeat(threading.Thread):
    """Renews the run's leases and reports progress until stopped; a long-running reader
    also finishes rebuilds whose last members it completed (``finish_rebuilds``)."""

    def __init__(
        self,
        store: SplitStore,
        engine: sa.Engine,
        run_id: str,
        lease: float,
        progress: Progress | None,
        finish_rebuilds: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(name="sluice-heartbeat", daemon=True)
        self._store, self._engine, self._run_id = store, engine, run_id
        self._lease, self._progress = lease, progress
        self._finish_rebuilds = finish_rebuilds
        self._stop_event = threading.Event()

    def run(self) -> None:
        last_renewal = last_finish = time.monotonic()
        while not self._stop_event.wait(0.5):
            try:
                if time.monotonic() - last_renewal >= self._lease / 3:
                    self._store.heartbeat_run(self._run_id, self._lease)
                    last_renewal = time.monotonic()
                # A long-running reader may complete a rebuild's last members (its own run
                # died): swap it in without waiting for the reader to end.
                if self._finish_rebuilds is not None and time.monotonic() - last_finish >= 10:
                    last_finish = time.monotonic()
                    self._finish_rebuilds()
                if self._progress is not None:
                    self._progress(*run_progress(self._engine, self._run_id))
            except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
                # Postgres restarting: renew on the next beat (a lease is lease/3 ahead).
                _log.warning("lease heartbeat failed: %s", exc)
            except Exception:
                # Never let a failed swap stop the lease renewals; the next call retries it.
                _log.exception("finishing partition rebuilds failed")

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)


def run_progress(engine: sa.Engine, run_id: str) -> tuple[int, int]:
    """(splits completed, splits held) of the run."""
    with engine.connect() as conn:
        done, total = conn.execute(
            sa.select(
                sa.func.count().filter(splits.c.status == SplitStatus.COMPLETED), sa.func.count()
            ).where(splits.c.run_id == run_id)
        ).one()
    return int(done), int(total)


def clean_staging(engine: sa.Engine, staging: Path | Location) -> None:
    """Delete staged files of runs that hold no split any more (aborted pre-commits); a
    local folder or an object-store prefix."""
    if isinstance(staging, Location):
        if not staging.object_store:
            staging = staging.local_path
        else:
            runs = subfolders(staging)
            if runs:
                live_runs = _live_runs(engine)
                for name in runs:
                    if name not in live_runs:
                        remove_folder(staging.child(name))
            return
    if not staging.is_dir():
        return
    live = _live_runs(engine)
    for folder in staging.iterdir():
        if folder.is_dir() and folder.name not in live:
            shutil.rmtree(folder, ignore_errors=True)


def _live_runs(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        live = set(
            conn.execute(
                sa.select(splits.c.run_id).where(splits.c.status.in_(ACTIVE_SPLIT)).distinct()
            ).scalars()
        )
    return live


@dataclass(frozen=True, slots=True)
class RunTotals:
    splits: int
    rows: int
    dropped: int
    dead_letters: int
    #: Of ``dropped``: records of other days a rebuild re-read and left as first written.
    other_days: int = 0


def other_days_of(table: sa.Table) -> sa.ColumnElement[int]:
    """A transaction's records of other days left by a rebuild (``DETAIL["other_days"]``)."""
    counts = table.c.partition_counts
    return sa.func.coalesce(counts["detail"]["other_days"].as_integer(), 0)


def run_totals(engine: sa.Engine, run_id: str) -> RunTotals:
    """Splits completed, rows committed, records dropped and dead letters of the run."""
    with engine.connect() as conn:
        rows, dropped, other_days = conn.execute(
            sa.select(
                sa.func.coalesce(sa.func.sum(sink_transactions.c.row_count), 0),
                sa.func.coalesce(sa.func.sum(sink_transactions.c.dropped_count), 0),
                sa.func.coalesce(sa.func.sum(other_days_of(sink_transactions)), 0),
            ).where(sink_transactions.c.run_id == run_id, sink_transactions.c.committed)
        ).one()
        done = conn.execute(
            sa.select(sa.func.count()).where(
                splits.c.run_id == run_id, splits.c.status == SplitStatus.COMPLETED
            )
        ).scalar_one()
        dead = conn.execute(
            sa.select(sa.func.count()).where(dead_letters.c.run_id == run_id)
        ).scalar_one()
    return RunTotals(int(done), int(rows), int(dropped), int(dead), int(other_days))
