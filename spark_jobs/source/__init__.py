"""FLIP-27 reading: split readers, the fetcher thread, the record emitter, the source reader."""

from spark_jobs.source._events import Event, parse_event, validate_event
from spark_jobs.source._fetcher import HandoffQueue, SplitFetcher
from spark_jobs.source._jsonl_reader import JsonLinesSplitReader
from spark_jobs.source._reader import InputStatus, ReaderOutput, SourceReader
from spark_jobs.source._records import RawLine, RecordsWithSplitIds

__all__ = [
    "Event",
    "HandoffQueue",
    "InputStatus",
    "JsonLinesSplitReader",
    "RawLine",
    "ReaderOutput",
    "RecordsWithSplitIds",
    "SourceReader",
    "SplitFetcher",
    "parse_event",
    "validate_event",
]
