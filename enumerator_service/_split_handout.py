"""Level 2 of split assignment: a run's splits handed out to its reader *subtasks*.

The reader side of ``SplitStore``: subtasks pull their next splits lazily with
``SELECT … FOR UPDATE SKIP LOCKED`` (``enumerator_service._split_pull``); every hand-out
bumps the split's fencing epoch, so an earlier attempt holding the same split can never
commit it (``SplitStore.complete`` checks the epoch).

Threading: every method blocks on the database; call them from a fetcher or committer thread,
never from a mailbox thread.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import date
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine, Row

from enumerator_service._file_identity import recorded_identity
from enumerator_service._schema import SplitStatus, splits
from enumerator_service._split_leases import lease
from enumerator_service._split_pull import pull_parameters, pull_statement, waiting_statement
from enumerator_service._splits import (
    STREAM_KINDS,
    TABLE_KINDS,
    FileSplit,
    Split,
    SplitAssignment,
    StreamSplit,
    TableRangeSplit,
)

__all__ = ["SubtaskHandout"]


def _to_assignment(row: Row[tuple[object, ...]]) -> SplitAssignment:
    m = row._mapping
    split: Split
    if m["kind"] in TABLE_KINDS:
        split = TableRangeSplit.from_uri(
            m["source"], m["uri"], m["start_offset"], m["end_offset"], m["kind"]
        )
    elif m["kind"] in STREAM_KINDS:
        split = StreamSplit(
            m["source"], m["kind"], m["uri"], m["start_offset"], m["end_offset"], m["partition_key"]
        )
    else:
        split = FileSplit(
            source=m["source"],
            kind=m["kind"],
            path=m["uri"],
            start=m["start_offset"],
            end=m["end_offset"],
            partition_key=m["partition_key"],
            file=recorded_identity(m),
            version=m["file_version"],
        )
    offset = m["committed_offset"] if m["committed_offset"] is not None else m["start_offset"]
    return SplitAssignment(
        split_id=m["id"],
        split=split,
        epoch=m["epoch"],
        resume_offset=offset,
        pending=tuple(m["pending"] or ()),
        rebuild_id=m["rebuild_id"],
        rebuild_day=m["rebuild_day"],
        rebuild_fresh=m["rebuild_fresh"],
        committed_watermark=m["committed_watermark"],
    )


class SubtaskHandout:
    """The subtask-level part of ``SplitStore`` (thread-safe: one Engine, no other state)."""

    _engine: Engine

    def _claim(self, params: dict[str, object], lease_seconds: float) -> list[Row[Any]]:
        """The rows :func:`pull_statement` claims; [] only when the run has no split left
        for the subtask. SKIP LOCKED also passes over splits that are merely locked right
        now — by the driver's lease heartbeat (it updates every split of the run) or by
        another subtask's pull, which may keep only a prefix of what it locked — and a
        subtask that took that [] for "none left" ended early: a run under load once read
        half its input and ended as if done. So an empty claim is checked against the
        unlocked state and tried again while candidates wait, for at most a lease."""
        quote = self._engine.dialect.identifier_preparer
        claim, waiting = pull_statement(quote), waiting_statement(quote)
        deadline = time.monotonic() + max(lease_seconds, 1.0)
        pause = 0.005
        while True:
            # Each its own implicit transaction (AUTOCOMMIT: no BEGIN/COMMIT round trips).
            with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                rows = list(c.execute(claim, params).fetchall())
                if rows or not c.execute(waiting, params).scalar_one():
                    return rows
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"run {params['run_id']}: its unclaimed splits stayed locked for "
                    f"{lease_seconds:g} s (a stuck transaction on sluice.splits?)"
                )
            time.sleep(pause)  # a heartbeat or a pull commits within milliseconds
            pause = min(pause * 2, 0.2)

    def reclaim(self, run_id: str, subtask: int, lease_seconds: float) -> list[SplitAssignment]:
        """Splits this subtask held in an earlier attempt, re-issued under a new epoch.

        A retried task restores its splits exactly as it would be assigned new ones; the epoch
        bump fences the earlier attempt if it is still alive somewhere.
        """
        stmt = (
            sa.update(splits)
            .where(
                splits.c.run_id == run_id,
                splits.c.subtask == subtask,
                splits.c.status == SplitStatus.READING,
            )
            .values(epoch=splits.c.epoch + 1, lease_expires_at=lease(lease_seconds))
            .returning(*splits.c)
        )
        with self._engine.begin() as conn:
            rows = conn.execute(stmt).fetchall()
        return sorted((_to_assignment(r) for r in rows), key=lambda a: a.split_id)

    def pull_next(self, run_id: str, subtask: int, lease_seconds: float) -> SplitAssignment | None:
        """Hand the next split of the run to ``subtask``; None when the run has none left.

        May block (one database round trip).
        """
        pulled = self.pull_splits(run_id, subtask, lease_seconds, max_splits=1)
        return pulled[0] if pulled else None

    def pull_splits(
        self,
        run_id: str,
        subtask: int,
        lease_seconds: float,
        *,
        max_splits: int,
        max_bytes: int = 0,
        owned_kinds: Sequence[str] = (),
        owners: int = 1,
    ) -> list[SplitAssignment]:
        """Hand the next splits of the run to ``subtask`` in one transaction; [] when none left.

        Splits of ``owned_kinds`` (stream partitions) are handed only to the subtask that
        owns them among ``owners`` (a stable function of the partition's name, Flink's
        owner rule), so each partition has one reader for the whole run and partitions
        found later go to their owner.

        The first split in (partition_key, id) order that no concurrent puller holds is always
        handed out. Up to ``max_splits - 1`` further ones follow only while they are *small*:
        byte ranges of a line file (``jsonl``, ``csv``) whose sizes, the first split's
        included, add up to at most ``max_bytes``. A split of unknown size (a whole gzip or
        Parquet file, a table key range) is handed out only alone, so a batch can never keep
        much work from idle pullers. Every split in the batch gets its own new fencing epoch
        and lease, exactly as one ``pull_next`` each would; the list is in (partition_key, id)
        order. May block (one database round trip).
        """
        params = pull_parameters(
            run_id,
            subtask,
            lease_seconds,
            max_splits=max_splits,
            max_bytes=max_bytes,
            owned_kinds=owned_kinds,
            owners=owners,
        )
        rows = self._claim(params, lease_seconds)
        # RETURNING has no order; NULL partition keys sort last, as in the statement.
        ordered = sorted(
            rows, key=lambda r: (r.partition_key is None, r.partition_key or date.min, r.id)
        )
        return [_to_assignment(row) for row in ordered]
