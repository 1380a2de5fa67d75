"""Validate a pipeline definition and derive its :class:`Plan` — every step's schema.

``derive(pipeline)`` runs when a :class:`Pipeline` is built (types of looked-up columns
unknown) and again when a run opens with the catalog's types (``lookup_types``). Each problem
is one :class:`PipelineDefinitionError` naming the pipeline, the part (``source``,
``step 2 (Lookup ref.fx_rates)``, ``sink``) and the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from enumerator_service._config import ConfigError
from enumerator_service._storage import check_uri
from spark_jobs.pipeline._checks import Context, names, require
from spark_jobs.pipeline._derive_steps import empty_batch, probe_map, stage_plan
from spark_jobs.pipeline._errors import check_field_name, check_identifier, check_table
from spark_jobs.pipeline._plan import Column, Plan, SinkPlan, SourcePlan, StagePlan
from spark_jobs.pipeline._sinks import ParquetSink, PostgresSink
from spark_jobs.pipeline._sources import LATE_POLICIES, FileSource, TableSource
from spark_jobs.pipeline._types import arrow_type, seconds

if TYPE_CHECKING:
    from spark_jobs.pipeline._definition import Pipeline

__all__ = ["PARTITION_COLUMN", "derive", "empty_batch", "probe_map"]

_COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "brotli", "none")
_CRON = re.compile(r"^\S+(\s+\S+){4}$")
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
    return Plan(pipeline.name, source, tuple(stages), sink, key, tuple(columns))


# --------------------------------------------------------------------------- source


def _source(ctx: Context, source: object) -> SourcePlan:
    if not isinstance(source, FileSource | TableSource):
        raise ctx.fail(f"must be a FileSource or TableSource, got {type(source).__name__}")
    if not isinstance(source.schema, Mapping) or not source.schema:
        raise ctx.fail("schema must map at least one field name to its type")
    columns = []
    for name, spec in source.schema.items():
        ctx.check(check_field_name, name, "field")
        kind = ctx.check(arrow_type, spec, f"field {name}")
        columns.append(Column(name, kind, "source"))
    required = frozenset(names(ctx, source.required, "required field"))
    require(ctx, sorted(required), columns, "required field")
    event_time = source.event_time
    if event_time is not None:
        found = {c.name: c.type for c in columns}
        if event_time not in found:
            raise ctx.fail(f"event_time: field {event_time!r} is not in the schema")
        if not pa.types.is_timestamp(found[event_time]):
            raise ctx.fail(f"event_time: field {event_time!r} must be a timestamp")
    delay = ctx.check(seconds, source.out_of_orderness, "out_of_orderness")
    idle = ctx.check(seconds, source.idle_timeout, "idle_timeout")
    late = source.late_records
    if late not in LATE_POLICIES:
        shown = " or ".join(repr(p) for p in LATE_POLICIES)
        raise ctx.fail(f"late_records must be {shown}, got {late!r}")
    if isinstance(source, TableSource):
        table = ctx.check(check_table, source.table, "table")
        key = ctx.check(check_identifier, source.key, "key")
        if not isinstance(source.rows_per_split, int) or source.rows_per_split < 1:
            raise ctx.fail("rows_per_split must be a positive integer")
        return SourcePlan(
            "table", tuple(columns), required, event_time, False, delay, idle,
            table=table, key=key, rows_per_split=source.rows_per_split, late_records=late,
        )  # fmt: skip
    if source.partition_by not in ("day", None):
        raise ctx.fail(f"partition_by must be 'day' or None, got {source.partition_by!r}")
    landing = None if source.landing is None else ctx.check(_landing, source.landing)
    start = source.start_date
    if isinstance(start, str):
        start = ctx.check(_date, str(source.start_date))
    if start is not None and not isinstance(start, date):
        raise ctx.fail(f"start_date must be a date or 'YYYY-MM-DD', got {start!r}")
    return SourcePlan(
        "files", tuple(columns), required, event_time, source.partition_by == "day", delay,
        idle, landing=landing, start_date=start, late_records=late,
    )  # fmt: skip


def _landing(given: object) -> Path | str:
    """An absolute folder, a relative one that stays under the data folder (no ``..``), or a
    URI (``file://``, ``s3://bucket/prefix``, ``gs://``, ``abfs://``, ``hdfs://``: kept as
    given, checked by ``open_location``: a scheme it does not know, credentials in it)."""
    if not isinstance(given, str | Path) or not str(given) or "\x00" in str(given):
        raise ValueError(f"landing {given!r} is not a folder path")
    if isinstance(given, str) and "://" in given:
        try:
            check_uri(given, what="landing")  # the URI's form only: nothing is contacted
        except ConfigError as exc:
            raise ValueError(f"landing {given!r}: {exc.problem}") from None
        return given.rstrip("/")
    path = Path(given)
    if not path.is_absolute() and ".." in path.parts:
        raise ValueError(f"landing {str(given)!r} leads out of the data folder ('..')")
    return path


def _date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"start_date {text!r} is not YYYY-MM-DD") from None


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
    if isinstance(sink, ParquetSink):
        folder = ctx.check(check_identifier, sink.table or pipeline, "table")
        dictionary = tuple(names(ctx, sink.dictionary, "dictionary field"))
        if not is_open:
            require(ctx, dictionary, columns, "dictionary field")
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
            upsert = tuple(names(ctx, sink.upsert_key, "upsert_key field"))
            if not upsert:
                raise ctx.fail("upsert_key must name at least one field (or be None: append)")
            if not is_open:
                require(ctx, upsert, columns, "upsert_key field")
        return SinkPlan("postgres", table=table, upsert_key=upsert)
    raise ctx.fail(f"must be a ParquetSink or PostgresSink, got {type(sink).__name__}")
