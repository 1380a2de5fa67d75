"""One stage per pipeline step, from the resolved plan and the platform defaults."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from spark_jobs._url_env import LOOKUP_URL_SETTING, task_dsn, where_of
from spark_jobs.async_io import NO_RETRY, AsyncRetryStrategy, OutputMode, exponential_backoff
from spark_jobs.jobs._outages import is_transient
from spark_jobs.jobs._record_stage import RecordElement, RecordStage
from spark_jobs.jobs._stages import (
    AsyncBatchStage,
    FilterStage,
    MapStage,
    Stage,
    as_batch,
    conform,
)
from spark_jobs.jobs._task_config import TaskConfig
from spark_jobs.jobs._user_errors import UserCodeError
from spark_jobs.jobs._user_functions import (
    Completed,
    UserFunction,
    as_async_function,
    results_retry,
)
from spark_jobs.lookup import CONNECT_PATIENCE, BatchLookup, miss_retry_strategy
from spark_jobs.pipeline._plan import AsyncMapPlan, FilterPlan, LookupPlan, MapPlan, StagePlan
from spark_jobs.runtime import MailboxProcessor
from spark_jobs.source._batch import OFFSET, Batch, user_rows, with_offsets

__all__ = ["build_stages"]


def build_stages(config: TaskConfig, processor: MailboxProcessor) -> list[Stage]:
    return [_stage(config, plan, processor) for plan in config.plan.stages]


def _stage(config: TaskConfig, plan: StagePlan, processor: MailboxProcessor) -> Stage:
    if isinstance(plan, LookupPlan):
        return _lookup(config, plan, processor)
    if isinstance(plan, AsyncMapPlan):
        return _async_map(plan, processor)
    if isinstance(plan, MapPlan):
        return MapStage(plan)
    if isinstance(plan, FilterPlan):
        return FilterStage(plan)
    raise TypeError(f"no stage for {plan!r}")


def _lookup(config: TaskConfig, plan: LookupPlan, processor: MailboxProcessor) -> Stage:
    defaults = config.defaults
    timeout = plan.timeout if plan.timeout is not None else defaults.lookup_timeout_seconds
    retries = plan.retries if plan.retries is not None else defaults.lookup_retries
    retry: AsyncRetryStrategy
    if plan.retry_attempts:
        retry = miss_retry_strategy(plan, is_transient)
    elif retries:
        # Transient database errors (a dropped connection, a restart) are retried.
        retry = exponential_backoff(retries, 0.1, 5.0, on_exception=is_transient)
    else:
        retry = NO_RETRY
    attempts = max(retries, plan.retry_attempts) + 2
    lookup = BatchLookup(
        plan,
        # The platform database, or the table's own (the URL read from this task's environment).
        task_dsn(plan.url_env, config.asyncpg_dsn, LOOKUP_URL_SETTING),
        input_schema=pa.schema([(c.name, c.type) for c in plan.inputs]),
        column_types=config.lookup_types.get(plan.index, {}),
        batch_size=plan.batch_size or defaults.lookup_batch_size,
        pool_size=defaults.lookup_pool_size,
        # Below the operator's timeout, so a retry re-queries instead of waiting.
        query_timeout=timeout / attempts,
        latency=defaults.injected_latency_ms / 1000,
        where=_where(plan),
        # A database restart is waited for, within the step's timeout (the error then names
        # the database, not the timeout).
        patience=min(CONNECT_PATIENCE, 0.75 * timeout),
    )
    return AsyncBatchStage(
        plan,
        lookup,
        processor,
        capacity=plan.capacity or defaults.lookup_capacity,
        mode=OutputMode(plan.mode),
        key=plan.key,
        timeout=timeout,
        retry=retry,
        lookup=lookup.metrics,
    )


def _where(plan: LookupPlan) -> str:
    """What a lookup's connection error names: the setting (and variable) of its database,
    as a CDC reader's does (``where_of``)."""
    setting, variable = where_of(plan.url_env, LOOKUP_URL_SETTING)
    return f"{setting}: {variable}"


def _async_map(plan: AsyncMapPlan, processor: MailboxProcessor) -> Stage:
    function = as_async_function(plan.function, per_record=plan.per_record)
    retry = NO_RETRY if plan.retry is None else results_retry(plan.retry)
    if plan.per_record:
        return RecordStage(
            plan,
            UserFunction(function, _row_of),
            processor,
            capacity=plan.capacity,
            mode=OutputMode(plan.mode),
            key=plan.key,
            timeout=plan.timeout,
            retry=retry,
        )
    added = pa.schema([(c.name, c.type) for c in plan.added])
    schema = plan.output_schema()

    def merge(completed: Completed) -> Batch:
        batch: Batch = completed.element
        where = plan.where
        if len(completed.results) != 1:
            raise UserCodeError(
                where,
                "a per-batch function completes with one RecordBatch, "
                f"got {len(completed.results)} results",
            )
        result = as_batch(completed.results[0], where)
        given = user_rows(batch.rows)
        if result.num_rows != given.num_rows:
            raise UserCodeError(
                where,
                f"returned {result.num_rows} rows for {given.num_rows}; a per-batch "
                "function returns one row per input row",
            )
        produced = conform(result, added, where)
        columns = [*given.columns, *produced.columns]
        merged = pa.RecordBatch.from_arrays(columns, schema=schema)
        batch.rows = with_offsets(merged, batch.rows.column(OFFSET))
        return batch

    return AsyncBatchStage(
        plan,
        UserFunction(function, _rows_of),
        processor,
        capacity=plan.capacity,
        mode=OutputMode(plan.mode),
        key=plan.key,
        timeout=plan.timeout,
        retry=retry,
        merge=merge,
    )


def _row_of(element: RecordElement) -> dict[str, Any]:
    return element.row


def _rows_of(batch: Batch) -> pa.RecordBatch:
    return user_rows(batch.rows)
