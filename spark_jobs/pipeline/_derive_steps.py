"""Each step's plan: its options normalised and its output columns derived from its input."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs._url_env import check_env_name
from spark_jobs.async_io import AsyncFunction, AsyncRetryStrategy
from spark_jobs.pipeline._checks import (
    Context,
    optional_int,
    optional_seconds,
    output_mode,
    require,
)
from spark_jobs.pipeline._errors import check_field_name, check_identifier, check_table
from spark_jobs.pipeline._plan import (
    AsyncMapPlan,
    Column,
    FilterPlan,
    LookupPlan,
    MapPlan,
    StagePlan,
)
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

__all__ = ["empty_batch", "probe_map", "stage_plan"]

_MISS = ("keep", "drop", "dead_letter")


def stage_plan(
    ctx: Context,
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
    ctx: Context,
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
            require(ctx, [field_name], base["inputs"], "on: key field")
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
    timeout = optional_seconds(ctx, step.timeout, "timeout", positive=True)
    if attempts and timeout is not None and timeout <= attempts * delay:
        raise ctx.fail(
            f"timeout {timeout:g}s must exceed the {attempts} retries of {delay:g}s on a miss"
        )
    cache: dict[str, Any] = {"cache": "none"}
    if isinstance(step.cache, PartialCache):
        if not isinstance(step.cache.max_rows, int) or step.cache.max_rows < 1:
            raise ctx.fail("cache: PartialCache.max_rows must be >= 1")
        rate = step.cache.min_hit_rate
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 <= rate <= 1:
            raise ctx.fail(f"cache: PartialCache.min_hit_rate must be within [0, 1], got {rate!r}")
        cache = {
            "cache": "partial",
            "cache_rows": step.cache.max_rows,
            "expire_after_write": optional_seconds(
                ctx, step.cache.expire_after_write, "cache: expire_after_write"
            ),
            "expire_after_access": optional_seconds(
                ctx, step.cache.expire_after_access, "cache: expire_after_access"
            ),
            # A cached miss would never be looked up again: misses are not cached on retry.
            "cache_missing": bool(step.cache.cache_missing) and not attempts,
            "cache_min_hit_rate": float(rate),
        }
    elif isinstance(step.cache, FullCache):
        cache = {
            "cache": "full",
            "reload_every": optional_seconds(
                ctx, step.cache.reload_every, "cache: reload_every", positive=True
            ),
        }
    elif step.cache is not None:
        raise ctx.fail("cache must be None, PartialCache(...) or FullCache(...)")
    mode, key = output_mode(ctx, step.mode, step.key, base["inputs"], is_open)
    url_env = ctx.check(check_env_name, step.url_env)
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
        retries=optional_int(ctx, step.retries, "retries", 0),
        capacity=optional_int(ctx, step.capacity, "capacity", 1),
        batch_size=optional_int(ctx, step.batch_size, "batch_size", 1),
        mode=mode,
        key=key,
        url_env=url_env,
        **cache,
    )


def _async_map(ctx: Context, step: AsyncMap, base: dict[str, Any], is_open: bool) -> AsyncMapPlan:
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
    timeout = optional_seconds(ctx, step.timeout, "timeout", positive=True)
    retry = step.retry
    if retry is not None:
        if not isinstance(retry, AsyncRetryStrategy):
            raise ctx.fail("retry must be an AsyncRetryStrategy (fixed_delay, exponential_backoff)")
        if retry.enabled and timeout is None:
            raise ctx.fail("a retry strategy needs a timeout (it spans all attempts)")
    mode, key = output_mode(ctx, step.mode, step.key, base["inputs"], is_open)
    return AsyncMapPlan(
        **base,
        outputs=_add(ctx, base["inputs"], added, is_open),
        open=is_open,
        function=function,
        per_record=step.per == "record",
        added=tuple(added),
        capacity=optional_int(ctx, step.capacity, "capacity", 1) or 100,
        timeout=timeout,
        retry=retry,
        mode=mode,
        key=key,
    )


def _map(ctx: Context, step: Map, base: dict[str, Any], is_open: bool) -> MapPlan:
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
    ctx: Context, inputs: tuple[Column, ...], added: list[Column], is_open: bool
) -> tuple[Column, ...]:
    """``inputs`` followed by ``added``; a name produced twice is an error."""
    seen = {c.name: c.origin for c in inputs}
    for column in added:
        # After an open step the input's names are unknown: checked when the run opens.
        if column.name in seen and not is_open:
            raise ctx.fail(f"field {column.name!r} is produced twice (also by {seen[column.name]})")
        seen[column.name] = ctx.where
    return inputs + tuple(added)
