"""What moves between the parts of a source: reads of splits, and fetched blocks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from enumerator_service import Split, SplitAssignment
from spark_jobs.source._batch import ParsedBlock

if TYPE_CHECKING:
    from spark_jobs.source._poison import SplitFailure

__all__ = ["BlockReader", "RecordsWithSplitIds", "SplitRead"]


@dataclass(frozen=True, slots=True)
class SplitRead:
    """One read of a split: its records with offsets from ``resume`` (the split's resume
    offset, or a replayed range's start) up to ``stop`` (exclusive; None: the split's end).

    ``replay``: the read re-reads a range that was in flight at the restored checkpoint —
    entry ``entry`` of the assignment's ``pending``; its blocks are marked ``replay`` (with
    ``replay_entry = entry``) and it never finishes the split.
    """

    split_id: int
    split: Split
    resume: int
    stop: int | None = None
    replay: bool = False
    entry: int = 0

    @classmethod
    def of(cls, assignment: SplitAssignment) -> SplitRead:
        """The normal read of an assignment: from its resume offset to the split's end."""
        return cls(assignment.split_id, assignment.split, assignment.resume_offset)

    def stop_within(self, end: int | None) -> int | None:
        """The first offset not to read, given the split's own ``end`` (None: unbounded)."""
        if self.stop is None:
            return end
        return self.stop if end is None else min(self.stop, end)


class BlockReader(Protocol):
    """The reader of one format: one read at a time, one block per ``fetch``.

    Threading: ``open`` and ``fetch`` may block and are called by one fetcher thread;
    ``wake_up`` may be called from any thread and makes a running ``fetch`` return early.
    """

    def open(self, read: SplitRead) -> None:
        """Start ``read`` (the previous one is finished or abandoned)."""

    def fetch(self) -> tuple[ParsedBlock | None, bool]:
        """(the next block or None, whether the read is finished)."""

    def wake_up(self) -> None: ...
    def close(self) -> None: ...


@dataclass(slots=True)
class RecordsWithSplitIds:
    """The result of one fetch: splits added, blocks (in order), splits finished by it, and
    splits dropped by it because their content failed (``SplitFailure``; see ``_poison``).

    Blocks come before the finished and failed splits: a split ends after its last block.

    ``behind``: None when the fetch says nothing about backlogs (every file reader); else
    the reader's splits known, after this fetch, to have records still to read (a Kafka
    partition whose last known end is past the split's next offset). Such a split is never
    idle, however long its fetches stall (``RecordEmitter.set_behind``).
    """

    added: list[SplitAssignment] = field(default_factory=list)
    blocks: list[ParsedBlock] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    failed: list[SplitFailure] = field(default_factory=list)
    end_of_input: bool = False
    behind: frozenset[int] | None = None
