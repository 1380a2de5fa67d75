"""Sensor-driven continuous mode per pipeline, and giving a failed run's splits back.

A pipeline's continuous sensor is its enumerator: every tick registers new landing files as
splits (the enumerator's bounded cursor and its per-tick cap keep a tick short: a backlog is
drained over several ticks, and the sensor cursor says how much is left), and it keeps exactly one
long-running run of its continuous job alive. New splits go to the live run (whose
subtasks pull them as they appear) or to the run the tick requests. Each run is one
*generation* (its ``run_key``), so a request is never made twice, and a new generation is
requested only when the previous run is over — failed, cancelled, or ended after idling.

A run Dagster calls STARTED is not trusted to be alive: with the default run launcher nothing
notices a run worker that died with its container or daemon, and the run stays STARTED for
ever. The driver's lease heartbeat in Postgres decides (``_dead_run_reason``): a run that has
been STARTED for longer than one lease and holds a split whose lease ran out is dead. The tick
then assigns it nothing more, reports it failed in Dagster with the reason, returns its splits
to the pool and requests the next generation, which takes them.

``release_failed_run_splits`` returns the splits of any failed Sluice run to the pool at once
(lease expiry would do it too, only later); the next run resumes them from their committed
checkpoint state.
"""

# No "from __future__ import annotations": Dagster inspects the context annotations.

import json
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from dagster import (
    DagsterEventType,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    DefaultSensorStatus,
    JobDefinition,
    Nothing,
    OpExecutionContext,
    Out,
    Output,
    RunFailureSensorContext,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    job,
    op,
    run_failure_sensor,
    sensor,
)

from dagster_project._runs import (
    PIPELINE_TAG,
    SLUICE_RUN_TAG,
    describe_run,
    discover_new,
    sluice_run_id,
    start_run,
    summary_metadata,
)
from dagster_project.assets import output_location
from dagster_project.resources import SluiceResource
from dagster_project.sensors import BACKLOG_TAG, backlog_note
from enumerator_service import ConfigError, Settings, SplitStatus, SplitStore, open_platform
from spark_jobs.pipeline import Pipeline

__all__ = [
    "CONTINUOUS_TAG",
    "GENERATION_TAG",
    "MODE_TAG",
    "REPLACES_TAG",
    "SLUICE_RUN_TAG",
    "continuous_job",
    "continuous_sensor",
    "release_failed_run_splits",
    "sluice_run_id",
]

MODE_TAG = "sluice/mode"
#: On a continuous run: its pipeline (the deployment allows one continuous run per value).
CONTINUOUS_TAG = "sluice/continuous"
GENERATION_TAG = "sluice/generation"
#: On a continuous run requested because the live one was found dead: that run's Dagster id.
REPLACES_TAG = "sluice/replaces"
_IN_PROGRESS = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
    DagsterRunStatus.CANCELING,
]


@dataclass(frozen=True)
class _Cursor:
    """The sensor's own state: the current generation and the Sluice run it was given, and
    the new files the last tick left for the next ones (its per-tick cap was hit).

    (The enumerator's discovery cursor lives in Postgres, ``enumerator_state``.)
    """

    generation: int = 0
    run_id: str | None = None
    backlog_files: int = 0

    @classmethod
    def parse(cls, text: str | None) -> "_Cursor":
        if not text:
            return cls()
        data = json.loads(text)
        return cls(int(data["generation"]), data.get("run_id"), int(data.get("backlog_files", 0)))

    def dump(self) -> str:
        return json.dumps(
            {
                "generation": self.generation,
                "run_id": self.run_id,
                "backlog_files": self.backlog_files,
            }
        )


def _runs(context: SensorEvaluationContext, tags: dict[str, str], **kw: Any) -> list[DagsterRun]:
    return list(context.instance.get_runs(filters=RunsFilter(tags=tags, **kw), limit=1))


def _unassigned(store: SplitStore, source: str) -> int:
    return store.counts(source).get(SplitStatus.UNASSIGNED, 0)


#: Grace, in leases, for a STARTED run whose step has not started yet (a busy machine can take
#: longer than a lease to start the step's process).
_STEP_START_LEASES = 3


def _dead_run_reason(
    instance: DagsterInstance, store: SplitStore, run: DagsterRun, lease_seconds: float
) -> str | None:
    """Why ``run``, STARTED in Dagster, is dead; None while it may be alive.

    Evidence is the run's lease heartbeat: from its step's start the reader op, and then its
    driver, renew the lease of every split the run holds each third of a lease. A run whose
    step started more than one lease ago (or, step not started, that has been STARTED for
    ``_STEP_START_LEASES`` leases: the leases the sensor gave it may run out while it queues
    and starts) and that holds a split whose lease ran out has stopped renewing. (A process
    cut off from Postgres for that long looks the same; its splits may go to another run
    either way, and their fencing epochs keep its late commits out.) A run that holds no split
    shows no heartbeat: the splits the tick assigns to it carry a lease, so a dead idle run is
    found one lease later. Runs not STARTED are left to Dagster's run monitoring (start and
    cancel timeouts).
    """
    if run.status != DagsterRunStatus.STARTED:
        return None
    record = instance.get_run_record_by_id(run.run_id)
    if record is None:
        return None
    steps = instance.get_records_for_run(
        run.run_id, of_type=DagsterEventType.STEP_START, limit=1, ascending=False
    ).records
    if steps:
        since, grace = steps[0].timestamp, lease_seconds
    else:
        since = record.start_time or record.create_timestamp.timestamp()
        grace = lease_seconds * _STEP_START_LEASES
    if time.time() - since < grace:
        return None
    expired = store.expired_leases(sluice_run_id(run))
    if expired == 0:
        return None
    return (
        f"its lease heartbeat stopped: {expired} of its splits' leases ran out "
        f"(SLUICE_LEASE_SECONDS={lease_seconds:g}); its run worker is gone"
    )


def continuous_job(pipeline: Pipeline) -> JobDefinition:
    """``<pipeline>_continuous``: the long-running reader of sensor-driven continuous mode."""

    @op(name=f"{pipeline.name}_continuous_reader", out=Out(Nothing))
    def run_continuous_reader(context: OpExecutionContext, sluice: SluiceResource) -> Output[None]:
        """Pulls the splits the sensor assigns to this run as they come, checkpointing every
        ``SLUICE_CHECKPOINT_INTERVAL_SECONDS``; ends when cancelled, or after
        ``SLUICE_CONTINUOUS_IDLE_SECONDS`` without new splits."""
        # Imported here so loading the code location (every sensor tick) never imports PySpark.
        from spark_jobs.jobs import Heartbeat, run_pipeline

        settings = sluice.settings()
        start_run(settings)
        run_id = sluice_run_id(context.run)
        # The leases the sensor gave this run are renewed from the step's first moment, not
        # only once the driver has its Spark session (which can take longer than a lease):
        # the sensor judges a run dead by them (_dead_run_reason).
        engine = open_platform(settings, migrate=False, pool_size=1).engine
        heartbeat = Heartbeat(SplitStore(engine), engine, run_id, settings.lease_seconds, None)
        SplitStore(engine).heartbeat_run(run_id, settings.lease_seconds)
        heartbeat.start()
        try:
            summary = run_pipeline(settings, pipeline, run_id=run_id, continuous=True)
        finally:
            heartbeat.stop()
            engine.dispose()
        context.log.info(describe_run(summary))
        where = output_location(pipeline, settings, None)
        return Output(None, metadata=summary_metadata(None, summary, where))

    @job(
        name=f"{pipeline.name}_continuous",
        description=f"The long-running reader of pipeline {pipeline.name} (one at a time).",
        tags={MODE_TAG: "continuous", PIPELINE_TAG: pipeline.name, CONTINUOUS_TAG: pipeline.name},
    )
    def _job() -> None:
        run_continuous_reader()

    return _job


def continuous_sensor(pipeline: Pipeline, job: JobDefinition) -> SensorDefinition:
    """``<pipeline>_continuous`` (stopped by default): register new input; keep one continuous
    reader run alive and feed it the new splits.

    A tick registers at most ``SLUICE_DISCOVERY_MAX_FILES_PER_TICK`` files; what it leaves is
    recorded in the cursor (``backlog_files``) and the tick's message, and the next ticks go
    on with it, feeding each chunk to the one live run (or to the run they request).
    """
    source = pipeline.name

    @sensor(
        name=f"{pipeline.name}_continuous",
        job=job,
        minimum_interval_seconds=15,
        default_status=DefaultSensorStatus.STOPPED,
    )
    def _sensor(
        context: SensorEvaluationContext, sluice: SluiceResource
    ) -> RunRequest | SkipReason:
        settings = sluice.settings()
        # Without a landing folder yet nothing is discovered; a live run is still fed and a
        # dead one still replaced. A schema that is not at head fails the tick with one line
        # (SchemaError: "run 'sluice db upgrade'"): a failed tick is what the UI and the
        # daemon's log show an operator, a skipped one reads as "nothing to do".
        discovery = discover_new(settings, pipeline)
        cursor = _Cursor.parse(context.cursor)
        # Recorded on every tick, skipped or not: the cursor always shows the current backlog.
        context.update_cursor(replace(cursor, backlog_files=discovery.backlog_files).dump())
        note = backlog_note(discovery)
        engine = open_platform(settings, migrate=False, pool_size=1).engine
        try:
            store = SplitStore(engine)
            mine = {MODE_TAG: "continuous", PIPELINE_TAG: source}
            live = _runs(context, mine, statuses=_IN_PROGRESS)
            dead = (
                _dead_run_reason(context.instance, store, live[0], settings.lease_seconds)
                if live
                else None
            )
            if live and dead is None:
                run_id = sluice_run_id(live[0])
                assigned = store.assign_to_run(run_id, source, lease_seconds=settings.lease_seconds)
                return SkipReason(
                    f"{discovery.splits_registered} new splits; {assigned} assigned to the "
                    f"live continuous run {live[0].run_id}{note}"
                )
            if live and dead is not None:
                # FAILURE (not CANCELED): the run-failure sensors see it; its splits go back
                # now, to the generation requested below.
                context.instance.report_run_failed(live[0], f"Sluice: {dead}")
                released = store.release_run(sluice_run_id(live[0]))
                context.log.warning(
                    f"continuous run {live[0].run_id} is dead ({dead}): reported failed, "
                    f"{released} splits returned to the pool"
                )
            current = (
                _runs(context, {**mine, GENERATION_TAG: str(cursor.generation)})
                if cursor.generation
                else []
            )
            if cursor.generation and not current:
                # Requested by an earlier tick and not created yet: never request a second one.
                return SkipReason(
                    f"waiting for continuous run generation {cursor.generation}{note}"
                )
            ended_badly = bool(current) and current[0].status in (
                DagsterRunStatus.FAILURE,
                DagsterRunStatus.CANCELED,
            )
            if not ended_badly and _unassigned(store, source) == 0:
                return SkipReason(f"no new input ({discovery.seen}){note}")
            next_cursor = _Cursor(
                cursor.generation + 1, f"{source}-c{secrets.token_hex(4)}", discovery.backlog_files
            )
            assert next_cursor.run_id is not None
            assigned = store.assign_to_run(
                next_cursor.run_id, source, lease_seconds=settings.lease_seconds
            )
        finally:
            engine.dispose()
        context.update_cursor(next_cursor.dump())
        return RunRequest(
            run_key=f"{source}:continuous:{next_cursor.generation}:{next_cursor.run_id}",
            tags={
                **mine,
                GENERATION_TAG: str(next_cursor.generation),
                SLUICE_RUN_TAG: next_cursor.run_id,
                "sluice/splits_assigned": str(assigned),
                BACKLOG_TAG: str(discovery.backlog_files),
                **({REPLACES_TAG: live[0].run_id} if live and dead is not None else {}),
            },
        )

    return _sensor


@run_failure_sensor(default_status=DefaultSensorStatus.RUNNING, minimum_interval_seconds=30)
def release_failed_run_splits(context: RunFailureSensorContext, sluice: SluiceResource) -> None:
    """A failed run's splits not covered by a completed checkpoint go back to the pool."""
    settings: Settings = sluice.settings()
    try:
        run_id = sluice_run_id(context.dagster_run)
    except ConfigError as exc:  # a run refused for its tag never held a split
        context.log.info(f"run {context.dagster_run.run_id}: {exc}; no splits to return")
        return
    engine = open_platform(settings, migrate=False, pool_size=1).engine
    try:
        released = SplitStore(engine).release_run(run_id)
    finally:
        engine.dispose()
    context.log.info(f"run {run_id} failed: {released} splits returned to the pool")
