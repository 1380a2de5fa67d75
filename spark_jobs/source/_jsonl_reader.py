"""Blocking reader of JSON Lines byte-range splits (runs in a fetcher thread)."""

from __future__ import annotations

from collections import deque
from typing import BinaryIO

from enumerator_service import SplitAssignment
from spark_jobs.source._records import RawLine, RecordsWithSplitIds

__all__ = ["JsonLinesSplitReader", "LineSplitCursor"]


class LineSplitCursor:
    """Where a line-oriented reader stands: its queue of splits, the open file of the current
    one, the carried partial line and the over-long-line state. ``_open_next`` applies the
    offset rule at a split's start (see :class:`JsonLinesSplitReader`).

    Threading: owned by one fetcher thread; ``wake_up`` may be called from any thread.
    """

    def __init__(self, *, max_line_bytes: int, chunk_bytes: int) -> None:
        self._max_line = max_line_bytes
        self._chunk = chunk_bytes
        self._splits: deque[SplitAssignment] = deque()
        self._current: SplitAssignment | None = None
        self._file: BinaryIO | None = None
        self._pos = 0  # file offset of the first byte of self._carry
        self._carry = b""
        self._skip_partial = False  # inside the line that began before the split's start
        self._long_start: int | None = None  # inside an over-long line starting here
        self._long_prefix = b""
        self._woken = False

    def add_split(self, assignment: SplitAssignment) -> None:
        self._splits.append(assignment)

    def has_splits(self) -> bool:
        return self._current is not None or bool(self._splits)

    def wake_up(self) -> None:
        self._woken = True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _begin_fetch(self) -> bool:
        """Start a ``fetch``: clear the wake-up flag and open the next split if none is
        current; False when there is no split to read."""
        self._woken = False
        if self._current is None:
            if not self._splits:
                return False
            self._open_next()
        return True

    def _open_next(self) -> None:
        assignment = self._splits.popleft()
        split = assignment.split
        self._current = assignment
        self._file = open(split.path, "rb")  # noqa: SIM115 - kept open across fetch calls
        pos = assignment.resume_offset
        self._carry = b""
        self._skip_partial = False
        self._long_start, self._long_prefix = None, b""
        if pos > 0 and pos == split.start:
            # Started mid-file: the line containing byte start-1 belongs to the previous split.
            self._file.seek(pos - 1)
            if self._file.read(1) != b"\n":
                self._skip_partial = True  # discard through the next newline
        self._file.seek(pos)
        self._pos = pos


class JsonLinesSplitReader(LineSplitCursor):
    """Reads the lines of its splits one after another, ``chunk_bytes`` at a time.

    Offset rule (see FileSplit): a line belongs to the split in which its first byte lies. A
    split starting mid-file skips the partial line before its start, and its last line may end
    past ``end``. A resume offset above ``start`` is always a line start (it was the
    ``next_offset`` of an emitted line), so nothing is skipped there.

    Threading: ``fetch`` may block on file I/O and is called by one fetcher thread only;
    ``wake_up`` may be called from any thread and makes a running ``fetch`` return early.
    """

    def __init__(self, *, max_line_bytes: int, chunk_bytes: int = 1 << 20) -> None:
        super().__init__(max_line_bytes=max_line_bytes, chunk_bytes=chunk_bytes)

    def fetch(self) -> RecordsWithSplitIds[RawLine]:
        """Up to one chunk of lines of the current split; marks the split finished at its end."""
        batch = RecordsWithSplitIds[RawLine]()
        if not self._begin_fetch():
            return batch
        assert self._current is not None and self._file is not None
        end = self._current.split.end
        limit = self._max_line
        lines: list[RawLine] = []
        while not lines and not self._woken:
            chunk = self._file.read(self._chunk)
            data = self._carry + chunk  # data[0] is at file offset self._pos
            start = 0
            while True:
                at = self._pos + start
                in_line = self._skip_partial or self._long_start is not None
                if not in_line and end is not None and at >= end:
                    self._finish(batch, lines)  # the line at `at` belongs to the next split
                    return batch
                newline = data.find(b"\n", start)
                if newline < 0:
                    break
                following = self._pos + newline + 1
                if self._skip_partial:
                    self._skip_partial = False
                elif self._long_start is not None:
                    lines.append(RawLine(self._long_start, following, self._long_prefix, True))
                    self._long_start, self._long_prefix = None, b""
                else:
                    content = data[start:newline].removesuffix(b"\r")
                    if len(content) > limit:
                        lines.append(RawLine(at, following, content[:limit], True))
                    else:
                        lines.append(RawLine(at, following, content))
                start = newline + 1
            rest = data[start:]
            rest_at = self._pos + start
            if self._skip_partial or self._long_start is not None:
                self._pos, self._carry = rest_at + len(rest), b""
            elif len(rest) > limit + 1:  # + 1: a pending "\r" is not content
                # Over-long line: keep only its beginning, drop the rest up to its newline.
                self._long_start, self._long_prefix = rest_at, rest[:limit]
                self._pos, self._carry = rest_at + len(rest), b""
            else:
                self._pos, self._carry = rest_at, rest
            if not chunk:  # end of file
                if self._long_start is not None:
                    lines.append(RawLine(self._long_start, self._pos, self._long_prefix, True))
                    self._long_start, self._long_prefix = None, b""
                elif self._carry and not self._skip_partial:
                    # Last line without a trailing newline.
                    content = self._carry.removesuffix(b"\r")
                    following = self._pos + len(self._carry)
                    truncated = len(content) > limit
                    lines.append(RawLine(self._pos, following, content[:limit], truncated))
                    self._pos, self._carry = following, b""
                self._finish(batch, lines)
                return batch
        if lines:
            batch.records[self._current.split_id] = lines
        return batch

    def _finish(self, batch: RecordsWithSplitIds[RawLine], lines: list[RawLine]) -> None:
        assert self._current is not None
        if lines:
            batch.records[self._current.split_id] = lines
        batch.finished.append(self._current.split_id)
        self.close()
        self._current = None
