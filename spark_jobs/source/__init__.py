"""FLIP-27 reading: split readers, the fetcher thread, the record emitter, the source reader."""

from spark_jobs.source._blocks import EVENT_SCHEMA, EventBlock, events_to_batch, parse_lines
from spark_jobs.source._csv_reader import CsvSplitReader, LinesSplitReader, parse_csv_record
from spark_jobs.source._emitter import ReaderOutput, RecordEmitter
from spark_jobs.source._events import Event, parse_event, validate_event
from spark_jobs.source._fetcher import HandoffQueue, SplitFetcher
from spark_jobs.source._format_router import FormatRouter, SplitBatch, SplitReader
from spark_jobs.source._jsonl_blocks import JsonBlockSplitReader, read_span
from spark_jobs.source._jsonl_reader import JsonLinesSplitReader
from spark_jobs.source._parquet_reader import ParquetSplitReader, RowRecord, parse_parquet_record
from spark_jobs.source._reader import InputStatus, SourceReaderBase
from spark_jobs.source._records import RawLine, RecordsWithSplitIds
from spark_jobs.source._table_reader import TableRangeSplitReader

__all__ = [
    "EVENT_SCHEMA",
    "CsvSplitReader",
    "Event",
    "EventBlock",
    "FormatRouter",
    "HandoffQueue",
    "InputStatus",
    "JsonBlockSplitReader",
    "JsonLinesSplitReader",
    "LinesSplitReader",
    "ParquetSplitReader",
    "RawLine",
    "ReaderOutput",
    "RecordEmitter",
    "RecordsWithSplitIds",
    "RowRecord",
    "SourceReaderBase",
    "SplitBatch",
    "SplitFetcher",
    "SplitReader",
    "TableRangeSplitReader",
    "events_to_batch",
    "parse_csv_record",
    "parse_event",
    "parse_lines",
    "parse_parquet_record",
    "read_span",
    "validate_event",
]
