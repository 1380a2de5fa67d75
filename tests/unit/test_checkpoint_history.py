"""Which checkpoints a run's pruning looks at (``CheckpointHistory``; a fake clock)."""

from __future__ import annotations

from enumerator_service._bookkeeping import CheckpointHistory


def _ended(history: CheckpointHistory, ids: range, at: float, aborted: set[int]) -> None:
    for n in ids:
        history.ended(n, at, completed=n not in aborted)


def test_nothing_is_due_before_two_checkpoints_completed() -> None:
    history = CheckpointHistory(0)
    history.ended(1, 0.0, completed=True)
    history.ended(2, 0.0, completed=False)
    assert history.due(100.0, final=True) == []


def test_the_last_two_completed_and_the_recent_ones_are_never_due() -> None:
    history = CheckpointHistory(60)
    _ended(history, range(1, 11), 0.0, aborted={10})  # the last two completed: 8 and 9
    _ended(history, range(11, 13), 50.0, aborted=set())  # now the last two: 11 and 12
    assert history.due(59.0) == []  # none ended 60 s ago yet
    assert history.due(61.0, final=True) == list(range(1, 11))  # 10 aborted, below 11
    assert history.due(200.0, final=True) == []  # 11 and 12 are the last two completed


def test_prunes_are_batched_except_the_final_one() -> None:
    history = CheckpointHistory(300)  # at most one prune per 60 s
    _ended(history, range(1, 4), 0.0, aborted=set())
    assert history.due(300.0) == [1]
    history.pruned([1], {1})
    history.ended(4, 301.0, completed=True)
    assert history.due(330.0) == []  # 2 expired, but the last prune was 30 s ago
    assert history.due(330.0, final=True) == [2]


def test_what_a_prune_kept_is_looked_at_again_with_the_next_expired_ones() -> None:
    history = CheckpointHistory(0)
    _ended(history, range(1, 5), 0.0, aborted=set())
    assert history.due(10.0) == [1, 2]
    history.pruned([1, 2], {2})  # 1 holds a finished subtask's final acknowledgement
    assert history.due(10.5, final=True) == []  # nothing new expired: no statement for 1 alone
    history.ended(5, 11.0, completed=True)
    assert history.due(10.9) == []  # within a second of the last prune
    assert history.due(12.0) == [1, 3]
