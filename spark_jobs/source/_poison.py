"""Poison splits: which read errors are a split's own fault, and how they are reported.

A split *attempt fails* when reading it raises on the split's content: a truncated or corrupt
gzip stream, an unreadable Parquet file (bad footer, too few row groups), an unusable CSV
header, a file that is gone or unreadable, a file that changed since discovery (the last is
*final*: quarantined at once, another attempt would read the same changed file). Such a
failure is reported with the split (see :class:`SplitFailure`) instead of failing the task:
the reader drops the split and goes on with its other splits; the failure is counted when
the checkpoint carrying it commits, and after ``SLUICE_SPLIT_MAX_ATTEMPTS`` the split is
quarantined (status FAILED).

Everything else — a lost database connection, a killed worker (no exception at all), memory,
a bug (TypeError, AttributeError …) and errors of table-range splits (database reads) — is
an infrastructure failure: it fails the task as before, Spark retries it, and it restores
from the last completed checkpoint without counting against any split.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass

from enumerator_service import redact_text
from enumerator_service._file_identity import CHANGED_REASON, FileChangedError
from enumerator_service._landing import OutsideLandingError
from enumerator_service._object_landing import OutsidePrefixError
from spark_jobs.source._csv import CsvHeaderError
from spark_jobs.source._parquet_reader import ParquetSplitError

__all__ = ["MAX_ERROR_CHARS", "SplitFailure", "content_failure", "one_line"]

#: Stored and shown error messages are cut to this many characters (one line).
MAX_ERROR_CHARS = 500

# Content errors by type, each with the short reason kept in ``splits.failure_reason``. Order
# matters: the first matching type names the reason (CsvHeaderError is a ValueError).
_CONTENT_ERRORS: tuple[tuple[type[BaseException], str], ...] = (
    (FileChangedError, CHANGED_REASON),
    (CsvHeaderError, "bad CSV header"),
    (ParquetSplitError, "unreadable Parquet file"),
    (gzip.BadGzipFile, "corrupt gzip stream"),
    (EOFError, "truncated compressed stream"),
    (zlib.error, "corrupt compressed stream"),
    (OutsidePrefixError, "key outside the landing prefix"),
    (OutsideLandingError, "link leads out of the landing folder"),
    (FileNotFoundError, "file not found"),
    (IsADirectoryError, "not a file"),
    (PermissionError, "file not readable"),
    (UnicodeDecodeError, "undecodable content"),
    (ValueError, "unreadable content"),
)


def one_line(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``message`` on one line, URLs' passwords redacted, at most ``limit`` characters."""
    flat = " ".join(message.split())
    flat = redact_text(flat)  # every URL in it, redacted as everywhere else
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class SplitFailure:
    """A failed attempt on split ``split_id``: a short reason and the (one-line) error."""

    split_id: int
    reason: str
    error: str
    #: Another attempt cannot succeed (the file changed since discovery): quarantined at once.
    final: bool = False


def content_failure(split_id: int, kind: str, exc: BaseException) -> SplitFailure | None:
    """The split failure ``exc`` is, or None when it is not the split's own fault."""
    if kind == "table":
        return None  # a table range is read from the database: an infrastructure failure
    for error_type, reason in _CONTENT_ERRORS:
        if isinstance(exc, error_type):
            message = one_line(f"{type(exc).__name__}: {exc}")
            return SplitFailure(split_id, reason, message, isinstance(exc, FileChangedError))
    return None
