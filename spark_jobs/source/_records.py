"""Batches handed from fetcher threads to the mailbox thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from enumerator_service import SplitAssignment

__all__ = ["RawLine", "RecordsWithSplitIds"]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class RawLine:
    """One line of a split: its first byte, the first byte after it, and its content.

    ``truncated`` marks a line longer than the reader's limit (content holds its beginning).
    """

    offset: int
    next_offset: int
    data: bytes
    truncated: bool = False


@dataclass(slots=True)
class RecordsWithSplitIds(Generic[R]):
    """Records of one fetch, grouped by split, plus splits added or finished by it.

    ``R`` is the record type of the format: ``RawLine`` for text files, ``RowRecord`` for
    Parquet and table rows.
    """

    added: list[SplitAssignment] = field(default_factory=list)
    records: dict[int, list[R]] = field(default_factory=dict)
    finished: list[int] = field(default_factory=list)
    end_of_input: bool = False
