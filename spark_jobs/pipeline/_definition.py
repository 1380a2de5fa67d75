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
    """A pipeline definition: records of ``source`` go through ``steps`` in order into
    ``sink``, exactly once.

    Building one validates it at once: an unknown field, a type a step cannot take, two
    steps producing one field, a malformed option — each raises one
    :class:`PipelineDefinitionError` naming the pipeline, the step and the field. Key types
    of lookups are checked against the Postgres catalog when a run opens.

    - ``name``: lower-case identifier; names the split source in Postgres, the output folder
      (by default), the Dagster assets and jobs, and the CLI argument.
    - ``key``: fields that identify an output record (the unique-key asset check); default:
      the sink's ``upsert_key``.
    - ``schedule``: cron of the Dagster incremental schedule (UTC).
    - ``sample_data``: ``f(settings)`` writing sample input (``sluice demo-data``).

    Register pipelines by naming their modules in ``SLUICE_PIPELINES``: every ``Pipeline``
    at a module's top level is found.
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
