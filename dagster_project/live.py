"""What a running pipeline looks like between completions: its live state and partial days.

``<pipeline>_live_state`` (running by default) reports, on each tick that finds a checkpoint
completed since its last report (its cursor holds the last one reported):

- an ``AssetObservation`` of the output asset with the live state (``sluice status``'s):
  watermark, lag, backlog of splits, the oldest unprocessed split's age, rows/s and the last
  checkpoint's duration;
- for a day-partitioned output, an ``AssetObservation`` of each partition in progress (it has
  splits and no completion yet; the newest ``PARTIAL_DAYS``): rows so far, dead letters,
  splits completed of all, and the watermark;
- an evaluation of ``watermark_freshness``.

``watermark_freshness`` fails when the watermark is further behind now than
``SLUICE_MAX_WATERMARK_LAG_SECONDS``. A stalled pipeline completes no checkpoint, so the
sensor also evaluates the check whenever its outcome would change (recorded in the cursor),
not on every tick: the event log gets an event per change, not one per 30 s. The check is
unpartitioned (the watermark is the pipeline's, not a day's): its runless evaluations are
kept one per event, where a partitioned one could only be kept once per partition
(see ``completions.py``). It can also be run from the UI.

Threading: the sensor runs on the daemon's sensor thread; each call opens and closes its own
database engine.
"""

# No "from __future__ import annotations": Dagster inspects the context annotations.

import json
import warnings
from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Any, cast

import sqlalchemy as sa
from dagster import (
    AssetCheckEvaluation,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetKey,
    AssetObservation,
    DefaultSensorStatus,
    MetadataValue,
    PreviewWarning,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    asset_check,
    sensor,
)

from dagster_project._counts import partition_counts
from dagster_project.resources import SluiceResource
from enumerator_service import (
    END_OF_INPUT,
    ENDED_WORDS,
    LiveState,
    Settings,
    completions_table_exists,
    live_state,
    open_platform,
    partition_completions,
    splits,
)
from spark_jobs.pipeline import Pipeline

__all__ = [
    "FRESHNESS_CHECK",
    "PARTIAL_DAYS",
    "freshness_check",
    "freshness_outcome",
    "live_metadata",
    "live_state_sensor",
    "partial_days",
]

FRESHNESS_CHECK = "watermark_freshness"
#: Partitions in progress observed per checkpoint at most (the newest).
PARTIAL_DAYS = 7
Clock = Callable[[], datetime]


def _now() -> datetime:
    return datetime.now(UTC)


def read_live_state(settings: Settings, source: str, now: datetime) -> LiveState:
    engine = open_platform(settings, migrate=False, pool_size=1).engine
    try:
        with engine.connect() as conn:
            return live_state(conn, source, now)
    finally:
        engine.dispose()


def watermark_value(watermark: datetime) -> MetadataValue[Any]:
    """A watermark as Dagster metadata: a timestamp, or the words for +infinity (a raw
    9999-12-31 epoch is no help)."""
    if watermark >= END_OF_INPUT:
        return MetadataValue.text(ENDED_WORDS)
    return MetadataValue.timestamp(watermark)


def freshness_outcome(state: LiveState, max_lag_seconds: float) -> AssetCheckResult:
    """Passes while the watermark is at most ``max_lag_seconds`` behind ``state.at``; a
    pipeline without a watermark yet (nothing committed) passes, with a note. A watermark
    more than ``max_lag_seconds`` *ahead* of ``state.at`` fails as a warning: an event time
    from the future holds it there, and a stalled pipeline would look fresh behind it."""
    metadata: dict[str, Any] = {"max_watermark_lag_seconds": MetadataValue.float(max_lag_seconds)}
    lag = state.watermark_lag_seconds
    if state.watermark is None or lag is None:
        return AssetCheckResult(passed=True, metadata=metadata, description="no watermark yet")
    metadata["watermark"] = watermark_value(state.watermark)
    metadata["watermark_lag_seconds"] = MetadataValue.float(lag)
    if -lag > max_lag_seconds:
        return AssetCheckResult(
            passed=False,
            severity=AssetCheckSeverity.WARN,
            metadata=metadata,
            description=(
                f"the watermark ({state.watermark:%Y-%m-%d %H:%M:%S}) is {-lag:,.0f}s ahead of"
                f" the clock, over SLUICE_MAX_WATERMARK_LAG_SECONDS={max_lag_seconds:g}: an"
                " event time from the future (a wrong clock or timestamp at the source) holds"
                " it there, and freshness cannot be told until the clock passes it"
            ),
        )
    stale = lag > max_lag_seconds
    description = None
    if stale:
        description = (
            f"the watermark ({state.watermark:%Y-%m-%d %H:%M:%S}) is {lag:,.0f}s behind, over "
            f"SLUICE_MAX_WATERMARK_LAG_SECONDS={max_lag_seconds:g}"
        )
        if state.backlog_splits == 0:
            # Nothing registered is waiting: a stopped run or schedule, or a quiet source.
            description += (
                "; nothing registered is waiting: is the run or its schedule stopped (a Kafka"
                " or CDC source's new input is registered when a run discovers), or is the"
                " source quiet (the watermark moves only with new event times)?"
            )
    return AssetCheckResult(passed=not stale, metadata=metadata, description=description)


def freshness_check(pipeline: Pipeline, key: AssetKey) -> AssetChecksDefinition:
    """``watermark_freshness`` on the output asset (unpartitioned), run from the UI."""

    def fn(context: AssetCheckExecutionContext, sluice: SluiceResource) -> AssetCheckResult:
        settings = sluice.settings()
        state = read_live_state(settings, pipeline.name, _now())
        return freshness_outcome(state, settings.max_watermark_lag_seconds)

    decorate = asset_check(
        asset=key,
        name=FRESHNESS_CHECK,
        blocking=False,
        description="The watermark is at most SLUICE_MAX_WATERMARK_LAG_SECONDS behind now.",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PreviewWarning)
        return decorate(cast(Callable[..., AssetCheckResult], fn))


def live_metadata(state: LiveState) -> dict[str, Any]:
    """The live state as asset metadata (durations in seconds)."""
    metadata: dict[str, Any] = {
        "run_id": MetadataValue.text(state.run_id or ""),
        "checkpoint_id": MetadataValue.int(state.checkpoint_id or 0),
        "backlog_splits": MetadataValue.int(state.backlog_splits),
    }
    optional = {
        "watermark_lag_seconds": state.watermark_lag_seconds,
        "oldest_unprocessed_age_seconds": state.oldest_unprocessed_age_seconds,
        "rows_per_second": state.rows_per_second,
        "last_checkpoint_seconds": state.last_checkpoint_seconds,
    }
    for name, value in optional.items():
        if value is not None:
            metadata[name] = MetadataValue.float(value)
    if state.watermark is not None:
        metadata["watermark"] = watermark_value(state.watermark)
    return metadata


def partial_days(settings: Settings, source: str, limit: int = PARTIAL_DAYS) -> list[date]:
    """The newest ``limit`` days of ``source`` that have splits and no completion (before
    the completions table exists: every day with splits), oldest first."""
    engine = open_platform(settings, migrate=False, pool_size=1).engine
    try:
        query = (
            sa.select(splits.c.partition_key)
            .where(splits.c.source == source, splits.c.partition_key.is_not(None))
            .group_by(splits.c.partition_key)
        )
        if completions_table_exists(engine):
            done = sa.select(partition_completions.c.partition_key).where(
                partition_completions.c.source == source
            )
            query = query.where(splits.c.partition_key.not_in(done))
        query = query.order_by(splits.c.partition_key.desc()).limit(limit)
        with engine.connect() as conn:
            return sorted(conn.execute(query).scalars())
    finally:
        engine.dispose()


def _observe(
    context: SensorEvaluationContext,
    pipeline: Pipeline,
    settings: Settings,
    key: AssetKey,
    state: LiveState,
    partitioned: bool,
) -> int:
    """Report the live state and the partial days; how many days."""
    instance = context.instance
    instance.report_runless_asset_event(
        AssetObservation(asset_key=key, metadata=live_metadata(state), tags=_tags(pipeline))
    )
    if not partitioned:
        return 0
    days = partial_days(settings, pipeline.name)
    for counts in partition_counts(pipeline, settings, days):
        assert counts.day is not None
        metadata: dict[str, Any] = {
            "rows_so_far": MetadataValue.int(counts.rows_committed),
            "dead_letters": MetadataValue.int(counts.dead_letters),
            "splits": MetadataValue.int(counts.splits),
            "splits_completed": MetadataValue.int(counts.splits_completed),
        }
        if state.watermark is not None:
            metadata["watermark"] = watermark_value(state.watermark)
        instance.report_runless_asset_event(
            AssetObservation(
                asset_key=key,
                partition=counts.day.isoformat(),
                description=f"{counts.day} in progress",
                metadata=metadata,
                tags=_tags(pipeline),
            )
        )
    return len(days)


def _tags(pipeline: Pipeline) -> dict[str, str]:
    return {"sluice/source": pipeline.name}


def live_state_sensor(
    pipeline: Pipeline, key: AssetKey, partitioned: bool, clock: Clock = _now
) -> SensorDefinition:
    """``<pipeline>_live_state`` (see the module's docstring); ``clock`` for tests."""

    @sensor(
        name=f"{pipeline.name}_live_state",
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING,
        description=f"Reports the live state and partial days of {pipeline.name}.",
    )
    def _sensor(context: SensorEvaluationContext, sluice: SluiceResource) -> SkipReason:
        settings = sluice.settings()
        state = read_live_state(settings, pipeline.name, clock())
        cursor = json.loads(context.cursor) if context.cursor else {}
        checkpoint = f"{state.run_id}/{state.checkpoint_id}" if state.run_id else None
        outcome = freshness_outcome(state, settings.max_watermark_lag_seconds)
        said = []
        if checkpoint is not None and checkpoint != cursor.get("checkpoint"):
            days = _observe(context, pipeline, settings, key, state, partitioned)
            said.append(f"checkpoint {checkpoint} observed ({days} days in progress)")
        if checkpoint != cursor.get("checkpoint") or outcome.passed != cursor.get("fresh"):
            context.instance.report_runless_asset_event(
                AssetCheckEvaluation(
                    asset_key=key,
                    check_name=FRESHNESS_CHECK,
                    passed=outcome.passed,
                    metadata=outcome.metadata,
                    description=outcome.description,
                    severity=outcome.severity,
                    blocking=False,
                )
            )
            said.append(f"{FRESHNESS_CHECK} {'passed' if outcome.passed else 'failed'}")
        context.update_cursor(json.dumps({"checkpoint": checkpoint, "fresh": outcome.passed}))
        # A tick that requests no run is shown as skipped; its message says what it did.
        return SkipReason("; ".join(said) or "no new checkpoint")

    return _sensor
