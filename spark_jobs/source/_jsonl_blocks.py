"""Blocking reader of plain JSON Lines splits in parsed blocks (runs in a fetcher thread).

Same lines, offsets and over-long-line handling as :class:`JsonLinesSplitReader`, but one
``fetch`` returns one :class:`EventBlock`: up to ``chunk_bytes`` of whole lines parsed at once
(:func:`parse_lines`), instead of one ``RawLine`` per line for the mailbox thread to parse.

Offset rule of a block (the unit the async operator, checkpoints and restore work with): a
block covers the whole lines ``[start, end)`` — ``start`` is the first byte of its first line
(always a line start: a split's partial first line is skipped before it), ``end`` the first
byte after its last line, which is the split's offset once the block was emitted (so a resume
offset is always a line start or the split's start). A block that was emitted but not yet
enriched is checkpointed as its range and re-read by :func:`read_span` on restore: reading
``[start, end)`` as a split yields exactly its lines again.

Threading: ``fetch`` may block on file I/O and is called by one fetcher thread only;
``wake_up`` may be called from any thread and makes a running ``fetch`` return early.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from enumerator_service import FileSplit, SplitAssignment
from spark_jobs.source._blocks import EventBlock, concat, max_time, parse_lines
from spark_jobs.source._events import parse_event
from spark_jobs.source._jsonl_reader import LineSplitCursor
from spark_jobs.source._records import RawLine, RecordsWithSplitIds

__all__ = ["JsonBlockSplitReader", "read_span"]


class JsonBlockSplitReader(LineSplitCursor):
    """Reads its splits one after another, one block of whole lines per ``fetch``."""

    def __init__(self, *, max_line_bytes: int, chunk_bytes: int = 256 << 10) -> None:
        super().__init__(max_line_bytes=max_line_bytes, chunk_bytes=chunk_bytes)

    def _long_line(self, start: int, following: int) -> tuple[int, int, RawLine]:
        line = RawLine(start, following, self._long_prefix, True)
        self._long_start, self._long_prefix = None, b""
        return (start, following, line)

    def fetch(self) -> RecordsWithSplitIds[EventBlock]:
        """One block of the current split (none if woken first); marks the split finished
        at its end."""
        batch = RecordsWithSplitIds[EventBlock]()
        if not self._begin_fetch():
            return batch
        assert self._current is not None and self._file is not None
        end = self._current.split.end
        limit = self._max_line
        # What this fetch covers, in order: an over-long line finished here, then whole
        # lines (one bytes run), then an over-long line ended by the end of the file.
        long_before: tuple[int, int, RawLine] | None = None
        text, text_at = b"", 0
        long_after: tuple[int, int, RawLine] | None = None
        finished = False
        while not self._woken:
            chunk = self._file.read(self._chunk)
            data = self._carry + chunk  # data[0] is at file offset self._pos
            base, start = self._pos, 0
            if self._skip_partial or self._long_start is not None:
                newline = data.find(b"\n")
                if newline < 0:  # the whole chunk is inside that line
                    self._pos, self._carry = base + len(data), b""
                    if not chunk:  # end of file inside it
                        if self._long_start is not None:
                            long_after = self._long_line(self._long_start, self._pos)
                        finished = True
                        break
                    continue
                if self._long_start is not None:
                    long_before = self._long_line(self._long_start, base + newline + 1)
                self._skip_partial = False
                start = newline + 1
            if end is not None and base + start >= end:
                stop, finished = start, True  # the line at `start` belongs to the next split
            else:
                found = data.rfind(b"\n", start)
                stop = len(data) if not chunk else (found + 1 if found >= 0 else start)
                if end is not None and base + stop >= end:
                    # Only lines starting before `end` belong to this split.
                    last = data.find(b"\n", max(end - base - 1, start))
                    stop, finished = (last + 1 if last >= 0 else stop), True
            if stop > start:
                text, text_at = data[start:stop], base + start
            rest, rest_at = data[stop:], base + stop
            if finished:
                self._pos, self._carry = rest_at, b""
            elif not chunk:  # end of file: `rest` is empty (stop covers the last line)
                self._pos, self._carry, finished = rest_at, b"", True
            elif len(rest) > limit + 1:  # + 1: a pending "\r" is not content
                # Over-long line: keep only its beginning, drop the rest up to its newline.
                self._long_start, self._long_prefix = rest_at, rest[:limit]
                self._pos, self._carry = rest_at + len(rest), b""
            else:
                self._pos, self._carry = rest_at, rest
            if text or long_before is not None or finished:
                break
        block = self._block(long_before, text, text_at, long_after)
        if block is not None:
            batch.records[self._current.split_id] = [block]
        if finished:
            batch.finished.append(self._current.split_id)
            self.close()
            self._current = None
        return batch

    def _block(
        self,
        long_before: tuple[int, int, RawLine] | None,
        text: bytes,
        text_at: int,
        long_after: tuple[int, int, RawLine] | None,
    ) -> EventBlock | None:
        assert self._current is not None
        split_id, limit = self._current.split_id, self._max_line
        ends = [
            part
            for part in (
                long_before[:2] if long_before else None,
                (text_at, text_at + len(text)) if text else None,
                long_after[:2] if long_after else None,
            )
            if part is not None
        ]
        if not ends:
            return None
        batches, dead = parse_lines(split_id, text, text_at, limit)
        for long_line in (long_before, long_after):
            if long_line is not None:
                line = long_line[2]
                reason = parse_event(split_id, line, limit)
                assert isinstance(reason, str)
                dead.append((line.offset, line.data, reason))
        dead.sort(key=lambda entry: entry[0])
        rows = concat(batches)
        return EventBlock(split_id, ends[0][0], ends[-1][1], rows, dead, max_time(rows))


def read_span(
    assignment: SplitAssignment, start: int, end: int, max_line_bytes: int
) -> pa.RecordBatch:
    """The events of the lines ``[start, end)`` of ``assignment``'s file (``start`` a line
    start, ``end`` the end of a line): what the blocks covering that range held. Blocking."""
    split = assignment.split
    assert isinstance(split, FileSplit)
    span = dataclasses.replace(split, start=start, end=end)
    # One read for a usual block; an over-long line inside is still streamed, not loaded.
    chunk = max(1, min(end - start, 4 << 20))
    reader = JsonBlockSplitReader(max_line_bytes=max_line_bytes, chunk_bytes=chunk)
    reader.add_split(SplitAssignment(assignment.split_id, span, assignment.epoch, start))
    batches: list[pa.RecordBatch] = []
    try:
        while reader.has_splits():
            for blocks in reader.fetch().records.values():
                batches.extend(block.rows for block in blocks)
    finally:
        reader.close()
    return concat(batches)
