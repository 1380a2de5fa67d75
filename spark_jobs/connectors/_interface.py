"""The connector contracts: what a source and a sink give the platform.

Modelled on Flink's ``Source`` (``SplitEnumerator`` + split serializer + ``SourceReader``) and
``Sink`` (``SinkWriter`` + ``Committer``), with their contracts and not their verbosity:

- a **source connector** turns its *spec* (the user's immutable definition value) into the
  source part of a plan (``SourceConnector.validate``), builds the *enumerator* that
  discovers its splits (bounded for given days, or one continuous tick, with bounded state;
  ``SourceConnector.discovery``) and the *split reader* a Spark task reads them with
  (``SourceConnector.split_reader``; ``fetch`` may block in the fetcher thread and must
  return early on ``wake_up()``). Splits are stored in Postgres as rows of the split store
  (``kind``, ``uri``, byte or key range, state): that row is the split's codec.
- a **sink connector** turns its spec into the sink part of a plan, opens the *writer* that
  stages output inside a task per checkpoint (snapshot and restore travel with the task's
  checkpoint state) and provides the *committer* (a
  ``TransactionalSink``: commit inside the checkpoint's Postgres
  transaction, publish after it, idempotent on recovery; abort) and, when it can, the
  replacement of one output partition for rebuilds.

Every concrete connector lives in its own folder under ``spark_jobs/connectors/`` and is
registered there (``spark_jobs.connectors._registry``); the driver, the reader task, the
CLI and the Dagster factory ask the registry and never name a concrete connector.

Threading: connector objects are stateless and shared; their methods run on the caller's
thread (the driver, a CLI command, a sensor tick). Split readers and writers are owned by one
Spark task (see their own docstrings).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import Location, Settings, StorageOptions, TransactionalSink
from spark_jobs.connectors._hooks import CompletionHook
from spark_jobs.connectors._maintenance import TableMaintenance

if TYPE_CHECKING:
    from enumerator_service import Discovery, Rebuild
    from spark_jobs.pipeline._checks import Context
    from spark_jobs.pipeline._definition import Pipeline
    from spark_jobs.pipeline._plan import Column, Plan, SinkPlan, SourcePlan
    from spark_jobs.source._batch import RecordSchema
    from spark_jobs.source._format_router import SplitReader
    from spark_jobs.source._records import BlockReader

__all__ = [
    "CompletionHook",
    "ObservedInput",
    "ReaderContext",
    "SinkConnector",
    "SinkDetails",
    "SinkWriterContext",
    "SourceConnector",
    "SourceDetails",
    "TableInput",
    "UpstreamAsset",
]


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True, slots=True)
class SourceDetails:
    """What a source connector's validation decides beyond the shared fields (schema,
    required, event time, watermark strategy, late records — validated by the platform).

    ``options``: the connector's own validated values (only the connector reads them).
    ``partitioned``: the output is partitioned by day (``dt``) and so are the Dagster assets.
    """

    options: Any
    partitioned: bool = False
    start_date: date | None = None
    #: The field whose greatest value wins an upsert instead of the event time (a change
    #: stream's commit position), or None.
    order_field: str | None = None
    #: The field saying whether a record deletes its key (value ``"d"``) in an upsert sink,
    #: or None: every record upserts.
    op_field: str | None = None


@dataclass(frozen=True, slots=True)
class ReaderContext:
    """What a split reader may use inside a Spark task (no secret travels in it: ``dsn`` is
    the database URL without its password, which the task completes from its environment)."""

    max_line_bytes: int
    block_bytes: int
    dsn: str
    #: What the connector's ``reader_root`` gave the driver (files: the landing folder), or None.
    root: Any = None
    #: ``SLUICE_FOLLOW_SYMLINKS``.
    follow_symlinks: bool = False
    #: The source connector's validated options (``SourceDetails.options`` of the plan).
    options: Any = None
    #: How object stores are reached in the task (endpoint, region; never credentials).
    storage: StorageOptions = field(default_factory=StorageOptions)
    #: The run is continuous (an unbounded split is followed, not read up to "now").
    continuous: bool = False


@dataclass(frozen=True, slots=True)
class TableInput:
    """An upstream Postgres table (the Dagster asset ``[schema, table]``, shared with lookups
    of the same table)."""

    schema: str
    table: str


@dataclass(frozen=True, slots=True)
class ObservedInput:
    """An upstream asset the source observes itself (``<pipeline>_<name>``): ``observe``
    returns (data version, metadata of plain values) for Dagster to record."""

    name: str
    description: str
    kinds: frozenset[str]
    observe: Callable[[Pipeline, Settings], tuple[str | None, Mapping[str, Any]]]
    #: A metadata key whose value is a path or URI (shown as such).
    path_key: str | None = None


UpstreamAsset = TableInput | ObservedInput


class SourceConnector(abc.ABC):
    """A kind of source. ``name`` is stored in plans and split rows (``split.kind`` values
    are the connector's ``split_kinds``)."""

    name: str = ""
    #: The split kinds its split reader reads (e.g. ``jsonl``, ``csv``; ``table``).
    split_kinds: tuple[str, ...] = ()
    #: All its splits a subtask owns are read at once by one ``concurrent_reader`` (streams:
    #: no partition starves the others; ``SplitStore.pull_splits(owned_kinds=…)``).
    concurrent_splits: bool = False
    #: Its splits of a day hold exactly the day's records (Kafka: a time range): a rebuild
    #: of the day re-reads them alone, not the splits that fed it (a stream's main line).
    own_day_splits: bool = False

    @abc.abstractmethod
    def validate(self, spec: Any, ctx: Context) -> SourceDetails:
        """The connector's own checks of ``spec`` (``ctx.fail(...)`` names the field)."""

    def added_fields(self, spec: Any) -> Mapping[str, Any]:
        """Fields the connector adds after the spec's declared ``schema`` (name → type
        spec; a change stream's operation and position). Default: none."""
        return {}

    @abc.abstractmethod
    def describe(self, plan: SourcePlan, pipeline: str, where: str | None = None) -> str:
        """One line for ``sluice pipelines`` and Dagster (``where``: its resolved location)."""

    def location(self, pipeline: Pipeline, settings: Settings) -> str | None:
        """Where the input is, as people read it (a folder, a URI), or None."""
        return None

    def sample_folder(self, pipeline: Pipeline, settings: Settings) -> Path | None:
        """Where ``sluice demo-data`` lets the pipeline's generator write files (None: the
        generator writes none, only tables)."""
        return None

    @abc.abstractmethod
    def discovery(self, pipeline: Pipeline, settings: Settings) -> Discovery:
        """How the enumerator finds the pipeline's splits (bounded or continuous); a
        connector with an enumerator of its own returns an
        ``EnumeratorDiscovery`` that builds it."""

    def waiting_for_input(self, pipeline: Pipeline, settings: Settings) -> str | None:
        """Why there is nothing to discover yet without it being an error (a landing folder
        that does not exist yet), or None."""
        return None

    def input_days(self, pipeline: Pipeline, settings: Settings) -> list[date] | None:
        """The days with input, for Dagster's discovered partitions (None: not day-based)."""
        return None

    def check_catalog(self, conn: sa.Connection, plan: Plan) -> None:
        """Check the source against the database when a run opens (default: nothing)."""
        return None

    def reader_root(self, pipeline: Pipeline, settings: Settings) -> Any:
        """What ``ReaderContext.root`` carries to the tasks (default: None)."""
        return None

    @abc.abstractmethod
    def split_reader(self, schema: RecordSchema, context: ReaderContext) -> BlockReader:
        """The task-side reader of this connector's splits (one per task and connector)."""

    def before_assignment(
        self,
        engine: Engine,
        pipeline: Pipeline,
        settings: Settings,
        *,
        continuous: bool,
        dates: Sequence[date] | None = None,
    ) -> None:
        """Before a run assigns itself the source's splits (a stream source closes its open
        splits for a bounded run of all new input). Default: nothing."""
        return None

    def completion_hook(
        self, engine: Engine, pipeline: Pipeline, settings: Settings
    ) -> CompletionHook | None:
        """Called by the coordinator after each completed checkpoint (Kafka: offsets to the
        consumer group); its failure is logged, never fails the run. Default: None."""
        return None

    def concurrent_reader(self, schema: RecordSchema, context: ReaderContext) -> SplitReader:
        """The task-side :class:`~spark_jobs.source.SplitReader` of all its splits at once
        (``concurrent_splits``: ``add_split`` any time, ``fetch`` gives several splits' blocks)."""
        raise NotImplementedError(f"source connector {self.name!r} reads one split at a time")

    def check_split(self, split: Any) -> None:
        """Called in the fetcher before a split is opened: raise when it must not be read
        (files: changed since discovery). Default: nothing."""
        return None

    def replay_split(self, split: Any, start: int, end: int) -> Any:
        """The split to read a replayed range ``[start, end)`` of (records whose offset is
        in it are kept by the reader in any case; bounding the split only saves reading).
        Default: the split itself."""
        return split

    def content_errors(self) -> Sequence[tuple[type[BaseException], str]]:
        """Errors that are the split's own content's fault (reason per type): the split is
        retried, then quarantined. Anything else fails the task. Default: none."""
        return ()

    def upstream_assets(self, plan: Plan) -> list[UpstreamAsset]:
        """The Dagster assets of the input (default: none)."""
        return []

    def source_status(self, conn: sa.Connection, plan: Plan) -> Mapping[str, Any]:
        """Plain values about resources the source holds on a server, for ``sluice status``
        (a replication slot: whether it is active, the WAL it retains). Default: none."""
        return {}

    def health_description(self, plan: Plan) -> str | None:
        """What the source's own Dagster check checks, or None: it has none (default)."""
        return None

    def health(
        self, conn: sa.Connection, plan: Plan, settings: Settings
    ) -> tuple[bool, str, Mapping[str, Any]]:
        """The source's own check (see ``health_description``): (passed, one line, plain
        metadata)."""
        return True, "nothing to check", {}

    def release(self, engine: Engine, plan: Plan) -> list[str] | None:
        """Drop what the source holds on a server (a replication slot, a publication) and
        forget its progress, so that the next discovery starts over; lines saying what was
        dropped. None: the source holds nothing (default)."""
        return None


# --------------------------------------------------------------------------- sinks


@dataclass(frozen=True, slots=True)
class SinkDetails:
    """A sink connector's validated values: ``options`` (only the connector reads them) and
    ``upsert_key`` (fields whose rows a record replaces; None: append)."""

    options: Any
    upsert_key: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class SinkWriterContext:
    """What a sink writer gets inside a task."""

    schema: pa.Schema
    partitioned: bool
    dsn: str
    run_id: str
    subtask: int
    attempt: str
    #: Where staged files go and where the table folder is (file sinks), else unused.
    staging_root: Any = None
    output_root: Any = None


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
