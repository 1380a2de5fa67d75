"""The files connector's split reader: JSON Lines and CSV (plain or gzip) by
:class:`LineSplitReader`, Parquet by :class:`ParquetSplitReader`, the one of the split's kind.

Threading: as every :class:`~spark_jobs.source.BlockReader` — ``open``/``fetch``/``close``
on the one fetcher thread (may block on I/O), ``wake_up`` from any thread.
"""

from __future__ import annotations

from enumerator_service import (
    FileSplit,
    LandingRoot,
    ObjectLanding,
    check_unchanged,
    current_identity,
)
from spark_jobs.source._batch import ParsedBlock, RecordSchema
from spark_jobs.source._line_reader import LINE_KINDS, LineSplitReader
from spark_jobs.source._parquet_reader import ParquetSplitReader
from spark_jobs.source._records import BlockReader, SplitRead

__all__ = ["FileSplitReader"]


class FileSplitReader:
    """Reads file splits; the reader of each read is chosen by the split's kind."""

    def __init__(
        self,
        schema: RecordSchema,
        *,
        max_line_bytes: int,
        block_bytes: int,
        landing: LandingRoot | ObjectLanding | None,
    ) -> None:
        # Landing files are opened through ``landing`` (the run's folder): a link swapped in
        # after discovery that leads out of it is refused (None: no check); on an object
        # store, keys outside its prefix are.
        # How a file's identity is taken now: a stat, or a HEAD on an object store.
        self._store = landing if isinstance(landing, ObjectLanding) else None
        self._identity_of = self._store.current if self._store is not None else current_identity
        self._lines = LineSplitReader(
            schema, max_line_bytes=max_line_bytes, chunk_bytes=block_bytes, landing=landing
        )
        self._parquet = ParquetSplitReader(schema, landing=landing)
        self._current: BlockReader | None = None
        self._split: FileSplit | None = None

    def open(self, read: SplitRead) -> None:
        split = read.split
        assert isinstance(split, FileSplit)
        # Never a mix of two versions: the file must still be the one its split was cut
        # from (size, mtime, inode at discovery), else the split is refused (quarantined at
        # once, see ``spark_jobs.source._poison``).
        check_unchanged(split.path, split.file, self._identity_of)
        self._split = split
        self._current = self._lines if split.kind in LINE_KINDS else self._parquet
        self._current.open(read)

    def fetch(self) -> tuple[ParsedBlock | None, bool]:
        assert self._current is not None and self._split is not None
        block, done = self._current.fetch()
        if done and self._store is not None:
            # On a store, once more when the read ends (one HEAD): an object overwritten
            # during the read fails its split before the last block is handed out (line
            # files also check after every request, see ``ObjectLanding.open``).
            check_unchanged(self._split.path, self._split.file, self._identity_of)
        return block, done

    def wake_up(self) -> None:
        current = self._current
        if current is not None:
            current.wake_up()

    def close(self) -> None:
        self._current = None
        self._lines.close()
        self._parquet.close()
