"""What a reader subtask checkpoints, and how it is encoded.

A subtask's state is, per split it holds: the split's progress (offset of the first record
not yet handed to the chain, watermark — see ``SplitState``) and the source ranges of the
records the chain has not emitted yet (:class:`PendingRange`, from every stage). Together
with the sink's staged output this is a consistent cut: every record before the offset is
in the staged output, among the pending ranges (read again and re-run through the whole
chain on restore), a dead letter, or was removed by a step.

Encoding of a split's pending ranges (``splits.pending``, in the order restore reads them):
``{"span": [start, end]}`` for all records whose offset lies in ``[start, end)`` (a block:
``end`` is at most the split's offset, since a block's end becomes the offset when it is
emitted), plus ``"only": [offsets]`` when just those records of the range are pending
(records of a per-record step). Ranges are re-read by the split's reader before it goes on
from the split's offset; a range being re-read is itself pending until its last record was
handed to the chain.

Threading: mailbox thread only.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from enumerator_service import SplitAssignment, SplitState
from spark_jobs.jobs._stages import PendingRange
from spark_jobs.source._poison import SplitFailure

__all__ = ["TaskSplit", "decode_pending", "encode_pending", "snapshot_splits"]


@dataclass(slots=True)
class TaskSplit:
    """A split this attempt holds: its assignment, its live state (shared with the reader),
    the checkpoint whose snapshot last recorded it as finished, the restored ranges not
    yet re-read (by their index in the assignment's ``pending``), and the content failure
    that ended its reading early (a poison split's failed attempt)."""

    assignment: SplitAssignment
    state: SplitState
    reading_done: bool = False
    finished_in: int | None = None
    replay: dict[int, PendingRange] = field(default_factory=dict)
    failure: SplitFailure | None = None

    def replayed(self, entry: int, end: int) -> PendingRange | None:
        """A re-read block of pending entry ``entry`` ended at ``end``: the entry's range
        (before this block), after which only ``[end, …)`` of it is left. Earlier entries
        are done (they are re-read in order)."""
        for done in [index for index in self.replay if index < entry]:
            del self.replay[done]
        current = self.replay.get(entry)
        if current is None:
            return None
        if end >= current.end:
            del self.replay[entry]
        else:
            only = None if current.only is None else tuple(o for o in current.only if o >= end)
            self.replay[entry] = dataclasses.replace(current, start=end, only=only)
        return current


def decode_pending(split_id: int, entries: Iterable[Any]) -> list[PendingRange]:
    """The pending ranges of a restored split, in the order they are re-read."""
    ranges = []
    for entry in entries:
        if not isinstance(entry, dict) or "span" not in entry:
            raise ValueError(
                f"split {split_id}: pending input {entry!r} is not a range; it was "
                "checkpointed by a version before pipelines (re-run that version to drain it)"
            )
        start, end = entry["span"]
        only = entry.get("only")
        ranges.append(
            PendingRange(split_id, int(start), int(end), None if only is None else tuple(only))
        )
    return ranges


def encode_pending(ranges: Iterable[PendingRange]) -> list[dict[str, Any]]:
    """JSON form of one split's pending ranges, ordered by their start."""
    out: list[dict[str, Any]] = []
    for r in sorted(ranges, key=lambda r: (r.start, r.end)):
        entry: dict[str, Any] = {"span": [r.start, r.end]}
        if r.only is not None:
            entry["only"] = sorted(set(r.only))
        out.append(entry)
    return out


def snapshot_splits(
    splits: Mapping[int, TaskSplit],
    pending: Iterable[PendingRange],
    checkpoint_id: int,
    *,
    max_attempts: int = 3,
) -> list[dict[str, Any]]:
    """The split states of checkpoint ``checkpoint_id``: offsets, watermarks and the pending
    ranges of each split (from the chain, and restored ranges not re-read yet).

    A split that is read to its end with nothing pending is marked finished in this
    checkpoint: once it completes, the split is no longer this subtask's state.

    A split whose reading failed on its content is marked finished *and* ``failed``
    (``{"reason", "error", "max_attempts"}``) once the chain holds none of its records: every
    record it emitted is then in this checkpoint's output, so the failure commits with the
    offset reached (the next attempt resumes there; the restored ranges it never re-read
    stay pending). Committing it counts one failed attempt (see ``apply_split_states``).
    """
    by_split: dict[int, list[PendingRange]] = defaultdict(list)
    for entry in pending:
        by_split[entry.split_id].append(entry)
    states = []
    for split_id, held in splits.items():
        state = held.state
        in_chain = by_split.get(split_id, ())
        waiting = encode_pending([*in_chain, *held.replay.values()])
        entry_state: dict[str, Any] = {
            "id": split_id,
            "epoch": held.assignment.epoch,
            "offset": state.offset,
            "watermark": state.watermark.isoformat() if state.watermark else None,
            "finished": held.reading_done,
            "pending": waiting,
        }
        failure = held.failure
        if failure is not None:
            if in_chain:
                entry_state["finished"] = False  # its records are still in the chain
            else:
                entry_state["failed"] = {
                    "reason": failure.reason,
                    "error": failure.error,
                    "max_attempts": 1 if failure.final else max_attempts,
                }
                if held.finished_in is None:
                    held.finished_in = checkpoint_id
        states.append(entry_state)
        if held.reading_done and not waiting and held.finished_in is None:
            # The first checkpoint that carries the final state: once it completes (or any
            # later one), the split is forgotten.
            held.finished_in = checkpoint_id
    return states
