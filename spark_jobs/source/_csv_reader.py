"""Blocking readers of CSV splits and of gzip-compressed line files (run in a fetcher thread).

Threading, for every reader here: ``fetch`` may block on file I/O and is called by one fetcher
thread only; ``wake_up`` may be called from any thread and makes a running ``fetch`` return
early (best effort: a ``fetch`` also returns after its first chunk that completes a line).
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import re
import threading
from collections import deque
from typing import Any

from enumerator_service import SplitAssignment
from spark_jobs.source._events import Event, validate_event
from spark_jobs.source._jsonl_reader import JsonLinesSplitReader
from spark_jobs.source._records import RawLine, RecordsWithSplitIds

__all__ = [
    "CsvHeaderError",
    "CsvSplitReader",
    "GzipLinesReader",
    "LinesSplitReader",
    "is_gzip_kind",
    "parse_csv_record",
]

_INT = re.compile(r"[+-]?[0-9]+")


def is_gzip_kind(kind: str) -> bool:
    """True for the kinds of whole-file gzip splits (``"csv.gz"``, ``"jsonl.gz"``)."""
    return kind.endswith(".gz")


def _check_whole_file(assignment: SplitAssignment) -> None:
    if (split := assignment.split).start != 0 or split.end is not None:
        bounds = f"[{split.start}, {split.end})"
        raise ValueError(f"gzip split {split.path} must cover the whole file, got {bounds}")


def _open_binary(path: str, gz: bool) -> io.BufferedIOBase:
    return gzip.open(path, "rb") if gz else open(path, "rb")


class GzipLinesReader:
    """Lines of whole-file gzip splits (``start == 0``, ``end is None``), one split after another.

    Offset rule: offsets are positions in the *decompressed* stream (a gzip file cannot be cut
    into byte ranges, so it is a single split). A record is one line, as in JSON Lines. Resuming
    from a committed offset decompresses the file from its beginning and discards everything
    before the offset (a resume offset above 0 is always a line start: the ``next_offset`` of an
    emitted line). Over-long lines come out truncated. A corrupt or truncated gzip stream raises
    from ``fetch`` (``gzip.BadGzipFile``/``EOFError``): the whole split fails, not one record.
    """

    def __init__(self, *, max_line_bytes: int, chunk_bytes: int = 1 << 20) -> None:
        self._max_line, self._chunk = max_line_bytes, chunk_bytes
        self._splits: deque[SplitAssignment] = deque()
        self._current: SplitAssignment | None = None
        self._file: io.BufferedIOBase | None = None
        self._pos, self._carry = 0, b""  # decompressed offset of the first byte of self._carry
        self._long_start: int | None = None  # inside an over-long line starting here
        self._long_prefix, self._woken = b"", False

    def add_split(self, assignment: SplitAssignment) -> None:
        _check_whole_file(assignment)
        self._splits.append(assignment)

    def has_splits(self) -> bool:
        return self._current is not None or bool(self._splits)

    def wake_up(self) -> None:
        self._woken = True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open_next(self) -> None:
        self._current = assignment = self._splits.popleft()
        self._file = _open_binary(assignment.split.path, gz=True)
        self._file.seek(assignment.resume_offset)  # decompresses and discards up to it
        self._pos, self._carry = assignment.resume_offset, b""
        self._long_start, self._long_prefix = None, b""

    def fetch(self) -> RecordsWithSplitIds[RawLine]:
        """Up to one chunk of lines of the current split; marks the split finished at its end."""
        self._woken = False
        batch = RecordsWithSplitIds[RawLine]()
        if self._current is None:
            if not self._splits:
                return batch
            self._open_next()
        assert self._current is not None and self._file is not None
        split_id, lines = self._current.split_id, list[RawLine]()
        while not lines and not self._woken:
            chunk = self._file.read(self._chunk)
            if not chunk:
                self._flush_last(lines)
                batch.finished.append(split_id)
                self.close()
                self._current = None
                break
            self._split_lines(self._carry + chunk, lines)
        if lines:
            batch.records[split_id] = lines
        return batch

    def _split_lines(self, data: bytes, lines: list[RawLine]) -> None:
        """Appends the lines completed in ``data`` (which starts at ``self._pos``)."""
        limit, base, start = self._max_line, self._pos, 0
        while (newline := data.find(b"\n", start)) >= 0:
            following = base + newline + 1
            if self._long_start is not None:
                lines.append(RawLine(self._long_start, following, self._long_prefix, True))
                self._long_start, self._long_prefix = None, b""
            else:
                content = data[start:newline].removesuffix(b"\r")
                lines.append(
                    RawLine(base + start, following, content[:limit], len(content) > limit)
                )
            start = newline + 1
        rest = data[start:]
        if self._long_start is None and len(rest) > limit + 1:  # + 1: a pending "\r"
            self._long_start, self._long_prefix = base + start, rest[:limit]
        if self._long_start is not None:  # drop the rest of an over-long line
            self._pos, self._carry = base + len(data), b""
        else:
            self._pos, self._carry = base + start, rest

    def _flush_last(self, lines: list[RawLine]) -> None:
        """The last line when it has no trailing newline."""
        if self._long_start is not None:
            lines.append(RawLine(self._long_start, self._pos, self._long_prefix, True))
        elif self._carry:
            content, limit = self._carry.removesuffix(b"\r"), self._max_line
            end = self._pos + len(self._carry)
            lines.append(RawLine(self._pos, end, content[:limit], len(content) > limit))
        self._pos += len(self._carry)
        self._carry, self._long_start, self._long_prefix = b"", None, b""


class LinesSplitReader:
    """Lines of each split, one split after another: byte ranges of plain files (the JSON Lines
    rule, see :class:`JsonLinesSplitReader`) and whole gzip files (kind ending in ``.gz``, see
    :class:`GzipLinesReader`). Usable as is for ``"jsonl"`` and ``"jsonl.gz"`` splits.

    Threading: ``fetch`` may block; called by one fetcher thread; ``wake_up`` from any thread.
    """

    def __init__(self, *, max_line_bytes: int, chunk_bytes: int = 1 << 20) -> None:
        self._max_line, self._chunk = max_line_bytes, chunk_bytes
        self._splits: deque[SplitAssignment] = deque()
        self._inner: JsonLinesSplitReader | GzipLinesReader | None = None

    def add_split(self, assignment: SplitAssignment) -> None:
        if is_gzip_kind(assignment.split.kind):
            _check_whole_file(assignment)
        self._splits.append(assignment)

    def has_splits(self) -> bool:
        return self._inner is not None or bool(self._splits)

    def wake_up(self) -> None:
        if (inner := self._inner) is not None:
            inner.wake_up()

    def close(self) -> None:
        """Releases the open file; the reader is not used afterwards."""
        inner, self._inner = self._inner, None
        if inner is not None:
            inner.close()

    def fetch(self) -> RecordsWithSplitIds[RawLine]:
        """Up to one chunk of lines of the current split; marks the split finished at its end."""
        if self._inner is None:
            if not self._splits:
                return RecordsWithSplitIds[RawLine]()
            assignment = self._splits.popleft()
            self._started(assignment)
            gz = is_gzip_kind(assignment.split.kind)
            kind = GzipLinesReader if gz else JsonLinesSplitReader
            self._inner = kind(max_line_bytes=self._max_line, chunk_bytes=self._chunk)
            self._inner.add_split(assignment)
        batch = self._inner.fetch()
        if batch.finished:
            self.close()
        return batch

    def _started(self, assignment: SplitAssignment) -> None:
        """Hook: called in ``fetch`` before the first line of ``assignment`` is read."""


class CsvHeaderError(ValueError):
    """A CSV file's header line is unusable: the whole split fails (not one record)."""


class CsvSplitReader(LinesSplitReader):
    """Data lines of CSV splits (kind ``"csv"``: byte ranges; ``"csv.gz"``: whole file).

    Offset rule: as JSON Lines, a record is one line and belongs to the split in which its first
    byte lies; offsets are file offsets (decompressed offsets for gzip). Quoted fields spanning
    lines are *not supported*: such a record is cut at its newlines and :func:`parse_csv_record`
    reports the pieces as malformed (the first and last have an odd number of ``"``).

    Header: the line at offset 0 is the file's header, never emitted as data. When ``fetch``
    starts a split it reads the file's first line (an unusable one raises
    :class:`CsvHeaderError`), so ``header_of(split_id)`` is set before any record of the split
    leaves ``fetch``; it may be called from any thread (the mailbox thread, for
    :func:`parse_csv_record`). ``release(split_id)`` drops it once the split is finished
    downstream. An empty file has the header ``[]`` and no records.

    Threading: ``fetch`` may block; called by one fetcher thread; ``wake_up`` from any thread.
    """

    def __init__(self, *, max_line_bytes: int, chunk_bytes: int = 1 << 20) -> None:
        super().__init__(max_line_bytes=max_line_bytes, chunk_bytes=chunk_bytes)
        self._headers: dict[int, list[str]] = {}
        self._lock = threading.Lock()

    def header_of(self, split_id: int) -> list[str]:
        """Column names of a split's file (KeyError before ``fetch`` started the split)."""
        with self._lock:
            return self._headers[split_id]

    def release(self, split_id: int) -> None:
        with self._lock:
            self._headers.pop(split_id, None)

    def _started(self, assignment: SplitAssignment) -> None:
        header = read_csv_header(assignment, self._max_line)
        with self._lock:
            self._headers[assignment.split_id] = header

    def fetch(self) -> RecordsWithSplitIds[RawLine]:
        """As :meth:`LinesSplitReader.fetch` (records of one split at a time), minus the header."""
        while True:
            batch = super().fetch()
            for split_id, lines in list(batch.records.items()):
                if lines[0].offset == 0:  # the header line
                    del lines[0]
                    if not lines:
                        del batch.records[split_id]
                        if not batch.finished:
                            break  # a batch of only the header: fetch on
            else:
                return batch


def read_csv_header(assignment: SplitAssignment, max_line_bytes: int) -> list[str]:
    """The column names on the first line of the split's file (``[]`` for an empty file)."""
    split = assignment.split
    with _open_binary(split.path, is_gzip_kind(split.kind)) as file:
        first = file.readline(max_line_bytes + 2)  # room for the line ending
    if not first:
        return []
    where = f"split {assignment.split_id} ({split.path})"
    content = first.removesuffix(b"\n").removesuffix(b"\r")
    if len(content) > max_line_bytes:
        raise CsvHeaderError(f"{where}: header line longer than {max_line_bytes} bytes")
    try:
        text = content.decode("utf-8-sig")
        row = next(csv.reader([text], strict=True), [])
    except (UnicodeDecodeError, csv.Error) as exc:
        raise CsvHeaderError(f"{where}: unreadable header line: {exc}") from exc
    names = [name.strip() for name in row]
    if not any(names):
        raise CsvHeaderError(f"{where}: empty header line")
    if len(set(names)) != len(names):
        raise CsvHeaderError(f"{where}: duplicate column names in header {names}")
    return names


def parse_csv_record(
    split_id: int, header: list[str], line: RawLine, max_line_bytes: int
) -> Event | str | None:
    """The event in one CSV data line; a dead-letter reason (``"category: detail"``) if it is
    malformed; None for a blank line (not a record). Empty fields count as missing;
    user ids outside the int64 range (the sink's type) are bad values."""
    if line.truncated:
        return f"line too long: over {max_line_bytes} bytes"
    if not line.data.strip():
        return None
    try:
        text = line.data.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid UTF-8: line is not valid UTF-8 text"
    if text.count('"') % 2:  # both halves of a quoted field cut at its newline are odd
        return "invalid CSV: unbalanced quotes (quoted fields spanning lines are not supported)"
    try:
        fields = next(csv.reader([text], strict=True))
    except csv.Error as exc:
        return f"invalid CSV: {exc}"
    if len(fields) != len(header):
        return f"bad value: expected {len(header)} fields, got {len(fields)}"
    obj: dict[str, Any] = {k: (v if v != "" else None) for k, v in zip(header, fields, strict=True)}
    user_id = obj.get("user_id")
    if user_id is not None:
        if not _INT.fullmatch(user_id.strip()):
            return f"wrong type: user_id must be an integer, got {user_id[:40]!r}"
        obj["user_id"] = int(user_id)
        if not -(2**63) <= obj["user_id"] < 2**63:
            return f"bad value: user_id {user_id[:40]!r} is outside the int64 range"
    amount = obj.get("amount")
    if amount is not None:
        try:
            obj["amount"] = float(amount)
        except ValueError:
            return f"wrong type: amount must be a number, got {amount[:40]!r}"
        if not math.isfinite(obj["amount"]):
            return f"bad value: amount {amount[:40]!r} is not finite"
    return validate_event(split_id, obj)
