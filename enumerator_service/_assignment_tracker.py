"""Which splits were handed to which reader, relative to checkpoints (Flink's
SplitAssignmentTracker).

The enumerator's state is its unassigned splits plus the assignments made since the last
completed checkpoint, keyed by the checkpoint that first captured them. When a reader fails and
restores checkpoint k, exactly the splits assigned to it *after* k go back to the enumerator:
the ones assigned before k are in the reader's own restored state.

Not thread-safe: the enumerator owns it (one thread).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any, Generic, TypeVar

__all__ = ["NO_CHECKPOINT", "SplitAssignmentTracker"]

S = TypeVar("S", bound=Hashable)

#: Restoring to this id means "before any checkpoint": every assignment goes back.
NO_CHECKPOINT = 0


def _add(target: dict[int, list[S]], assignment: Mapping[int, Sequence[S]]) -> None:
    for subtask, splits in assignment.items():
        bucket = target.setdefault(subtask, [])
        bucket.extend(s for s in splits if s not in bucket)


class SplitAssignmentTracker(Generic[S]):
    def __init__(self) -> None:
        # checkpoint id -> subtask -> splits (insertion-ordered: ascending checkpoint ids).
        self._by_checkpoint: dict[int, dict[int, list[S]]] = {}
        self._uncheckpointed: dict[int, list[S]] = {}

    def record_split_assignment(self, assignment: Mapping[int, Sequence[S]]) -> None:
        """Remember an assignment (subtask -> splits) made since the last snapshot."""
        _add(self._uncheckpointed, assignment)

    def snapshot_state(self, checkpoint_id: int) -> dict[str, Any]:
        """Attach the uncheckpointed assignments to ``checkpoint_id``; return the state."""
        if self._by_checkpoint and checkpoint_id <= max(self._by_checkpoint):
            raise ValueError(f"checkpoint ids must increase: {checkpoint_id}")
        if self._uncheckpointed:
            self._by_checkpoint[checkpoint_id] = self._uncheckpointed
            self._uncheckpointed = {}
        return self.to_json()

    def on_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Forget the assignments a completed checkpoint covers (and older ones)."""
        for done in [c for c in self._by_checkpoint if c <= checkpoint_id]:
            del self._by_checkpoint[done]

    def get_and_remove_uncheckpointed_assignment(
        self, subtask: int, restored_checkpoint_id: int = NO_CHECKPOINT
    ) -> list[S]:
        """The splits to give back when ``subtask`` restores ``restored_checkpoint_id``:
        those assigned to it after that checkpoint, in assignment order."""
        returned: list[S] = []
        for checkpoint_id in sorted(self._by_checkpoint):
            if checkpoint_id > restored_checkpoint_id:
                returned.extend(self._by_checkpoint[checkpoint_id].pop(subtask, []))
        returned.extend(self._uncheckpointed.pop(subtask, []))
        for checkpoint_id in [c for c, by in self._by_checkpoint.items() if not by]:
            del self._by_checkpoint[checkpoint_id]
        return returned

    # -- inspection ----------------------------------------------------------------------

    def current_splits_assignment(self) -> dict[int, list[S]]:
        """Every tracked assignment per subtask, checkpointed or not."""
        current: dict[int, list[S]] = {}
        for checkpoint_id in sorted(self._by_checkpoint):
            _add(current, self._by_checkpoint[checkpoint_id])
        _add(current, self._uncheckpointed)
        return current

    def assignments_by_checkpoint_id(self, checkpoint_id: int) -> dict[int, list[S]] | None:
        return self._by_checkpoint.get(checkpoint_id)

    def uncheckpointed_assignments(self) -> dict[int, list[S]]:
        return self._uncheckpointed

    # -- persistence ---------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "by_checkpoint": {
                str(c): {str(t): list(s) for t, s in by.items()}
                for c, by in self._by_checkpoint.items()
            },
            "uncheckpointed": {str(t): list(s) for t, s in self._uncheckpointed.items()},
        }

    @classmethod
    def from_json(cls, state: Mapping[str, Any]) -> SplitAssignmentTracker[Any]:
        tracker: SplitAssignmentTracker[Any] = cls()
        for checkpoint_id, by in sorted(state["by_checkpoint"].items(), key=lambda i: int(i[0])):
            tracker._by_checkpoint[int(checkpoint_id)] = {int(t): list(s) for t, s in by.items()}
        tracker._uncheckpointed = {int(t): list(s) for t, s in state["uncheckpointed"].items()}
        return tracker
