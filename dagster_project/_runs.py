"""Discovery and runs of a pipeline, shared by its assets, jobs and sensors."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import date
from typing import TYPE_CHECKING, Any

from dagster import DagsterRun, Failure, MetadataValue

from enumerator_service import (
    CrossDayRebuildError,
    DiscoveryResult,
    PartitionBusyError,
    Settings,
    discover,
    open_platform,
    safe_name,
)
from spark_jobs import BadInputFailure, DeterministicFailure, ExitCode
from spark_jobs.connectors import source_connector_named
from spark_jobs.pipeline import Pipeline, discovery_of

if TYPE_CHECKING:
    from spark_jobs.jobs import RunSummary

__all__ = [
    "PIPELINE_TAG",
    "SLUICE_RUN_TAG",
    "describe_run",
    "discover_and_run",
    "discover_new",
    "discover_once",
    "drain_and_run",
    "drain_discovery",
    "missing_landing",
    "sluice_run_id",
    "start_run",
    "summary_metadata",
]

#: The Sluice run (``splits.run_id``) a Dagster run works on, when it is not derived.
SLUICE_RUN_TAG = "sluice/run_id"
#: The pipeline a Dagster run works for.
PIPELINE_TAG = "sluice/pipeline"


def sluice_run_id(run: DagsterRun) -> str:
    """The Sluice run id of a Dagster run: its tag, else ``dagster-<Dagster run id>`` (so the
    failed-run sensor can give a dead run's splits back).

    The tag can be set by anyone who can launch a run and becomes a staging folder name: a
    value that is not a safe path part (``/``, ``..``, NUL, empty, over 128 characters) is a
    ConfigError naming the tag, before anything runs."""
    tagged = run.tags.get(SLUICE_RUN_TAG)
    if tagged is None:
        return f"dagster-{run.run_id}"
    return safe_name(tagged, f"run tag {SLUICE_RUN_TAG}")


def start_run(settings: Settings) -> None:
    """What a run does first: migrate the platform database (creating the embedded one if the
    home has none). Runs are one of the three places migrations run; sensor ticks and checks
    only check the schema version."""
    open_platform(settings, migrate=True).close()


def discover_once(
    settings: Settings, pipeline: Pipeline, dates: Sequence[date] | None = None
) -> DiscoveryResult:
    """One discovery tick (bounded to ``dates`` when given) on a short-lived connection.

    Never migrates: a schema that is not at head is a one-line SchemaError (a sensor tick
    fails with it; a run has migrated first, :func:`start_run`).
    """
    platform = open_platform(settings, migrate=False, pool_size=1)
    try:
        return discover(platform, discovery_of(pipeline, settings), dates=dates)
    finally:
        platform.close()


def missing_landing(settings: Settings, pipeline: Pipeline) -> str | None:
    """Why the source has nothing to discover yet without it being an error (a landing
    folder that does not exist yet: a pipeline registered before its first file landed),
    else None."""
    connector = source_connector_named(pipeline.plan.source.kind)
    return connector.waiting_for_input(pipeline, settings)


def discover_new(settings: Settings, pipeline: Pipeline) -> DiscoveryResult:
    """One capped tick of the continuous discovery (sensors, incremental runs); nothing is
    found while the landing folder does not exist yet — not an error: files are to come."""
    if missing_landing(settings, pipeline) is not None:
        return DiscoveryResult(files_seen=0, splits_registered=0, cursor={})
    return discover_once(settings, pipeline)


def drain_discovery(settings: Settings, pipeline: Pipeline) -> int:
    """Capped discovery ticks until no backlog is left; the splits they registered.

    The per-tick cap keeps a *sensor tick* short; a run has no such limit and processes
    "everything discovered", so it first registers the whole backlog, one committed chunk
    after another. Called at the start of a run: migrates first (:func:`start_run`).
    """
    start_run(settings)
    registered = 0
    while True:
        tick = discover_new(settings, pipeline)
        registered += tick.splits_registered
        if tick.complete:
            return registered


def drain_and_run(
    settings: Settings, pipeline: Pipeline, *, run_id: str | None
) -> tuple[DiscoveryResult, RunSummary]:
    """The whole backlog of new input registered (:func:`drain_discovery`), then
    :func:`discover_and_run` of everything unassigned; the discovery's ``splits_registered``
    counts both (an incremental run, an unpartitioned output's materialisation)."""
    drained = drain_discovery(settings, pipeline)
    discovery, summary = discover_and_run(settings, pipeline, run_id=run_id)
    registered = drained + discovery.splits_registered
    return dataclasses.replace(discovery, splits_registered=registered), summary


def discover_and_run(
    settings: Settings,
    pipeline: Pipeline,
    dates: Sequence[date] | None = None,
    *,
    run_id: str | None = None,
    rebuild: bool = False,
) -> tuple[DiscoveryResult, RunSummary]:
    """Register the splits of ``dates`` (or all new ones), then process every unassigned one.

    ``run_id`` names the Sluice run (``dagster-<Dagster run id>`` from Dagster, so the
    failed-run sensor can give a dead run's splits back). ``rebuild``: days of ``dates`` that
    were processed before are processed again and their output replaced (by event day: every
    file that fed the day is re-read, see ``enumerator_service._rebuilds``). The run starts by
    migrating the platform database (:func:`start_run`). A rebuild that cannot start because
    a file feeding the day is not read to the end fails as a :class:`dagster.Failure` (not
    retried) naming the day.
    """
    start_run(settings)
    # Days asked for must have their folders; "all new input" may have none yet.
    discovery = (
        discover_new(settings, pipeline)
        if dates is None
        else discover_once(settings, pipeline, dates)
    )
    # Imported here so loading the code location (and every sensor tick) never imports PySpark.
    from spark_jobs.jobs import run_pipeline

    try:
        summary = run_pipeline(
            settings,
            pipeline,
            dates=list(dates) if dates is not None else None,
            run_id=run_id,
            rebuild=rebuild,
        )
    except BadInputFailure as exc:
        # The source's input (a truncated table, a dropped slot): a retry meets it again.
        raise Failure(
            description=str(exc),
            metadata={"exit_code": int(ExitCode.USAGE)},
            allow_retries=False,
        ) from None
    except DeterministicFailure as exc:
        # An error in the pipeline's code: every retry would fail on the same record.
        raise Failure(
            description=f"run failed: {exc}",
            metadata={"exit_code": int(ExitCode.CODE_ERROR)},
            allow_retries=False,
        ) from None
    except CrossDayRebuildError as exc:
        # Refused before anything moved; a retry would be refused the same way. The one line
        # says it all: no cause chain (Dagster would log the refusal's traceback twice).
        raise Failure(
            description=f"cannot re-materialise: {exc}",
            metadata={"partition": str(exc.partition_key)},
            allow_retries=False,
        ) from None
    except PartitionBusyError as exc:
        # Refused before anything moved; once the other run ends, a retry can proceed.
        raise Failure(description=f"cannot re-materialise now: {exc}") from None
    return discovery, summary


def describe_run(summary: RunSummary) -> str:
    """One log line for a finished run (no connection details)."""
    left = summary.left
    waiting = "".join(
        (
            f"; {len(left.quarantined)} split(s) quarantined" if left.quarantined else "",
            f"; {left.held} split(s) held by another run" if left.held else "",
            f"; {left.rebuilding} split(s) held for a rebuild" if left.rebuilding else "",
            f"; {left.returned} split(s) not read, back in the pool" if left.returned else "",
            f"; {len(left.retrying)} split(s) failed an attempt, back in the pool"
            if left.retrying
            else "",
        )
    )
    if summary.nothing_new:
        what = "nothing to process now" if left.held or left.rebuilding else "nothing new"
        return f"run {summary.run_id}: {what}{waiting}"
    rebuilt = f", replaced partitions {', '.join(summary.rebuilt)}" if summary.rebuilt else ""
    return (
        f"run {summary.run_id} ({summary.pipeline}): {summary.splits} splits, "
        f"{summary.rows_in} rows in, {summary.rows_out} rows out, {summary.dropped} removed by "
        f"steps, {summary.dead_letters} dead letters, {summary.fenced} fenced, "
        f"{summary.seconds:.1f}s ({summary.rows_per_second:,.0f} rows/s){rebuilt}{waiting}"
    )


def summary_metadata(
    discovery: DiscoveryResult | None, summary: RunSummary, output: str
) -> dict[str, MetadataValue[Any]]:
    """Dagster metadata for a run: counts, lookup and checkpoint figures, the output; discovery
    counts when the run discovered (a continuous reader does not).

    Never the database URL (nor anything else from the connection settings).
    """
    found: dict[str, MetadataValue[Any]] = {}
    if discovery is not None:
        found["splits_registered"] = MetadataValue.int(discovery.splits_registered)
        if discovery.of_files:  # (what a Kafka, CDC or table discovery counts is no file)
            found["files_seen"] = MetadataValue.int(discovery.files_seen)
            found["skipped_links"] = MetadataValue.int(discovery.skipped_links)
            found["skipped_names"] = MetadataValue.int(discovery.skipped_names)
    steps = "\n".join(
        f"| {where} | {records_in:,} | {records_out:,} |"
        for where, records_in, records_out in summary.steps
    )
    return {
        "run_id": MetadataValue.text(summary.run_id),
        "pipeline": MetadataValue.text(summary.pipeline),
        **found,
        "splits": MetadataValue.int(summary.splits),
        "rows_in": MetadataValue.int(summary.rows_in),
        "rows_out": MetadataValue.int(summary.rows_out),
        "rows_removed_by_steps": MetadataValue.int(summary.dropped),
        "dead_letters": MetadataValue.int(summary.dead_letters),
        "fenced": MetadataValue.int(summary.fenced),
        "seconds": MetadataValue.float(float(summary.seconds)),
        "rows_per_second": MetadataValue.float(float(summary.rows_per_second)),
        "lookups": MetadataValue.int(summary.lookups),
        "lookup_queries": MetadataValue.int(summary.lookup_queries),
        "cache_hit_rate": MetadataValue.float(float(summary.cache_hit_rate)),
        "cache_bypass_rate": MetadataValue.float(float(summary.cache_bypass_rate)),
        "lookup_p50_ms": MetadataValue.float(float(summary.lookup_p50_ms)),
        "lookup_p99_ms": MetadataValue.float(float(summary.lookup_p99_ms)),
        "checkpoints_completed": MetadataValue.int(summary.checkpoints),
        "checkpoints_aborted": MetadataValue.int(summary.checkpoints_aborted),
        "checkpoint_p50_ms": MetadataValue.float(float(summary.checkpoint_p50_ms)),
        "checkpoint_p99_ms": MetadataValue.float(float(summary.checkpoint_p99_ms)),
        "alignment_p50_ms": MetadataValue.float(float(summary.alignment_p50_ms)),
        "nothing_new": MetadataValue.bool(summary.nothing_new),
        # The CLI's exit code for this run (spark_jobs._outcomes): 3 quarantined, 4 held.
        "exit_code": MetadataValue.int(int(summary.exit_code)),
        "quarantined_splits": MetadataValue.int(len(summary.left.quarantined)),
        "held_splits": MetadataValue.int(summary.left.held + summary.left.rebuilding),
        "retrying_splits": MetadataValue.int(len(summary.left.retrying)),
        "rebuilt_partitions": MetadataValue.text(", ".join(summary.rebuilt) or "none"),
        "steps": MetadataValue.md("| step | records in | records out |\n|---|---:|---:|\n" + steps),
        "output": MetadataValue.text(output),
    }
