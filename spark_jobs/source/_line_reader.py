"""Reader of line files — JSON Lines and CSV, plain byte ranges or whole gzip files — in blocks.

One ``fetch`` reads up to about ``chunk_bytes`` of whole lines (:class:`LineCursor`) and
parses them on the fetcher thread into one :class:`ParsedBlock`: JSON Lines by the block
parser (:class:`JsonLinesParser`, whose fast path equals the exact per-line path), CSV line
by line (:class:`CsvLinesParser`). Over-long lines are dead letters ``line too long``.

Offset rule of a block (the unit the operators, checkpoints and restore work with): a block
covers the whole lines ``[start, end)`` — ``start`` is the first byte of its first line
(always a line start: a split's partial first line is skipped before it), ``end`` the first
byte after its last line, which is the split's offset once the block is emitted (so a resume
offset is always a line start or the split's start). Consecutive blocks of a read touch.
Re-reading ``[start, end)`` (a replay read) yields exactly the block's lines again.

Threading: ``open`` and ``fetch`` may block on file I/O and are called by one fetcher thread
only; ``wake_up`` may be called from any thread and makes a running ``fetch`` return early.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa

from enumerator_service import FileSplit, LandingRoot, ObjectLanding
from spark_jobs._dead_letters import LINE_TOO_LONG
from spark_jobs.source._batch import DeadLetter, ParsedBlock, RecordSchema
from spark_jobs.source._blocks import JsonLinesParser
from spark_jobs.source._convert import RecordConverter, new_block
from spark_jobs.source._csv import CsvHeaderError, CsvLinesParser, read_csv_header
from spark_jobs.source._lines import LineCursor
from spark_jobs.source._records import SplitRead

__all__ = ["LINE_KINDS", "LineSplitReader", "check_whole_file"]

_BOM = b"\xef\xbb\xbf"
#: The split kinds read by :class:`LineSplitReader`.
LINE_KINDS = frozenset({"jsonl", "jsonl.gz", "csv", "csv.gz"})


class _LinesParser(Protocol):
    def parse(self, data: bytes, offset: int) -> tuple[pa.RecordBatch, list[DeadLetter]]: ...


def check_whole_file(split: FileSplit) -> None:
    """A gzip split must cover its whole file (``start == 0``, ``end is None``)."""
    if split.kind.endswith(".gz") and (split.start != 0 or split.end is not None):
        bounds = f"[{split.start}, {split.end})"
        raise ValueError(f"gzip split {split.path} must cover the whole file, got {bounds}")


class LineSplitReader:
    """Reads one read of a line file at a time, one block per ``fetch``."""

    def __init__(
        self,
        schema: RecordSchema,
        *,
        max_line_bytes: int,
        chunk_bytes: int = 256 << 10,
        landing: LandingRoot | ObjectLanding | None = None,
    ) -> None:
        self._schema = schema
        self._landing = landing  # None: files are opened without the landing folder check
        self._converter = RecordConverter(schema)
        self._json = JsonLinesParser(schema, max_line_bytes)
        self._max_line = max_line_bytes
        self._chunk = chunk_bytes
        self._split_id = -1
        self._cursor: LineCursor | None = None
        self._parser: _LinesParser = self._json

    def open(self, read: SplitRead) -> None:
        self.close()
        split = read.split
        if not isinstance(split, FileSplit) or split.kind not in LINE_KINDS:
            raise ValueError(f"not a line file split: {split!r}")
        check_whole_file(split)
        gz = split.kind.endswith(".gz")
        if split.kind.startswith("csv"):
            where = f"split {read.split_id} ({split.path})"
            header = read_csv_header(
                split.path,
                gz=gz,
                where=where,
                max_line_bytes=self._max_line,
                landing=self._landing,
                expected=split.file,
            )
            # A header without a required column would make every line a dead letter: the
            # file is wrong as a whole (renamed columns, another file's layout), so it fails.
            missing = sorted(self._schema.required - set(header)) if header else []
            if missing:
                raise CsvHeaderError(f"{where}: header lacks required columns {missing}")
            self._parser = CsvLinesParser(self._converter, header, self._max_line)
        else:
            self._parser = self._json
        self._split_id = read.split_id
        self._cursor = LineCursor(
            split.path,
            gz=gz,
            start=split.start,
            resume=read.resume,
            stop=read.stop_within(split.end),
            max_line_bytes=self._max_line,
            chunk_bytes=self._chunk,
            landing=self._landing,
            expected=split.file,
        )

    def fetch(self) -> tuple[ParsedBlock | None, bool]:
        if self._cursor is None:
            return None, True
        run = self._cursor.read()
        if run.finished:
            self.close()
        bounds = run.bounds
        if bounds is None:
            return None, run.finished
        text = run.text
        if run.text_at == 0 and text.startswith(_BOM) and self._parser is self._json:
            # A UTF-8 byte order mark opening the file is not part of its first record (CSV
            # drops it with the header): blanks keep every offset, and JSON skips them.
            text = b"   " + text[len(_BOM) :]
        if text:
            rows, dead = self._parser.parse(text, run.text_at)
        else:
            rows, dead = self._converter.empty(), []
        for line in (run.long_before, run.long_after):
            if line is not None:
                prefix = line.prefix
                if line.offset == 0 and prefix.startswith(_BOM) and self._parser is self._json:
                    prefix = b"   " + prefix[len(_BOM) :]  # (as the first record's text)
                dead.append((line.offset, prefix, f"{LINE_TOO_LONG}: over {self._max_line} bytes"))
        block = new_block(self._schema, self._split_id, bounds[0], bounds[1], rows, dead)
        return block, run.finished

    def wake_up(self) -> None:
        if (cursor := self._cursor) is not None:
            cursor.wake_up()

    def close(self) -> None:
        cursor, self._cursor = self._cursor, None
        if cursor is not None:
            cursor.close()
