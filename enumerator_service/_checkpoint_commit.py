"""The commit side of checkpoints shared by subtasks and the coordinator: what a subtask
acknowledges (its snapshot and staged output), and the statements that make a snapshot
durable — split states under fencing epochs and dead letters.

Threading: every function blocks on the database; call from a writer or coordinator thread.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Connection, Engine

from enumerator_service._completeness import add_partition_counts
from enumerator_service._schema import SplitStatus, checkpoint_acks, sink_transactions, splits
from enumerator_service._split_store import FencedError

__all__ = [
    "CHECKPOINT_CHANNEL",
    "COORDINATOR_CHANNEL",
    "Acknowledgement",
    "StagedTransaction",
    "TransactionalSink",
    "acknowledge",
    "apply_split_states",
    "encode_dead_letters",
    "insert_dead_letters",
]

#: Coordinator → subtasks: ``{"run": …, "id": n, "event": "trigger" | "complete" | "abort"}``.
CHECKPOINT_CHANNEL = "sluice_checkpoint"
#: Subtasks → coordinator: ``{"run": …, "event": "ack" | "request", "subtask": k}``.
COORDINATOR_CHANNEL = "sluice_coordinator"


@dataclass(frozen=True, slots=True)
class StagedTransaction:
    """One pre-committed piece of sink output (a ``sink_transactions`` row)."""

    id: int
    run_id: str
    subtask: int
    attempt: str
    checkpoint_id: int
    sink: str
    staged: Any
    row_count: int


class TransactionalSink(Protocol):
    """The commit side of a two-phase-commit sink, run by the coordinator (or recovery)."""

    #: The value of ``sink_transactions.sink`` this sink owns.
    name: str

    def commit(self, conn: Connection, txns: Sequence[StagedTransaction]) -> None:
        """Inside the completion transaction: make what must commit atomically visible."""

    def publish(self, txns: Sequence[StagedTransaction]) -> None:
        """After the completion transaction: publish committed output. Idempotent."""

    def abort(self, txns: Sequence[StagedTransaction]) -> None:
        """Delete staged output that will never commit. Idempotent."""


def encode_dead_letters(dead: Iterable[tuple[int, int, bytes, str]]) -> list[dict[str, Any]]:
    """JSON form of rejected input (split id, offset, raw bytes ≤ 4 KiB, reason)."""
    return [
        {
            "split_id": split_id,
            "offset": offset,
            "raw": base64.b64encode(raw[:4096]).decode(),
            "reason": reason,
        }
        for split_id, offset, raw, reason in dead
    ]


# A line is recorded once per split, offset and ordinal (its place among the dead letters of
# that split and offset in this acknowledgement, in their order: one block's, so a replay
# numbers them alike). Re-rejected by a partition rebuild, it is re-tagged with the rebuild
# (and run), so the rebuild's swap keeps it and deletes only the earlier generation's dead
# letters that the rebuild no longer produced.
_INSERT_DEAD_LETTERS = sa.text(
    """
    INSERT INTO sluice.dead_letters
        (split_id, source, uri, "offset", "ordinal", raw, reason, run_id, rebuild_id)
    SELECT s.id, s.source, s.uri, d."offset",
           row_number() OVER (PARTITION BY s.id, d."offset" ORDER BY d.n) - 1,
           decode(d.raw, 'base64'), d.reason, :run_id, s.rebuild_id
    FROM ROWS FROM (
             jsonb_to_recordset(CAST(:dead AS jsonb))
             AS (split_id bigint, "offset" bigint, raw text, reason text)
         ) WITH ORDINALITY AS d(split_id, "offset", raw, reason, n)
    JOIN sluice.splits AS s ON s.id = d.split_id
    ON CONFLICT (split_id, "offset", "ordinal") DO UPDATE
    SET run_id = EXCLUDED.run_id, rebuild_id = EXCLUDED.rebuild_id, reason = EXCLUDED.reason
    WHERE dead_letters.rebuild_id IS DISTINCT FROM EXCLUDED.rebuild_id
    """
)


def insert_dead_letters(conn: Connection, run_id: str, dead: Sequence[Any]) -> None:
    if dead:
        conn.execute(_INSERT_DEAD_LETTERS, {"run_id": run_id, "dead": json.dumps(list(dead))})


def apply_split_states(
    conn: Connection, run_id: str, states: Sequence[Mapping[str, Any]], *, skip_fenced: bool
) -> int:
    """Commit split states (offset, watermark, pending inputs) under their fencing epochs.

    A finished split with nothing pending becomes COMPLETED; a ``failed`` one counts a failed
    attempt (see :func:`_commit_failure`). A state whose epoch is stale raises FencedError, or
    is skipped with ``skip_fenced`` (AT_LEAST_ONCE). Returns how many splits completed.
    """
    completed = 0
    for state in states:
        if state.get("failed") and state["finished"]:
            if not _commit_failure(conn, run_id, state) and not skip_fenced:
                raise _stale(run_id, state)
            continue
        finished = bool(state["finished"]) and not state["pending"]
        values: dict[str, Any] = _progress(state)
        if finished:
            values.update(
                status=SplitStatus.COMPLETED, lease_expires_at=None, completed_at=sa.func.now()
            )
        result = conn.execute(
            sa.update(splits)
            .where(
                splits.c.id == state["id"],
                splits.c.epoch == state["epoch"],
                splits.c.run_id == run_id,
                # COMPLETED too: a snapshot taken before the subtask heard that the split's
                # final state was committed carries that same state again (idempotent).
                splits.c.status.in_((SplitStatus.READING, SplitStatus.COMPLETED)),
            )
            .values(**values)
        )
        if result.rowcount != 1:
            if skip_fenced:
                continue
            raise _stale(run_id, state)
        completed += finished
    return completed


def _stale(run_id: str, state: Mapping[str, Any]) -> FencedError:
    return FencedError(
        f"split {state['id']} epoch {state['epoch']} is no longer held by run {run_id}"
    )


def _progress(state: Mapping[str, Any]) -> dict[str, Any]:
    """The columns of a split's committed progress in snapshot ``state``: the resume offset,
    its watermark and the ranges still pending (see ``SplitState``)."""
    watermark = state.get("watermark")
    return {
        "committed_offset": state["offset"],
        "committed_watermark": datetime.fromisoformat(watermark) if watermark else None,
        "pending": state["pending"] or None,
    }


def _commit_failure(conn: Connection, run_id: str, state: Mapping[str, Any]) -> bool:
    """A split attempt that failed on the split's content (see ``spark_jobs.source._poison``).

    Its progress commits (the next attempt resumes at the offset reached: what it emitted is
    in this checkpoint's output) and one failure is counted. Below ``max_attempts`` failures
    the split goes back to the run's pool (ASSIGNED) for another attempt; at
    ``max_attempts`` it is quarantined: FAILED, out of every run until ``sluice retry``.

    Idempotent: a later snapshot taken before the subtask heard of this commit carries the
    same failure again; ``failed_epoch`` recognises it. False when the epoch is stale.
    """
    failed = state["failed"]
    failures = splits.c.failures + 1
    quarantine = failures >= int(failed["max_attempts"])
    result = conn.execute(
        sa.update(splits)
        .where(
            splits.c.id == state["id"],
            splits.c.epoch == state["epoch"],
            splits.c.run_id == run_id,
            splits.c.status == SplitStatus.READING,
        )
        .values(
            **_progress(state),
            failures=failures,
            failure_reason=str(failed["reason"]),
            last_error=str(failed["error"]),
            failed_epoch=state["epoch"],
            failed_at=sa.func.now(),
            status=sa.case(
                (quarantine, sa.literal(SplitStatus.FAILED.value)),
                else_=sa.literal(SplitStatus.ASSIGNED.value),
            ),
            subtask=None,
            assigned_checkpoint=None,
            lease_expires_at=sa.case((quarantine, sa.null()), else_=splits.c.lease_expires_at),
        )
    )
    if result.rowcount == 1:
        return True
    again = conn.execute(
        sa.select(splits.c.id).where(
            splits.c.id == state["id"], splits.c.failed_epoch == state["epoch"]
        )
    ).first()
    return again is not None


@dataclass(frozen=True, slots=True)
class Acknowledgement:
    """One subtask's part of checkpoint ``checkpoint_id`` (task side)."""

    run_id: str
    checkpoint_id: int
    subtask: int
    attempt: str
    final: bool
    #: {"splits": [{"id", "epoch", "offset", "watermark", "finished", "pending"}, …],
    #: "attempt", "watermark", "finished", "stream", "day_end", "idle"}. The top-level
    #: "watermark" is the subtask's sink-side task watermark: the last Watermark marker that
    #: reached its sink before the barrier (ISO-8601 UTC string, e.g.
    #: "2026-01-03T00:00:00+00:00"; null before the first marker; a retried attempt resumes
    #: the committed one). "finished": the
    #: subtask's input ended and everything was emitted (it then counts as +infinity, like
    #: a closed channel — unless "stream": it read a piece of a stream that goes on, a
    #: bounded run's Kafka or slot offsets; it then closes at the watermark it reached,
    #: not +infinity; "day_end": the end of the latest day of the Kafka day splits it read,
    #: which it reached). "idle": no active split (none held, or every one idle) and nothing
    #: in the operator chain: like Flink's idle watermark status, it does not hold the run's
    #: watermark back (and when every open subtask is idle, the greatest "watermark" any of
    #: them reached is the run's: ``_run_watermark``). A split's "watermark" is that split's
    #: own (what ``splits.committed_watermark`` stores and a restore resumes).
    snapshot: Mapping[str, Any]
    sink: str
    staged: Any
    row_count: int
    dead_letters: Sequence[Any]
    #: Records the pipeline's steps removed in the interval (counted, never stored).
    dropped: int = 0
    #: The split source (pipeline) the subtask reads.
    source: str | None = None
    #: The interval's counts per output partition (an event day):
    #: ``{"YYYY-MM-DD": {"rows": n, "dead_letters": n, "late_records": n,
    #: "foreign_rows": n}}`` (a missing counter is 0), and optionally ``DETAIL`` (see
    #: ``_completeness``); they reach ``partition_stats`` when the output commits. None: not
    #: reported.
    partitions: Mapping[str, Mapping[str, Any]] | None = None

    @property
    def has_output(self) -> bool:
        return (
            bool(self.staged)
            or bool(self.dead_letters)
            or self.dropped > 0
            or bool(self.partitions)
        )


def acknowledge(
    engine: Engine,
    ack: Acknowledgement,
    *,
    two_phase: bool,
    sink: TransactionalSink | None = None,
) -> None:
    """Record a subtask's snapshot and staged output in one transaction, and tell the
    coordinator.

    EXACTLY_ONCE (``two_phase``): nothing becomes visible; the coordinator commits it when
    the checkpoint completes. AT_LEAST_ONCE: the caller has already published the output; the
    split states and dead letters commit here (stale epochs skipped), so a crash before this
    commits replays — duplicates, never losses. With ``sink`` (AT_LEAST_ONCE only) its
    ``commit`` runs in this transaction too: a table sink's rows become visible atomically
    with this subtask's split states.
    """
    with engine.begin() as conn:
        txn_id = None
        if ack.has_output:
            txn_id = conn.execute(
                insert(sink_transactions)
                .values(
                    run_id=ack.run_id,
                    source=ack.source,
                    subtask=ack.subtask,
                    attempt=ack.attempt,
                    checkpoint_id=ack.checkpoint_id,
                    sink=ack.sink,
                    staged=ack.staged,
                    row_count=ack.row_count,
                    dropped_count=ack.dropped,
                    dead_letters=list(ack.dead_letters),
                    partition_counts=(
                        {day: dict(counts) for day, counts in ack.partitions.items()}
                        if ack.partitions
                        else None
                    ),
                    committed=not two_phase,
                    published=not two_phase,
                    committed_at=None if two_phase else sa.func.now(),
                    published_at=None if two_phase else sa.func.now(),
                )
                .on_conflict_do_nothing()
                .returning(sink_transactions.c.id)
            ).scalar_one_or_none()
        if not two_phase and sink is not None and txn_id is not None:
            txn = StagedTransaction(
                txn_id,
                ack.run_id,
                ack.subtask,
                ack.attempt,
                ack.checkpoint_id,
                ack.sink,
                ack.staged,
                ack.row_count,
            )
            sink.commit(conn, [txn])
        if not two_phase:
            apply_split_states(conn, ack.run_id, ack.snapshot["splits"], skip_fenced=True)
            insert_dead_letters(conn, ack.run_id, ack.dead_letters)
            # Counted once: a replayed acknowledgement inserts no transaction (txn_id None).
            if txn_id is not None and ack.partitions and ack.source is not None:
                add_partition_counts(conn, ack.source, ack.partitions)
        values = {"attempt": ack.attempt, "final": ack.final, "snapshot": dict(ack.snapshot)}
        conn.execute(
            insert(checkpoint_acks)
            .values(
                run_id=ack.run_id, checkpoint_id=ack.checkpoint_id, subtask=ack.subtask, **values
            )
            # A retried attempt acknowledging the same checkpoint replaces its predecessor.
            .on_conflict_do_update(
                index_elements=["run_id", "checkpoint_id", "subtask"],
                set_={**values, "acked_at": sa.func.now()},
            )
        )
        payload = json.dumps({"run": ack.run_id, "event": "ack", "subtask": ack.subtask})
        conn.execute(sa.select(sa.func.pg_notify(COORDINATOR_CHANNEL, payload)))
