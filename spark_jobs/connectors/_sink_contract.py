"""The sink connector contract: what a sink gives the platform.

Modelled on Flink's ``Sink`` (``SinkWriter`` + ``Committer``): a sink connector turns its spec
into the sink part of a plan (``validate``, ``check_plan``), opens the *writer* that stages
output inside a task per checkpoint (``open_writer``: snapshot and restore travel with the
task's checkpoint state) and provides the *committers* (``committers``: each a
``TransactionalSink`` that commits inside the checkpoint's Postgres transaction, publishes
after it, is idempotent on recovery, and aborts) and, when it can, the replacement of one
output partition for rebuilds (``finish_rebuilds``) and its table's maintenance.

Threading: connector objects are stateless and shared; their methods run on the caller's
thread (the driver, a CLI command, a sensor tick). Writers are owned by one Spark task.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import Location, Settings, StorageOptions, TransactionalSink
from spark_jobs.connectors._maintenance import TableMaintenance
from spark_jobs.connectors._task_contexts import SinkWriterContext

if TYPE_CHECKING:
    from enumerator_service import Rebuild
    from spark_jobs.pipeline._checks import Context
    from spark_jobs.pipeline._definition import Pipeline
    from spark_jobs.pipeline._plan import Column, Plan, SinkPlan

__all__ = ["SinkConnector", "SinkDetails"]


@dataclass(frozen=True, slots=True)
class SinkDetails:
    """A sink connector's validated values: ``options`` (only the connector reads them) and
    ``upsert_key`` (fields whose rows a record replaces; None: append)."""

    options: Any
    upsert_key: tuple[str, ...] | None = None


class SinkConnector(abc.ABC):
    """A kind of sink. ``name`` is stored in plans; ``committer_names`` are the values of
    ``sink_transactions.sink`` its committers handle (recovery needs every one)."""

    name: str = ""

    @abc.abstractmethod
    def validate(
        self,
        spec: Any,
        ctx: Context,
        *,
        pipeline: str,
        columns: tuple[Column, ...],
        is_open: bool,
    ) -> SinkDetails:
        """The connector's own checks of ``spec`` against the output ``columns``."""

    def check_plan(self, plan: Plan, ctx: Context) -> None:
        """Checks of the sink against the whole plan — its source's partitions and event
        time — when the pipeline is defined (``ctx.fail(...)``), so that ``sluice pipelines``
        and the code location catch them, not only the run. ``plan.complete`` False: the
        output is not resolved yet (lookups, probed maps); check what the source decides."""
        return None

    @abc.abstractmethod
    def describe(self, plan: Plan) -> str:
        """One line: where the output goes and how."""

    @abc.abstractmethod
    def location(self, pipeline: Pipeline, settings: Settings, days: Sequence[date]) -> str:
        """Where the output of ``days`` is (all of it for no days), as people read it."""

    @abc.abstractmethod
    def committers(
        self, engine: Engine | None, storage: StorageOptions | None = None
    ) -> Mapping[str, TransactionalSink]:
        """Commit sides by ``sink_transactions.sink`` name (``engine``: for aborts that
        clean up at once; None: cleanup is left to later sweeps; ``storage``: how object
        stores are reached)."""

    def output_root(self, pipeline: Pipeline, settings: Settings) -> Location | None:
        """A file sink's table folder (a local folder or an object-store prefix); None for
        a sink of rows."""
        return None

    def staging_root(self, pipeline: Pipeline, settings: Settings) -> Location | None:
        """Where a file sink stages uncommitted files (outside its table folder: the driver
        sweeps dead runs' leftovers there); None when the sink stages no files."""
        return None

    def check_output(self, pipeline: Pipeline, settings: Settings) -> None:
        """Before a run reads the catalog: one ``ConfigError``
        line when the output cannot be used at all (an unreachable object store, a missing
        bucket). Default: nothing."""
        return None

    def check_existing(self, engine: Engine, pipeline: Pipeline, settings: Settings) -> None:
        """Read-only, before anything is created for the pipeline (a CDC source's slot at
        discovery): one ``ConfigError`` line when an existing output cannot take this
        pipeline's output (a table without a unique index on the upsert key). The run's
        ``prepare`` checks again, with everything else. Default: nothing."""
        return None

    @abc.abstractmethod
    def open_writer(
        self, plan: SinkPlan, io: ThreadPoolExecutor, context: SinkWriterContext
    ) -> Any:
        """The task-side writer (``write``, ``snapshot``, ``restore``, ``close``)."""

    def publish_unaligned(self, staged: list[Any], storage: StorageOptions) -> None:
        """AT_LEAST_ONCE: make one subtask's staged output (``StagedOutput.files``) visible
        before its acknowledgement commits its split states (a replay may then duplicate,
        never lose). Default: nothing (a sink whose committer's ``commit`` runs inside the
        acknowledgement's transaction)."""
        return None

    def can_replace(self, plan: SinkPlan) -> bool:
        """Whether re-materialising a partition replaces its output (else only new input
        of it is processed). Default: no."""
        return False

    def finish_rebuilds(
        self,
        engine: Engine,
        pipeline: Pipeline,
        settings: Settings,
        sinks: Mapping[str, TransactionalSink],
    ) -> list[Rebuild]:
        """Make every ready rebuild of ``pipeline``'s days live (replace each rebuilt day's
        output by its members' output); returns the rebuilds now live. Called by the driver
        when it starts, every few seconds while it runs and when its tasks end — from any
        process, any number of times, after a crash at any point: must be idempotent.
        Default: bookkeeping only (a sink whose members' rows replaced the day's rows by key
        as they committed)."""
        from spark_jobs.sink import finish_rebuilds

        return finish_rebuilds(engine, None, sinks, source=pipeline.name, folders=False)

    def maintenance(
        self, engine: Engine, pipeline: Pipeline, settings: Settings
    ) -> TableMaintenance | None:
        """The maintenance of ``pipeline``'s output table (compact a complete day, expire
        old snapshots, remove orphan files: a lakehouse table's), bound to ``engine``; the
        Dagster factory builds the pipeline's maintenance jobs when it is not None. Called
        when a maintenance run or sensor tick starts (not when the code location loads);
        must not open the table before a method is called. Default: None (the sink needs
        no maintenance)."""
        return None

    def output_metadata(
        self, pipeline: Pipeline, settings: Settings, run_id: str | None
    ) -> dict[str, str | int]:
        """What a Dagster materialisation of the output shows about it as it is now: e.g. a
        table's URI (key ``dagster/uri``) and name (``dagster/table_name``), its snapshot or
        version, the rows and files run ``run_id`` added (None: no run in particular). Plain
        values, never a secret. Default: nothing."""
        return {}

    def prepare(self, engine: Engine, plan: Plan, pipeline: Pipeline, settings: Settings) -> None:
        """Before tasks start, with the run's settings (create tables; a table whose location
        depends on them: the warehouse, the object store). Default: nothing."""
        return None

    def wrap_up(self, engine: Engine, plan: Plan) -> None:
        """After a run's tasks end (sweep leftovers). Default: nothing."""
        return None

    @abc.abstractmethod
    def committed_rows(
        self, conn: sa.Connection, pipeline: Pipeline, settings: Settings, days: list[date]
    ) -> dict[date | None, int]:
        """Rows committed by the platform, per day (``{None: n}`` for no days)."""

    @abc.abstractmethod
    def rows_out(
        self,
        conn: sa.Connection,
        pipeline: Pipeline,
        settings: Settings,
        days: Sequence[date | None],
    ) -> dict[date | None, int]:
        """Rows present in the output now, per day (None: all of it)."""

    @abc.abstractmethod
    def duplicate_keys(
        self, pipeline: Pipeline, settings: Settings, day: date | None, key: list[str]
    ) -> tuple[int, list[str]]:
        """(duplicate rows, sample keys) of ``key`` in one output partition."""
