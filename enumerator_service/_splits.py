"""Split types: the immutable unit of work, apart from its mutable progress state."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from enumerator_service._file_identity import FileIdentity

__all__ = [
    "CONCURRENT_STREAM_KINDS",
    "STREAM_KINDS",
    "STREAM_SOURCE_KINDS",
    "TABLE_KINDS",
    "FileSplit",
    "Split",
    "SplitAssignment",
    "SplitState",
    "StreamSplit",
    "TableRangeSplit",
]

#: Stored split kinds that are key ranges of a table (:class:`TableRangeSplit`): the table
#: source's ranges and a change-data-capture source's snapshot chunks.
TABLE_KINDS = frozenset({"table", "pgcdc-chunk"})
#: Stored split kinds that are position ranges of one ordered stream (:class:`StreamSplit`):
#: a Kafka topic-partition's offsets, a logical replication slot's LSNs. Every other kind is
#: a landing file's byte range (:class:`FileSplit`).
STREAM_KINDS = frozenset({"kafka", "pgcdc"})
#: Stream kinds read *concurrently*: a subtask's reader takes every split of the kind the
#: moment it is pulled, and each is pulled only by its owner subtask (Kafka partitions). The
#: run watermark's stream rules (``_run_watermark``) rely on both, so they apply to these
#: kinds alone; a CDC stream split is read one at a time after the snapshot chunks pulled
#: with it, and may wait in its fetcher while READING.
CONCURRENT_STREAM_KINDS = frozenset({"kafka"})
#: Kinds of the splits of a source that reads a stream, whose input has no end: the stream
#: kinds and a change-data-capture source's snapshot chunks.
STREAM_SOURCE_KINDS = STREAM_KINDS | {"pgcdc-chunk"}


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
    #: The file version the split was cut from (size, mtime, inode at discovery): a reader
    #: refuses the split when the file under ``path`` is no longer it. None: not recorded
    #: (splits registered before identities were kept).
    file: FileIdentity | None = field(default=None, compare=False)
    #: 0 for a file's first registration, +1 for each new version of it (a changed file read
    #: again, see ``enumerator_service._file_versions``).
    version: int = field(default=0, compare=False)

    @property
    def identity(self) -> tuple[str, str, int]:
        return (self.source, self.path, self.start)


@dataclass(frozen=True, slots=True)
class TableRangeSplit:
    """Rows of a Postgres table whose integer key lies in ``[low, high)``. Immutable.

    Offset rule: the offset of a table split is a key value — the smallest key not yet
    emitted. Resuming from it reads exactly the rows with ``offset <= key < high``, in key
    order (the reader emits in key order, so every emitted row's key is below the offset).
    """

    source: str
    table: str  # schema-qualified, validated identifiers
    key_column: str
    low: int
    high: int
    kind: str = "table"  # one of TABLE_KINDS

    @property
    def path(self) -> str:
        """How the split is named in the split store (``uri``) and in dead letters."""
        return f"{self.table}?key={self.key_column}"

    @property
    def start(self) -> int:
        return self.low

    @property
    def end(self) -> int:
        return self.high

    @property
    def partition_key(self) -> date | None:
        return None

    @property
    def identity(self) -> tuple[str, str, int]:
        return (self.source, self.path, self.low)

    @classmethod
    def from_uri(
        cls, source: str, uri: str, low: int, high: int, kind: str = "table"
    ) -> TableRangeSplit:
        table, _, key = uri.partition("?key=")
        return cls(source, table, key, low, high, kind)


@dataclass(frozen=True, slots=True)
class StreamSplit:
    """Positions ``[start, end)`` of one ordered stream: a Kafka topic-partition's offsets,
    a logical replication slot's LSNs. Immutable; identity = (source, path, start).

    ``path`` names the stream in the split store (``uri``; the connector's own form, e.g.
    ``orders/3`` for partition 3 of topic ``orders``). ``end`` None: unbounded — the split
    of a continuous run, never finished by its reader. Offset rule: the offset is the
    position of the next record *not yet emitted*, so resuming from it reads exactly the
    records after the last emitted one.
    """

    source: str
    kind: str  # one of STREAM_KINDS
    path: str
    start: int
    end: int | None
    partition_key: date | None = None

    @property
    def identity(self) -> tuple[str, str, int]:
        return (self.source, self.path, self.start)


Split = FileSplit | TableRangeSplit | StreamSplit


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


@dataclass(frozen=True, slots=True)
class SplitAssignment:
    """A split handed to one reader subtask, with the fencing epoch its commits must present."""

    split_id: int
    split: Split
    epoch: int
    resume_offset: int
    #: The async operator's inputs from this split that were in flight at the committed
    #: checkpoint (JSON-encoded, input order): re-invoked before reading from resume_offset.
    pending: tuple[Any, ...] = ()
    #: The partition rebuild the split is re-read for (its output goes to the rebuild's
    #: folder), or None.
    rebuild_id: int | None = None
    #: The partition (day) that rebuild replaces: the split writes only its records of it.
    rebuild_day: date | None = None
    #: A member no run had read before (see ``splits.rebuild_fresh``).
    rebuild_fresh: bool = False
    #: The split's watermark at the committed checkpoint (``splits.committed_watermark``):
    #: a restored split resumes it, so its event time never moves backwards after recovery.
    committed_watermark: datetime | None = None

    def initial_state(self) -> SplitState:
        return SplitState(offset=self.resume_offset, watermark=self.committed_watermark)
