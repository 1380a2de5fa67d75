"""Deleting checkpoint bookkeeping that nothing reads any more, so it stays bounded.

Each checkpoint leaves a ``checkpoints`` row and one ``checkpoint_acks`` row per subtask (its
snapshot: a few KB); a continuous run checkpointing every 5 s would grow them without bound.

* :func:`prune_checkpoints` (after completions, batched, and at the run's end): deletes the run's
  checkpoints older than its second-to-last completed one that ended more than
  ``history_seconds`` ago (recent ones are kept for whoever debugs a run), as
  :class:`CheckpointHistory` picks them. It keeps what the readers of these tables still
  need:

  - every PENDING checkpoint (recovery aborts them; subtasks acknowledge them);
  - the last two completed ones and anything newer (restore starts from the last; the live
    state's rows per second spans the last two);
  - each subtask's latest acknowledgement in a completed checkpoint, and its latest one
    carrying a sink watermark, with their checkpoint rows: ``CheckpointStore.finished``
    (a finished subtask acknowledges no later checkpoint) and ``committed_task_watermark``
    (a retried attempt resumes it) read exactly these.

  Nothing else reads old acknowledgements: split progress is committed into ``splits``,
  staged output is in ``sink_transactions`` (never touched here: an uncommitted transaction
  commits with a later checkpoint, and committed ones are the output ledger that
  ``sluice status`` and Dagster's counts read), counts are in ``partition_stats``.
  Each call looks only at what expired since the previous one and at the few rows kept
  before, by primary key and through ``ix_checkpoint_acks_run_id_subtask_checkpoint_id``;
  a completion between two batches runs no statement at all.

* :func:`prune_finished_runs` (at each driver start): deletes the checkpoints,
  acknowledgements and ``run_watermarks`` row of runs that are over (no pending checkpoint,
  no split in their hands, no uncommitted output) and had no checkpoint for
  ``retention_hours``; in bounded batches, so a start after a long time does not stall.

Threading: blocking; any thread (statements are idempotent and safe to run concurrently).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Engine

__all__ = [
    "CheckpointHistory",
    "PrunedRuns",
    "prune_checkpoints",
    "prune_finished_runs",
    "run_id_used",
]

_log = logging.getLogger(__name__)

# A later acknowledgement of the same subtask in a completed checkpoint (:watermark: one that
# carries a sink watermark) supersedes ``a`` for the readers.
_NEWER = """
    EXISTS (
        SELECT 1 FROM sluice.checkpoint_acks AS n
        JOIN sluice.checkpoints AS nc
          ON nc.run_id = n.run_id AND nc.checkpoint_id = n.checkpoint_id
        WHERE n.run_id = a.run_id AND n.subtask = a.subtask
          AND n.checkpoint_id > a.checkpoint_id AND nc.status = 'COMPLETED' {watermark}
    )
"""
_PRUNE_ACKS = sa.text(
    f"""
    DELETE FROM sluice.checkpoint_acks AS a
    USING sluice.checkpoints AS c
    WHERE a.run_id = :run AND a.checkpoint_id = ANY(:ids)
      AND c.run_id = a.run_id AND c.checkpoint_id = a.checkpoint_id AND c.status <> 'PENDING'
      AND (
          c.status <> 'COMPLETED'
          OR (
              {_NEWER.format(watermark="")}
              AND (
                  a.snapshot ->> 'watermark' IS NULL
                  OR {_NEWER.format(watermark="AND n.snapshot ->> 'watermark' IS NOT NULL")}
              )
          )
      )
    """
)
# Checkpoint rows left without acknowledgements (the kept ones still have theirs).
_PRUNE_CHECKPOINTS = sa.text(
    """
    DELETE FROM sluice.checkpoints AS c
    WHERE c.run_id = :run AND c.checkpoint_id = ANY(:ids) AND c.status <> 'PENDING'
      AND NOT EXISTS (
          SELECT 1 FROM sluice.checkpoint_acks AS a
          WHERE a.run_id = c.run_id AND a.checkpoint_id = c.checkpoint_id
      )
    RETURNING c.checkpoint_id
    """
)


def prune_checkpoints(engine: Engine, run_id: str, ids: Sequence[int]) -> set[int]:
    """Delete what nothing reads any more of ``run_id``'s checkpoints ``ids`` (ended ones, not
    among its last two completed; see the module docstring): the checkpoints whose rows went.
    """
    params = {"run": run_id, "ids": list(ids)}
    with engine.begin() as conn:
        conn.execute(_PRUNE_ACKS, params)
        return {int(n) for n in conn.execute(_PRUNE_CHECKPOINTS, params).scalars()}


class CheckpointHistory:
    """Which of a run's checkpoints :func:`prune_checkpoints` should look at, known from
    the coordinator's own completions and aborts (no query): those that ended more than
    ``history_seconds`` ago below the run's second-to-last completed checkpoint, and those
    an earlier prune kept (a later acknowledgement may have superseded them since).

    Pruning is batched: at most once per ``max(1, min(60, history_seconds / 5))`` seconds
    (one transaction for a dozen checkpoints at the default 5 s interval and 300 s history),
    and once more when the run ends (``final``).

    Threading: the coordinator's thread only.
    """

    def __init__(self, history_seconds: float) -> None:
        self._history = history_seconds
        self._every = max(1.0, min(60.0, history_seconds / 5))
        self._last = float("-inf")
        self._ended: deque[tuple[int, float]] = deque()  # (checkpoint id, ended at), in order
        self._completed: deque[int] = deque(maxlen=2)
        self._kept: set[int] = set()

    def ended(self, checkpoint_id: int, at: float, *, completed: bool) -> None:
        self._ended.append((checkpoint_id, at))
        if completed:
            self._completed.append(checkpoint_id)

    def due(self, now: float, *, final: bool = False) -> list[int]:
        """The checkpoints to prune now, forgotten here but for those :meth:`pruned` keeps;
        [] when nothing new expired or the last prune is too recent (unless ``final``)."""
        if len(self._completed) < 2 or (not final and now - self._last < self._every):
            return []
        below = min(self._completed)
        due = set(self._kept)
        while self._ended:
            checkpoint_id, at = self._ended[0]
            if checkpoint_id >= below or now - at < self._history:
                break  # ids grow with time: every later one is as recent
            due.add(self._ended.popleft()[0])
        if len(due) == len(self._kept):
            return []
        self._last = now
        return sorted(due)

    def pruned(self, due: Sequence[int], deleted: set[int]) -> None:
        """What a prune of ``due`` deleted; the rest is looked at again next time."""
        self._kept = set(due) - deleted


# Runs over and quiet for :hours: every checkpoint of theirs ended before the cutoff, none is
# pending, no split is in their hands and none of their output waits for a commit.
_FINISHED_RUNS = sa.text(
    """
    WITH quiet AS (
        SELECT run_id FROM sluice.checkpoints
        GROUP BY run_id
        HAVING max(COALESCE(completed_at, triggered_at))
                   < now() - :hours * interval '1 hour'
           AND bool_and(status <> 'PENDING')
        UNION
        SELECT run_id FROM sluice.run_watermarks
        WHERE updated_at < now() - :hours * interval '1 hour'
    )
    SELECT q.run_id FROM quiet AS q
    WHERE NOT EXISTS (
              SELECT 1 FROM sluice.checkpoints AS c
              WHERE c.run_id = q.run_id
                AND (c.status = 'PENDING'
                     OR COALESCE(c.completed_at, c.triggered_at)
                        >= now() - :hours * interval '1 hour')
          )
      AND NOT EXISTS (
              SELECT 1 FROM sluice.splits AS s
              WHERE s.run_id = q.run_id AND s.status IN ('ASSIGNED', 'READING')
          )
      AND NOT EXISTS (
              SELECT 1 FROM sluice.sink_transactions AS t
              WHERE t.run_id = q.run_id AND NOT t.committed
          )
    ORDER BY q.run_id
    LIMIT :runs
    """
)
# One batch of a run's checkpoints (their acknowledgements go with them: ON DELETE CASCADE).
_DROP_CHECKPOINTS = sa.text(
    """
    DELETE FROM sluice.checkpoints AS c
    WHERE (c.run_id, c.checkpoint_id) IN (
        SELECT run_id, checkpoint_id FROM sluice.checkpoints
        WHERE run_id = ANY(:runs) LIMIT :batch
    )
    """
)
_DROP_WATERMARKS = sa.text("DELETE FROM sluice.run_watermarks WHERE run_id = ANY(:runs)")


@dataclass(frozen=True, slots=True)
class PrunedRuns:
    runs: int
    checkpoints: int
    #: False when the batch budget ran out: the next start continues.
    complete: bool


def prune_finished_runs(
    engine: Engine,
    *,
    retention_hours: float,
    max_runs: int = 1000,
    batch: int = 5000,
    max_batches: int = 20,
) -> PrunedRuns:
    """Delete the checkpoint bookkeeping of runs over for ``retention_hours`` (see the
    module docstring): at most ``max_batches`` deletes of ``batch`` checkpoints each.

    Best effort: a database error (a concurrent start pruning the same rows: a deadlock) is
    logged and the next start prunes what this one could not.
    """
    try:
        return _prune_finished_runs(engine, retention_hours, max_runs, batch, max_batches)
    except sa.exc.OperationalError as exc:
        _log.warning("the bookkeeping of finished runs was not pruned now: %s", exc.orig)
        return PrunedRuns(0, 0, False)


def _prune_finished_runs(
    engine: Engine, retention_hours: float, max_runs: int, batch: int, max_batches: int
) -> PrunedRuns:
    with engine.connect() as conn:
        runs = list(
            conn.execute(
                _FINISHED_RUNS, {"hours": float(retention_hours), "runs": max_runs}
            ).scalars()
        )
    if not runs:
        return PrunedRuns(0, 0, True)
    deleted = 0
    for _ in range(max_batches):
        with engine.begin() as conn:
            n = conn.execute(_DROP_CHECKPOINTS, {"runs": runs, "batch": batch}).rowcount
        deleted += n
        if n < batch:
            break
    else:
        _log.info("pruned %d checkpoints of finished runs; the rest at the next start", deleted)
        return PrunedRuns(len(runs), deleted, False)
    with engine.begin() as conn:
        conn.execute(_DROP_WATERMARKS, {"runs": runs})
    _log.info("pruned the bookkeeping of %d finished run(s): %d checkpoints", len(runs), deleted)
    return PrunedRuns(len(runs), deleted, True)


# A run id names one run: every table that keys state by it.
_RUN_ID_USED = sa.text(
    """
    SELECT EXISTS (SELECT 1 FROM sluice.checkpoints WHERE run_id = :run)
        OR EXISTS (SELECT 1 FROM sluice.run_watermarks WHERE run_id = :run)
        OR EXISTS (SELECT 1 FROM sluice.sink_transactions WHERE run_id = :run)
    """
)


def run_id_used(engine: Engine, run_id: str) -> bool:
    """Whether an earlier run left state under ``run_id`` (checkpoints, its watermark,
    staged output). A run reusing the id would read that state as its own — an earlier
    run's COMPLETED checkpoint or finished watermark taken for its own, its output never
    committed — so the driver refuses it before anything moves. (Splits assigned to the id
    are not such state: the continuous sensor assigns splits to a run before it starts.)"""
    with engine.connect() as conn:
        return bool(conn.execute(_RUN_ID_USED, {"run": run_id}).scalar_one())
