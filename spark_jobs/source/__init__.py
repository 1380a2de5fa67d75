"""FLIP-27 reading: split readers, the fetcher thread, the record emitter, the source reader."""

from spark_jobs.source._csv_reader import CsvSplitReader, LinesSplitReader, parse_csv_record
from spark_jobs.source._emitter import ReaderOutput, RecordEmitter
from spark_jobs.source._events import Event, parse_event, validate_event
from spark_jobs.source._fetcher import HandoffQueue, SplitFetcher
from spark_jobs.source._format_router import FormatRouter, SplitBatch, SplitReader
from spark_jobs.source._jsonl_reader import JsonLinesSplitReader
from spark_jobs.source._parquet_reader import ParquetSplitReader, RowRecord, parse_parquet_record
from spark_jobs.source._reader import InputStatus, SourceReaderBase
from spark_jobs.source._records import RawLine, RecordsWithSplitIds
from spark_jobs.source._table_reader import TableRangeSplitReader

__all__ = [
    "CsvSplitReader",
    "Event",
    "FormatRouter",
    "HandoffQueue",
    "InputStatus",
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
    "parse_csv_record",
    "parse_event",
    "parse_parquet_record",
    "validate_event",
]
