"""FLIP-27 reading for any declared schema: split readers, the fetcher thread, the record
emitter, the source reader.

Every format is read in :class:`ParsedBlock`\\ s of a :class:`RecordSchema` (parsed and
validated on the fetcher thread); the exact per-record semantics are in ``_convert``.
"""

from spark_jobs.source._batch import (
    OFFSET,
    Batch,
    DeadLetter,
    ParsedBlock,
    RecordSchema,
    user_rows,
    with_offsets,
)
from spark_jobs.source._blocks import JsonLinesParser
from spark_jobs.source._convert import RecordConverter, max_event_time, new_block
from spark_jobs.source._csv import CsvHeaderError, CsvLinesParser
from spark_jobs.source._emitter import ReaderOutput, RecordEmitter
from spark_jobs.source._fetcher import HandoffQueue, SplitFetcher
from spark_jobs.source._format_router import FormatRouter, SplitReader
from spark_jobs.source._line_reader import LineSplitReader
from spark_jobs.source._parquet_reader import ParquetSplitError, ParquetSplitReader
from spark_jobs.source._reader import InputStatus, SourceReaderBase
from spark_jobs.source._records import BlockReader, RecordsWithSplitIds, SplitRead
from spark_jobs.source._table_reader import TableRangeSplitReader

__all__ = [
    "OFFSET",
    "Batch",
    "BlockReader",
    "CsvHeaderError",
    "CsvLinesParser",
    "DeadLetter",
    "FormatRouter",
    "HandoffQueue",
    "InputStatus",
    "JsonLinesParser",
    "LineSplitReader",
    "ParquetSplitError",
    "ParquetSplitReader",
    "ParsedBlock",
    "ReaderOutput",
    "RecordConverter",
    "RecordEmitter",
    "RecordSchema",
    "RecordsWithSplitIds",
    "SourceReaderBase",
    "SplitFetcher",
    "SplitRead",
    "SplitReader",
    "TableRangeSplitReader",
    "max_event_time",
    "new_block",
    "user_rows",
    "with_offsets",
]
