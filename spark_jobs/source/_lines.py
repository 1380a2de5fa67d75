"""Whole lines of a line file (JSON Lines, CSV), read in runs: the blocking side of their readers.

Offset rule (see FileSplit): a line belongs to the range in which its first byte lies. A read
of ``[start, stop)`` that starts mid-file skips the partial line before ``start`` (the line
containing byte ``start - 1`` belongs to the previous range), and its last line may end past
``stop``. A resume offset above ``start`` is always a line start (it was the end of an
emitted block), so nothing is skipped there. So a range ``[o, o + 1)`` with ``o`` a line
start reads exactly the line starting at ``o``.

Gzip files are one split (they cannot be cut into byte ranges): offsets are positions in the
decompressed stream, and resuming decompresses the file from its beginning and discards
everything before the resume offset. A corrupt or truncated stream raises from ``read``
(``gzip.BadGzipFile``/``EOFError``): the whole split fails, not one record.

Over-long lines (content beyond ``max_line_bytes``, a CRLF's ``"\\r"`` not counted) are
never held whole: only their beginning is kept, as a :class:`LongLine`.

Files are opened by :func:`open_data_file`: through the run's :class:`LandingRoot` when
there is one, which refuses a file that resolves outside the landing folder (a symbolic link
swapped in after discovery) unless following such links is on; or through the run's
:class:`ObjectLanding` (a prefix on an object store), which opens only keys inside it and
checks the object's identity after every request to the store.

Threading: a cursor is owned by one fetcher thread; ``wake_up`` may be called from any
thread and makes a running ``read`` return early.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from enumerator_service import FileIdentity, LandingRoot, ObjectLanding

__all__ = ["LineCursor", "LineRun", "LongLine", "lines_of", "open_data_file"]


class _OwningGzipFile(gzip.GzipFile):
    """A GzipFile over an open file that it closes too (``gzip.open(file)`` does not)."""

    def __init__(self, raw: IO[bytes]) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def open_data_file(
    path: str,
    *,
    gz: bool,
    landing: LandingRoot | ObjectLanding | None,
    expected: FileIdentity | None = None,
) -> io.BufferedIOBase:
    """``path`` opened for reading (decompressed when ``gz``), through ``landing``'s checks
    when given (:class:`~enumerator_service.OutsideLandingError` for a file outside it; on
    an object store, ``FileChangedError`` at the first read after the object stopped being
    ``expected``)."""
    if landing is None:
        return gzip.open(path, "rb") if gz else open(path, "rb")
    raw = landing.open(path, expected) if isinstance(landing, ObjectLanding) else landing.open(path)
    if not gz:
        return raw  # type: ignore[return-value]  # an io.BufferedReader
    try:
        return _OwningGzipFile(raw)
    except BaseException:
        raw.close()
        raise


@dataclass(frozen=True, slots=True)
class LongLine:
    """An over-long line: its first byte, the first byte after it, its beginning."""

    offset: int
    next_offset: int
    prefix: bytes


@dataclass(frozen=True, slots=True)
class LineRun:
    """What one ``read`` covers, in order: an over-long line finished here, whole lines
    ``text`` (starting at ``text_at``; each ends with a newline except a file's last), and an
    over-long line ended by the end of the file. ``finished``: the range is read."""

    long_before: LongLine | None
    text: bytes
    text_at: int
    long_after: LongLine | None
    finished: bool

    @property
    def bounds(self) -> tuple[int, int] | None:
        """(first byte, first byte after) of what the run covers; None for nothing."""
        parts = [
            (line.offset, line.next_offset) if line is not None else None
            for line in (self.long_before, self.long_after)
        ]
        if self.text:
            parts.insert(1, (self.text_at, self.text_at + len(self.text)))
        present = [part for part in parts if part is not None]
        return (present[0][0], present[-1][1]) if present else None


def lines_of(data: bytes, offset: int, limit: int) -> Iterator[tuple[int, bytes, bool]]:
    """The lines of whole lines ``data`` (at ``offset``): (offset, content without its line
    ending, cut at ``limit``; True when it was longer)."""
    at, end = offset, offset + len(data)
    for text in data.split(b"\n"):
        following = at + len(text) + 1
        if following > end:  # the last line, without a newline
            following = end
            if not text:
                break
        content = text.removesuffix(b"\r")
        yield at, content[:limit], len(content) > limit
        at = following


class LineCursor:
    """Reads the lines of one range of one file, about ``chunk_bytes`` per ``read``."""

    def __init__(
        self,
        path: str,
        *,
        gz: bool,
        start: int,
        resume: int,
        stop: int | None,
        max_line_bytes: int,
        chunk_bytes: int,
        landing: LandingRoot | ObjectLanding | None = None,
        expected: FileIdentity | None = None,
    ) -> None:
        self._max_line, self._chunk, self._end = max_line_bytes, chunk_bytes, stop
        self._file = open_data_file(path, gz=gz, landing=landing, expected=expected)
        self._carry = b""  # read, not yet handed out; self._pos is the offset of its first byte
        self._long_start: int | None = None  # inside an over-long line starting here
        self._long_prefix = b""
        self._skip_partial = False  # inside the line that began before the range's start
        self._woken = False
        if not gz and resume > 0 and resume == start:
            self._file.seek(resume - 1)
            self._skip_partial = self._file.read(1) != b"\n"  # discard through the next newline
        self._file.seek(resume)  # gzip: decompresses and discards up to it
        self._pos = resume

    def wake_up(self) -> None:
        self._woken = True

    def close(self) -> None:
        self._file.close()

    def _long_line(self, start: int, following: int) -> LongLine:
        line = LongLine(start, following, self._long_prefix)
        self._long_start, self._long_prefix = None, b""
        return line

    def read(self) -> LineRun:
        """The next run (empty and not finished when woken before anything was read)."""
        self._woken = False
        end, limit = self._end, self._max_line
        long_before: LongLine | None = None
        text, text_at = b"", 0
        long_after: LongLine | None = None
        finished = False
        while not self._woken:
            chunk = self._file.read(self._chunk)
            data = self._carry + chunk  # data[0] is at offset self._pos
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
                stop, finished = start, True  # the line at `start` belongs to the next range
            else:
                found = data.rfind(b"\n", start)
                stop = len(data) if not chunk else (found + 1 if found >= 0 else start)
                if end is not None and base + stop >= end:
                    # Only lines starting before `end` belong to this range.
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
        return LineRun(long_before, text, text_at, long_after, finished)
