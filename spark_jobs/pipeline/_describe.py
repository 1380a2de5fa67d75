"""A pipeline in words: its source, steps, sink and output schema (CLI and Dagster)."""

from __future__ import annotations

from dataclasses import dataclass

from spark_jobs._url_env import database_note
from spark_jobs.connectors._registry import sink_connector_named, source_connector_named
from spark_jobs.pipeline._definition import Pipeline
from spark_jobs.pipeline._plan import (
    AsyncMapPlan,
    FilterPlan,
    LookupPlan,
    MapPlan,
    Plan,
    StagePlan,
)
from spark_jobs.pipeline._types import type_name

__all__ = ["Description", "describe"]


@dataclass(frozen=True)
class Description:
    name: str
    source: str
    steps: list[str]
    sink: str
    #: (field, type, where it comes from)
    output: list[tuple[str, str, str]]


def _source(plan: Plan, landing: str | None) -> str:
    source = plan.source
    text = source_connector_named(source.kind).describe(source, plan.name, landing)
    if source.required:
        required = [c.name for c in source.columns if c.name in source.required]
        text += f"; required {', '.join(required)}"
    if source.event_time:
        text += (
            f"; event time {source.event_time} (out of order {source.out_of_orderness:g}s, "
            f"idle {source.idle_timeout:g}s, late records: {source.late_records})"
        )
    return text


def _step(stage: StagePlan) -> str:
    head = stage.where.split(" ", 2)[-1][1:-1]
    if isinstance(stage, LookupPlan):
        on = ", ".join(f"{f}={c}" for f, c in stage.keys)
        added = ", ".join(out if out == col else f"{col} as {out}" for col, out in stage.columns)
        miss: str = stage.on_miss
        if stage.retry_attempts:
            miss = f"retry {stage.retry_attempts}x every {stage.retry_delay:g}s, then {miss}"
        cache = {
            "none": "no cache",
            "partial": f"partial cache of {stage.cache_rows} rows",
            "full": "full cache"
            + (f" reloaded every {stage.reload_every:g}s" if stage.reload_every else ""),
        }[stage.cache]
        mode = _mode(stage.mode, stage.key)
        server = database_note(stage.url_env)
        return f"{head}{server} on {on} → {added} (on miss: {miss}; {cache}; {mode})"
    if isinstance(stage, AsyncMapPlan):
        per = "per record" if stage.per_record else "per batch"
        added = ", ".join(c.name for c in stage.added)
        mode = _mode(stage.mode, stage.key)
        timeout = f"timeout {stage.timeout:g}s" if stage.timeout else "no timeout"
        return f"{head} {per} → {added} (capacity {stage.capacity}; {timeout}; {mode})"
    if isinstance(stage, MapPlan):
        new = [c.name for c in stage.outputs if c.origin == stage.where]
        return f"{head}" + (f" → {', '.join(new)}" if new else "")
    if isinstance(stage, FilterPlan):
        return head
    return stage.where


def _mode(mode: str, key: tuple[str, ...] | None) -> str:
    return f"ordered per key {', '.join(key)}" if key else mode


def describe(
    pipeline: Pipeline, plan: Plan | None = None, landing: str | None = None
) -> Description:
    """``pipeline`` in words; ``plan``: its resolved plan when the catalog was read (output
    types of looked-up columns known), else the definition's."""
    plan = plan or pipeline.plan
    where = sink_connector_named(plan.sink.kind).describe(plan)
    if plan.key:
        where += f"; key {', '.join(plan.key)}"
    output = [(c.name, type_name(c.type), c.origin) for c in plan.outputs]
    return Description(
        pipeline.name,
        _source(plan, landing),
        [f"{stage.index}. {_step(stage)}" for stage in plan.stages],
        where,
        output,
    )
