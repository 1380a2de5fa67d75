"""Validate a pipeline definition and derive its :class:`Plan` — every step's schema.

``derive(pipeline)`` runs when a :class:`Pipeline` is built (types of looked-up columns
unknown) and again when a run opens with the catalog's types (``lookup_types``). Each problem
is one :class:`PipelineDefinitionError` naming the pipeline, the part (``source``,
``step 2 (Lookup ref.fx_rates)``, ``sink``) and the field.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pyarrow as pa

from spark_jobs.connectors._registry import (
    registered_sinks,
    registered_sources,
    sink_connector,
    sink_connector_named,
    source_connector,
)
from spark_jobs.pipeline._checks import Context, names, require
from spark_jobs.pipeline._derive_steps import empty_batch, probe_map, stage_plan
from spark_jobs.pipeline._errors import check_field_name, check_identifier
from spark_jobs.pipeline._plan import (
    AsyncMapPlan,
    Column,
    LookupPlan,
    Plan,
    SinkPlan,
    SourcePlan,
    StagePlan,
)
from spark_jobs.pipeline._sources import LATE_POLICIES, Source
from spark_jobs.pipeline._types import arrow_type, seconds

if TYPE_CHECKING:
    from spark_jobs.pipeline._definition import Pipeline

__all__ = ["PARTITION_COLUMN", "derive", "empty_batch", "probe_map"]

_CRON = re.compile(r"^\S+(\s+\S+){4}$")
#: What every source spec has (validated here, for every connector).
_SHARED_SOURCE_FIELDS = (
    "schema",
    "required",
    "event_time",
    "out_of_orderness",
    "idle_timeout",
    "late_records",
)
#: The partition column a day-partitioned output adds (``dt=`` folders, or a column).
PARTITION_COLUMN = "dt"


def derive(
    pipeline: Pipeline, lookup_types: Mapping[int, Mapping[str, pa.DataType]] | None = None
) -> Plan:
    """The plan of ``pipeline``; ``lookup_types``: step index → table column → Arrow type."""
    ctx = Context(str(pipeline.name))
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
        stage = stage_plan(ctx, index, step, columns, is_open, types)
        stages.append(stage)
        columns, is_open = stage.outputs, stage.open
    ctx.where = "sink"
    sink = _sink(ctx, pipeline.sink, pipeline.name, columns, is_open, source.partitioned)
    produced = {c.name for c in columns}
    change_fields = [f for f in (source.order_field, source.op_field) if f is not None]
    lost = [f for f in change_fields if f not in produced]
    if sink.upsert_key is not None and lost and not is_open:
        # Without them an upsert would keep whichever change came last and write deletes
        # as rows.
        raise ctx.fail(
            f"an upsert of a change stream needs the source's field(s) {', '.join(lost)}"
            " in the output (the steps dropped them)"
        )
    _refuse_foreign_upsert_key(ctx, source, sink.upsert_key, produced)
    per_record = [s for s in stages if isinstance(s, AsyncMapPlan) and s.per_record]
    if sink.upsert_key is None and source.order_field is not None and per_record:
        # The records of one transaction share a stream position: a restore re-reads a
        # per-record step's in-flight records by position, so it would append again those
        # of their transaction that had already left.
        raise ctx.fail(
            "an append sink of a change stream cannot follow a per-record AsyncMap (step "
            f'{per_record[0].index}): use per="batch" on the AsyncMap, or an upsert sink'
        )
    _refuse_lossy_lookups(ctx, source, stages)
    _refuse_reordering_steps(ctx, source, stages)
    if sink.upsert_key is not None and source.order_field in produced:
        # A change stream: the latest change of a key wins (its commit position), and a
        # delete removes the key unless a later change is stored.
        op_field = source.op_field if source.op_field in produced else None
        sink = dataclasses.replace(sink, latest_by=source.order_field, op_field=op_field)
    elif sink.upsert_key is not None and source.event_time in produced:
        # An upsert keeps the row of the latest event, whatever order records arrive in (a
        # rebuild of an older day, late records): the source's event time decides.
        sink = dataclasses.replace(sink, latest_by=source.event_time)
    ctx.where = "key"
    key = None
    if pipeline.key is not None:
        key = tuple(names(ctx, pipeline.key, "key field"))
        if not is_open:
            require(ctx, key, columns, "key field")
    if key is None and sink.upsert_key is not None:
        key = sink.upsert_key
    ctx.where = "schedule"
    if not isinstance(pipeline.schedule, str) or not _CRON.fullmatch(pipeline.schedule.strip()):
        raise ctx.fail(f"{pipeline.schedule!r} is not a cron schedule (five fields)")
    ctx.where = "sample_data"
    if pipeline.sample_data is not None and not callable(pipeline.sample_data):
        raise ctx.fail("must be a callable (or None)")
    plan = Plan(pipeline.name, source, tuple(stages), sink, key, tuple(columns))
    ctx.where = "sink"
    sink_connector_named(sink.kind).check_plan(plan, ctx)
    return plan


# --------------------------------------------------------------------------- source


def _refuse_lossy_lookups(ctx: Context, source: SourcePlan, stages: list[StagePlan]) -> None:
    """A change stream's Lookup must keep its misses: a delete carries only the key (the
    other columns are null), so a lookup on them misses; a dropped miss loses the delete,
    and the dead letters of one transaction share its position (the commit LSN), so all
    but one of them would be lost. Until a transaction's records get distinct positions."""
    if source.order_field is None:
        return
    for stage in stages:
        if isinstance(stage, LookupPlan) and stage.on_miss != "keep":
            ctx.where = stage.where
            raise ctx.fail(
                f'on_miss="{stage.on_miss}" on a change stream loses deletes (a delete'
                " carries only the key, its other columns are null, so it misses): use"
                ' on_miss="keep"',
            )


def _refuse_foreign_upsert_key(
    ctx: Context, source: SourcePlan, upsert_key: tuple[str, ...] | None, produced: set[str]
) -> None:
    """A change stream's delete carries only the source's key columns (the others are null
    unless the table has ``REPLICA IDENTITY FULL``): an upsert keyed without them would never
    apply a delete (or, with the full old row, delete a row another source row shares), and
    several source rows would share one stored row. A key a step renamed is not checked."""
    if upsert_key is None or source.op_field not in produced or not source.row_key:
        return
    if not set(source.row_key) <= produced or set(source.row_key) <= set(upsert_key):
        return
    raise ctx.fail(
        f"upsert_key ({', '.join(upsert_key)}) of a change stream must include the source's"
        f" key ({', '.join(source.row_key)}): a delete carries only the key's columns, so"
        " deletes would never reach the stored rows"
    )


def _refuse_reordering_steps(ctx: Context, source: SourcePlan, stages: list[StagePlan]) -> None:
    """A change stream's Lookup or AsyncMap must keep each row's changes in order: those of
    one transaction share their position, so the upsert sink keeps the last staged — a
    step that reorders them (``mode="unordered"``, or ``mode="key"`` by fields that do not
    identify the row) would leave an older version of the row, or undo a delete."""
    if source.order_field is None or not source.row_key:
        return
    row_key = ", ".join(source.row_key)
    for stage in stages:
        if not isinstance(stage, (LookupPlan, AsyncMapPlan)) or stage.mode == "ordered":
            continue
        ctx.where = stage.where
        if stage.mode != "key":
            raise ctx.fail(
                f'mode="{stage.mode}" on a change stream can reorder a row\'s changes (the'
                ' sink would keep an older one): use mode="ordered", or mode="key" with'
                f" key= including the source's key ({row_key})"
            )
        if not set(source.row_key) <= set(stage.key or ()):
            shown = ", ".join(stage.key or ())
            raise ctx.fail(
                f'key=({shown}) of mode="key" on a change stream can reorder a row\'s'
                f" changes (the sink would keep an older one): key must include the"
                f" source's key ({row_key})"
            )


def _source(ctx: Context, source: object) -> SourcePlan:
    connector = source_connector(source)
    if connector is None:
        known = ", ".join(t.__name__ for t in registered_sources())
        raise ctx.fail(f"must be a registered source spec ({known}), got {type(source).__name__}")
    missing = [name for name in _SHARED_SOURCE_FIELDS if not hasattr(source, name)]
    if missing:
        raise ctx.fail(
            f"{type(source).__name__} lacks the fields every source spec has: {', '.join(missing)}"
        )
    spec: Source = source  # type: ignore[assignment]  # a registered spec has the fields
    if not isinstance(spec.schema, Mapping) or not spec.schema:
        raise ctx.fail("schema must map at least one field name to its type")
    columns = []
    for name, type_spec in spec.schema.items():
        ctx.check(check_field_name, name, "field")
        kind = ctx.check(arrow_type, type_spec, f"field {name}")
        columns.append(Column(name, kind, "source"))
    for name, type_spec in connector.added_fields(source).items():
        if any(c.name == name for c in columns):
            raise ctx.fail(f"field {name!r} is added by the source; declare another name")
        columns.append(Column(name, ctx.check(arrow_type, type_spec, f"field {name}"), "source"))
    required = frozenset(names(ctx, spec.required, "required field"))
    require(ctx, sorted(required), columns, "required field")
    event_time = spec.event_time
    if event_time is not None:
        found = {c.name: c.type for c in columns}
        if event_time not in found:
            raise ctx.fail(f"event_time: field {event_time!r} is not in the schema")
        if not pa.types.is_timestamp(found[event_time]):
            raise ctx.fail(f"event_time: field {event_time!r} must be a timestamp")
    delay = ctx.check(seconds, spec.out_of_orderness, "out_of_orderness")
    idle = ctx.check(seconds, spec.idle_timeout, "idle_timeout")
    late = spec.late_records
    if late not in LATE_POLICIES:
        shown = " or ".join(repr(p) for p in LATE_POLICIES)
        raise ctx.fail(f"late_records must be {shown}, got {late!r}")
    details = connector.validate(source, ctx)
    return SourcePlan(
        connector.name, tuple(columns), required, event_time, details.partitioned, delay,
        idle, options=details.options, start_date=details.start_date, late_records=late,
        order_field=details.order_field, op_field=details.op_field, row_key=details.row_key,
    )  # fmt: skip


def _sink(
    ctx: Context,
    sink: object,
    pipeline: str,
    columns: tuple[Column, ...],
    is_open: bool,
    partitioned: bool,
) -> SinkPlan:
    produced = {c.name for c in columns}
    if partitioned and PARTITION_COLUMN in produced:
        raise ctx.fail(
            f"field {PARTITION_COLUMN!r} collides with the partition column of a "
            "day-partitioned output"
        )
    connector = sink_connector(sink)
    if connector is None:
        known = ", ".join(t.__name__ for t in registered_sinks())
        raise ctx.fail(f"must be a registered sink spec ({known}), got {type(sink).__name__}")
    details = connector.validate(sink, ctx, pipeline=pipeline, columns=columns, is_open=is_open)
    return SinkPlan(connector.name, details.options, details.upsert_key)
