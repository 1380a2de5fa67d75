"""The source connector contract: what a source gives the platform.

Modelled on Flink's ``Source`` (``SplitEnumerator`` + split serializer + ``SourceReader``):
a source connector turns its *spec* into the source part of a plan (``validate``), builds the
*enumerator* that discovers its splits (``discovery``) and the *split reader* a Spark task
reads them with (``split_reader``; ``fetch`` may block in the fetcher thread and must return
early on ``wake_up()``). Splits are stored in Postgres as rows of the split store: that row
is the split's codec. ``SourceDetails`` is what validation decides; ``UpstreamAsset`` names
the input's Dagster assets.

Threading: connector objects are stateless and shared; their methods run on the caller's
thread (the driver, a CLI command, a sensor tick). Split readers are owned by one Spark task.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from enumerator_service import STREAM_KINDS, Settings
from spark_jobs.connectors._hooks import CompletionHook
from spark_jobs.connectors._task_contexts import ReaderContext

if TYPE_CHECKING:
    from enumerator_service import Discovery
    from spark_jobs.pipeline._checks import Context
    from spark_jobs.pipeline._definition import Pipeline
    from spark_jobs.pipeline._plan import Plan, SourcePlan
    from spark_jobs.source._batch import RecordSchema
    from spark_jobs.source._format_router import SplitReader
    from spark_jobs.source._records import BlockReader

__all__ = ["ObservedInput", "SourceConnector", "SourceDetails", "TableInput", "UpstreamAsset"]


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
    #: The fields identifying a row of a change stream (its table's key): steps must keep
    #: each row's changes in order (a keyed step's key must include them), or ().
    row_key: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TableInput:
    """An upstream Postgres table (the Dagster asset ``[schema, table]``, shared with lookups
    of the same table; ``[url_env, schema, table]`` for a table in the database whose URL
    the environment variable ``url_env`` holds)."""

    schema: str
    table: str
    url_env: str | None = None


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

    @property
    def stream(self) -> bool:
        """Its input has no end (a log: Kafka, a replication slot — one of its split kinds is
        in ``STREAM_KINDS``): an incremental run reads up to a position taken when it starts,
        and what is new is not a split discovery finds, so the pipeline gets no
        ``<P>_new_files`` sensor (run it from ``<P>_schedule`` or ``<P>_continuous``)."""
        return any(kind in STREAM_KINDS for kind in self.split_kinds)

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
