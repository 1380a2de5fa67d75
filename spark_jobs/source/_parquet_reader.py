"""Reader of Parquet row-group splits in blocks (runs in a fetcher thread).

A FileSplit of kind ``"parquet"`` covers row groups ``[start, end)`` of its file (``end``
None: through the last row group). Offset rule: an offset is a *row index within the file*,
the first row not yet emitted. A fresh assignment has ``resume_offset == split.start`` (the
split store hands out ``start_offset``, a row-group index, while nothing is committed), so
reading begins at ``max(resume_offset, first row of row group start)``. That is exact when
the first row of row group ``start`` is at least ``start`` (always true without empty row
groups): every emitted offset then lies above it. Otherwise a committed row offset could
equal ``start``, so such a split (with rows) fails with :class:`ParquetSplitError`: the
enumerator must not start a split right after empty row groups. Resuming inside a row group
decodes that row group from its beginning and skips the rows before the offset. A replay
read of rows ``[a, b)`` reads exactly those rows.

Each ``fetch`` turns one ``iter_batches`` batch (the declared columns only) into a block,
converted by :class:`BatchConverter`.

Threading: ``open`` and ``fetch`` may block on file I/O and are called by one fetcher thread
only; ``wake_up`` may be called from any thread (a ``fetch`` reads at most one batch, so it
returns soon anyway).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from enumerator_service import LandingRoot, ObjectLanding
from spark_jobs.source._batch import ParsedBlock, RecordSchema
from spark_jobs.source._convert import new_block
from spark_jobs.source._parquet_rows import BatchConverter
from spark_jobs.source._records import SplitRead

__all__ = ["ParquetSplitError", "ParquetSplitReader"]

#: Linux: the open files of this process by descriptor.
_PROC_FD = Path("/proc/self/fd")


class ParquetSplitError(RuntimeError):
    """A Parquet file is unreadable (missing, corrupt, fewer row groups than the split names).

    Raised from ``open``/``fetch``: the task fails and the split is retried. An unreadable
    file is not a malformed *record*, so it is never dead-lettered row by row.
    """


class ParquetSplitReader:
    """Reads one read of a Parquet split at a time, up to ``batch_rows`` rows per block."""

    def __init__(
        self,
        schema: RecordSchema,
        *,
        batch_rows: int = 1024,
        landing: LandingRoot | ObjectLanding | None = None,
    ) -> None:
        self._schema = schema
        self._landing = landing  # None: files are opened without the landing folder check
        self._rows = BatchConverter(schema)
        self._names = [field.name for field in schema.fields]
        self._batch_rows = batch_rows
        self._read: SplitRead | None = None
        self._file: Any = None  # pq.ParquetFile
        self._raw: Any = None  # the file opened through the landing check (or the store)
        self._batches: Iterator[Any] = iter(())  # pa.RecordBatch
        self._row = 0  # row index of the next row the batches yield
        self._first = 0  # first row to emit (rows before it are skipped)
        self._stop = 0  # first row not to emit

    def open(self, read: SplitRead) -> None:
        self.close()
        self._read = read
        try:
            self._open(read)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise self._error(exc) from exc  # closes the file it may have opened

    def _open(self, read: SplitRead) -> None:
        split = read.split
        if self._landing is None:
            self._file = pq.ParquetFile(split.path)
        elif isinstance(self._landing, ObjectLanding):
            # An Arrow file on the store: the footer, then ranged requests per column chunk
            # (pyarrow does not close a file it was given: close() does).
            self._raw = self._landing.open_native(split.path)
            self._file = pq.ParquetFile(self._raw)
        else:
            self._raw = self._landing.open(split.path)  # the checked file
            if _PROC_FD.is_dir():
                # Reopening the open file by its /proc name reaches that same file (no link
                # is resolved again) and lets Arrow read it natively: a Python file object
                # costs up to half again as much decode time (measured on a 2M-row file).
                self._file = pq.ParquetFile(str(_PROC_FD / str(self._raw.fileno())))
                raw, self._raw = self._raw, None
                raw.close()
            else:
                # pyarrow does not close a file object it was given: close() does.
                self._file = pq.ParquetFile(self._raw)
        meta = self._file.metadata
        groups = int(meta.num_row_groups)
        end = groups if split.end is None else split.end
        if not 0 <= split.start <= end <= groups:
            raise ValueError(f"row groups [{split.start}, {split.end}) outside 0..{groups}")
        firsts = [0]  # first row of each row group, and the row count at the end
        for index in range(groups):
            firsts.append(firsts[-1] + int(meta.row_group(index).num_rows))
        if firsts[split.start] < min(split.start, firsts[end]):  # a split with rows
            raise ValueError(
                f"row group {split.start} starts at row {firsts[split.start]}, below its own "
                "index (empty row groups before it): a fresh resume offset would be ambiguous"
            )
        self._first = max(read.resume, firsts[split.start])
        self._stop = firsts[end] if read.stop is None else min(read.stop, firsts[end])
        if self._first >= self._stop:
            self._batches = iter(())
            return
        # From the last row group starting at or before the first row (skips empty groups)
        # to the one holding the last row.
        group = max(split.start, bisect_right(firsts, self._first) - 1)
        last = min(end, bisect_left(firsts, self._stop))
        self._row = firsts[group]
        present = set(self._file.schema_arrow.names)
        self._batches = self._file.iter_batches(
            batch_size=self._batch_rows,
            row_groups=list(range(group, last)),
            columns=[name for name in self._names if name in present],
        )

    def fetch(self) -> tuple[ParsedBlock | None, bool]:
        if self._read is None:
            return None, True
        while True:
            try:
                batch = next(self._batches, None)
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise self._error(exc) from exc
            if batch is None:
                self.close()
                return None, True
            first_row = self._row
            self._row += batch.num_rows
            skip = max(0, self._first - first_row)
            take = min(batch.num_rows, self._stop - first_row) - skip
            done = self._row >= self._stop
            if take > 0:
                block = self._block(batch.slice(skip, take), first_row + skip)
                if done:
                    self.close()
                return block, done
            if done:
                self.close()
                return None, True

    def _block(self, batch: pa.RecordBatch, first_row: int) -> ParsedBlock:
        assert self._read is not None
        rows, dead = self._rows.convert(batch, first_row)
        end = first_row + batch.num_rows
        return new_block(self._schema, self._read.split_id, first_row, end, rows, dead)

    def wake_up(self) -> None:
        """Nothing to interrupt: a ``fetch`` reads one batch."""

    def close(self) -> None:
        self._batches = iter(())
        if self._file is not None:
            self._file.close()
            self._file = None
        raw, self._raw = self._raw, None
        if raw is not None:
            raw.close()

    def _error(self, exc: BaseException) -> ParquetSplitError:
        read = self._read
        assert read is not None
        split = read.split
        self.close()
        return ParquetSplitError(
            f"split {read.split_id}: cannot read Parquet file {split.path} "
            f"(row groups [{split.start}, {split.end})): {exc}"
        )
