"""What a pipeline does to its records, in order: lookups, the user's async functions, maps
and filters.

Steps are plain, immutable descriptions; the :class:`~spark_jobs.pipeline.Pipeline` holding
them validates them (naming pipeline, step and field) and derives each step's output
schema. At run time each step is one operator of the task's chain, all on the task's one
mailbox thread: ``Lookup`` and ``AsyncMap`` are async wait operators with their own queue
(``capacity`` elements in flight, ``ordered``, ``unordered`` or ``key`` output), ``Map``
and ``Filter`` run inline. When the source declares an event-time field, watermarks flow
through every step: ``ordered`` keeps them in input order with the records, and
``unordered`` becomes *event-time* unordered — records overtake each other only between two
watermarks, never a watermark (processing time, without an event-time field: fully
unordered). ``key`` (Flink's FLIP-519) is unordered across keys and ordered per key: records
with the same value of the ``key`` fields leave in input order, and a record is not even
started before the earlier records of its key completed; watermarks as in ``unordered``.

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

OutputMode: TypeAlias = Literal["ordered", "unordered", "key"]
MissPolicy: TypeAlias = Literal["keep", "drop", "dead_letter"]


@dataclass(frozen=True)
class PartialCache:
    """Flink's partial lookup cache, per task: keys looked up recently, with their rows.

    Least recently used keys are evicted beyond `max_rows`; entries expire
    `expire_after_write` after they were read from Postgres and/or `expire_after_access`
    after their last use.

    Args:
        max_rows: Most keys kept per task.
        expire_after_write: A key is read again this long after it was read (`None`: never).
        expire_after_access: A key unused this long is evicted (`None`: never).
        cache_missing: Keys without a row are cached too, as misses. Never with
            `on_miss="retry"` or `RetryOnMiss`.
        min_hit_rate: Below this share of keys answered by the (warm) cache, it costs more
            than it saves: a task then bypasses it (plain queries) for nine windows of
            16,384 keys, and samples it again for one. 0 consults the cache always.
    """

    max_rows: int
    expire_after_write: Duration | None = "5m"
    expire_after_access: Duration | None = None
    cache_missing: bool = True
    min_hit_rate: float = 0.2


@dataclass(frozen=True)
class FullCache:
    """The whole lookup table (its key and looked-up columns) in Arrow, per task: no query
    per record at all. For small dimension tables.

    Loaded when the task opens; a reload swaps the table whole between two batches. A failed
    reload is logged, the loaded table is kept and the next period tries again.

    Args:
        reload_every: Reload the table this often (`None`: loaded once per task).
    """

    reload_every: Duration | None = None


@dataclass(frozen=True)
class RetryOnMiss:
    """FLIP-234's retry on an empty result, for rows that reach the lookup table after the
    record: `Lookup(on_miss=RetryOnMiss(...))`.

    Rows without a match are looked up again after `delay`, up to `attempts` times (the
    whole element waits, so results keep their order); rows still without a match then
    follow `then`. The step's `timeout` spans all attempts and must exceed
    `attempts * delay`. `on_miss="retry"` is `RetryOnMiss()`.

    Args:
        attempts: Lookups again of the keys still without a row (at least 1).
        delay: Wait before each new attempt.
        then: What happens to records still without a row: `"keep"`, `"drop"` or
            `"dead_letter"`.
    """

    attempts: int = 3
    delay: Duration = "1s"
    then: MissPolicy = "keep"


@dataclass(frozen=True)
class Lookup:
    """Enrich each record with columns of the row of a Postgres table that matches its key.

    ```python
    from spark_jobs import Lookup, PartialCache

    step = Lookup(
        "public.users",
        on={"user_id": "id"},
        columns={"country": "user_country"},
        on_miss="dead_letter",
        cache=PartialCache(max_rows=100_000),
    )
    ```

    One query per block of records (`= ANY` of its distinct keys; for a composite key, the
    keys probed through a btree index that begins with its columns, else joined against
    `unnest` of them), results joined back column-wise in Arrow. The key and
    column types are checked against the table's catalog when a run opens: key and column
    must be of one family (integer, float, decimal, string, date, timestamp, bool, binary).

    Args:
        table: `"schema.table"`, or `"table"` in schema `public`.
        on: Record field → table column (several for a composite key); a string or a list
            uses the same name on both sides.
        columns: Table columns to add: a list (same names), or column → output field name.
        on_miss: A record without a matching row is kept with nulls (`"keep"`, a left
            join), dropped (`"drop"`, counted), made a dead letter (`"dead_letter"`, reason
            `lookup miss: <table> has no row for k=v`), or looked up again (`"retry"` or a
            `RetryOnMiss`).
        cache: `None` (a query per block), `PartialCache(...)` or `FullCache(...)`.
        timeout: Bound on one element, all attempts included; past it the task fails.
            Default: `SLUICE_LOOKUP_TIMEOUT_SECONDS`.
        retries: Retries of a query that failed on a connection error (exponential
            backoff). Default: `SLUICE_LOOKUP_RETRIES`.
        capacity: Elements (blocks of records) in flight per task. Default:
            `SLUICE_LOOKUP_CAPACITY`.
        batch_size: Most distinct keys per query. Default: `SLUICE_LOOKUP_BATCH_SIZE`.
        mode: `"ordered"` (output in input order), `"unordered"` (as lookups complete;
            never across a watermark) or `"key"` (in input order per value of `key`, as
            lookups complete across keys; never across a watermark). In `"key"` mode a
            block of records is looked up only once every earlier block sharing a key
            value with it was: a later change of a row is never looked up before the
            earlier one. Blocks of different keys are still looked up concurrently, each
            with its `= ANY` queries. Blocks waiting for their keys count in `capacity`;
            `timeout` runs from the lookup's start.
        key: With `mode="key"` (and only then): the field, or tuple of fields, of the
            step's input whose records keep their order, e.g. the row's primary key.
        name: How errors and metrics name the step. Default: the table.
        url_env: The table is on another server: the name of the environment variable that
            holds its URL (`postgresql://user@host:port/dbname`), set on the driver and on
            every Spark executor — never the URL itself, which would end up in the plan.
            Default: the platform database.
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
    key: str | Sequence[str] | None = None
    name: str | None = None
    url_env: str | None = None

    kind = "Lookup"

    def label(self) -> str:
        return self.name or self.table


@dataclass(frozen=True)
class AsyncMap:
    """The user's own asynchronous function (Flink's `AsyncFunction`), e.g. a call to a
    scoring service; each call is an element of Flink's async wait operator.

    ```python
    from spark_jobs import AsyncMap


    async def score(record: dict) -> list[dict]:
        return [{"score": len(record["event_id"]) / 10}]


    step = AsyncMap(score, output={"score": "float64"}, capacity=50, timeout="10s")
    ```

    `open()` and `close()` of an `AsyncFunction` run on the task's event loop: create
    clients there.

    Args:
        function: An `AsyncFunction` (callback style `async_invoke(value, result_future)`,
            overridable `timeout(value, result_future)`), a `CoroutineAsyncFunction`
            (`async def invoke(value) -> list`), or a plain `async def`.
        output: The fields it adds, name → type.
        per: `"record"`: the value is one record as a dict (read it, do not change it); the
            function completes with a list of dicts holding the `output` fields, each one
            output record (the input record plus those fields): `[]` drops the record, a
            missing field is null. `"batch"`: the value is a `pyarrow.RecordBatch`; the
            function completes with one RecordBatch of the same length holding the `output`
            fields.
        capacity: Elements in flight per task (records, or batches with `per="batch"`).
            Default: 100.
        timeout: Bound on one element, all attempts included; on expiry the function's
            `timeout()` decides (by default the task fails). `None`: no bound.
        retry: `fixed_delay(...)` or `exponential_backoff(...)`, with result and exception
            predicates; needs a `timeout`.
        mode: `"ordered"`, `"unordered"` (as completed; never across a watermark) or
            `"key"` (Flink's FLIP-519: in input order per value of `key`, as completed
            across keys; never across a watermark). In `"key"` mode the function is called
            for a record only once the earlier records of its key completed (a later change
            of a row is never sent before the earlier one; with `per="batch"`, a batch
            waits for the earlier batches sharing any key value). Waiting elements count
            in `capacity`; `timeout` runs from the call.
        key: With `mode="key"` (and only then): the field, or tuple of fields, of the
            step's input whose records keep their order.
        name: How errors and metrics name the step. Default: the function's name.
    """

    function: Any
    output: Mapping[str, TypeSpec]
    per: Literal["record", "batch"] = "record"
    capacity: int | None = None
    timeout: Duration | None = None
    retry: AsyncRetryStrategy | None = None
    mode: OutputMode = "ordered"
    key: str | Sequence[str] | None = None
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
    """A function of a `pyarrow.RecordBatch` returning a RecordBatch with one row per input
    row, in order: add, replace or drop columns. Runs inline on the task's mailbox thread.

    ```python
    import pyarrow as pa
    import pyarrow.compute as pc

    from spark_jobs import Map


    def with_total(batch: pa.RecordBatch) -> pa.RecordBatch:
        total = pc.multiply(batch.column("price"), batch.column("qty"))
        return batch.append_column("total", total)


    step = Map(with_total)
    ```

    Args:
        function: The function. Its output schema is found by calling it on an empty batch
            of its input, unless `output` is given.
        output: The fields it adds or replaces, name → type; every input field is then kept.
        name: How errors name the step. Default: the function's name.
    """

    function: Callable[[pa.RecordBatch], pa.RecordBatch]
    output: Mapping[str, TypeSpec] | None = None
    name: str | None = None

    kind = "Map"

    def label(self) -> str:
        return self.name or str(getattr(self.function, "__name__", "function"))


@dataclass(frozen=True)
class Filter:
    """Keep the records for which a `pyarrow.compute` expression is true; null counts as
    false. Runs inline on the task's mailbox thread.

    ```python
    import pyarrow.compute as pc

    from spark_jobs import Filter

    step = Filter(pc.field("qty") > 0)
    ```

    Args:
        predicate: A `pyarrow.compute.Expression` over the record's fields. Compare a
            decimal field with a `Decimal`: Arrow compares decimals with integer literals
            only at small precisions.
        name: How errors name the step. Default: the expression's text.
    """

    predicate: pc.Expression
    name: str | None = None

    kind = "Filter"

    def label(self) -> str:
        return self.name or str(self.predicate)


Step = Lookup | AsyncMap | Map | Filter
