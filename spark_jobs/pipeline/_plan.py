"""The validated, normalised form of a pipeline definition: what the runtime builds from.

A :class:`Plan` is derived from a definition (``derive`` in ``_derive``): field types as Arrow
types, durations in seconds, keys and column maps as pairs, each step's input and output
columns. A looked-up column's type is known only from the Postgres catalog; until a run opens
(``resolve`` in ``_catalog``) it is ``None``, and a ``Map`` that cannot be probed on an
empty batch leaves its output *open* (checked when the run opens).

Threading: immutable values, any thread; they travel to Spark tasks inside the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Any, Literal

import pyarrow as pa

__all__ = [
    "AsyncMapPlan",
    "Column",
    "FilterPlan",
    "LookupPlan",
    "MapPlan",
    "Plan",
    "SinkPlan",
    "SourcePlan",
    "StagePlan",
]


@dataclass(frozen=True, slots=True)
class Column:
    """A field of the records between two steps. ``type`` None: read from the catalog when a
    run opens (a looked-up column)."""

    name: str
    type: pa.DataType | None
    origin: str


@dataclass(frozen=True, slots=True)
class SourcePlan:
    """The source part of a plan: the shared, validated fields, and ``options`` — the
    connector's own values (only connector ``kind`` reads them)."""

    kind: str
    columns: tuple[Column, ...]
    required: frozenset[str]
    event_time: str | None
    partitioned: bool
    out_of_orderness: float
    idle_timeout: float
    options: Any = None
    start_date: date | None = None
    #: What a late record (event day already recorded complete) becomes: "dead_letter" or
    #: "reopen" (see ``FileSource.late_records``).
    late_records: Literal["dead_letter", "reopen"] = "reopen"
    #: See ``SourceDetails.order_field`` / ``op_field`` / ``row_key``.
    order_field: str | None = None
    op_field: str | None = None
    row_key: tuple[str, ...] = ()

    @property
    def event_day_partitions(self) -> bool:
        """Whether the output partition of a record is its event day (a day-partitioned
        source with an event-time field); otherwise it is the landing day of its file."""
        return self.partitioned and self.event_time is not None

    @property
    def schema(self) -> pa.Schema:
        """The records as the source emits them (declared types, all nullable)."""
        return pa.schema([pa.field(c.name, c.type) for c in self.columns])


@dataclass(frozen=True, slots=True)
class StagePlan:
    """One step: its place (1-based), how errors name it, its input and output columns.

    ``open``: the output columns are unknown until the run opens (an unprobed ``Map``)."""

    index: int
    where: str
    inputs: tuple[Column, ...]
    outputs: tuple[Column, ...]
    open: bool

    def output_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.type) for c in self.outputs])


@dataclass(frozen=True, slots=True)
class LookupPlan(StagePlan):
    schema_name: str = ""
    table: str = ""
    #: (record field, table column) pairs of the key, in order.
    keys: tuple[tuple[str, str], ...] = ()
    #: (table column, output field) pairs.
    columns: tuple[tuple[str, str], ...] = ()
    #: What rows without a match become (after the retries of ``retry_attempts``).
    on_miss: Literal["keep", "drop", "dead_letter"] = "keep"
    retry_attempts: int = 0
    retry_delay: float = 0.0
    cache: Literal["none", "partial", "full"] = "none"
    cache_rows: int = 0
    expire_after_write: float | None = None
    expire_after_access: float | None = None
    cache_missing: bool = True
    #: The partial cache is bypassed while its hit rate is below this (``HitRateGuard``).
    cache_min_hit_rate: float = 0.0
    reload_every: float | None = None
    timeout: float | None = None
    retries: int | None = None
    capacity: int | None = None
    batch_size: int | None = None
    #: "ordered", "unordered" or "key" (input order per value of the ``key`` fields).
    mode: Literal["ordered", "unordered", "key"] = "ordered"
    key: tuple[str, ...] | None = None
    #: The environment variable holding the URL of the table's database (None: the
    #: platform database); the URL itself is read where it is used (``_url_env``).
    url_env: str | None = None

    @property
    def qualified(self) -> str:
        return f"{self.schema_name}.{self.table}"


@dataclass(frozen=True, slots=True)
class AsyncMapPlan(StagePlan):
    function: Any = None
    per_record: bool = True
    added: tuple[Column, ...] = ()
    capacity: int = 100
    timeout: float | None = None
    retry: Any = None
    mode: Literal["ordered", "unordered", "key"] = "ordered"
    key: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class MapPlan(StagePlan):
    function: Any = None
    #: Declared output (fields added or replaced), or None: probed.
    declared: tuple[Column, ...] | None = None


@dataclass(frozen=True, slots=True)
class FilterPlan(StagePlan):
    predicate: Any = None


@dataclass(frozen=True, slots=True)
class SinkPlan:
    """The sink part of a plan: connector ``kind``, its own ``options``, the fields whose
    rows a record replaces (``upsert_key``; None: the sink appends), and the output field
    whose greatest value wins an upsert (``latest_by``: the source's order field — a change
    stream's commit position — or else its event time, when the output holds it; None: the
    last record processed wins), and the field whose value ``"d"`` deletes the key
    (``op_field``: a change stream's operation when the output holds it; None: no deletes)."""

    kind: str
    options: Any = None
    upsert_key: tuple[str, ...] | None = None
    latest_by: str | None = None
    op_field: str | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    name: str
    source: SourcePlan
    stages: tuple[StagePlan, ...]
    sink: SinkPlan
    key: tuple[str, ...] | None
    outputs: tuple[Column, ...] = field(default=())

    @property
    def complete(self) -> bool:
        """Every output type is known (after ``resolve``, or without lookups and open maps)."""
        return not any(s.open for s in self.stages) and all(
            c.type is not None for c in self.outputs
        )

    def output_schema(self) -> pa.Schema:
        if not self.complete:
            raise RuntimeError(f"pipeline {self.name}: output schema not resolved yet")
        return pa.schema([pa.field(c.name, c.type) for c in self.outputs])

    def lookups(self) -> list[LookupPlan]:
        return [s for s in self.stages if isinstance(s, LookupPlan)]
