"""What both sinks share on the task side: the result of a pre-commit, and the check that a
batch has the output schema.

Threading: plain values and a pure function, any thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from spark_jobs.pipeline._types import type_name

__all__ = ["StagedOutput", "conform_batch"]


@dataclass(slots=True)
class StagedOutput:
    """What one pre-commit staged: ``files`` (the sink's staged entries: Parquet files, or
    table batches), their ``rows``, dead letters, and how many records the pipeline's steps
    removed in the interval (``dropped``: counted, never stored)."""

    files: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    dropped: int = 0

    @property
    def empty(self) -> bool:
        return not self.files and not self.dead_letters and not self.dropped


def conform_batch(batch: pa.RecordBatch, schema: pa.Schema, where: str) -> pa.RecordBatch:
    """``batch`` with exactly ``schema``: the same field names and types in the same order
    (nullability and metadata are taken from ``schema``); ValueError naming ``where``
    otherwise."""
    if batch.schema.equals(schema):
        return batch
    got = [(f.name, f.type) for f in batch.schema]
    if got != [(f.name, f.type) for f in schema]:
        shown = ", ".join(f"{name} {type_name(kind)}" for name, kind in got)
        wanted = ", ".join(f"{f.name} {type_name(f.type)}" for f in schema)
        raise ValueError(f"{where}: a batch has ({shown}), the output is ({wanted})")
    return pa.RecordBatch.from_arrays(batch.columns, schema=schema)
