"""The reader job's driver: one run of a pipeline, in named steps.

:class:`ReaderRun` resolves the pipeline against the catalog, recovers what crashed runs
left, assigns splits to the run, runs the subtasks on Spark under the checkpoint coordinator
and a lease heartbeat, publishes and swaps what completed, and reports. Whatever the run does
not commit returns to the pool when it ends, successfully or not.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import date

import sqlalchemy as sa

from enumerator_service import (
    CheckpointStore,
    ConfigError,
    Rebuild,
    RebuildStore,
    Settings,
    SplitStore,
    StorageOptions,
    connect_engine,
    database_url,
    prune_finished_runs,
    recover,
    run_id_used,
    safe_name,
    sweep_secret_files,
)
from spark_jobs._outcomes import job_failure, stopped_by
from spark_jobs._spark import auth_secret, slot_error, spark_for
from spark_jobs.checkpoint import CheckpointCoordinator
from spark_jobs.connectors._registry import sink_connector_named, source_connector_named
from spark_jobs.jobs._credentials import share_database
from spark_jobs.jobs._heartbeat import Heartbeat, clean_staging, run_progress
from spark_jobs.jobs._input_left import input_left
from spark_jobs.jobs._outages import coordinator_failed, while_down
from spark_jobs.jobs._results import SubtaskResult
from spark_jobs.jobs._run_report import summarize_run
from spark_jobs.jobs._shipping import ship_by_value
from spark_jobs.jobs._spark_stage import cancel_subtasks, run_subtasks
from spark_jobs.jobs._summary import RunSummary
from spark_jobs.jobs._task_config import StepDefaults, TaskConfig
from spark_jobs.pipeline import Pipeline
from spark_jobs.pipeline._catalog import Resolved, resolve
from spark_jobs.sink import build_sinks
from spark_jobs.sink._object_store import remove_folder

__all__ = ["ReaderRun", "RunSummary", "run_pipeline"]

_log = logging.getLogger(__name__)
Progress = Callable[[int, int], None]


def run_pipeline(
    settings: Settings,
    pipeline: Pipeline,
    *,
    dates: Sequence[date] | None = None,
    progress: Progress | None = None,
    run_id: str | None = None,
    continuous: bool = False,
    rebuild: bool = False,
) -> RunSummary:
    """Assign the pipeline's unassigned splits (of ``dates`` if given) to a new run and
    process them (see :class:`ReaderRun`)."""
    sweep_secret_files(settings.home_path)  # password files of drivers that were killed
    run = ReaderRun(
        settings,
        pipeline,
        dates=dates,
        progress=progress,
        run_id=run_id,
        continuous=continuous,
        rebuild=rebuild,
    )
    return run.execute()


class ReaderRun:
    """One run of ``pipeline``.

    ``continuous``: a long-running reader — its subtasks keep pulling splits that are
    assigned to ``run_id`` later (by the enumerator sensor) and end only after
    ``continuous_idle_seconds`` without new work (0: when the run is cancelled).

    ``rebuild`` (with ``dates``): the days that were processed before are read again from
    scratch and their output replaces the previous output in one swap at the end (see
    ``enumerator_service._rebuilds``); days never processed are simply processed.
    """

    #: Subtasks run as one barrier stage (gang-scheduled, restarted together). Benchmarks
    #: turn it off to measure what it costs; without it a run whose parallelism exceeds the
    #: free task slots never ends.
    gang_scheduled = True

    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        *,
        dates: Sequence[date] | None = None,
        progress: Progress | None = None,
        run_id: str | None = None,
        continuous: bool = False,
        rebuild: bool = False,
    ) -> None:
        plan = pipeline.plan
        if rebuild and dates is None:
            raise ValueError("a rebuild needs the dates to rebuild")
        if dates is not None and not plan.source.partitioned:
            raise ConfigError(f"{pipeline.name}: dates", "the pipeline's output is unpartitioned")
        if continuous and settings.checkpoint_interval_seconds == 0:
            raise ConfigError(
                "SLUICE_CHECKPOINT_INTERVAL_SECONDS", "must be > 0 for a continuous reader run"
            )
        auth_secret(settings)  # an unusable secret setting fails before any split moves
        self.settings = settings
        self.pipeline = pipeline
        self.dates = list(dates) if dates is not None else None
        self.progress = progress
        # A given run id (a Dagster run tag, an API argument) becomes a staging folder name.
        self.run_id = (
            safe_name(run_id, "run_id")
            if run_id is not None
            else f"run-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
        )
        self.continuous = continuous
        self._source_connector = source_connector_named(plan.source.kind)
        self._sink_connector = sink_connector_named(plan.sink.kind)
        # A sink that cannot replace a partition's output (an append table): re-materialising
        # a day then only processes its new splits.
        self.rebuild = rebuild and self._sink_connector.can_replace(plan.sink)
        # A file sink's table folder and staging folder (local folders or object-store
        # prefixes: SLUICE_WAREHOUSE_DIR, ParquetSink(path=)); None for a sink of rows.
        self.output_root = self._sink_connector.output_root(pipeline, settings)
        self.staging_root = self._sink_connector.staging_root(pipeline, settings)
        self.storage = StorageOptions.of(settings)
        self.source_root = self._source_connector.reader_root(pipeline, settings)

    @property
    def source(self) -> str:
        return self.pipeline.name

    def execute(self) -> RunSummary:
        started = time.monotonic()
        self._url = database_url(self.settings)
        self._engine = connect_engine(self._url)
        self._unshare: Callable[[], None] = lambda: None
        try:
            # Step 1: the complete plan from the catalog (looked-up types, key types): a
            # definition that does not fit the database fails here, before anything moves.
            # An output that cannot be used at all (an unreachable object store): one line.
            self._sink_connector.check_output(self.pipeline, self.settings)
            if run_id_used(self._engine, self.run_id):
                raise ConfigError(
                    "run id",
                    f"{self.run_id!r} names an earlier run (its checkpoints, splits or output "
                    "are recorded under it): a run id names one run — give a new one, or "
                    "none (a Dagster re-execution: drop the copied sluice/run_id tag)",
                )
            resolved = resolve(self.pipeline, self._engine)
            # Step 2: recovery — dead runs' leases back, committed output published, dead
            # runs' staged output aborted, interrupted rebuild swaps finished.
            self._sinks = build_sinks(self._engine, self.storage)
            self._recover(resolved)
            # Step 3: assignment (rebuilt days first, as rebuild members).
            replacing, assigned = self._assign()
            if assigned == 0 and not self.continuous:
                left = input_left(self._engine, self.source, self.run_id, self.dates)
                return RunSummary.nothing(
                    self.source, self.run_id, time.monotonic() - started, left
                )
            # Step 4: the subtasks on Spark, under the coordinator and the lease heartbeat.
            results, coordinator = self._execute(resolved, assigned)
            # Step 5: publish what is committed, swap finished rebuilds, sweep.
            self._wrap_up(replacing)
            # Step 6: the summary, from Postgres (a retried task's commits count too).
            return summarize_run(
                self._engine,
                self.run_id,
                self.source,
                self.dates,
                results,
                coordinator.stats,
                rebuilt=tuple(r.partition_key for r in replacing),
                seconds=time.monotonic() - started,
                # A continuous run that stops gives its open splits back by design.
                returned=0 if self.continuous else self._returned,
            )
        finally:
            self._unshare()  # the run's password file, if it needed one
            self._engine.dispose()

    # -- steps ---------------------------------------------------------------------------

    def _recover(self, resolved: Resolved) -> None:
        engine, plan = self._engine, resolved.plan
        SplitStore(engine).release_expired(self.source)
        recover(engine, self._sinks)
        prune_finished_runs(engine, retention_hours=self.settings.bookkeeping_retention_hours)
        if self.staging_root is not None:  # (a table sink stages rows, never files)
            clean_staging(engine, self.staging_root)
        self._finish = functools.partial(
            self._sink_connector.finish_rebuilds,
            engine,
            self.pipeline,
            self.settings,
            self._sinks,
        )
        self._finish()  # rebuilds a crash interrupted
        self._sink_connector.prepare(engine, plan, self.pipeline, self.settings)

    def _assign(self) -> tuple[list[Rebuild], int]:
        settings, store = self.settings, SplitStore(self._engine)
        self._rebuilds = rebuilds = RebuildStore(self._engine)
        # Rebuilt days: every split that fed them is assigned to this run again, as a
        # rebuild member.
        replacing = (
            rebuilds.start(
                self.source,
                self.dates or [],
                self.run_id,
                lease_seconds=settings.lease_seconds,
                event_days=self.pipeline.plan.source.event_day_partitions
                and not self._source_connector.own_day_splits,
                fed_members=not self._source_connector.own_day_splits,
            )
            if self.rebuild
            else []
        )
        assigned = rebuilds.unfinished_members([r.id for r in replacing])
        self._source_connector.before_assignment(
            self._engine, self.pipeline, settings, continuous=self.continuous, dates=self.dates
        )
        assigned += store.assign_to_run(
            self.run_id,
            self.source,
            lease_seconds=settings.lease_seconds,
            partition_keys=self.dates,
        )
        return replacing, assigned

    def _task_config(self, resolved: Resolved) -> TaskConfig:
        settings = self.settings
        # The closure gets the URL without its password, and where executors read it.
        database, self._unshare = share_database(settings, self._url)
        return TaskConfig(
            # The sample-data generator stays here: workers never need it (nor its imports).
            pipeline=dataclasses.replace(self.pipeline, sample_data=None),
            plan=resolved.plan,
            lookup_types=resolved.lookup_types,
            database=database,
            run_id=self.run_id,
            lease_seconds=settings.lease_seconds,
            output_root=None if self.output_root is None else self.output_root.uri,
            staging_root=None if self.staging_root is None else self.staging_root.uri,
            max_line_bytes=settings.max_line_bytes,
            block_bytes=settings.read_block_bytes,
            pull_max_splits=settings.pull_max_splits,
            pull_max_bytes=settings.pull_max_bytes,
            defaults=StepDefaults(
                lookup_capacity=settings.lookup_capacity,
                lookup_batch_size=settings.lookup_batch_size,
                lookup_pool_size=settings.lookup_pool_size,
                lookup_timeout_seconds=settings.lookup_timeout_seconds,
                lookup_retries=settings.lookup_retries,
                injected_latency_ms=settings.lookup_injected_latency_ms,
            ),
            exactly_once=settings.checkpointing_mode == "EXACTLY_ONCE",
            continuous=self.continuous,
            continuous_poll_seconds=settings.continuous_poll_seconds,
            continuous_idle_seconds=settings.continuous_idle_seconds or None,
            source_root=self.source_root,
            source_connector=self._source_connector,
            sink_connector=self._sink_connector,
            follow_symlinks=settings.follow_symlinks,
            split_max_attempts=settings.split_max_attempts,
            storage=self.storage,
        )

    def _execute(
        self, resolved: Resolved, assigned: int
    ) -> tuple[list[SubtaskResult], CheckpointCoordinator]:
        settings, engine = self.settings, self._engine
        config = self._task_config(resolved)
        parallelism = (
            settings.parallelism if self.continuous else min(settings.parallelism, assigned)
        )
        config = dataclasses.replace(config, parallelism=parallelism)
        hook = self._source_connector.completion_hook(engine, self.pipeline, settings)
        heartbeat = Heartbeat(
            SplitStore(engine),
            engine,
            self.run_id,
            settings.lease_seconds,
            self.progress,
            self._finish if self.continuous else None,
        )
        spark = spark_for(settings)
        ship_by_value(self.pipeline)
        coordinator = CheckpointCoordinator(
            engine,
            self.run_id,
            parallelism,
            self._sinks,
            interval=settings.checkpoint_interval_seconds,
            timeout=settings.checkpoint_timeout_seconds,
            exactly_once=config.exactly_once,
            source=self.source,
            history_seconds=settings.checkpoint_history_seconds,
            # Subtasks wait for their final checkpoint: without a coordinator, stop the job.
            on_failure=lambda _exc: spark.sparkContext.cancelAllJobs(),
            # A deterministic error: stop now, Spark's stage retries would only repeat it.
            on_stop_request=lambda _line: spark.sparkContext.cancelAllJobs(),
            on_complete=hook,
        )
        heartbeat.start()
        coordinator.start()
        try:
            results: list[SubtaskResult] = run_subtasks(
                spark, config, parallelism, self.gang_scheduled
            )
        except BaseException as exc:
            # Interrupted (a cancelled Dagster run, Ctrl-C, SIGTERM) or failed: stop the
            # subtasks too — a continuous reader would otherwise keep running without its
            # driver's leases. Best effort: an interrupt inside a Py4J call can leave the
            # gateway answering nothing, and that must not replace the run's own error.
            try:
                cancel_subtasks(spark)
            except Exception as cancel_error:  # logged: the run's own error is raised below
                _log.warning("run %s: Spark job not cancelled: %s", self.run_id, cancel_error)
            if coordinator.stop_requested is not None:
                raise stopped_by(coordinator.stop_requested) from None
            too_few = slot_error(exc, spark, parallelism, settings.spark_master)
            if too_few is not None:
                raise too_few from None
            if coordinator.error is not None:
                # The job was cancelled because the coordinator failed (e.g. the sink's table
                # refused the commit): its error is the cause, not the cancellation.
                raise coordinator_failed(coordinator.error) from coordinator.error
            failed = job_failure(exc, self.source)
            if failed is not None:
                raise failed from exc
            raise
        finally:
            coordinator.stop()
            heartbeat.stop()
            if hook is not None:
                hook.close()
            self._give_back()
        if coordinator.stop_requested is not None:
            raise stopped_by(coordinator.stop_requested)
        if coordinator.error is not None:
            raise coordinator_failed(coordinator.error) from coordinator.error
        return results, coordinator

    def _wrap_up(self, replacing: list[Rebuild]) -> None:
        engine, plan = self._engine, self.pipeline.plan
        # The run's work is committed: a Postgres restart now delays the wrap-up, no more.
        if self.progress is not None:
            self.progress(*while_down(lambda: run_progress(engine, self.run_id)))
        while_down(lambda: recover(engine, self._sinks))  # publishes committed, unpublished
        if self.staging_root is not None:
            remove_folder(self.staging_root.child(safe_name(self.run_id, "run_id")))
        while_down(self._finish)
        pending = {r.id for r in while_down(lambda: self._rebuilds.pending(self.source))}
        unfinished = [r for r in replacing if r.id in pending]
        if unfinished:
            left = self._rebuilds.unfinished_members([unfinished[0].id])
            raise RuntimeError(
                f"rebuild of partition {unfinished[0].partition_key} is not complete "
                f"({left} of its splits uncommitted); the previous output stays live: "
                "materialise it again"
            )
        self._sink_connector.wrap_up(engine, plan)

    def _give_back(self) -> None:
        """Whatever the run did not commit goes back to the pool (addSplitsBack), and its
        staged leftovers are aborted. With the database down this fails — logged, not
        raised, so the run's own error stays visible; lease expiry and recovery do the same
        work later."""
        self._returned = 0
        try:
            store = SplitStore(self._engine)
            self._returned = store.unread_of_run(self.run_id)
            store.release_run(self.run_id)
            CheckpointStore(self._engine, self.run_id, self._sinks).abort_uncommitted()
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
            _log.warning(
                "run %s: splits not returned now (lease expiry will): %s", self.run_id, exc
            )
