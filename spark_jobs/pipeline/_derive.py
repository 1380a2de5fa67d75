"""Validate a pipeline definition and derive its :class:`Plan` — every step's schema.

``derive(pipeline)`` runs when a :class:`Pipeline` is built (types of looked-up columns
unknown) and again when a run opens with the catalog's types (``lookup_types``). Each problem
is one :class:`PipelineDefinitionError` naming the pipeline, the part (``source``,
``step 2 (Lookup ref.fx_rates)``, ``sink``) and the field.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.async_io import AsyncFunction, AsyncRetryStrategy
from spark_jobs.pipeline._errors import (
    PipelineDefinitionError,
    check_field_name,
    check_identifier,
    check_table,
)
from spark_jobs.pipeline._plan import (
    AsyncMapPlan,
    Column,
    FilterPlan,
    LookupPlan,
    MapPlan,
    Plan,
    SinkPlan,
    SourcePlan,
    StagePlan,
)
from spark_jobs.pipeline._sinks import ParquetSink, PostgresSink
from spark_jobs.pipeline._sources import FileSource, TableSource
from spark_jobs.pipeline._steps import (
    AsyncMap,
    Filter,
    FullCache,
    Lookup,
    Map,
    PartialCache,
    RetryOnMiss,
)
from spark_jobs.pipeline._types import arrow_type, seconds

if TYPE_CHECKING:
    from spark_jobs.pipeline._definition import Pipeline

__all__ = ["derive", "empty_batch", "probe_map"]

_MISS = ("keep", "drop", "dead_letter")
_COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "brotli", "none")
_CRON = re.compile(r"^\S+(\s+\S+){4}$")
#: The partition column a day-partitioned output adds (``dt=`` folders, or a column).
PARTITION_COLUMN = "dt"


class _Context:
    """Raises errors that name the pipeline and the part being checked."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.where = ""

    def fail(self, problem: str) -> PipelineDefinitionError:
        return PipelineDefinitionError(self.pipeline, self.where, problem)

    def check(self, check: Callable[..., Any], *args: Any) -> Any:
        """``check(*args)``; its ValueError becomes a definition error naming this part."""
        try:
            return check(*args)
        except ValueError as exc:
            raise self.fail(str(exc)) from None


def derive(
    pipeline: Pipeline, lookup_types: Mapping[int, Mapping[str, pa.DataType]] | None = None
) -> Plan:
    """The plan of ``pipeline``; ``lookup_types``: step index → table column → Arrow type."""
    ctx = _Context(str(pipeline.name))
    ctx.check(check_identifier, pipeline.name, "pipeline name")
    ctx.where = "source"
    source = _source(ctx, pipeline.source)
    columns = source.columns
    stages: list[StagePlan] = []
    is_open = False
    for index, step in enumerate(pipeline.steps, start=1):
        kind = getattr(step, "kind", type(step).__name__)
        label = step.label() if hasattr(step, "label") else "?"
        ctx.where = f"step {index} ({kind} {label})"
        types = (lookup_types or {}).get(index)
        stage = _stage(ctx, index, step, columns, is_open, types)
        stages.append(stage)
        columns, is_open = stage.outputs, stage.open
    ctx.where = "sink"
    sink = _sink(ctx, pipeline.sink, pipeline.name, columns, is_open, source.partitioned)
    ctx.where = "key"
    key = None
    if pipeline.key is not None:
        key = tuple(_names(ctx, pipeline.key, "key field"))
        if not is_open:
            _require(ctx, key, columns, "key field")
    if key is None and sink.upsert_key is not None:
        key = sink.upsert_key
    ctx.where = "schedule"
    if not isinstance(pipeline.schedule, str) or not _CRON.fullmatch(pipeline.schedule.strip()):
        raise ctx.fail(f"{pipeline.schedule!r} is not a cron schedule (five fields)")
    ctx.where = "sample_data"
    if pipeline.sample_data is not None and not callable(pipeline.sample_data):
        raise ctx.fail("must be a callable (or None)")
    return Plan(pipeline.name, source, tuple(stages), sink, key, tuple(columns))


# --------------------------------------------------------------------------- source


def _source(ctx: _Context, source: object) -> SourcePlan:
    if not isinstance(source, FileSource | TableSource):
        raise ctx.fail(f"must be a FileSource or TableSource, got {type(source).__name__}")
    if not isinstance(source.schema, Mapping) or not source.schema:
        raise ctx.fail("schema must map at least one field name to its type")
    columns = []
    for name, spec in source.schema.items():
        ctx.check(check_field_name, name, "field")
        kind = ctx.check(arrow_type, spec, f"field {name}")
        columns.append(Column(name, kind, "source"))
    required = frozenset(_names(ctx, source.required, "required field"))
    _require(ctx, sorted(required), columns, "required field")
    event_time = source.event_time
    if event_time is not None:
        found = {c.name: c.type for c in columns}
        if event_time not in found:
            raise ctx.fail(f"event_time: field {event_time!r} is not in the schema")
        if not pa.types.is_timestamp(found[event_time]):
            raise ctx.fail(f"event_time: field {event_time!r} must be a timestamp")
    delay = ctx.check(seconds, source.out_of_orderness, "out_of_orderness")
    idle = ctx.check(seconds, source.idle_timeout, "idle_timeout")
    if isinstance(source, TableSource):
        table = ctx.check(check_table, source.table, "table")
        key = ctx.check(check_identifier, source.key, "key")
        if not isinstance(source.rows_per_split, int) or source.rows_per_split < 1:
            raise ctx.fail("rows_per_split must be a positive integer")
        return SourcePlan(
            "table", tuple(columns), required, event_time, False, delay, idle,
            table=table, key=key, rows_per_split=source.rows_per_split,
        )  # fmt: skip
    if source.partition_by not in ("day", None):
        raise ctx.fail(f"partition_by must be 'day' or None, got {source.partition_by!r}")
    landing = None if source.landing is None else Path(source.landing)
    start = source.start_date
    if isinstance(start, str):
        start = ctx.check(_date, str(source.start_date))
    if start is not None and not isinstance(start, date):
        raise ctx.fail(f"start_date must be a date or 'YYYY-MM-DD', got {start!r}")
    return SourcePlan(
        "files", tuple(columns), required, event_time, source.partition_by == "day", delay,
        idle, landing=landing, start_date=start,
    )  # fmt: skip


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"start_date {text!r} is not YYYY-MM-DD") from None


# --------------------------------------------------------------------------- steps


def _stage(
    ctx: _Context,
    index: int,
    step: object,
    inputs: tuple[Column, ...],
    is_open: bool,
    lookup_types: Mapping[str, pa.DataType] | None,
) -> StagePlan:
    base: dict[str, Any] = {"index": index, "where": ctx.where, "inputs": inputs}
    if isinstance(step, Lookup):
        return _lookup(ctx, step, base, is_open, lookup_types)
    if isinstance(step, AsyncMap):
        return _async_map(ctx, step, base, is_open)
    if isinstance(step, Map):
        return _map(ctx, step, base, is_open)
    if isinstance(step, Filter):
        if not isinstance(step.predicate, pc.Expression):
            raise ctx.fail("predicate must be a pyarrow.compute expression, e.g. pc.field('x') > 0")
        known = not is_open and all(c.type is not None for c in inputs)
        if known:
            try:
                pa.Table.from_batches([empty_batch(inputs)]).filter(step.predicate)
            except (pa.ArrowException, TypeError, KeyError) as exc:
                raise ctx.fail(f"the predicate does not apply to the input: {exc}") from None
        return FilterPlan(**base, outputs=inputs, open=is_open, predicate=step.predicate)
    raise ctx.fail(f"not a step: {step!r} (use Lookup, AsyncMap, Map or Filter)")


def _lookup(
    ctx: _Context,
    step: Lookup,
    base: dict[str, Any],
    is_open: bool,
    lookup_types: Mapping[str, pa.DataType] | None,
) -> LookupPlan:
    schema_name, table = ctx.check(check_table, step.table, "table")
    on = step.on
    pairs: list[tuple[str, str]]
    if isinstance(on, str):
        pairs = [(on, on)]
    elif isinstance(on, Mapping):
        pairs = [(str(k), v) for k, v in on.items()]
    else:
        pairs = [(name, name) for name in on]
    if not pairs:
        raise ctx.fail("on: at least one key field is required")
    for field_name, column in pairs:
        ctx.check(check_identifier, column, "on: key column")
        if not is_open:
            _require(ctx, [field_name], base["inputs"], "on: key field")
    raw = step.columns
    selected = list(raw.items()) if isinstance(raw, Mapping) else [(c, c) for c in raw]
    if not selected:
        raise ctx.fail("columns: at least one column to add is required")
    added = []
    for column, output in selected:
        ctx.check(check_identifier, column, "columns: table column")
        ctx.check(check_field_name, output, "columns: output field")
        kind = None if lookup_types is None else lookup_types.get(column)
        added.append(Column(output, kind, f"{ctx.where}: {schema_name}.{table}.{column}"))
    outputs = _add(ctx, base["inputs"], added, is_open)
    miss: object = step.on_miss
    attempts, delay = 0, 0.0
    retry = RetryOnMiss() if miss == "retry" else miss
    if isinstance(retry, RetryOnMiss):
        if not isinstance(retry.attempts, int) or retry.attempts < 1:
            raise ctx.fail("on_miss: RetryOnMiss.attempts must be >= 1")
        attempts = retry.attempts
        delay = ctx.check(seconds, retry.delay, "on_miss: RetryOnMiss.delay")
        miss = retry.then
    if miss not in _MISS:
        raise ctx.fail(f"on_miss must be one of keep, drop, dead_letter, retry; got {miss!r}")
    timeout = _optional_seconds(ctx, step.timeout, "timeout", positive=True)
    if attempts and timeout is not None and timeout <= attempts * delay:
        raise ctx.fail(
            f"timeout {timeout:g}s must exceed the {attempts} retries of {delay:g}s on a miss"
        )
    cache: dict[str, Any] = {"cache": "none"}
    if isinstance(step.cache, PartialCache):
        if not isinstance(step.cache.max_rows, int) or step.cache.max_rows < 1:
            raise ctx.fail("cache: PartialCache.max_rows must be >= 1")
        cache = {
            "cache": "partial",
            "cache_rows": step.cache.max_rows,
            "expire_after_write": _optional_seconds(
                ctx, step.cache.expire_after_write, "cache: expire_after_write"
            ),
            "expire_after_access": _optional_seconds(
                ctx, step.cache.expire_after_access, "cache: expire_after_access"
            ),
            # A cached miss would never be looked up again: misses are not cached on retry.
            "cache_missing": bool(step.cache.cache_missing) and not attempts,
        }
    elif isinstance(step.cache, FullCache):
        cache = {
            "cache": "full",
            "reload_every": _optional_seconds(
                ctx, step.cache.reload_every, "cache: reload_every", positive=True
            ),
        }
    elif step.cache is not None:
        raise ctx.fail("cache must be None, PartialCache(...) or FullCache(...)")
    return LookupPlan(
        **base,
        outputs=outputs,
        open=is_open,
        schema_name=schema_name,
        table=table,
        keys=tuple(pairs),
        columns=tuple(selected),
        on_miss=miss,  # type: ignore[arg-type]  # one of _MISS, checked above
        retry_attempts=attempts,
        retry_delay=delay,
        timeout=timeout,
        retries=_optional_int(ctx, step.retries, "retries", 0),
        capacity=_optional_int(ctx, step.capacity, "capacity", 1),
        batch_size=_optional_int(ctx, step.batch_size, "batch_size", 1),
        ordered=_ordered(ctx, step.mode),
        **cache,
    )


def _async_map(ctx: _Context, step: AsyncMap, base: dict[str, Any], is_open: bool) -> AsyncMapPlan:
    function = step.function
    if not (isinstance(function, AsyncFunction) or inspect.iscoroutinefunction(function)):
        raise ctx.fail(
            "function must be an AsyncFunction (or CoroutineAsyncFunction) instance or an "
            f"'async def' function, got {function!r}"
        )
    if step.per not in ("record", "batch"):
        raise ctx.fail(f"per must be 'record' or 'batch', got {step.per!r}")
    if not isinstance(step.output, Mapping) or not step.output:
        raise ctx.fail("output must map the fields the function adds to their types")
    added = []
    for name, spec in step.output.items():
        ctx.check(check_field_name, name, "output field")
        kind = ctx.check(arrow_type, spec, f"output field {name}")
        added.append(Column(name, kind, ctx.where))
    timeout = _optional_seconds(ctx, step.timeout, "timeout", positive=True)
    retry = step.retry
    if retry is not None:
        if not isinstance(retry, AsyncRetryStrategy):
            raise ctx.fail("retry must be an AsyncRetryStrategy (fixed_delay, exponential_backoff)")
        if retry.enabled and timeout is None:
            raise ctx.fail("a retry strategy needs a timeout (it spans all attempts)")
    return AsyncMapPlan(
        **base,
        outputs=_add(ctx, base["inputs"], added, is_open),
        open=is_open,
        function=function,
        per_record=step.per == "record",
        added=tuple(added),
        capacity=_optional_int(ctx, step.capacity, "capacity", 1) or 100,
        timeout=timeout,
        retry=retry,
        ordered=_ordered(ctx, step.mode),
    )


def _map(ctx: _Context, step: Map, base: dict[str, Any], is_open: bool) -> MapPlan:
    if not callable(step.function):
        raise ctx.fail("function must be a callable taking and returning a pyarrow.RecordBatch")
    inputs: tuple[Column, ...] = base["inputs"]
    if step.output is not None:
        if not isinstance(step.output, Mapping):
            raise ctx.fail("output must map the fields the function adds or replaces to types")
        declared = []
        for name, spec in step.output.items():
            ctx.check(check_field_name, name, "output field")
            kind = ctx.check(arrow_type, spec, f"output field {name}")
            declared.append(Column(name, kind, ctx.where))
        replaced = {c.name: c for c in declared}
        outputs = tuple(replaced.pop(c.name, c) for c in inputs) + tuple(replaced.values())
        return MapPlan(
            **base, outputs=outputs, open=is_open, function=step.function,
            declared=tuple(declared),
        )  # fmt: skip
    if is_open or any(c.type is None for c in inputs):
        return MapPlan(**base, outputs=inputs, open=True, function=step.function)
    schema = ctx.check(probe_map, step.function, inputs)
    by_name = {c.name: c for c in inputs}
    outputs = tuple(
        by_name[f.name]
        if f.name in by_name and by_name[f.name].type == f.type
        else Column(f.name, f.type, ctx.where)
        for f in schema
    )
    return MapPlan(**base, outputs=outputs, open=False, function=step.function)


def empty_batch(columns: Sequence[Column]) -> pa.RecordBatch:
    """A batch of no rows with ``columns`` (all types known)."""
    schema = pa.schema([pa.field(c.name, c.type) for c in columns])
    return pa.RecordBatch.from_pylist([], schema=schema)


def probe_map(function: Callable[[pa.RecordBatch], Any], columns: Sequence[Column]) -> pa.Schema:
    """The schema ``function`` returns for an empty batch of ``columns``; ValueError if it
    fails there, returns something else, or returns an unsupported type."""
    try:
        result = function(empty_batch(columns))
    except Exception as exc:
        raise ValueError(
            f"calling it on an empty batch of its input failed ({type(exc).__name__}: {exc}); "
            "declare output={...} if it cannot run on an empty batch"
        ) from None
    if isinstance(result, pa.Table):
        result = pa.RecordBatch.from_pylist([], schema=result.schema)
    if not isinstance(result, pa.RecordBatch):
        raise ValueError(f"it must return a pyarrow.RecordBatch, returned {type(result).__name__}")
    for f in result.schema:
        check_field_name(f.name, "output field")
        arrow_type(f.type, f"output field {f.name}")
    return result.schema


def _add(
    ctx: _Context, inputs: tuple[Column, ...], added: list[Column], is_open: bool
) -> tuple[Column, ...]:
    """``inputs`` followed by ``added``; a name produced twice is an error."""
    seen = {c.name: c.origin for c in inputs}
    for column in added:
        # After an open step the input's names are unknown: checked when the run opens.
        if column.name in seen and not is_open:
            raise ctx.fail(f"field {column.name!r} is produced twice (also by {seen[column.name]})")
        seen[column.name] = ctx.where
    return inputs + tuple(added)


# --------------------------------------------------------------------------- sink


def _sink(
    ctx: _Context,
    sink: object,
    pipeline: str,
    columns: tuple[Column, ...],
    is_open: bool,
    partitioned: bool,
) -> SinkPlan:
    names = {c.name for c in columns}
    if partitioned and PARTITION_COLUMN in names:
        raise ctx.fail(
            f"field {PARTITION_COLUMN!r} collides with the partition column of a "
            "day-partitioned output"
        )
    if isinstance(sink, ParquetSink):
        folder = ctx.check(check_identifier, sink.table or pipeline, "table")
        dictionary = tuple(_names(ctx, sink.dictionary, "dictionary field"))
        if not is_open:
            _require(ctx, dictionary, columns, "dictionary field")
        if sink.compression not in _COMPRESSIONS:
            raise ctx.fail(f"compression must be one of {', '.join(_COMPRESSIONS)}")
        return SinkPlan(
            "parquet", folder=folder, dictionary=dictionary, compression=sink.compression
        )
    if isinstance(sink, PostgresSink):
        table = ctx.check(check_table, sink.table, "table")
        if len(table[1]) > 55:
            raise ctx.fail(f"table name {table[1]!r} is too long (at most 55: +'__staged')")
        upsert = None
        if sink.upsert_key is not None:
            upsert = tuple(_names(ctx, sink.upsert_key, "upsert_key field"))
            if not upsert:
                raise ctx.fail("upsert_key must name at least one field (or be None: append)")
            if not is_open:
                _require(ctx, upsert, columns, "upsert_key field")
        return SinkPlan("postgres", table=table, upsert_key=upsert)
    raise ctx.fail(f"must be a ParquetSink or PostgresSink, got {type(sink).__name__}")


# --------------------------------------------------------------------------- helpers


def _names(ctx: _Context, names: object, what: str) -> list[str]:
    if isinstance(names, str) or not isinstance(names, Sequence | frozenset | set):
        raise ctx.fail(f"{what}s must be a list of field names, got {names!r}")
    return [ctx.check(check_field_name, n, what) for n in names]


def _require(ctx: _Context, names: Sequence[str], columns: Sequence[Column], what: str) -> None:
    known = [c.name for c in columns]
    for name in names:
        if name not in known:
            raise ctx.fail(f"{what} {name!r} is not in the input (fields: {', '.join(known)})")


def _optional_seconds(
    ctx: _Context, value: Any, what: str, *, positive: bool = False
) -> float | None:
    if value is None:
        return None
    result: float = ctx.check(seconds, value, what)
    if positive and result <= 0:
        raise ctx.fail(f"{what} must be > 0")
    return result


def _optional_int(ctx: _Context, value: Any, what: str, minimum: int) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ctx.fail(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


def _ordered(ctx: _Context, mode: object) -> bool:
    if mode not in ("ordered", "unordered"):
        raise ctx.fail(f"mode must be 'ordered' or 'unordered', got {mode!r}")
    return mode == "ordered"
