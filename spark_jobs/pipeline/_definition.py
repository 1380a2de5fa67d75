"""A pipeline: a source, steps and a sink, validated when it is defined."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_jobs.connectors.parquet._spec import ParquetSink
from spark_jobs.pipeline._derive import derive
from spark_jobs.pipeline._plan import Column, Plan
from spark_jobs.pipeline._sinks import Sink
from spark_jobs.pipeline._sources import Source
from spark_jobs.pipeline._steps import Step

__all__ = ["Pipeline"]


@dataclass(frozen=True)
class Pipeline:
    """A pipeline definition: records of `source` go through `steps` in order into `sink`,
    exactly once.

    ```python
    from spark_jobs import FileSource, Lookup, ParquetSink, Pipeline

    orders = Pipeline(
        name="orders",
        source=FileSource(
            schema={"order_id": "int64", "user_id": "int64", "ts": "timestamp"},
            required=["order_id"],
            event_time="ts",
        ),
        steps=[Lookup("public.users", on="user_id", columns=["country"])],
        sink=ParquetSink(),
    )
    ```

    Building one validates it at once: an unknown field, a type a step cannot take, two
    steps producing one field, a malformed option — each raises one
    `PipelineDefinitionError` naming the pipeline, the step and the field. What needs the
    database (the types of a lookup's key and columns, a table source's columns, an existing
    sink table) is checked when a run opens, or by `sluice pipelines`.

    Register pipelines by naming their modules in `SLUICE_PIPELINES`: every `Pipeline` at a
    module's top level is found.

    Names: field names are letters, digits and `_` (at most 63 characters, not starting with
    `__sluice`); table, schema, column and pipeline names are lower-case identifiers of at
    most 63 characters. Every name is validated, then quoted wherever it reaches SQL, so
    reserved words such as `order` or `user` work as names.

    Args:
        name: Lower-case identifier. Names the split source in the platform database, the
            output folder (by default), the Dagster assets and jobs, and the CLI argument.
        source: Where records come from: a `FileSource`, a `TableSource`, a `KafkaSource`
            or a `PostgresCdcSource` (or a registered connector's spec).
        steps: `Lookup`, `AsyncMap`, `Map` and `Filter` steps, applied in order.
        sink: Where output rows go: a `ParquetSink` (the default, under
            `SLUICE_WAREHOUSE_DIR`), a `PostgresSink`, an `IcebergSink` or a `DeltaSink`
            (or a registered connector's spec).
        key: Output fields that identify a record (the Dagster `unique_key` asset check).
            Default: the sink's `upsert_key`, if any.
        schedule: Cron expression (five fields, UTC) of the Dagster incremental schedule.
        sample_data: `f(target: SampleTarget) -> str`, writing sample input for
            `sluice demo-data` and `sluice demo` into `target.landing` and, through
            `claim_demo_table`, tables it creates; returns one line saying what it wrote.
        description: Shown in Dagster.
    """

    name: str
    source: Source
    steps: Sequence[Step] = ()
    sink: Sink = field(default_factory=ParquetSink)
    key: Sequence[str] | None = None
    schedule: str = "0 * * * *"
    sample_data: Callable[[Any], Any] | None = None
    description: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "_plan", derive(self))

    @property
    def plan(self) -> Plan:
        """The validated plan (types of looked-up columns unknown until a run opens)."""
        plan: Plan = self.__dict__["_plan"]
        return plan

    @property
    def output(self) -> tuple[Column, ...]:
        """The output fields, in order (a looked-up column's type is None until resolved)."""
        return self.plan.outputs
