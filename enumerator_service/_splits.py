"""Split types: the immutable unit of work, apart from its mutable progress state."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

__all__ = ["FileSplit", "SplitAssignment", "SplitState"]


@dataclass(frozen=True, slots=True)
class FileSplit:
    """Bytes ``[start, end)`` of one landing file. Immutable; identity = (source, path, start).

    Offset rule: a record (line) belongs to the split in which its first byte lies, so a reader
    of ``[start, end)`` skips a line that began before ``start`` and finishes a line that began
    before ``end`` even when it ends past it.
    """

    source: str
    kind: str
    path: str
    start: int
    end: int | None
    partition_key: date | None

    @property
    def identity(self) -> tuple[str, str, int]:
        return (self.source, self.path, self.start)


@dataclass(slots=True)
class SplitState:
    """Mutable progress of one split, owned by the mailbox thread of the task reading it.

    ``offset`` is the first byte *not yet emitted*: resuming from it yields exactly the records
    after the last emitted one (the committed offset in Postgres has the same meaning).
    """

    offset: int
    watermark: datetime | None = None
    records: int = 0
    dead_letters: int = 0

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["watermark"] = self.watermark.isoformat() if self.watermark else None
        return data


@dataclass(frozen=True, slots=True)
class SplitAssignment:
    """A split handed to one reader subtask, with the fencing epoch its commits must present."""

    split_id: int
    split: FileSplit
    epoch: int
    resume_offset: int

    def initial_state(self) -> SplitState:
        return SplitState(offset=self.resume_offset)
