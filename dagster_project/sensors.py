"""A pipeline's sensor that registers new input and asks for an incremental run."""

import hashlib
import json
from dataclasses import dataclass

from dagster import (
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)

from dagster_project._runs import PIPELINE_TAG, discover_new, missing_landing
from dagster_project.jobs import IncrementalJob
from dagster_project.resources import SluiceResource
from enumerator_service import DiscoveryResult
from spark_jobs.pipeline import Pipeline

__all__ = [
    "BACKLOG_TAG",
    "FilesSensorCursor",
    "backlog_note",
    "discovery_run_key",
    "new_files_sensor",
]

#: Run tag: new files the requesting tick left for the next ticks (its per-tick cap was hit).
BACKLOG_TAG = "sluice/backlog_files"


@dataclass(frozen=True)
class FilesSensorCursor:
    """The sensor's own cursor: how many runs it requested, and the backlog of its last tick.

    (The enumerator's discovery cursor lives in Postgres, ``enumerator_state``.) Older
    versions stored the bare sequence number; it still parses.
    """

    sequence: int = 0
    backlog_files: int = 0

    @classmethod
    def parse(cls, text: str | None) -> "FilesSensorCursor":
        if not text:
            return cls()
        data = json.loads(text)
        if isinstance(data, int):
            return cls(sequence=data)
        return cls(int(data["sequence"]), int(data.get("backlog_files", 0)))

    def dump(self) -> str:
        return json.dumps({"sequence": self.sequence, "backlog_files": self.backlog_files})


def discovery_run_key(source: str, discovery: DiscoveryResult, sequence: int) -> str:
    """A run key from the discovery cursor (mtime watermark, recent paths) and the new count.

    ``sequence`` (the sensor's own count of requested runs, kept in its Dagster cursor) keeps
    keys unique if the platform database is reset while the Dagster instance is kept: the same
    files would otherwise give the same key again and Dagster would silently drop the run.
    """
    watermark = discovery.cursor.get("mtime_watermark")
    recent = sorted(str(p) for p in discovery.cursor.get("recent_paths") or [])
    digest = hashlib.sha256("\n".join(recent).encode()).hexdigest()[:12]
    mark = f"{float(watermark):.6f}" if watermark is not None else "none"
    return f"{source}:{sequence}:{mark}:{digest}:{discovery.splits_registered}"


def backlog_note(discovery: DiscoveryResult) -> str:
    """``"; N files left for the next ticks"`` when the tick's cap was hit, else ``""``."""
    if discovery.complete:
        return ""
    return f"; {discovery.backlog_files} files left for the next ticks (backlog)"


def new_files_sensor(pipeline: Pipeline, job: IncrementalJob) -> SensorDefinition:
    """``<pipeline>_new_files`` (stopped by default): each tick registers new input as splits;
    new splits -> one incremental run.

    A tick registers at most ``SLUICE_DISCOVERY_MAX_FILES_PER_TICK`` files (oldest first), so
    a large backlog is drained over several ticks, each requesting a run for its chunk; the
    cursor and the run's ``sluice/backlog_files`` tag say how much is left.
    """

    @sensor(
        name=f"{pipeline.name}_new_files",
        job=job,
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.STOPPED,
    )
    def _sensor(
        context: SensorEvaluationContext, sluice: SluiceResource
    ) -> RunRequest | SkipReason:
        settings = sluice.settings()
        missing = missing_landing(settings, pipeline)
        if missing is not None:
            return SkipReason(f"nothing to discover yet ({missing})")
        discovery = discover_new(settings, pipeline)
        cursor = FilesSensorCursor.parse(context.cursor)
        if discovery.splits_registered == 0:
            if cursor.backlog_files != discovery.backlog_files:
                context.update_cursor(
                    FilesSensorCursor(cursor.sequence, discovery.backlog_files).dump()
                )
            reason = (
                f"no new input ({discovery.seen})"
                if discovery.complete
                else f"no new splits in this chunk ({discovery.seen})"
            )
            return SkipReason(reason + backlog_note(discovery))
        sequence = cursor.sequence + 1
        context.update_cursor(FilesSensorCursor(sequence, discovery.backlog_files).dump())
        return RunRequest(
            run_key=discovery_run_key(pipeline.name, discovery, sequence),
            tags={
                PIPELINE_TAG: pipeline.name,
                "sluice/splits_registered": str(discovery.splits_registered),
                BACKLOG_TAG: str(discovery.backlog_files),
            },
        )

    return _sensor
