"""What a pipeline does to its records, in order: lookups, the user's async functions, maps
and filters.

Steps are plain, immutable descriptions; the :class:`~spark_jobs.pipeline.Pipeline` holding
them validates them (naming pipeline, step and field) and derives each step's output
schema. At run time each step is one operator of the task's chain, all on the task's one
mailbox thread: ``Lookup`` and ``AsyncMap`` are async wait operators with their own queue
(``capacity`` elements in flight, ``ordered`` or ``unordered`` output), ``Map`` and
``Filter`` run inline. When the source declares an event-time field, watermarks flow
through every step: ``ordered`` keeps them in input order with the records, and
``unordered`` becomes *event-time* unordered — records overtake each other only between two
watermarks, never a watermark (processing time, without an event-time field: fully
unordered).

Options left ``None`` take the platform's defaults (``SLUICE_LOOKUP_*``) when a run opens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.async_io import AsyncRetryStrategy
from spark_jobs.pipeline._types import Duration, TypeSpec

__all__ = [
    "AsyncMap",
    "Filter",
    "FullCache",
    "Lookup",
    "Map",
    "MissPolicy",
    "OutputMode",
    "PartialCache",
    "RetryOnMiss",
    "Step",
]

OutputMode: TypeAlias = Literal["ordered", "unordered"]
MissPolicy: TypeAlias = Literal["keep", "drop", "dead_letter"]


@dataclass(frozen=True)
class PartialCache:
    """Flink's partial lookup cache, per task: up to ``max_rows`` keys (least recently used
    evicted), expired ``expire_after_write`` after they were read from Postgres and/or
    ``expire_after_access`` after their last use; keys without a row are cached as misses
    too unless ``cache_missing`` is False (never with ``on_miss="retry"``)."""

    max_rows: int
    expire_after_write: Duration | None = "5m"
    expire_after_access: Duration | None = None
    cache_missing: bool = True


@dataclass(frozen=True)
class FullCache:
    """The whole table (its key and looked-up columns) in Arrow, per task: no query per
    record at all. Loaded when the task opens and again every ``reload_every`` (None: once);
    a reload swaps the table atomically between two batches. For small dimension tables."""

    reload_every: Duration | None = None


@dataclass(frozen=True)
class RetryOnMiss:
    """FLIP-234's retry on an empty result, for rows that reach the table after the record:
    rows without a match are looked up again after ``delay``, up to ``attempts`` more times
    (the whole element waits: its results keep their order); rows still without a match
    then follow ``then``. The step's ``timeout`` spans all attempts and must exceed them."""

    attempts: int = 3
    delay: Duration = "1s"
    then: MissPolicy = "keep"


@dataclass(frozen=True)
class Lookup:
    """Enrich each record with columns of the row of a Postgres table that matches its key.

    - ``table``: ``"schema.table"`` (or ``"table"`` in ``public``).
    - ``on``: record field → table column (a composite key maps several); a string or a list
      uses the same name on both sides. Key types must match the columns' (checked against
      the catalog when a run opens).
    - ``columns``: table columns to add, as a list (same names) or column → output name.
    - ``on_miss``: a record without a matching row is kept with nulls (``"keep"``, a left
      join), dropped (``"drop"``), sent to the dead letters (``"dead_letter"``), or looked up
      again (``"retry"`` or a :class:`RetryOnMiss`).
    - ``cache``: None, :class:`PartialCache` or :class:`FullCache`.
    - ``timeout`` (all attempts of one element), ``retries`` (of a failed query: connection
      errors, with exponential backoff), ``capacity`` (elements in flight; an element is a
      block of records), ``batch_size`` (distinct keys per query), ``mode``.
    """

    table: str
    on: Mapping[str, str] | Sequence[str] | str
    columns: Sequence[str] | Mapping[str, str]
    on_miss: MissPolicy | Literal["retry"] | RetryOnMiss = "keep"
    cache: PartialCache | FullCache | None = None
    timeout: Duration | None = None
    retries: int | None = None
    capacity: int | None = None
    batch_size: int | None = None
    mode: OutputMode = "ordered"
    name: str | None = None

    kind = "Lookup"

    def label(self) -> str:
        return self.name or self.table


@dataclass(frozen=True)
class AsyncMap:
    """The user's own asynchronous function (Flink's ``AsyncFunction``), e.g. a call to a
    scoring service.

    ``function`` is an :class:`~spark_jobs.async_io.AsyncFunction` (callback style
    ``async_invoke(value, result_future)``, overridable ``timeout(value, result_future)``),
    a :class:`~spark_jobs.async_io.CoroutineAsyncFunction`, or a plain ``async def``.

    - ``per="record"``: the value is one record as a dict (read it, do not change it); the
      function completes with a list of dicts holding the ``output`` fields, each becoming one
      output record (the input record plus those fields): ``[]`` drops the record, a
      missing field is null. ``capacity`` counts records.
    - ``per="batch"``: the value is a ``pyarrow.RecordBatch`` of records; the function
      completes with one RecordBatch of the same length holding the ``output`` fields.

    ``output``: the fields it adds (name → type). ``timeout`` bounds one element across all
    attempts (on expiry the function's ``timeout()`` decides: by default the task fails);
    ``retry``: an ``AsyncRetryStrategy`` (``fixed_delay``, ``exponential_backoff``, with
    result and exception predicates; it needs a timeout).
    """

    function: Any
    output: Mapping[str, TypeSpec]
    per: Literal["record", "batch"] = "record"
    capacity: int | None = None
    timeout: Duration | None = None
    retry: AsyncRetryStrategy | None = None
    mode: OutputMode = "ordered"
    name: str | None = None

    kind = "AsyncMap"

    def label(self) -> str:
        if self.name:
            return self.name
        function = self.function
        named = getattr(function, "__name__", None) or type(function).__name__
        return str(named)


@dataclass(frozen=True)
class Map:
    """A function of a ``pyarrow.RecordBatch`` returning a RecordBatch with one row per input
    row (in order): add, replace or drop columns. Its output schema is found by calling it
    on an empty batch of its input schema, or given as ``output`` (the fields it adds or
    replaces; every input field is then kept)."""

    function: Callable[[pa.RecordBatch], pa.RecordBatch]
    output: Mapping[str, TypeSpec] | None = None
    name: str | None = None

    kind = "Map"

    def label(self) -> str:
        return self.name or str(getattr(self.function, "__name__", "function"))


@dataclass(frozen=True)
class Filter:
    """Keep the records for which a ``pyarrow.compute`` expression is true (e.g.
    ``pc.field("qty") > 0``; compare a decimal field with a ``Decimal``: Arrow compares
    decimals with integer literals only at small precisions); null counts as false."""

    predicate: pc.Expression
    name: str | None = None

    kind = "Filter"

    def label(self) -> str:
        return self.name or str(self.predicate)


Step = Lookup | AsyncMap | Map | Filter
