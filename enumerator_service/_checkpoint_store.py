"""Checkpoints in Postgres: trigger, acknowledge, complete (the commit phase of the two-phase
commit) and abort; recovery of runs that died with checkpoints in progress is in
``_checkpoint_recovery`` (re-exported here).

Protocol (EXACTLY_ONCE):

1. The coordinator inserts checkpoint *n* as PENDING and notifies the run's subtasks
   (``CHECKPOINT_CHANNEL``; the notification is sent when the insert commits).
2. Each subtask snapshots on its mailbox thread, pre-commits its sink (staged output, durable,
   invisible) and acknowledges in one transaction: the ``sink_transactions`` row of its staged
   output and the ``checkpoint_acks`` row with its split states.
3. When every open subtask acknowledged, :meth:`CheckpointStore.complete` commits everything in
   one transaction and then publishes the staged output (idempotent), together with any of
   the run's earlier committed output whose publication failed: a table committer skips what
   its log already has up to the largest checkpoint id, so earlier output published after a
   later checkpoint's would be lost. When the work after the commit fails (Postgres restarting
   under the publish, a table refusing the commit), ``PublishFailed`` carries the completion:
   the checkpoint IS committed, and the coordinator must count it (its final subtasks ended).

A subtask's staged output commits with the first completed checkpoint >= its own that the same
*attempt* acknowledged, so the output of an aborted checkpoint rolls into the next one; output
of an attempt that was superseded (a retried task restored an earlier state) is aborted.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from enumerator_service._bookkeeping import CheckpointHistory, prune_checkpoints

# Re-exported: the protocol's shared half lives in _checkpoint_commit.
from enumerator_service._checkpoint_commit import (
    CHECKPOINT_CHANNEL,
    COORDINATOR_CHANNEL,
    Acknowledgement,
    StagedTransaction,
    TransactionalSink,
    acknowledge,
    apply_split_states,
    encode_dead_letters,
    insert_dead_letters,
)
from enumerator_service._checkpoint_recovery import (
    AbortCause,
    _abort_staged,
    _by_sink,
    _mark_published,
    _staged,
    abort_runs,
    publish_committed,
    recover,
)
from enumerator_service._completeness import (
    NO_WATERMARK,
    PartitionCompletion,
    add_partition_counts,
    complete_partitions,
    merge_partition_counts,
    record_run_watermark,
)
from enumerator_service._run_watermark import run_watermark_of
from enumerator_service._schema import (
    CheckpointStatus,
    checkpoint_acks,
    checkpoints,
    sink_transactions,
)
from enumerator_service._secrets import redact_text
from enumerator_service._split_store import SplitStore
from enumerator_service._task_watermarks import committed_acks

__all__ = [
    "CHECKPOINT_CHANNEL",
    "COORDINATOR_CHANNEL",
    "AbortCause",
    "Acknowledgement",
    "CheckpointStore",
    "CompletedCheckpoint",
    "PublishFailed",
    "StagedTransaction",
    "TransactionalSink",
    "acknowledge",
    "apply_split_states",
    "encode_dead_letters",
    "insert_dead_letters",
    "publish_committed",
    "recover",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CompletedCheckpoint:
    checkpoint_id: int
    subtasks: int
    final_subtasks: tuple[int, ...]
    rows: int
    splits_completed: int
    #: Seconds from trigger to completion, and from the first to the last acknowledgement.
    duration: float
    alignment: float
    #: The run watermark after it (END_OF_INPUT / NO_WATERMARK for +/-infinity).
    watermark: datetime = NO_WATERMARK
    #: The output partitions it completed (recorded in its transaction).
    completions: tuple[PartitionCompletion, ...] = ()


class PublishFailed(Exception):
    """The checkpoint committed in Postgres, the work after it failed (``cause``): its output
    stays committed and unpublished until the run's next completion or a recovery publishes
    it. ``completed`` is the completion, to be counted as if nothing had failed."""

    def __init__(self, completed: CompletedCheckpoint, cause: BaseException) -> None:
        super().__init__(f"checkpoint {completed.checkpoint_id} committed, not published: {cause}")
        self.completed = completed
        self.cause = cause


class CheckpointStore:
    """The checkpoints of one run. Blocking: call from the coordinator thread.

    ``history_seconds``: after each completion, delete the bookkeeping of this run's
    checkpoints older than that which nothing reads any more (``_bookkeeping``); None keeps
    everything.
    """

    def __init__(
        self,
        engine: Engine,
        run_id: str,
        sinks: Mapping[str, TransactionalSink],
        *,
        source: str | None = None,
        history_seconds: float | None = None,
    ) -> None:
        self._engine = engine
        self._run_id = run_id
        self._sinks = sinks
        self._source = source
        self._history = None if history_seconds is None else CheckpointHistory(history_seconds)

    def _notify(self, conn: Connection, checkpoint_id: int, event: str) -> None:
        payload = json.dumps({"run": self._run_id, "id": checkpoint_id, "event": event})
        conn.execute(sa.select(sa.func.pg_notify(CHECKPOINT_CHANNEL, payload)))

    def trigger(self, checkpoint_id: int) -> None:
        with self._engine.begin() as conn:
            conn.execute(
                sa.insert(checkpoints).values(
                    run_id=self._run_id, checkpoint_id=checkpoint_id, source=self._source
                )
            )
            self._notify(conn, checkpoint_id, "trigger")

    def acks(self, checkpoint_id: int) -> list[tuple[int, bool]]:
        """(subtask, final) of every acknowledgement of the checkpoint so far."""
        with self._engine.connect() as conn:
            rows = conn.execute(
                sa.select(checkpoint_acks.c.subtask, checkpoint_acks.c.final).where(
                    checkpoint_acks.c.run_id == self._run_id,
                    checkpoint_acks.c.checkpoint_id == checkpoint_id,
                )
            ).all()
        return [(int(subtask), bool(final)) for subtask, final in rows]

    def abort(self, checkpoint_id: int, cause: AbortCause, detail: str = "") -> None:
        """PENDING → ABORTED. Staged output stays: it commits with a later checkpoint."""
        reason = f"{cause.value}: {detail}" if detail else cause.value
        with self._engine.begin() as conn:
            updated = conn.execute(
                sa.update(checkpoints)
                .where(
                    checkpoints.c.run_id == self._run_id,
                    checkpoints.c.checkpoint_id == checkpoint_id,
                    checkpoints.c.status == CheckpointStatus.PENDING,
                )
                .values(
                    status=CheckpointStatus.ABORTED, reason=reason[:500], completed_at=sa.func.now()
                )
            ).rowcount
            if updated:
                self._notify(conn, checkpoint_id, "abort")
        if updated and self._history is not None:
            self._history.ended(checkpoint_id, time.monotonic(), completed=False)

    def complete(self, checkpoint_id: int, *, two_phase: bool) -> CompletedCheckpoint | None:
        """Commit checkpoint ``checkpoint_id``; None if it is no longer PENDING.

        With ``two_phase`` (EXACTLY_ONCE) the split states and the staged sink output of the
        acknowledging attempts commit here, atomically; without it (AT_LEAST_ONCE) every
        subtask committed its own snapshot when it acknowledged. Raises FencedError (nothing
        committed) when an acknowledgement comes from an attempt that lost its splits, and
        PublishFailed (committed, with the completion) when the work after the commit fails.
        """
        run_id = self._run_id
        with self._engine.begin() as conn:
            # Step 1: only a PENDING checkpoint completes; the row lock orders us against
            # a concurrent abort and makes a repeated completion a no-op.
            row = conn.execute(
                sa.select(checkpoints.c.status, checkpoints.c.triggered_at)
                .where(
                    checkpoints.c.run_id == run_id,
                    checkpoints.c.checkpoint_id == checkpoint_id,
                )
                .with_for_update()
            ).one_or_none()
            if row is None or row.status != CheckpointStatus.PENDING:
                return None
            # Step 2: the acknowledgements (one per subtask: the latest attempt's).
            acks = conn.execute(
                sa.select(checkpoint_acks).where(
                    checkpoint_acks.c.run_id == run_id,
                    checkpoint_acks.c.checkpoint_id == checkpoint_id,
                )
            ).all()
            rows = splits_completed = 0
            superseded: list[StagedTransaction] = []
            committed: list[StagedTransaction] = []
            unpublished: list[StagedTransaction] = []
            if two_phase:
                # Step 3: split states, fenced by the epochs the snapshots were taken under.
                for ack in acks:
                    splits_completed += apply_split_states(
                        conn, run_id, ack.snapshot["splits"], skip_fenced=False
                    )
                # Step 4: the staged output of each acknowledging attempt up to n commits;
                # that of other attempts of the same subtasks can never commit.
                attempts = {ack.subtask: ack.attempt for ack in acks}
                staged = _staged(
                    conn.execute(
                        sa.select(sink_transactions).where(
                            sink_transactions.c.run_id == run_id,
                            sink_transactions.c.checkpoint_id <= checkpoint_id,
                            sa.not_(sink_transactions.c.committed),
                            sink_transactions.c.subtask.in_(list(attempts)),
                        )
                    ).all()
                )
                committed = [t for t in staged if attempts[t.subtask] == t.attempt]
                superseded = [t for t in staged if attempts[t.subtask] != t.attempt]
                # Step 4b: output of earlier checkpoints whose publication failed goes with
                # this one (never after it: a committer skips versions below its log's).
                unpublished = _staged(
                    conn.execute(
                        sa.select(sink_transactions).where(
                            sink_transactions.c.run_id == run_id,
                            sink_transactions.c.committed,
                            sa.not_(sink_transactions.c.published),
                        )
                    ).all()
                )
                for sink, group in _by_sink(self._sinks, committed):
                    sink.commit(conn, group)
                if committed:
                    ids = [t.id for t in committed]
                    counts: dict[str, dict[str, int]] = {}
                    for dead, partitions in conn.execute(
                        sa.select(
                            sink_transactions.c.dead_letters, sink_transactions.c.partition_counts
                        ).where(sink_transactions.c.id.in_(ids))
                    ).all():
                        insert_dead_letters(conn, run_id, dead)
                        merge_partition_counts(counts, partitions)
                    if counts and self._source is not None:
                        add_partition_counts(conn, self._source, counts)
                    conn.execute(
                        sa.update(sink_transactions)
                        .where(sink_transactions.c.id.in_(ids))
                        .values(committed=True, committed_at=sa.func.now())
                    )
                rows = sum(t.row_count for t in committed)
            # Step 5: enumerator bookkeeping — this checkpoint captures every hand-out no
            # earlier checkpoint has (SplitAssignmentTracker.snapshot_state).
            SplitStore.mark_snapshotted(conn, run_id, checkpoint_id)
            # Step 5b: the run watermark, and the partitions it completes (in this
            # transaction: a completion exists exactly when its checkpoint does).
            watermark = run_watermark_of(conn, run_id, ((a.snapshot, a.final) for a in acks))
            completions: list[PartitionCompletion] = []
            if self._source is not None:
                watermark = record_run_watermark(
                    conn, run_id, self._source, checkpoint_id, watermark
                )
                completions = complete_partitions(
                    conn,
                    source=self._source,
                    run_id=run_id,
                    checkpoint_id=checkpoint_id,
                    watermark=watermark,
                )
            # Step 6: COMPLETED; the subtasks hear of it when this transaction commits.
            completed_at = conn.execute(
                sa.update(checkpoints)
                .where(
                    checkpoints.c.run_id == run_id,
                    checkpoints.c.checkpoint_id == checkpoint_id,
                )
                .values(status=CheckpointStatus.COMPLETED, completed_at=sa.func.now())
                .returning(checkpoints.c.completed_at)
            ).scalar_one()
            self._notify(conn, checkpoint_id, "complete")
        ack_times = [ack.acked_at for ack in acks]
        done = CompletedCheckpoint(
            checkpoint_id=checkpoint_id,
            subtasks=len(acks),
            final_subtasks=tuple(sorted(ack.subtask for ack in acks if ack.final)),
            rows=rows,
            splits_completed=splits_completed,
            duration=(completed_at - row.triggered_at).total_seconds(),
            alignment=(max(ack_times) - min(ack_times)).total_seconds() if ack_times else 0.0,
            watermark=watermark,
            completions=tuple(completions),
        )
        if self._history is not None:
            self._history.ended(checkpoint_id, time.monotonic(), completed=True)
        try:
            self._after_commit(unpublished + committed, superseded)
        except Exception as exc:
            raise PublishFailed(done, exc) from exc
        return done

    def _after_commit(
        self, committed: list[StagedTransaction], superseded: list[StagedTransaction]
    ) -> None:
        """Steps 7-9 of a completion, after its transaction committed."""
        # Step 7: publish (idempotent; recovery repeats it if we die before marking it).
        if committed:
            for sink, group in _by_sink(self._sinks, committed):
                sink.publish(group)
            _mark_published(self._engine, committed)
        # Step 8: superseded attempts' staged output is deleted.
        if superseded:
            _abort_staged(self._engine, self._sinks, superseded)
        # Step 9: old bookkeeping goes (after the commit: never part of its transaction).
        if self._history is not None:
            self._prune(self._history)

    def prune_ended(self) -> None:
        """At the end of the run: prune what expired since the last (batched) prune."""
        if self._history is not None:
            self._prune(self._history, final=True)

    def _prune(self, history: CheckpointHistory, *, final: bool = False) -> None:
        due = history.due(time.monotonic(), final=final)
        if not due:
            return
        try:
            history.pruned(due, prune_checkpoints(self._engine, self._run_id, due))
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            # Best effort: the checkpoint is committed; a later completion looks at them again.
            history.pruned(due, set())
            _log.warning(
                "pruning old checkpoints of run %s failed: %s", self._run_id, redact_text(str(exc))
            )

    def finished(self, subtask: int) -> bool:
        """Whether a completed checkpoint of this run carries ``subtask``'s final snapshot: the
        subtask's work is committed, and a retried attempt of it has nothing left to do."""
        with self._engine.connect() as conn:
            found = conn.execute(
                committed_acks(self._run_id, subtask, sa.literal(1))
                .where(checkpoint_acks.c.final)
                .limit(1)
            ).first()
        return found is not None

    def abort_uncommitted(self) -> int:
        """At the end of the run: abort pending checkpoints and delete staged output left."""
        return abort_runs(self._engine, self._sinks, [self._run_id], AbortCause.RUN_ENDED)
