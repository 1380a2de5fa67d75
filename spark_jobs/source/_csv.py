"""CSV lines: the header, and data lines parsed column-wise by Arrow where that provably
gives the exact per-line path's rows (``_csv_blocks``), by the exact path otherwise.

A record is one line (as in JSON Lines, see :mod:`._lines`). Quoted fields spanning lines
are *not supported*: such a record is cut at its newlines and each piece is reported as
malformed (the first and last have an odd number of ``"``). Columns are mapped to the
declared fields by header name; declared fields missing from the header are null, columns
not declared are ignored, and an empty field is null (see :mod:`._convert`).

Header: the line at offset 0 is the file's header, never a record. A reader reads it when a
split starts (:func:`read_csv_header`); an unusable header raises :class:`CsvHeaderError`
(the whole split fails, not one record). An empty file has the header ``[]`` and no records.

Threading: a parser is immutable; any thread (the fetcher thread).
"""

from __future__ import annotations

import csv
from typing import Any

import pyarrow as pa

from enumerator_service import FileIdentity, LandingRoot, ObjectLanding
from spark_jobs._dead_letters import BAD_VALUE, INVALID_CSV, INVALID_UTF8, LINE_TOO_LONG
from spark_jobs.source._batch import DeadLetter
from spark_jobs.source._convert import RecordConverter
from spark_jobs.source._csv_blocks import CsvBlockParser
from spark_jobs.source._lines import lines_of, open_data_file

__all__ = ["CsvHeaderError", "CsvLinesParser", "read_csv_header"]

_UNBALANCED = f"{INVALID_CSV}: unbalanced quotes (quoted fields spanning lines are not supported)"


class CsvHeaderError(ValueError):
    """A CSV file's header line is unusable: the whole split fails (not one record)."""


def read_csv_header(
    path: str,
    *,
    gz: bool,
    where: str,
    max_line_bytes: int,
    landing: LandingRoot | ObjectLanding | None = None,
    expected: FileIdentity | None = None,
) -> list[str]:
    """The column names on the first line of the file (``[]`` for an empty file); ``where``
    names the split in errors; ``landing`` checks where the file is (see ``open_data_file``)."""
    with open_data_file(path, gz=gz, landing=landing, expected=expected) as file:
        first = file.readline(max_line_bytes + 2)  # room for the line ending
    if not first:
        return []
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


class CsvLinesParser:
    """Parses whole CSV lines of one file (``header`` its column names)."""

    def __init__(self, converter: RecordConverter, header: list[str], max_line_bytes: int):
        self._converter = converter
        self._width = len(header)
        position = {name: i for i, name in enumerate(header)}
        self._columns = [position.get(name) for name in converter.names]
        self._limit = max_line_bytes
        self._blocks = CsvBlockParser(converter.schema, header, max_line_bytes, self.parse_exact)

    def parse(self, data: bytes, offset: int) -> tuple[pa.RecordBatch, list[DeadLetter]]:
        """Whole lines ``data`` starting at file offset ``offset``: (rows in line order, dead
        letters in offset order), exactly ``parse_exact``'s. The line at offset 0 (the
        header) is skipped."""
        if not self._blocks.usable:
            return self.parse_exact(data, offset)
        if offset == 0:
            newline = data.find(b"\n")
            if newline < 0:
                return self.parse_exact(data, offset)
            data, offset = data[newline + 1 :], newline + 1
            if not data:
                return self._converter.empty(), []
        return self._blocks.parse(data, offset)

    def parse_exact(self, data: bytes, offset: int) -> tuple[pa.RecordBatch, list[DeadLetter]]:
        """``parse`` line by line (``parse_line``): the definition of its result."""
        rows: list[tuple[Any, ...]] = []
        offsets: list[int] = []
        dead: list[DeadLetter] = []
        for at, content, truncated in lines_of(data, offset, self._limit):
            if at == 0:
                continue
            parsed = self.parse_line(content, truncated)
            if isinstance(parsed, str):
                dead.append((at, content, parsed))
            elif parsed is not None:
                rows.append(parsed)
                offsets.append(at)
        return self._converter.to_batch(rows, offsets), dead

    def parse_line(self, content: bytes, truncated: bool = False) -> tuple[Any, ...] | str | None:
        """One data line (without its line ending): the row, a dead-letter reason, or None
        for a blank line (not a record)."""
        if truncated:
            return f"{LINE_TOO_LONG}: over {self._limit} bytes"
        if not content.strip():
            return None
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError:
            return f"{INVALID_UTF8}: line is not valid UTF-8 text"
        if text.count('"') % 2:  # both halves of a quoted field cut at its newline are odd
            return _UNBALANCED
        try:
            fields = next(csv.reader([text], strict=True))
        except csv.Error as exc:
            return f"{INVALID_CSV}: {exc}"
        if len(fields) != self._width:
            return f"{BAD_VALUE}: expected {self._width} fields, got {len(fields)}"
        values = [None if i is None or not fields[i] else fields[i] for i in self._columns]
        return self._converter.from_text(values)
