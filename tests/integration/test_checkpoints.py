"""The checkpoint coordinator and the completion protocol on a real Postgres.

Subtasks are played by the test: they acknowledge through the same ``acknowledge()`` the
reader tasks use, so trigger (NOTIFY + row), alignment over subtasks, the one-transaction
completion, aborts, roll-over of aborted output, fencing and recovery are exercised for real.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from checkpoint_harness import RecordingSink, Run, forget_recorded, status, wait_until

from enumerator_service import AbortCause, Settings, recover
from enumerator_service._checkpoint_store import COORDINATOR_CHANNEL
from enumerator_service._operations import Platform, open_platform
from enumerator_service._schema import checkpoints, dead_letters, sink_transactions
from spark_jobs.sink import SINKS


@pytest.fixture
def platform(make_settings: Any) -> Iterator[Platform]:
    settings: Settings = make_settings()
    p = open_platform(settings)
    yield p
    forget_recorded(p)
    p.close()


def test_a_checkpoint_acknowledged_by_every_subtask_commits_in_one_transaction(
    platform: Platform,
) -> None:
    run, sink = Run(platform), RecordingSink()
    coordinator = run.coordinator(sink, interval=60)  # only the first, immediate trigger
    try:
        coordinator.request_checkpoint()
        wait_until(lambda: status(platform, run.run_id, 1) == "PENDING")
        run.ack(1, 0, offset=120, pending=[["e1", 7, "2026-01-01T00:00:00+00:00", "click", 1.0]])
        time.sleep(0.3)
        assert status(platform, run.run_id, 1) == "PENDING"  # still aligning: one of two
        assert run.split_row(0).committed_offset is None  # nothing visible before completion
        run.ack(1, 1, offset=1000, finished=True, dead=[(run.held[1].split_id, 5, b"{x", "bad")])
        wait_until(lambda: status(platform, run.run_id, 1) == "COMPLETED")
    finally:
        coordinator.stop()
    first, second = run.split_row(0), run.split_row(1)
    assert (first.status, first.committed_offset, first.assigned_checkpoint) == ("READING", 120, 1)
    assert first.pending == [["e1", 7, "2026-01-01T00:00:00+00:00", "click", 1.0]]
    assert (second.status, second.committed_offset, second.pending) == ("COMPLETED", 1000, None)
    assert [(t.committed, t.published) for t in run.txns()] == [(True, True), (True, True)]
    assert sink.events == [("commit", [1, 1]), ("publish", [1, 1])]
    with platform.engine.connect() as conn:
        letters = conn.execute(
            sa.select(dead_letters.c.reason, dead_letters.c.raw).where(
                dead_letters.c.run_id == run.run_id
            )
        ).all()
    assert [(r.reason, bytes(r.raw)) for r in letters] == [("bad", b"{x")]
    (done,) = coordinator.stats.completed
    assert (done.checkpoint_id, done.subtasks, done.rows) == (1, 2, 20)
    assert done.duration >= done.alignment >= 0.3


def test_a_timed_out_checkpoint_aborts_and_its_output_rolls_into_the_next(
    platform: Platform,
) -> None:
    run, sink = Run(platform), RecordingSink()
    coordinator = run.coordinator(sink, interval=0.05, timeout=0.5)
    try:
        wait_until(lambda: status(platform, run.run_id, 1) == "PENDING")
        run.ack(1, 0, offset=50)  # subtask 1 never acknowledges checkpoint 1
        wait_until(lambda: status(platform, run.run_id, 1) == "ABORTED")
        assert [t.committed for t in run.txns()] == [False]  # staged output is kept
        wait_until(lambda: status(platform, run.run_id, 2) == "PENDING")
        run.ack(2, 0, offset=90)
        run.ack(2, 1, offset=30)
        wait_until(lambda: status(platform, run.run_id, 2) == "COMPLETED")
    finally:
        coordinator.stop()
    aborted = coordinator.stats.aborted[0]
    assert (aborted.checkpoint_id, aborted.cause) == (1, AbortCause.TIMEOUT)
    assert aborted.detail == "1 of 2 subtasks acked"
    # Checkpoint 1's staged output commits with checkpoint 2 (same attempt), not lost.
    assert [(t.checkpoint_id, t.committed) for t in run.txns()] == [
        (1, True),
        (2, True),
        (2, True),
    ]
    assert sink.events[0] == ("commit", [1, 2, 2])
    assert run.split_row(0).committed_offset == 90


def test_an_acknowledgement_from_a_fenced_attempt_aborts_the_checkpoint(
    platform: Platform,
) -> None:
    run, sink = Run(platform), RecordingSink()
    coordinator = run.coordinator(sink, interval=60)
    try:
        coordinator.request_checkpoint()
        wait_until(lambda: status(platform, run.run_id, 1) == "PENDING")
        stale = run.held[0].epoch
        run.store.reclaim(run.run_id, 0, 60)  # a retried attempt took the split over
        run.ack(1, 0, offset=500, epoch=stale)
        run.ack(1, 1, offset=10)
        wait_until(lambda: status(platform, run.run_id, 1) == "ABORTED")
    finally:
        coordinator.stop()
    assert coordinator.stats.aborted[0].cause is AbortCause.FENCED
    assert run.split_row(0).committed_offset is None  # the whole checkpoint rolled back
    assert run.split_row(1).committed_offset is None
    assert sink.events == []


def test_a_final_subtask_is_a_closed_channel_for_later_checkpoints(platform: Platform) -> None:
    run, sink = Run(platform), RecordingSink()
    coordinator = run.coordinator(sink, interval=0.05)
    try:
        wait_until(lambda: status(platform, run.run_id, 1) == "PENDING")
        run.ack(1, 0, offset=10)
        run.ack(1, 1, offset=1000, finished=True, final=True)
        wait_until(lambda: status(platform, run.run_id, 1) == "COMPLETED")
        wait_until(lambda: status(platform, run.run_id, 2) == "PENDING")
        run.ack(2, 0, offset=20)  # subtask 1 has finished: subtask 0 alone completes it
        wait_until(lambda: status(platform, run.run_id, 2) == "COMPLETED")
    finally:
        coordinator.stop()
    assert run.split_row(1).status == "COMPLETED"
    assert [c.final_subtasks for c in coordinator.stats.completed[:2]] == [(1,), ()]


def test_output_of_a_superseded_attempt_is_aborted(platform: Platform) -> None:
    run, sink = Run(platform), RecordingSink()
    coordinator = run.coordinator(sink, interval=60)
    try:
        coordinator.request_checkpoint()
        wait_until(lambda: status(platform, run.run_id, 1) == "PENDING")
        run.ack(1, 0, attempt="old")
        # The attempt died; its successor restored the committed state and acknowledges
        # the same checkpoint (its acknowledgement replaces the predecessor's).
        run.held[0] = run.store.reclaim(run.run_id, 0, 60)[0]
        run.ack(1, 0, attempt="new", offset=70)
        run.ack(1, 1)
        wait_until(lambda: status(platform, run.run_id, 1) == "COMPLETED")
    finally:
        coordinator.stop()
    assert [(t.subtask, t.attempt, t.committed) for t in run.txns()] == [
        (0, "new", True),
        (1, "a1", True),
    ]
    assert ("abort", [1]) in sink.events
    assert run.split_row(0).committed_offset == 70


def test_at_least_once_commits_each_subtask_on_acknowledgement(platform: Platform) -> None:
    run, sink = Run(platform), RecordingSink()
    coordinator = run.coordinator(sink, interval=0.05, exactly_once=False)
    try:
        wait_until(lambda: status(platform, run.run_id, 1) == "PENDING")
        run.ack(1, 0, offset=40, two_phase=False)
        # No alignment wait: subtask 0's state is committed before subtask 1 acknowledges.
        assert run.split_row(0).committed_offset == 40
        run.ack(1, 1, offset=60, two_phase=False)
        wait_until(lambda: status(platform, run.run_id, 1) == "COMPLETED")
    finally:
        coordinator.stop()
    assert all(t.committed and t.published for t in run.txns())
    assert sink.events == []  # the subtasks published their output themselves


def test_interval_zero_triggers_only_on_request(platform: Platform) -> None:
    run, sink = Run(platform), RecordingSink()
    coordinator = run.coordinator(sink, interval=0)
    try:
        time.sleep(0.5)
        assert status(platform, run.run_id, 1) is None
        with platform.engine.begin() as conn:
            payload = f'{{"run": "{run.run_id}", "event": "request", "subtask": 0}}'
            conn.execute(sa.select(sa.func.pg_notify(COORDINATOR_CHANNEL, payload)))
        wait_until(lambda: status(platform, run.run_id, 1) == "PENDING")
    finally:
        coordinator.stop()


def test_recovery_aborts_dead_runs_and_publishes_committed_output(platform: Platform) -> None:
    dead, sink = Run(platform), RecordingSink()
    # A run died mid-checkpoint: checkpoint 1 pending with staged output, splits released.
    with platform.engine.begin() as conn:
        conn.execute(sa.insert(checkpoints).values(run_id=dead.run_id, checkpoint_id=1))
    dead.ack(1, 0)
    dead.store.release_run(dead.run_id)
    # Another run committed checkpoint output but died before publishing it.
    other = Run(platform)
    with platform.engine.begin() as conn:
        conn.execute(sa.insert(checkpoints).values(run_id=other.run_id, checkpoint_id=1))
    other.ack(1, 0, two_phase=True)
    with platform.engine.begin() as conn:
        conn.execute(
            sa.update(sink_transactions)
            .where(sink_transactions.c.run_id == other.run_id)
            .values(committed=True)
        )
    # Other tests' runs share this database: recovery must know their sinks too.
    published, aborted = recover(platform.engine, {**SINKS, sink.name: sink})
    assert published >= 1 and aborted >= 1
    assert status(platform, dead.run_id, 1) == "ABORTED"
    assert dead.txns() == []
    assert [t.published for t in other.txns()] == [True]
    assert status(platform, other.run_id, 1) == "PENDING"  # a live run is left alone


def test_a_finished_split_repeated_in_a_later_snapshot_is_not_fenced(platform: Platform) -> None:
    """A subtask may snapshot again before it hears that the checkpoint carrying a split's
    final state completed: the repeated final state must commit, not abort the checkpoint."""
    run, sink = Run(platform), RecordingSink()
    coordinator = run.coordinator(sink, interval=0.05)
    try:
        wait_until(lambda: status(platform, run.run_id, 1) == "PENDING")
        run.ack(1, 0, offset=10)
        run.ack(1, 1, offset=1000, finished=True)
        wait_until(lambda: status(platform, run.run_id, 1) == "COMPLETED")
        wait_until(lambda: status(platform, run.run_id, 2) == "PENDING")
        run.ack(2, 0, offset=20)
        run.ack(2, 1, offset=1000, finished=True)  # the same final state once more
        wait_until(lambda: status(platform, run.run_id, 2) == "COMPLETED")
    finally:
        coordinator.stop()
    assert coordinator.stats.aborted == []
    assert run.split_row(1).status == "COMPLETED"
    assert run.split_row(0).committed_offset == 20
