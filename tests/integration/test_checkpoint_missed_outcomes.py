"""A completion the coordinator did not hear of must not hang the run (real Postgres).

The fault that hung ``test_lakehouse_exactly_once_under_kills[orders-delta]``: Postgres
crashed while checkpoint 2 was being published — after its transaction committed, under the
Delta commit's table lock — so the unlock raised a database error out of the completion.
The coordinator lost the completion with it: the subtask whose final snapshot it carried had
ended, yet stayed an open channel, so every later checkpoint waited for it, timed out after
``SLUICE_CHECKPOINT_TIMEOUT_SECONDS`` and was triggered again, forever (checkpoints 3-12
"timeout: 1 of 2 subtasks acked" in that run's database). A commit whose acknowledgement is
lost (Postgres crashing at COMMIT) has the same effect without any publish.

Here the sink's publish raises what the unlock raised, and the completion's result is thrown
away after its commit; each time the other subtask alone must complete the next checkpoint
well within the checkpoint timeout, and the output must be published once, in order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from checkpoint_harness import RecordingSink, Run, forget_recorded, status, wait_until

from enumerator_service import CheckpointStore, PublishFailed, Settings, StagedTransaction
from enumerator_service._operations import Platform, open_platform

#: Long enough that no checkpoint times out while a test waits (the hang's symptom is a
#: checkpoint that only ever ends by timing out).
TIMEOUT = 30.0


@pytest.fixture
def platform(make_settings: Any) -> Iterator[Platform]:
    settings: Settings = make_settings()
    p = open_platform(settings)
    yield p
    forget_recorded(p)
    p.close()


def _crashed() -> sa.exc.OperationalError:
    """What SQLAlchemy raises when Postgres went away under a statement."""
    return sa.exc.OperationalError(
        "SELECT pg_advisory_unlock(hashtextextended(%(key)s, 0))",
        {},
        Exception("server closed the connection unexpectedly"),
    )


class FailingSink(RecordingSink):
    """Its first publish raises ``error`` (after recording the attempt)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error: BaseException | None = error

    def publish(self, txns: Sequence[StagedTransaction]) -> None:
        super().publish(txns)
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def _published(run: Run) -> list[tuple[int, int, bool, bool]]:
    return [(t.checkpoint_id, t.subtask, t.committed, t.published) for t in run.txns()]


def test_a_publish_failing_after_the_commit_still_closes_the_final_subtask(
    platform: Platform,
) -> None:
    run, sink = Run(platform), FailingSink(_crashed())
    coordinator = run.coordinator(sink, interval=0.05, timeout=TIMEOUT)
    try:
        wait_until(lambda: status(platform, run.run_id, 1) == "PENDING")
        run.ack(1, 0, offset=10)
        run.ack(1, 1, offset=1000, finished=True, final=True)
        wait_until(lambda: status(platform, run.run_id, 1) == "COMPLETED")
        wait_until(lambda: status(platform, run.run_id, 2) == "PENDING")
        run.ack(2, 0, offset=20)  # subtask 1 ended with checkpoint 1: subtask 0 alone
        wait_until(lambda: status(platform, run.run_id, 2) == "COMPLETED")
    finally:
        coordinator.stop()
    assert coordinator.error is None and coordinator.stats.aborted == []
    completed = coordinator.stats.completed
    assert [(c.checkpoint_id, c.final_subtasks) for c in completed[:2]] == [(1, (1,)), (2, ())]
    # Checkpoint 1's output goes with checkpoint 2's: a committer skips what is below the
    # largest checkpoint id its table has, so publishing it after 2 would lose it.
    assert [e for e in sink.events if e[0] == "publish"] == [
        ("publish", [1, 1]),
        ("publish", [1, 1, 2]),
    ]
    assert _published(run) == [(1, 0, True, True), (1, 1, True, True), (2, 0, True, True)]


def test_a_commit_whose_outcome_was_lost_still_closes_the_final_subtask(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = CheckpointStore.complete
    lost: list[int] = []

    def complete(self: CheckpointStore, checkpoint_id: int, *, two_phase: bool) -> Any:
        done = real(self, checkpoint_id, two_phase=two_phase)
        if not lost:  # committed, but the coordinator hears only that the connection broke
            lost.append(checkpoint_id)
            raise _crashed()
        return done

    monkeypatch.setattr(CheckpointStore, "complete", complete)
    run, sink = Run(platform), RecordingSink()
    coordinator = run.coordinator(sink, interval=0.05, timeout=TIMEOUT)
    try:
        wait_until(lambda: status(platform, run.run_id, 1) == "PENDING")
        run.ack(1, 0, offset=10)
        run.ack(1, 1, offset=1000, finished=True, final=True)
        wait_until(lambda: status(platform, run.run_id, 2) == "PENDING")
        run.ack(2, 0, offset=20)
        wait_until(lambda: status(platform, run.run_id, 2) == "COMPLETED")
    finally:
        coordinator.stop()
    assert lost == [1]
    assert coordinator.error is None and coordinator.stats.aborted == []
    assert coordinator.stats.completed[0].checkpoint_id == 2
    assert _published(run) == [(1, 0, True, True), (1, 1, True, True), (2, 0, True, True)]


def test_a_publish_refused_after_the_commit_fails_the_run_with_its_cause(
    platform: Platform,
) -> None:
    run, sink = Run(platform), FailingSink(RuntimeError("the table refused the commit"))
    coordinator = run.coordinator(sink, interval=0.05, timeout=TIMEOUT)
    try:
        wait_until(lambda: status(platform, run.run_id, 1) == "PENDING")
        run.ack(1, 0, offset=10)
        run.ack(1, 1, offset=1000, finished=True, final=True)
        wait_until(lambda: not coordinator.is_alive())
    finally:
        coordinator.stop()
    assert isinstance(coordinator.error, RuntimeError)
    assert str(coordinator.error) == "the table refused the commit"
    assert [c.checkpoint_id for c in coordinator.stats.completed] == [1]
    # Committed, not published: the next recovery publishes it.
    assert _published(run) == [(1, 0, True, False), (1, 1, True, False)]


def test_the_store_hands_over_a_completion_whose_publish_failed(platform: Platform) -> None:
    run, sink = Run(platform), FailingSink(_crashed())
    store = CheckpointStore(platform.engine, run.run_id, {sink.name: sink})
    store.trigger(1)
    run.ack(1, 0, offset=10)
    run.ack(1, 1, offset=1000, finished=True, final=True)
    with pytest.raises(PublishFailed) as failed:
        store.complete(1, two_phase=True)
    assert isinstance(failed.value.cause, sa.exc.OperationalError)
    done = failed.value.completed
    assert (done.checkpoint_id, done.final_subtasks, done.rows) == (1, (1,), 20)
    assert status(platform, run.run_id, 1) == "COMPLETED"
    store.trigger(2)
    run.ack(2, 0, offset=20)
    assert store.complete(2, two_phase=True) is not None
    assert sink.events[-1] == ("publish", [1, 1, 2])
    assert _published(run) == [(1, 0, True, True), (1, 1, True, True), (2, 0, True, True)]
