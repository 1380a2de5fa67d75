"""Flink's SplitAssignmentTrackerTest, ported (same scenarios, same expected splits)."""

from __future__ import annotations

import json

import pytest

from enumerator_service import NO_CHECKPOINT, SplitAssignmentTracker


def splits_assignment(subtasks: int, first: int) -> dict[int, list[str]]:
    """Subtask i gets i + 1 consecutive splits, numbered from ``first`` (Flink's helper)."""
    assignment: dict[int, list[str]] = {}
    split = first
    for subtask in range(subtasks):
        assignment[subtask] = [str(split + i) for i in range(subtask + 1)]
        split += subtask + 1
    return assignment


def test_record_incremental_split_assignment() -> None:
    tracker: SplitAssignmentTracker[str] = SplitAssignmentTracker()
    tracker.record_split_assignment(splits_assignment(3, 0))
    tracker.record_split_assignment(splits_assignment(2, 6))
    current = tracker.current_splits_assignment()
    assert current[0] == ["0", "6"]
    assert current[1] == ["1", "2", "7", "8"]
    assert current[2] == ["3", "4", "5"]


def test_take_snapshot() -> None:
    tracker: SplitAssignmentTracker[str] = SplitAssignmentTracker()
    tracker.record_split_assignment(splits_assignment(3, 0))
    tracker.snapshot_state(123)
    assert tracker.current_splits_assignment() == {0: ["0"], 1: ["1", "2"], 2: ["3", "4", "5"]}
    assert tracker.uncheckpointed_assignments() == {}
    assert tracker.assignments_by_checkpoint_id(123) == {
        0: ["0"],
        1: ["1", "2"],
        2: ["3", "4", "5"],
    }


def test_restore_round_trips_through_json() -> None:
    tracker: SplitAssignmentTracker[str] = SplitAssignmentTracker()
    tracker.record_split_assignment(splits_assignment(1, 0))
    state = json.loads(json.dumps(tracker.snapshot_state(123)))
    restored = SplitAssignmentTracker.from_json(state)
    assert restored.current_splits_assignment() == tracker.current_splits_assignment()
    assert restored.assignments_by_checkpoint_id(123) == tracker.assignments_by_checkpoint_id(123)
    assert restored.uncheckpointed_assignments() == tracker.uncheckpointed_assignments()


def test_on_checkpoint_complete_forgets_what_it_covers() -> None:
    tracker: SplitAssignmentTracker[str] = SplitAssignmentTracker()
    tracker.record_split_assignment(splits_assignment(2, 0))
    tracker.snapshot_state(100)
    tracker.record_split_assignment(splits_assignment(2, 3))
    tracker.snapshot_state(101)
    assert tracker.assignments_by_checkpoint_id(100) == {0: ["0"], 1: ["1", "2"]}
    assert tracker.assignments_by_checkpoint_id(101) == {0: ["3"], 1: ["4", "5"]}
    tracker.on_checkpoint_complete(100)
    assert tracker.assignments_by_checkpoint_id(100) is None
    assert tracker.assignments_by_checkpoint_id(101) == {0: ["3"], 1: ["4", "5"]}
    tracker.on_checkpoint_complete(101)
    assert tracker.current_splits_assignment() == {}


def test_restore_before_the_first_checkpoint_returns_every_assigned_split() -> None:
    tracker: SplitAssignmentTracker[str] = SplitAssignmentTracker()
    tracker.record_split_assignment(splits_assignment(2, 0))
    tracker.snapshot_state(100)
    tracker.record_split_assignment(splits_assignment(2, 3))
    tracker.snapshot_state(101)
    assert tracker.get_and_remove_uncheckpointed_assignment(0, NO_CHECKPOINT) == ["0", "3"]
    assert tracker.current_splits_assignment() == {1: ["1", "2", "4", "5"]}


def test_restore_to_a_checkpoint_returns_only_what_was_assigned_after_it() -> None:
    tracker: SplitAssignmentTracker[str] = SplitAssignmentTracker()
    tracker.record_split_assignment(splits_assignment(2, 0))
    tracker.snapshot_state(1)
    tracker.record_split_assignment(splits_assignment(2, 3))
    tracker.snapshot_state(2)
    tracker.record_split_assignment({1: ["9"]})  # not in any snapshot yet
    assert tracker.get_and_remove_uncheckpointed_assignment(1, 1) == ["4", "5", "9"]
    assert tracker.get_and_remove_uncheckpointed_assignment(1, 1) == []  # removed
    assert tracker.get_and_remove_uncheckpointed_assignment(0, 1) == ["3"]
    assert tracker.assignments_by_checkpoint_id(2) is None  # emptied checkpoints disappear
    assert tracker.assignments_by_checkpoint_id(1) == {0: ["0"], 1: ["1", "2"]}


def test_checkpoint_ids_must_increase() -> None:
    tracker: SplitAssignmentTracker[str] = SplitAssignmentTracker()
    tracker.record_split_assignment({0: ["a"]})
    tracker.snapshot_state(5)
    tracker.record_split_assignment({0: ["b"]})
    with pytest.raises(ValueError, match="increase"):
        tracker.snapshot_state(5)
