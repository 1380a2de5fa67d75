"""Checkpoint recovery and the staged-output helpers the checkpoint store shares with it:
publish output committed in Postgres but not yet published, abort checkpoints and staged
output of runs that died (or ended) with them in progress.

Threading: every function blocks on the database and on the sinks; call from the
coordinator, the driver, or a sensor — never from a mailbox thread.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service._checkpoint_commit import StagedTransaction, TransactionalSink
from enumerator_service._schema import (
    ACTIVE_SPLIT,
    CheckpointStatus,
    checkpoints,
    sink_transactions,
    splits,
)

# The underscored helpers are shared with _checkpoint_store only.
__all__ = ["AbortCause", "abort_runs", "publish_committed", "recover"]

_log = logging.getLogger(__name__)


class AbortCause(StrEnum):
    """Why a checkpoint was given up (the start of ``checkpoints.reason``)."""

    #: Not every open subtask acknowledged it within the checkpoint timeout.
    TIMEOUT = "timeout"
    #: An acknowledgement came from a task attempt that has been superseded.
    FENCED = "fenced"
    #: Its run ended before it completed.
    RUN_ENDED = "run ended"
    #: Its run died (recovery of a later run found it pending).
    RUN_DIED = "run died"


def _staged(rows: Iterable[Any]) -> list[StagedTransaction]:
    return [
        StagedTransaction(
            r.id, r.run_id, r.subtask, r.attempt, r.checkpoint_id, r.sink, r.staged, r.row_count
        )
        for r in rows
    ]


def _by_sink(
    sinks: Mapping[str, TransactionalSink], txns: Sequence[StagedTransaction]
) -> Iterable[tuple[TransactionalSink, list[StagedTransaction]]]:
    for name in sorted({t.sink for t in txns}):
        sink = sinks.get(name)
        if sink is None:
            raise LookupError(f"no sink registered for staged output of kind {name!r}")
        yield sink, [t for t in txns if t.sink == name]


def _mark_published(engine: Engine, txns: Sequence[StagedTransaction]) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.update(sink_transactions)
            .where(sink_transactions.c.id.in_([t.id for t in txns]))
            .values(published=True, published_at=sa.func.now())
        )


def _abort_staged(
    engine: Engine, sinks: Mapping[str, TransactionalSink], txns: Sequence[StagedTransaction]
) -> None:
    for sink, group in _by_sink(sinks, txns):
        sink.abort(group)
    with engine.begin() as conn:
        conn.execute(
            sa.delete(sink_transactions).where(
                sink_transactions.c.id.in_([t.id for t in txns]),
                sa.not_(sink_transactions.c.committed),
            )
        )


def abort_runs(
    engine: Engine,
    sinks: Mapping[str, TransactionalSink],
    run_ids: Sequence[str],
    cause: AbortCause,
) -> int:
    if not run_ids:
        return 0
    with engine.begin() as conn:
        conn.execute(
            sa.update(checkpoints)
            .where(
                checkpoints.c.run_id.in_(run_ids), checkpoints.c.status == CheckpointStatus.PENDING
            )
            .values(status=CheckpointStatus.ABORTED, reason=cause.value, completed_at=sa.func.now())
        )
        leftover = _staged(
            conn.execute(
                sa.select(sink_transactions).where(
                    sink_transactions.c.run_id.in_(run_ids),
                    sa.not_(sink_transactions.c.committed),
                )
            ).all()
        )
    if leftover:
        _abort_staged(engine, sinks, leftover)
    return len(leftover)


def recover(engine: Engine, sinks: Mapping[str, TransactionalSink]) -> tuple[int, int]:
    """Finish what crashed runs left: publish output committed in Postgres but not yet
    published, then abort checkpoints and staged output of runs that hold no split any more.

    Returns (published, aborted) transaction counts. Run it after expired leases were
    released, so that a dead run holds no split.
    """
    published = publish_committed(engine, sinks)
    with engine.connect() as conn:
        live = sa.select(splits.c.run_id).where(
            splits.c.status.in_(ACTIVE_SPLIT), splits.c.run_id.is_not(None)
        )
        dead_runs = sorted(
            set(
                conn.execute(
                    sa.select(checkpoints.c.run_id).where(
                        checkpoints.c.status == CheckpointStatus.PENDING,
                        checkpoints.c.run_id.not_in(live),
                    )
                ).scalars()
            )
            | set(
                conn.execute(
                    sa.select(sink_transactions.c.run_id).where(
                        sa.not_(sink_transactions.c.committed),
                        sink_transactions.c.run_id.not_in(live),
                    )
                ).scalars()
            )
        )
    aborted = abort_runs(engine, sinks, dead_runs, AbortCause.RUN_DIED)
    if published or aborted:
        _log.info("recovery: published %d, aborted %d", published, aborted)
    return published, aborted


def publish_committed(engine: Engine, sinks: Mapping[str, TransactionalSink]) -> int:
    """Publish every sink transaction committed in Postgres but not yet published (after a
    crash between a checkpoint's completion and its publication); idempotent. Returns how
    many there were."""
    with engine.connect() as conn:
        unpublished = _staged(
            conn.execute(
                sa.select(sink_transactions).where(
                    sink_transactions.c.committed, sa.not_(sink_transactions.c.published)
                )
            ).all()
        )
    if unpublished:
        for sink, group in _by_sink(sinks, unpublished):
            sink.publish(group)
        _mark_published(engine, unpublished)
    return len(unpublished)
